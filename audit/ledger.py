"""The privacy ledger: every dataset identity (the population the data is about, a policy's
``dataset.id``) has a lifetime budget, and every release from any of its files (vintages, by
fingerprint) charges its privacy-event tree.

What has been spent is the **composition of the stored trees** under the dataset's accountant,
never a running sum of numbers: an auditor replays exactly the trees stored here. Under
approximate DP the trees compose through privacy loss distributions (the tightest sound method,
:mod:`privrelease.mechanisms.composition`) and the budget holds while the composed delta at the
lifetime epsilon is at most the lifetime delta; under the papers' probabilistic notion epsilons
and deltas add (Theorem 2). Trees of committed
releases and of live reservations count; a reservation not committed within its time to live
(a crashed run) expires and stops counting.

Protocol (a run, in order): :func:`reserve` in its own transaction, committed **before** the data
is read; then :func:`commit` after the outputs are published, or :func:`release` on failure.
:func:`reserve` takes the audit write lock first (:func:`privrelease.audit.chain.lock`), checks
the audit database (:func:`privrelease.audit.witness.check_before_spending`), then reads the stored trees, checks the budget and inserts the reservation, all in one transaction,
so two runs racing for the last budget cannot both get it.

Budget comparisons allow a relative slack of ``1e-9`` for floating-point rounding of sums
(three releases of epsilon 0.1 fit a budget of 0.3).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlmodel import Session, col, select

from privrelease.audit import chain, identities, witness
from privrelease.audit.identities import Vintage
from privrelease.audit.models import Dataset, DatasetIdentity, LedgerEntry, Run, utcnow
from privrelease.audit.records import attach_dataset, finish_run
from privrelease.errors import TargetNotMet, UserError
from privrelease.mechanisms.guarantees import Budget
from privrelease.settings import NO_LIFETIME_BUDGET, get_settings

if TYPE_CHECKING:
    from privrelease.policies.schema import LifetimeBudget

__all__ = [
    "Budget",
    "LedgerStateError",
    "LedgerStatus",
    "Reservation",
    "commit",
    "entry_charge",
    "ledger_status",
    "reap_expired",
    "release",
    "reserve",
    "resolve_lifetime_budget",
    "check_fits",
    "counting_key",
    "curve_of",
    "history_curve",
    "largest_fitting",
    "runway",
    "policy_status",
    "status_for",
]

MAX_RUNWAY = 100_000
"""Runways are counted up to this many runs."""
_FARTHEST = 8
"""How far one step of the runway search goes out: at most this many times the largest runway known (:func:`largest_fitting`)."""
EXPIRED_REASON = "expired: not committed within the reservation time to live (crashed run?)"


class LedgerStateError(RuntimeError):
    """A ledger entry is not in the state the operation needs (e.g. committing a released or
    expired reservation, releasing a committed one)."""


ZERO = Budget(0.0, 0.0)


@dataclass(frozen=True)
class Reservation:
    """A recorded reservation: the ledger entry, and the ledger before and after this release."""

    entry_id: int
    dataset: str
    run_id: str
    notion: str
    expires_at: datetime
    budget: Budget
    spent_before: Budget
    this_release: Budget
    total_after: Budget
    remaining_after: Budget
    """What is left after this release (:func:`_remaining`)."""
    at_lifetime_delta: bool
    """Spent and left are epsilons at the lifetime delta (approximate DP), not delta amounts."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LedgerStatus:
    """A dataset identity's ledger now: its entries (oldest first), what the counting ones
    compose to, and the remainder (a display figure; the check composes): under approximate DP
    the epsilon left at the lifetime delta, otherwise ``budget - spent`` componentwise."""

    dataset: DatasetIdentity
    budget: Budget
    entries: list[LedgerEntry]
    counting: list[LedgerEntry]
    spent: Budget
    remaining: Budget
    now: datetime
    neighbours: str = ""
    """The neighbouring relation every counting tree is for (:func:`~privrelease.mechanisms.events.relation_of`:
    one row, or one person of a column); empty when nothing counts or the trees cannot be read."""
    cannot_compose: str = ""
    """Why the counting trees cannot be composed here (a plugin's event kind not installed:
    :class:`~privrelease.mechanisms.events.UnknownEventKind`); then ``spent`` is unbounded and
    nothing remains (fail closed), and only each entry's recorded charge can be shown."""

    @property
    def at_lifetime_delta(self) -> bool:
        """Spent and remaining are epsilons at the lifetime delta (approximate DP), not delta amounts."""
        return _at_lifetime_delta(self.dataset.notion, self.budget)

    def shown(self, amount: Budget) -> str:
        """``amount`` (spent, remaining, ...) for people: under approximate DP an epsilon at the
        lifetime delta, which is where it is read, not a delta spent."""
        if self.at_lifetime_delta:
            return f"epsilon={amount.epsilon:g} at the lifetime delta {self.budget.delta:g}"
        return str(amount)

    def effective_state(self, entry: LedgerEntry) -> str:
        """``reserved``/``committed``/``released``, or ``expired`` for a lapsed reservation."""
        if entry.state == "reserved" and _expired(entry, self.now):
            return "expired"
        return entry.state


