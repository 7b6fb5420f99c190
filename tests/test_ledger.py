"""The privacy ledger: reserve / commit / release / expiry, the budget as the composition of the
stored event trees, and OS processes racing for the last budget never overspending.

Every test runs on SQLite, and also on PostgreSQL when ``PRIVRELEASE_TEST_POSTGRES_URL`` names a
server (a maintenance database URL, e.g. ``postgresql+psycopg://postgres@127.0.0.1/postgres``):
each test gets a database of its own there.
"""

from __future__ import annotations

import multiprocessing
import queue
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import select
from test_audit_chain import (
    BACKENDS,
    FINGERPRINT,
    POLICY,
    POLICY_SHA,
    audit_database,
    check,
)

from privrelease.audit import approvals, database, ledger, records
from privrelease.audit.models import LedgerEntry, Run, utcnow
from privrelease.errors import TargetNotMet, UserError
from privrelease.mechanisms.events import (
    SDGS,
    Composed,
    Laplace,
    SPLUGen,
    event_to_json,
)

accountants = pytest.importorskip(
    "privrelease.mechanisms.accountants",
    reason="the accountants module has not landed yet",
)

NOTION = "probabilistic"


def _a_supported_release() -> Any:
    """A pure epsilon = 0.5 Laplace release, or an SDGS one if the accountant does not take
    Laplace under NOTION: the tests compare against whatever the accountant says."""
    for event in (
        Laplace(scale=2.0, sensitivity=1.0),
        SDGS(k=20, beta=0.1, epsilon=0.5),
    ):
        if accountants.account(event, NOTION).supported:
            return event
    pytest.skip(f"the {NOTION} accountant supports neither Laplace nor SDGS")


RELEASE = _a_supported_release()


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    with audit_database(request.param, tmp_path) as engine:
        yield engine


def composed(*events: Any) -> ledger.Budget:
    """What the real accountant says ``events`` compose to."""
    event = events[0] if len(events) == 1 else Composed(events=tuple(events))
    guarantee = accountants.account(event, NOTION)
    assert guarantee.supported, guarantee.detail
    return ledger.Budget(float(guarantee.epsilon), float(guarantee.delta))


def setup_dataset(engine: Any, budget: ledger.Budget, runs: int, notion: str = NOTION) -> list[str]:
    """Approve a policy, register the dataset with ``budget`` under ``notion``, start ``runs`` runs."""
    with database.session(engine) as s:
        approvals.register_policy(s, POLICY)
        records.register_dataset(
            s,
            FINGERPRINT,
            identity="census",
            size_bytes=100,
            row_count=10,
            lifetime_epsilon=budget.epsilon,
            lifetime_delta=budget.delta,
            notion=notion,
            label="census.csv",
        )
        return [records.start_run(s, policy_sha256=POLICY_SHA, code_version="test").id for _ in range(runs)]


def reserve(engine: Any, run_id: str, **kwargs: Any) -> ledger.Reservation:
    with database.session(engine) as s:
        return ledger.reserve(s, FINGERPRINT, run_id, RELEASE, NOTION, **kwargs)


def test_reserve_commit_and_the_spent_budget_is_the_composition(engine: Any) -> None:
    runs = setup_dataset(engine, composed(RELEASE, RELEASE), runs=3)
    first = reserve(engine, runs[0])
    assert first.spent_before == ledger.Budget(0.0, 0.0)
    assert first.this_release == composed(RELEASE) == first.total_after
    second = reserve(engine, runs[1])
    assert second.spent_before == composed(RELEASE)
    assert second.total_after == composed(RELEASE, RELEASE)
    with database.session(engine) as s:
        ledger.commit(s, first)
        ledger.commit(s, second.entry_id)
        ledger.commit(s, second)  # idempotent
    with pytest.raises(TargetNotMet) as refused:
        reserve(engine, runs[2])
    message = str(refused.value)
    for part in (
        FINGERPRINT[:12],
        "census.csv",
        "lifetime budget",
        "already spent",
        "2 release",
    ):
        assert part in message
    assert f"this release needs {composed(RELEASE)}" in message
    with database.session(engine, readonly=True) as s:
        status = ledger.ledger_status(s, FINGERPRINT)
        assert status.spent == composed(RELEASE, RELEASE)
        assert [status.effective_state(e) for e in status.entries] == [
            "committed",
            "committed",
        ]
        entry = s.exec(select(LedgerEntry)).first()
        assert entry is not None and entry.event_json == event_to_json(RELEASE)
        run = s.get(Run, runs[0])
        assert run is not None and run.dataset_fingerprint == FINGERPRINT
    assert check(engine).ok


