"""The ledger under approximate DP: histories compose through privacy loss distributions, a
release is admitted exactly while the composed delta at the lifetime epsilon stays within the
lifetime delta, the runway counts the runs left, and racing processes never overspend."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import test_ledger as ledger_tests
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_audit_chain import BACKENDS, FINGERPRINT, audit_database, check

from privrelease.audit import database, ledger
from privrelease.errors import TargetNotMet
from privrelease.mechanisms import composition, guarantees
from privrelease.mechanisms.events import SDGS

ADULT = SDGS(k=20, beta=0.1, epsilon=1.0)
LIFETIME = ledger.Budget(1.25, 1e-6)


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    with audit_database(request.param, tmp_path) as engine:
        yield engine


def setup_dataset(engine: Any, budget: ledger.Budget, runs: int) -> list[str]:
    return ledger_tests.setup_dataset(engine, budget, runs, notion="approximate")


def crossing(event: Any, budget: ledger.Budget, upto: int) -> int:
    """The number of runs that fit, by a plain scan of the composed curve (no search)."""
    for runs in range(1, upto + 1):
        if composition.delta_at([event], budget.epsilon, times=runs).delta > budget.delta * (
            1 + guarantees.RELATIVE_SLACK
        ):
            return runs - 1
    return upto


def test_monthly_adult_releases_are_admitted_exactly_until_the_curve_crosses_the_budget(engine: Any) -> None:
    expected = crossing(ADULT, LIFETIME, 120)
    assert 60 < expected < 120  # the budget binds inside ten years of monthly runs
    runs = setup_dataset(engine, LIFETIME, runs=120)
    with database.session(engine, readonly=True) as s:
        assert ledger.runway(ledger.ledger_status(s, FINGERPRINT), ADULT).runs == expected
    admitted = 0
    for run in runs:
        try:
            with database.session(engine) as s:
                reservation = ledger.reserve(s, FINGERPRINT, run, ADULT, "approximate")
                ledger.commit(s, reservation)
            admitted += 1
        except TargetNotMet as refusal:
            assert "would be exceeded" in str(refusal)
            break
    assert admitted == expected
    with database.session(engine, readonly=True) as s:
        status = ledger.ledger_status(s, FINGERPRINT)
        assert status.spent.fits(status.budget) and status.spent.delta == LIFETIME.delta
        assert status.spent.epsilon == pytest.approx(
            composition.epsilon_at([ADULT], LIFETIME.delta, times=expected).epsilon
        )
        assert ledger.runway(status, ADULT).runs == 0
    assert check(engine).ok


def test_runway_counts_down_and_reports_the_next_run(engine: Any) -> None:
    runs = setup_dataset(engine, LIFETIME, runs=3)
    with database.session(engine, readonly=True) as s:
        before = ledger.runway(ledger.ledger_status(s, FINGERPRINT), ADULT)
    for run in runs[:2]:
        with database.session(engine) as s:
            ledger.commit(s, ledger.reserve(s, FINGERPRINT, run, ADULT, "approximate"))
    with database.session(engine, readonly=True) as s:
        after = ledger.runway(ledger.ledger_status(s, FINGERPRINT), ADULT)
    assert after.runs == before.runs - 2
    assert after.spent.epsilon == pytest.approx(composition.epsilon_at([ADULT], 1e-6, times=2).epsilon)
    assert after.after_next_run.epsilon == pytest.approx(composition.epsilon_at([ADULT], 1e-6, times=3).epsilon)
    assert after.this_run.epsilon == pytest.approx(composition.epsilon_at([ADULT], 1e-6).epsilon)
    assert not after.capped


def test_processes_racing_for_the_last_composed_slot_never_overspend(engine: Any) -> None:
    budget = ledger.Budget(composition.epsilon_at([ADULT], 1e-6, times=2).epsilon, 1e-6)
    runs = setup_dataset(engine, budget, runs=4)
    assert ledger_tests.race(engine, runs, ADULT, "approximate") == ["committed"] * 2 + ["refused"] * 2
    with database.session(engine, readonly=True) as s:
        status = ledger.ledger_status(s, FINGERPRINT)
        assert len(status.counting) == 2 and status.spent.fits(status.budget)
    assert check(engine).ok


@settings(max_examples=300, deadline=None)
@example(boundary=601, maximum=1716, shares="noisy", power=1.0)  # shares 0.4004, 0.4006 aimed past any float
@given(
    boundary=st.integers(1, 5000),
    maximum=st.integers(1, 5000),
    shares=st.sampled_from(["power", "linear", "constant", "falling", "infinite", "noisy"]),
    power=st.floats(0.05, 3.0),
)
def test_the_runway_search_finds_the_largest_fitting_count_whatever_guides_it(
    boundary: int, maximum: int, shares: str, power: float
) -> None:
    """ledger.largest_fitting equals a scan for any monotone 'fits' (fitting up to
    ``boundary``), whatever the shares that guide it, within 3 log2(maximum) + 4 evaluations
    (noisy shares took 26 at maximum 1,984, above the 2 log2 + 4 first stated), and evaluates
    few counts when the shares follow a power of the count as composed losses do."""
    import math
    import random

    rng = random.Random(boundary * 7919 + maximum)
    probes: list[int] = []

    def share(runs: int) -> float:
        return {
            "power": (runs / (boundary + 0.5)) ** power,
            "linear": runs / (boundary + 0.5),
            "constant": 0.5,
            "falling": 1 / runs,
            "infinite": math.inf,
            "noisy": rng.uniform(0, 3),
        }[shares]

    def measure(runs: int) -> tuple[bool, float]:
        assert 1 <= runs <= maximum and runs not in probes
        probes.append(runs)
        return runs <= boundary, share(runs)

    assert ledger.largest_fitting(measure, maximum) == min(boundary, maximum)
    # outwards each probe at least doubles; inwards every second probe at least halves the bracket
    assert len(probes) <= 3 * math.log2(maximum) + 4
    if shares == "power" and boundary < maximum:
        assert len(probes) <= 12