STATE_WORDS = {
    "reserved": "reserved (run in progress; counted)",
    "committed": "spent (published)",
    "released": "returned (nothing published; not counted)",
    "expired": "lapsed (run lost; not counted)",
}
"""An entry's :meth:`LedgerStatus.effective_state` for people: "released" is the reservation's,
never the data's (the JSON keeps the stored word)."""


def _expired(entry: LedgerEntry, now: datetime) -> bool:
    return entry.expires_at is not None and entry.expires_at <= now


def _counts(entry: LedgerEntry, now: datetime) -> bool:
    return entry.state == "committed" or (entry.state == "reserved" and not _expired(entry, now))


def resolve_lifetime_budget(stated: LifetimeBudget | None = None, registered: DatasetIdentity | None = None) -> Budget:
    """The lifetime budget a dataset is registered with: the policy's
    (``targets.lifetime_budget``), else the ``default_lifetime_budget`` setting;
    :class:`UserError` when neither is set (naming the ``registered`` dataset's budget, if any)."""
    if stated is not None:
        return stated.budget
    default = get_settings().default_lifetime_budget
    if default is not None:
        return Budget(*default)
    if registered is None:
        raise UserError(NO_LIFETIME_BUDGET)
    raise UserError(
        f"the policy states no lifetime budget (dataset {registered.id} has "
        f"{Budget(registered.lifetime_epsilon, registered.lifetime_delta)} registered: state it as "
        "targets.lifetime_budget)"
    )


def _at_lifetime_delta(notion: str, limit: Budget) -> bool:
    """Whether what is spent is measured as an epsilon at the lifetime delta (approximate DP)."""
    return notion == "approximate" and 0 < limit.delta < 1


def _remaining(limit: Budget, spent: Budget, notion: str) -> Budget:
    """What is left of ``limit`` after ``spent`` (a display figure; the check composes): under
    approximate DP the epsilon left at the lifetime delta (paired with that delta), otherwise
    ``limit - spent`` componentwise; never below 0, and no epsilon after an unbounded spend."""
    return Budget(
        max(0.0, limit.epsilon - spent.epsilon) if math.isfinite(spent.epsilon) else 0.0,
        limit.delta if _at_lifetime_delta(notion, limit) else max(0.0, limit.delta - spent.delta),
    )