def test_release_gives_the_budget_back(engine: Any) -> None:
    runs = setup_dataset(engine, composed(RELEASE), runs=2)
    first = reserve(engine, runs[0])
    with pytest.raises(TargetNotMet):
        reserve(engine, runs[1])
    with database.session(engine) as s:
        released = ledger.release(s, first, "run failed: disk full")
        assert released.state == "released" and released.reason == "run failed: disk full"
        ledger.release(s, first)  # idempotent
    reserve(engine, runs[1])
    assert check(engine).ok


def test_state_errors(engine: Any) -> None:
    runs = setup_dataset(engine, composed(RELEASE, RELEASE), runs=2)
    first, second = reserve(engine, runs[0]), reserve(engine, runs[1])
    with database.session(engine) as s:
        ledger.commit(s, first)
        ledger.release(s, second)
    with (
        database.session(engine) as s,
        pytest.raises(ledger.LedgerStateError, match="un-spent"),
    ):
        ledger.release(s, first)
    with (
        database.session(engine) as s,
        pytest.raises(ledger.LedgerStateError, match="released"),
    ):
        ledger.commit(s, second)
    with pytest.raises(ledger.LedgerStateError, match="already holds"):
        reserve(engine, runs[0])


def test_an_expired_reservation_stops_counting(engine: Any) -> None:
    runs = setup_dataset(engine, composed(RELEASE), runs=2)
    start = utcnow()
    crashed = reserve(engine, runs[0], ttl_seconds=10, now=start)
    with database.session(engine, readonly=True) as s:
        early = ledger.ledger_status(s, FINGERPRINT, now=start + timedelta(seconds=5))
        late = ledger.ledger_status(s, FINGERPRINT, now=start + timedelta(seconds=11))
    assert early.effective_state(early.entries[0]) == "reserved"
    assert early.spent == composed(RELEASE)
    assert late.effective_state(late.entries[0]) == "expired"
    assert late.spent == ledger.Budget(0.0, 0.0)
    with pytest.raises(TargetNotMet):
        reserve(engine, runs[1], now=start + timedelta(seconds=9))
    reserve(engine, runs[1], now=start + timedelta(seconds=11))
    with database.session(engine, readonly=True) as s:
        entry = s.get(LedgerEntry, crashed.entry_id)
        assert entry is not None and entry.state == "released"
        assert entry.reason is not None and entry.reason.startswith("expired")
        run = s.get(Run, runs[0])
        assert run is not None and run.status == "failed" and "expired" in (run.error or "")
    with database.session(engine) as s, pytest.raises(ledger.LedgerStateError):
        ledger.commit(s, crashed)
    assert check(engine).ok


def test_a_slow_run_cannot_commit_after_expiry(engine: Any) -> None:
    runs = setup_dataset(engine, composed(RELEASE), runs=1)
    start = utcnow()
    slow = reserve(engine, runs[0], ttl_seconds=10, now=start)
    with (
        database.session(engine) as s,
        pytest.raises(ledger.LedgerStateError, match="expired"),
    ):
        ledger.commit(s, slow, now=start + timedelta(seconds=10))


