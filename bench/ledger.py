"""Benchmark of lifetime accounting (not a test): a ledger of 120 monthly releases of the Adult
SDGS example (k = 20, beta = 0.1) composed and checked against the lifetime budget in a warm
process, the same check by basic composition (adding the stated epsilons: the baseline,
measured in the same run), the runway search, and the whole `privrelease guarantee compose
--times 1000` process against a bare `python -c pass`. Last line: one JSON object of the
figures.

    python bench/ledger.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[1]
POLICY = REPO / "policies" / "examples" / "adult-sdgs.yaml"
RELEASES = 120
BUDGET = (3.0, 1e-6)
T = TypeVar("T")
# the Adult example reads its hierarchies from ../shared/data: declare it a data root (also for
# the `privrelease guarantee compose` process below, which inherits the environment)
os.environ.setdefault("PRIVRELEASE_DATA_ROOTS", str(REPO.parent / "shared" / "data"))


def seconds(function: Callable[[], T], repeats: int = 5) -> tuple[float, T]:
    """Median wall time of ``repeats`` calls, and the last result."""
    assert repeats >= 1, f"repeats must be >= 1; got {repeats}"
    times, results = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        results.append(function())
        times.append(time.perf_counter() - start)
    return statistics.median(times), results[-1]


def process_seconds(*args: str, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(args, check=True, capture_output=True, cwd=REPO)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    from privrelease.audit import approvals, database, ledger, records
    from privrelease.audit.models import LedgerEntry
    from privrelease.mechanisms.accountants import account
    from privrelease.mechanisms.events import SDGS
    from privrelease.policies import load_policy

    event = SDGS(k=20, beta=0.1, epsilon=1.0)
    budget = ledger.Budget(*BUDGET)
    with tempfile.TemporaryDirectory() as folder:
        engine = database.open_database(f"sqlite:///{folder}/audit.db", create=True)
        database.migrate(engine)
        facts = approvals.policy_facts(load_policy(POLICY))
        with database.session(engine) as s:
            approvals.register_policy(s, facts)
            records.register_dataset(
                s, "ab" * 32, identity="adult-census", size_bytes=1, row_count=1,
                lifetime_epsilon=budget.epsilon, lifetime_delta=budget.delta, notion="approximate",
            )  # fmt: skip
            for _ in range(RELEASES):  # stored directly: committing through reserve() would warm the cache
                run = records.start_run(s, policy_sha256=facts.sha256, code_version="bench").id
                s.add(
                    LedgerEntry(
                        dataset_id="adult-census", run_id=run, notion="approximate",
                        event_json=ledger_event_json(event), epsilon=0.0, delta=0.0, state="committed",
                    )
                )  # fmt: skip

        def check() -> tuple[float, bool]:
            with database.session(engine, readonly=True) as s:
                status = ledger.ledger_status(s, "adult-census")
            return status.spent.epsilon, status.spent.fits(status.budget)

        start = time.perf_counter()
        check()
        cold = time.perf_counter() - start
        warm, (spent, fits) = seconds(check)

        def basic() -> tuple[float, bool]:
            with database.session(engine, readonly=True) as s:
                status = ledger.ledger_status(s, "adult-census")
            stated = [account(tree, "approximate") for tree in ledger._trees(status.counting)]
            total = ledger.Budget(sum(g.epsilon for g in stated), sum(g.delta for g in stated))
            return total.epsilon, total.fits(budget)

        basic_warm, (basic_spent, basic_fits) = seconds(basic)
        with database.session(engine, readonly=True) as s:
            status = ledger.ledger_status(s, "adult-census")
        runway_seconds, runway = seconds(lambda: ledger.runway(status, event), repeats=3)

    privrelease = [sys.executable, "-m", "privrelease"]
    compose = process_seconds(*privrelease, "guarantee", "compose", str(POLICY), "--times", "1000", "--delta", "1e-6")
    startup = process_seconds(sys.executable, "-c", "pass")
    figures = {
        "releases": RELEASES,
        "budget": {"epsilon": BUDGET[0], "delta": BUDGET[1]},
        "spent_epsilon_pld": spent,
        "spent_epsilon_basic": basic_spent,
        "fits_pld": fits,
        "fits_basic": basic_fits,
        "check_cold_s": cold,
        "check_warm_s": warm,
        "check_basic_warm_s": basic_warm,
        "runway_runs": runway.runs,
        "runway_s": runway_seconds,
        "compose_1000_process_s": compose,
        "python_startup_s": startup,
    }
    print(f"{RELEASES} stored Adult SDGS releases, lifetime budget (epsilon {BUDGET[0]}, delta {BUDGET[1]:g}):")
    print(f"  PLD ledger: spent epsilon {spent:.4f} at delta {BUDGET[1]:g}, fits: {fits}")
    print(f"  basic composition (baseline): spent epsilon {basic_spent:.4f}, fits: {basic_fits}")
    print(
        f"  check: cold {cold:.3f} s (imports, PLD built), warm {warm:.3f} s (target < 1 s); basic {basic_warm:.3f} s"
    )
    print(f"  runway: {runway.runs} more runs, found in {runway_seconds:.3f} s")
    print(f"guarantee compose --times 1000: {compose:.2f} s per process (target < 3 s); python -c pass {startup:.2f} s")
    print(json.dumps(figures))


def ledger_event_json(event) -> str:
    from privrelease.mechanisms.events import event_to_json

    return event_to_json(event)


if __name__ == "__main__":
    main()