def _account(events: list[Any] | dict[Any, int], notion: str, limit: Budget) -> Budget:
    """What ``events`` (event trees, or a multiset of releases) compose to under ``notion``,
    measured against the lifetime ``limit``.

    ``approximate`` (with 0 < lifetime delta < 1): the smallest epsilon at which the releases
    compose to (epsilon, lifetime delta)-DP, by the tightest sound method
    (:mod:`privrelease.mechanisms.composition`: privacy loss distributions for several
    releases), paired with the lifetime delta; so ``fits`` is "the composed delta at the
    lifetime epsilon is at most the lifetime delta". ``probabilistic`` (the papers' notion):
    epsilons and deltas add (Theorem 2). Refuses (fail closed) what cannot be accounted for."""
    if not events:
        return ZERO
    from privrelease.mechanisms import composition

    if _at_lifetime_delta(notion, limit):
        composed = composition.epsilon_at(events, limit.delta)
        epsilon, delta = composed.epsilon, limit.delta
    else:
        composed = composition.summed(events, composition.as_notion(notion))
        epsilon, delta = composed.epsilon, composed.delta
    supported, detail = composed.supported, composed.detail
    if not supported:
        raise TargetNotMet(
            f"the {notion} accountant cannot account for this release, so the dataset's "
            f"lifetime budget cannot be checked: {detail}"
        )
    return Budget(float(epsilon), float(delta))


def _trees(entries: list[LedgerEntry]) -> list[Any]:
    """The entries' stored trees; :class:`~privrelease.mechanisms.events.UnknownEventKind`
    naming the entry (and what to install) for one whose plugin is not installed here."""
    from privrelease.mechanisms.events import UnknownEventKind, event_from_json

    trees = []
    for entry in entries:
        try:
            trees.append(event_from_json(entry.event_json))
        except UnknownEventKind as error:
            where = f"ledger entry {entry.id} of dataset {entry.dataset_id} (run {entry.run_id[:12]})"
            raise UnknownEventKind(f"{where}: {error}", recorded=error.recorded) from None
    return trees


def entry_charge(entry: LedgerEntry, dataset: DatasetIdentity) -> Budget:
    """What ``entry``'s stored tree alone charges ``dataset``'s lifetime budget, computed as
    :func:`reserve` computed the entry's ``epsilon``/``delta`` (``audit verify`` replays it:
    :mod:`.replay`). Raises for a tree that does not parse (ValueError) or that the accountant
    cannot account for (:class:`TargetNotMet`)."""
    return _account(_trees([entry]), entry.notion, Budget(dataset.lifetime_epsilon, dataset.lifetime_delta))


def _dataset(session: Session, dataset: DatasetIdentity | Dataset | str) -> tuple[DatasetIdentity, Dataset | None]:
    """The identity named by ``dataset`` (an identity or its id, or a vintage or its full
    fingerprint), and the vintage when one was named."""
    ref = dataset.id if isinstance(dataset, DatasetIdentity) else dataset
    vintage = dataset if isinstance(dataset, Dataset) else None
    if isinstance(ref, str):
        found = session.get(DatasetIdentity, ref)
        if found is not None:
            return found, None
        vintage = session.get(Dataset, ref.lower())
    if vintage is None:
        raise UserError(
            f"dataset {str(ref)[:64]!r} is not registered in the audit database "
            "(privrelease.audit.records.register_dataset)"
        )
    found = session.get(DatasetIdentity, vintage.identity_id)
    assert found is not None, f"vintage {vintage.fingerprint} of unknown identity {vintage.identity_id}"
    return found, vintage


def _entries(session: Session, identity_id: str) -> list[LedgerEntry]:
    statement = (
        select(LedgerEntry)
        .where(LedgerEntry.dataset_id == identity_id)
        .order_by(col(LedgerEntry.id))
        .execution_options(populate_existing=True)
    )
    return list(session.exec(statement).all())


def _name(dataset: DatasetIdentity) -> str:
    return dataset.id + (" (migrated from a fingerprint-keyed ledger)" if dataset.migrated else "")


def _file(vintage: Dataset | None) -> str:
    if vintage is None:
        return ""
    label = f"{vintage.label}, " if vintage.label else ""
    return f"; this run reads file {label}sha256 {vintage.fingerprint[:12]}"