def test_mismatched_budget_notion_dataset_or_run_are_user_errors(engine: Any) -> None:
    runs = setup_dataset(engine, composed(RELEASE), runs=1)
    with pytest.raises(UserError, match="cannot be changed"):
        reserve(engine, runs[0], budget=(9.0, 0.0))
    with (
        database.session(engine) as s,
        pytest.raises(UserError, match="one accountant"),
    ):
        ledger.reserve(s, FINGERPRINT, runs[0], RELEASE, "approximate")
    with (
        database.session(engine) as s,
        pytest.raises(UserError, match="not registered"),
    ):
        ledger.reserve(s, "ab" * 32, runs[0], RELEASE, NOTION)
    with database.session(engine) as s, pytest.raises(UserError, match="no run"):
        ledger.reserve(s, FINGERPRINT, "nope", RELEASE, NOTION)
    with (
        database.session(engine) as s,
        pytest.raises(UserError, match="cannot be changed"),
    ):
        records.register_dataset(
            s,
            FINGERPRINT,
            identity="census",
            size_bytes=100,
            row_count=10,
            lifetime_epsilon=99.0,
            lifetime_delta=0.0,
            notion=NOTION,
        )
    reserve(engine, runs[0], budget=composed(RELEASE))


def test_an_event_the_accountant_cannot_account_for_is_refused(engine: Any) -> None:
    splu = SPLUGen(gamma=5)
    if accountants.account(splu, NOTION).supported:
        pytest.skip(f"the {NOTION} accountant supports SPLU-Gen")
    runs = setup_dataset(engine, composed(RELEASE), runs=1)
    with (
        database.session(engine) as s,
        pytest.raises(TargetNotMet, match="cannot account"),
    ):
        ledger.reserve(s, FINGERPRINT, runs[0], splu, NOTION)


# --- two OS processes racing for the last budget -------------------------------------------------


def _race(url: str, run_id: str, event_json: str, notion: str, barrier: Any, results: Any) -> None:
    try:
        engine = database.open_database(url)
        barrier.wait(30)
        with database.session(engine) as s:
            reservation = ledger.reserve(s, FINGERPRINT, run_id, event_json, notion)
        with database.session(engine) as s:
            ledger.commit(s, reservation)
        results.put((run_id, "committed"))
    except TargetNotMet:
        results.put((run_id, "refused"))
    except BaseException as error:  # noqa: BLE001  (reported to the parent: the test fails)
        results.put((run_id, f"error: {error!r}"))


def race(engine: Any, runs: list[str], event: Any, notion: str = NOTION) -> list[str]:
    """Each run reserves and commits ``event`` in its own OS process, all released at once by a
    barrier; the sorted outcomes (``committed`` / ``refused``)."""
    url = engine.url.render_as_string(hide_password=False)
    context = multiprocessing.get_context(
        "spawn"
    )  # a fresh interpreter: forking a test process that runs threads can deadlock or fail the child
    barrier, results = context.Barrier(len(runs)), context.Queue()
    tree = event_to_json(event)
    workers = [context.Process(target=_race, args=(url, run, tree, notion, barrier, results)) for run in runs]
    for worker in workers:
        worker.start()
    outcomes = {}
    for _ in workers:
        try:
            run_id, outcome = results.get(timeout=120)
        except queue.Empty:
            pytest.fail("a racing process did not report")
        outcomes[run_id] = outcome
    for worker in workers:
        worker.join(30)
    return sorted(outcomes.values())


@pytest.mark.parametrize("fits", [1, 2])
def test_processes_racing_for_the_last_budget_never_overspend(engine: Any, fits: int) -> None:
    runs = setup_dataset(engine, composed(*[RELEASE] * fits), runs=4)
    assert race(engine, runs, RELEASE) == ["committed"] * fits + ["refused"] * (len(runs) - fits)
    with database.session(engine, readonly=True) as s:
        status = ledger.ledger_status(s, FINGERPRINT)
        assert len(status.counting) == fits
        assert status.spent.fits(status.budget)
    assert check(engine).ok