def reserve(
    session: Session,
    dataset: DatasetIdentity | Dataset | str,
    run_id: str,
    event_tree: Any,
    notion: str,
    budget: Budget | tuple[float, float] | None = None,
    *,
    ttl_seconds: float | None = None,
    now: datetime | None = None,
) -> Reservation:
    """Reserve ``event_tree`` (an event, or its ``event_to_json`` text) of run ``run_id`` against
    the lifetime budget of ``dataset`` (a registered identity or its id; or a vintage or its
    fingerprint, which names its identity and is attached to the run), under ``notion``.

    In one transaction, under the audit write lock: the audit database is checked
    (:func:`.witness.check_before_spending`: a tampered, cut-short or rolled-back one is refused
    with :class:`~privrelease.errors.AuditRefused`), expired reservations are released, the
    stored trees that count plus the new one are composed, and if they fit the budget the
    reservation is recorded (expiring after ``ttl_seconds``, default the
    ``reservation_ttl_seconds`` setting). ``budget``, when given, must equal the dataset's
    registered lifetime budget. Commit the session before reading the data.

    Raises :class:`TargetNotMet` when the budget would be exceeded (naming the dataset, the
    budget, what is spent and what this release needs) or the accountant cannot account for a
    tree; :class:`UserError` for an unknown dataset or run, or a notion/budget that differs
    from the dataset's.
    """
    from privrelease.mechanisms.events import event_from_json, event_to_json

    now = now or utcnow()
    event = event_from_json(event_tree) if isinstance(event_tree, str) else event_tree
    event_json = event_to_json(event)
    witness.check_before_spending(session)  # locks the chain first
    reap_expired(session, now=now)
    ds, vintage = _dataset(session, dataset)
    limit = Budget(ds.lifetime_epsilon, ds.lifetime_delta)
    if notion != ds.notion:
        raise UserError(
            f"dataset {_name(ds)} is accounted under the {ds.notion} accountant; this release "
            f"names {notion}: one dataset's ledger composes under one accountant"
        )
    if budget is not None:
        stated = budget if isinstance(budget, Budget) else Budget(*budget)
        if stated != limit:
            raise UserError(
                f"dataset {_name(ds)} has lifetime budget {limit}; this release states {stated}: "
                "a dataset's lifetime budget cannot be changed"
            )
    run = session.get(Run, run_id)
    if run is None:
        raise UserError(f"no run with id {run_id!r}: start_run before reserving budget")
    if vintage is not None and run.dataset_fingerprint != vintage.fingerprint:
        attach_dataset(session, run, vintage.fingerprint)
    elif vintage is None and run.dataset_fingerprint is not None:
        vintage = session.get(Dataset, run.dataset_fingerprint)
        if vintage is not None and vintage.identity_id != ds.id:
            raise UserError(
                f"run {run_id} reads file sha256 {vintage.fingerprint[:12]}, a vintage of dataset "
                f"{vintage.identity_id}, not of {ds.id}: it cannot charge {ds.id}'s budget"
            )

    entries = _entries(session, ds.id)
    counting = [entry for entry in entries if _counts(entry, now)]
    if any(entry.run_id == run_id for entry in counting):
        raise LedgerStateError(f"run {run_id} already holds budget of dataset {_name(ds)}")
    trees = _trees(counting)
    spent_before = _account(trees, notion, limit)
    this_release = _account([event], notion, limit)
    total_after = _account([*trees, event], notion, limit)
    if not total_after.fits(limit):
        committed = sum(entry.state == "committed" for entry in counting)
        raise _exceeded(
            ds,
            notion,
            f"already spent {spent_before} by {len(counting)} release(s) ({committed} committed, "
            f"{len(counting) - committed} reserved); this release needs {this_release}; "
            f"together {total_after}{_file(vintage)}",
        )
    ttl = get_settings().reservation_ttl_seconds if ttl_seconds is None else ttl_seconds
    assert ttl > 0, f"ttl_seconds must be > 0; got {ttl}"
    entry = LedgerEntry(
        dataset_id=ds.id,
        run_id=run_id,
        notion=notion,
        event_json=event_json,
        epsilon=this_release.epsilon,
        delta=this_release.delta,
        state="reserved",
        created_at=now,
        updated_at=now,
        expires_at=now + timedelta(seconds=ttl),
    )
    chain.append(session, "ledger_reserved", entry, run=run_id, dataset=ds.id)
    assert entry.id is not None and entry.expires_at is not None
    return Reservation(
        entry_id=entry.id,
        dataset=ds.id,
        run_id=run_id,
        notion=notion,
        expires_at=entry.expires_at,
        budget=limit,
        spent_before=spent_before,
        this_release=this_release,
        total_after=total_after,
        remaining_after=_remaining(limit, total_after, notion),
        at_lifetime_delta=_at_lifetime_delta(notion, limit),
    )


def _entry(session: Session, reservation: Reservation | int) -> LedgerEntry:
    entry_id = reservation.entry_id if isinstance(reservation, Reservation) else reservation
    chain.lock(session)
    entry = session.get(LedgerEntry, entry_id, populate_existing=True)
    if entry is None:
        raise LedgerStateError(f"no ledger entry {entry_id}")
    return entry


def commit(session: Session, reservation: Reservation | int, *, now: datetime | None = None) -> LedgerEntry:
    """Turn a live reservation into a committed charge (idempotent for a committed one).
    Raises :class:`LedgerStateError` if it was released or has expired: the run must then
    publish nothing."""
    now = now or utcnow()
    entry = _entry(session, reservation)
    if entry.state == "committed":
        return entry
    if entry.state != "reserved":
        raise LedgerStateError(
            f"ledger entry {entry.id} of run {entry.run_id} is {entry.state} ({entry.reason}); it cannot be committed"
        )
    if _expired(entry, now):
        raise LedgerStateError(
            f"ledger entry {entry.id} of run {entry.run_id} expired at "
            f"{entry.expires_at:%Y-%m-%d %H:%M:%S} UTC before it was committed; its budget may "
            "have gone to another run"
        )
    entry.state, entry.updated_at = "committed", now
    chain.append(session, "ledger_committed", entry, run=entry.run_id)
    return entry


def release(
    session: Session,
    reservation: Reservation | int,
    reason: str = "run failed",
    *,
    now: datetime | None = None,
) -> LedgerEntry:
    """Give a reservation's budget back (the run failed; nothing was published). Idempotent
    for a released entry; a committed charge can never be released (:class:`LedgerStateError`)."""
    entry = _entry(session, reservation)
    if entry.state == "released":
        return entry
    if entry.state == "committed":
        raise LedgerStateError(
            f"ledger entry {entry.id} of run {entry.run_id} is committed: a published release cannot be un-spent"
        )
    entry.state, entry.reason, entry.updated_at = "released", reason, now or utcnow()
    chain.append(session, "ledger_released", entry, run=entry.run_id, reason=reason)
    return entry


def reap_expired(session: Session, *, now: datetime | None = None) -> list[LedgerEntry]:
    """Release every reservation past its expiry (crashed runs), and mark such runs still
    ``pending``/``running`` as failed. Called by :func:`reserve`; safe to call any time."""
    now = now or utcnow()
    chain.lock(session)
    statement = (
        select(LedgerEntry)
        .where(LedgerEntry.state == "reserved", col(LedgerEntry.expires_at) <= now)
        .order_by(col(LedgerEntry.id))
        .execution_options(populate_existing=True)
    )
    reaped = list(session.exec(statement).all())
    for entry in reaped:
        entry.state, entry.reason, entry.updated_at = "released", EXPIRED_REASON, now
        chain.append(session, "ledger_expired", entry, run=entry.run_id)
        run = session.get(Run, entry.run_id)
        if run is not None and run.status in ("pending", "running"):
            finish_run(session, run, "failed", error=f"budget reservation {EXPIRED_REASON}")
    return reaped


def ledger_status(
    session: Session, dataset: DatasetIdentity | Dataset | str, *, now: datetime | None = None
) -> LedgerStatus:
    """A dataset identity's ledger (named as in :func:`reserve`): entries, the composition of
    the counting trees, what remains."""
    now = now or utcnow()
    ds, _vintage = _dataset(session, dataset)
    entries = _entries(session, ds.id)
    counting = [entry for entry in entries if _counts(entry, now)]
    limit = Budget(ds.lifetime_epsilon, ds.lifetime_delta)
    from privrelease.mechanisms.events import UnknownEventKind, relation_of

    try:
        trees = _trees(counting)
        spent = _account(trees, ds.notion, limit)
    except UnknownEventKind as error:
        unbounded = Budget(math.inf, 1.0)
        return LedgerStatus(ds, limit, entries, counting, unbounded, ZERO, now, cannot_compose=str(error))
    remaining = _remaining(limit, spent, ds.notion)
    return LedgerStatus(
        dataset=ds,
        budget=limit,
        entries=entries,
        counting=counting,
        spent=spent,
        remaining=remaining,
        now=now,
        neighbours=relation_of(trees) if trees else "",
    )


def status_for(session: Session, identity_id: str, budget: Budget, notion: str) -> LedgerStatus:
    """The ledger of dataset identity ``identity_id``; for one not registered yet, the empty
    ledger it would start with (``budget`` under ``notion``, nothing spent)."""
    if session.get(DatasetIdentity, identity_id) is not None:
        return ledger_status(session, identity_id)
    fresh = DatasetIdentity(id=identity_id, lifetime_epsilon=budget.epsilon, lifetime_delta=budget.delta, notion=notion)
    return LedgerStatus(
        dataset=fresh, budget=budget, entries=[], counting=[], spent=ZERO, remaining=budget, now=utcnow()
    )


def check_fits(status: LedgerStatus, event_tree: Any) -> Budget:
    """What the ledger ``status`` would hold with ``event_tree`` (one run's releases) added;
    :class:`TargetNotMet` naming the dataset, budget and amounts when it would not fit (a
    read-only preview of :func:`reserve`'s check)."""
    from privrelease.mechanisms.events import event_from_json

    event = event_from_json(event_tree) if isinstance(event_tree, str) else event_tree
    notion, limit = status.dataset.notion, status.budget
    total = _account([*_trees(status.counting), event], notion, limit)
    if not total.fits(limit):
        raise _exceeded(
            status.dataset,
            notion,
            f"already spent {status.spent} by {len(status.counting)} release(s); "
            f"this release needs {_account([event], notion, limit)}; together {total}",
        )
    return total


def _exceeded(dataset: DatasetIdentity, notion: str, amounts: str) -> TargetNotMet:
    """The refusal of a release that would not fit ``dataset``'s lifetime budget."""
    limit = Budget(dataset.lifetime_epsilon, dataset.lifetime_delta)
    return TargetNotMet(
        f"privacy budget of dataset {_name(dataset)} would be exceeded under the {notion} accountant: "
        f"lifetime budget {limit}; {amounts}; nothing was charged or published"
    )


@dataclass(frozen=True)
class Runway:
    """How many more runs of a release fit a dataset's lifetime budget (``runs``, at most
    :data:`MAX_RUNWAY`; ``capped`` when the search stopped there), what is spent now and what
    would be spent after one more run (each as :func:`_account` measures it)."""

    runs: int
    capped: bool
    budget: Budget
    spent: Budget
    after_next_run: Budget
    this_run: Budget

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def policy_status(session: Session, loaded: Any, notion: str) -> LedgerStatus:
    """The ledger a DP release of policy ``loaded`` under ``notion`` charges, as a run finds it
    (:func:`status_for`); :class:`UserError` when the policy states no lifetime budget (nor is
    a default set) or another budget or accountant than the dataset has registered (as the
    run's registration refuses it: :func:`.identities.register_identity`)."""
    dataset = loaded.require_dataset_id()
    assert dataset is not None, "a DP release charges the lifetime budget: require_dataset_id has refused"
    registered = session.get(DatasetIdentity, dataset)
    budget = resolve_lifetime_budget(loaded.policy.targets.lifetime_budget, registered)
    message = identities.clash(registered, budget.epsilon, budget.delta, notion) if registered else None
    if message:
        raise UserError(message)
    return status_for(session, dataset, budget, notion)


def policy_runway(session: Session, plan: Any) -> tuple[LedgerStatus, Runway]:
    """The ledger of the dataset a planned release (:func:`privrelease.planning.dp_plan`)
    charges, and the release's runway on it (``ledger runway``)."""
    status = policy_status(session, plan.loaded, plan.notion)
    return status, runway(status, plan.event)


def runway(status: LedgerStatus, event_tree: Any) -> Runway:
    """The runway of ``event_tree`` (one run's releases) on the ledger ``status``: the largest
    r <= MAX_RUNWAY such that the counting trees plus r copies fit the lifetime budget. The
    composed loss only grows with r, so a bracketing search finds it exactly
    (:func:`largest_fitting`, guided by the share of the budget each r uses)."""
    from privrelease.mechanisms.composition import releases_of
    from privrelease.mechanisms.events import event_from_json

    event = event_from_json(event_tree) if isinstance(event_tree, str) else event_tree
    notion, limit = status.dataset.notion, status.budget
    spent, one_run = releases_of(_trees(status.counting)), releases_of([event])
    at_delta = _at_lifetime_delta(notion, limit)

    @functools.cache
    def total(runs: int) -> Budget:  # a multiset: r runs are r as multiplicities, not r copies
        releases = dict(spent)
        for leaf, count in one_run.items():
            releases[leaf] = releases.get(leaf, 0) + count * runs
        return _account(releases, notion, limit)

    def measure(runs: int) -> tuple[bool, float]:
        composed = total(runs)
        share = composed.epsilon / limit.epsilon if limit.epsilon > 0 else math.inf
        if not at_delta:  # at the lifetime delta the composed delta is that delta
            share = max(share, composed.delta / limit.delta if limit.delta > 0 else math.inf)
        return composed.fits(limit), share

    after_next = total(1)
    low = largest_fitting(measure, MAX_RUNWAY) if after_next.fits(limit) else 0
    return Runway(
        runs=low,
        capped=low == MAX_RUNWAY,
        budget=limit,
        spent=status.spent,
        after_next_run=after_next,
        this_run=_account([event], notion, limit),
    )


def largest_fitting(measure: Callable[[int], tuple[bool, float]], maximum: int) -> int:
    """The largest r in [1, ``maximum``] for which ``measure(r)`` fits, given that 1 fits and
    that fitting only stops as r grows. ``measure(r)`` is (fits, share): the share of the
    budget r uses, which only guides where to look (whatever it is, the answer is a binary
    search's). The composed loss of r releases grows about as a power of r, so each probe is
    where the power through the last two points measured meets the budget (a share of 1):
    outwards at least doubling and at most :data:`_FARTHEST` times the largest r known to fit,
    then within the bracket of the largest r known to fit and the smallest known not to, a step
    that does not halve the bracket followed by a halving one. About 10 evaluations where a
    doubling then binary search took 2 log2(r) (26 for a runway of 4,439 runs); at most
    3 log2(``maximum``) + 4 whatever the shares (each outward probe at least doubles, every
    second inward one at least halves the bracket)."""

    def aimed(a: tuple[int, float], b: tuple[int, float]) -> float | None:
        """Where the power law through points a and b (runs, share) reaches a share of 1."""
        (runs_a, share_a), (runs_b, share_b) = sorted((a, b))
        if not (0 < share_a < share_b < math.inf) or runs_a == runs_b:
            return None
        power = math.log(share_b / share_a) / math.log(runs_b / runs_a)
        # in logs: shares nearly equal make the power tiny and the aim beyond any float
        return math.exp(min(math.log(runs_a) - math.log(share_a) / power, math.log(sys.float_info.max)))

    points = [(1, measure(1)[1])]
    low = 1
    high = None
    while high is None:  # outwards
        if low >= maximum:
            return maximum
        target = aimed(*points[-2:]) if len(points) > 1 else None
        reach = 2 * low if target is None else min(max(2 * low, math.ceil(target)), _FARTHEST * low)
        probe = min(reach, maximum)
        fits, share = measure(probe)
        points.append((probe, share))
        low, high = (probe, None) if fits else (low, probe)
    halve = False
    while high - low > 1:  # inwards
        width = high - low
        target = None if halve else aimed(*points[-2:])
        probe = (low + high) // 2 if target is None else min(max(math.floor(target), low + 1), high - 1)
        fits, share = measure(probe)
        points.append((probe, share))
        low, high = (probe, high) if fits else (low, probe)
        halve = not halve and high - low > width // 2
    return low


@dataclass(frozen=True)
class DatasetLedger:
    """A dataset identity's ledger (``status``: budget, entries, what the counting trees compose
    to, what remains) and its files (``vintages``, oldest first, with the runs that read each),
    as ``privrelease ledger show`` prints them."""

    status: LedgerStatus
    vintages: list[Vintage]

    @property
    def dataset(self) -> DatasetIdentity:
        return self.status.dataset

    @property
    def latest(self) -> LedgerEntry | None:
        """The newest entry that counts against the budget."""
        return self.status.counting[-1] if self.status.counting else None

    @functools.cached_property
    def runway(self) -> Runway | None:
        """How many more runs like :attr:`latest` fit the budget (None: nothing charged yet)."""
        latest = self.latest
        return None if latest is None or self.status.cannot_compose else runway(self.status, latest.event_json)


def dataset_ledger(session: Session, ref: str) -> DatasetLedger:
    """The ledger of the dataset ``ref``: a dataset id, or a file's fingerprint, fingerprint
    prefix or label (:func:`.identities.find_identity`)."""
    return _dataset_ledger(session, identities.find_identity(session, ref))


def dataset_ledgers(session: Session) -> list[DatasetLedger]:
    """The ledger of every registered dataset, oldest first."""
    return [_dataset_ledger(session, found) for found in identities.list_identities(session)]


def _dataset_ledger(session: Session, found: DatasetIdentity) -> DatasetLedger:
    return DatasetLedger(ledger_status(session, found), identities.vintages_of(session, found.id))


def history_curve(session: Session, dataset: str, run_id: str, points: int = 41) -> dict[str, Any] | None:
    """For the report of run ``run_id``: the composed privacy curve (delta at each epsilon of a
    grid from 0 past the lifetime epsilon) of the dataset's counting releases before and after
    this run's, the lifetime budget, and the runway of another run like this one. Only under
    approximate DP (the papers' probabilistic notion adds stated points: no curve); None when
    the run holds no counting charge."""
    return curve_of(ledger_status(session, dataset), run_id, points)


def counting_key(status: LedgerStatus) -> tuple[Any, ...]:
    """What :func:`curve_of` reads of ``status``: its budget, its notion and which entries
    count (an entry's tree never changes), so that a curve computed from an earlier status
    of the same key is the curve of this one."""
    return (status.dataset.id, status.dataset.notion, status.budget, tuple(entry.id for entry in status.counting))


def curve_of(status: LedgerStatus, run_id: str, points: int = 41) -> dict[str, Any] | None:
    """:func:`history_curve` of a ledger status already read (arithmetic only: no database)."""
    import numpy as np

    from privrelease.mechanisms.composition import PLD, delta_curve

    mine = [entry for entry in status.counting if entry.run_id == run_id]
    if not mine or not _at_lifetime_delta(status.dataset.notion, status.budget):
        return None
    others = [entry for entry in status.counting if entry.run_id != run_id]
    before, after = _trees(others), _trees(others + mine)
    top = 1.25 * max(status.budget.epsilon, min(status.spent.epsilon, 4 * status.budget.epsilon))
    epsilons = np.linspace(0.0, top, points).tolist()
    ahead = runway(status, _trees(mine)[0])
    return {
        "epsilons": epsilons,
        "before": delta_curve(before, epsilons) if before else None,
        "after": delta_curve(after, epsilons),
        "releases_before": len(before),
        "releases_after": len(after),
        "budget": status.budget.as_dict(),
        "spent": status.spent.as_dict(),
        "runway": {"runs": ahead.runs, "capped": ahead.capped},
        "method": PLD if len(after) > 1 else "the exact profile of one release",
    }
