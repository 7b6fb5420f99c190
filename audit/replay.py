"""Replaying the stored guarantees: ``audit verify`` recomputes every (epsilon, delta) the audit
database stores from the event tree stored beside it, with today's accountants, and flags each
one that does not match.

What is replayed:

* every ``guarantee`` row (one per run and notion, recorded as the run publishes): its
  ``epsilon``/``delta`` against :func:`privrelease.mechanisms.accountants.account` of its
  ``event_json`` under its ``notion``; under ``approximate``, the release's tightest composition
  (:func:`privrelease.mechanisms.composition.release_approximate`, which the plan states too),
  which reads the run's policy's ``targets.accounting`` and ``targets.delta`` from the policy
  version's stored canonical JSON. An unsupported guarantee is stored as None, None. A figure
  recorded before a composition method was added (:data:`~privrelease.mechanisms.composition.RECENT`,
  the Rényi bound) also replays to what the other methods give
  (:func:`~privrelease.mechanisms.composition.without_recent`, never smaller than today's: the
  tightest of fewer methods): a tighter method never turns an intact record into a finding;
* every ``ledger_entry`` (a release's charge against its dataset's lifetime budget): its
  ``epsilon``/``delta`` against the ledger's own composition of its ``event_json`` alone under
  the dataset's lifetime budget (:func:`privrelease.audit.ledger.entry_charge`, as
  :func:`~privrelease.audit.ledger.reserve` computed it). The ledger's totals are never stored:
  every budget check composes the stored trees, so the trees are what must be sound.

The hash chain vouches that a row is as it was recorded; the replay vouches that what was
recorded follows from its tree. Together they catch a database insider who writes a smaller
guarantee *before* the row is chained (a tampered writer, a patched process, a migration or
restore script that rewrites rows and then rechains them with the service key): the chain and
the signatures are intact, the arithmetic is not.

Tolerance: a relative ``1e-9`` (:data:`RELATIVE_TOLERANCE`). The accountants are deterministic
(no sampling; the bisections stop at a fixed relative 1e-9 and are rounded up), so a replay on the
same code gives the same bits; the tolerance only absorbs last-bit differences of floating-point
libraries (numpy's FFT in the privacy loss distributions, libm) between the recording host and
the auditor's, and is as tight as the ledger's own budget slack. A stored value *smaller* than
the recomputed one understates the privacy loss (the dangerous direction: the release, or the
budget it was charged, claims more privacy than its tree gives); a larger one is conservative
but still not what the tree gives. Both are findings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from functools import partial
from typing import Any

from sqlmodel import Session, col, select

from privrelease.audit.chain import Problem
from privrelease.audit.models import DatasetIdentity, Guarantee, LedgerEntry, PolicyVersion, Run

__all__ = ["CANNOT_REPLAY", "RELATIVE_TOLERANCE", "problems"]

CANNOT_REPLAY = "cannot_replay"
"""The finding of a stored tree whose event kind is defined by a plugin distribution (its tree
records which) that is not installed here: not replayed, which says nothing against the record
(``audit verify`` says what to install, and does not call the chain broken)."""

RELATIVE_TOLERANCE = 1e-9
"""Relative slack of a stored guarantee against its replay (module docstring: why)."""

Pair = tuple[float | None, float | None]


def _same(stored: float | None, recomputed: float | None) -> bool:
    if stored is None or recomputed is None:
        return stored is None and recomputed is None
    if math.isinf(stored) or math.isinf(recomputed) or math.isnan(stored) or math.isnan(recomputed):
        return stored == recomputed
    return abs(stored - recomputed) <= RELATIVE_TOLERANCE * max(abs(stored), abs(recomputed))


def _smaller(stored: float | None, recomputed: float | None) -> bool:
    """Whether ``stored`` claims less loss than ``recomputed`` (None: no guarantee, i.e. unbounded)."""
    if stored is None or recomputed is None:
        return recomputed is None and stored is not None
    return stored < recomputed


def _pair(epsilon: float | None, delta: float | None) -> str:
    def shown(value: float | None) -> str:
        return "none" if value is None else repr(float(value))

    return f"(epsilon {shown(epsilon)}, delta {shown(delta)})"


def _mismatch(what: str, stored: Pair, recomputed: Pair) -> str:
    understated = any(_smaller(s, r) for s, r in zip(stored, recomputed, strict=True))
    direction = (
        "UNDERSTATED: the stored value is smaller than what its event tree gives, so it claims more privacy "
        "than the release has (the dangerous direction)"
        if understated
        else "overstated: the stored value is larger than what its event tree gives (conservative, but not "
        "what was computed)"
    )
    return (
        f"{what}: stored {_pair(*stored)} but its stored event tree replays to {_pair(*recomputed)} "
        f"(relative tolerance {RELATIVE_TOLERANCE:g}); {direction}"
    )


def _targets(policy: PolicyVersion | None) -> tuple[str | None, float | None]:
    """``targets.accounting`` and ``targets.delta`` of a stored policy (None, None: unreadable)."""
    try:
        targets = json.loads(policy.canonical_json)["policy"]["targets"] if policy is not None else {}
        accounting, delta = targets.get("accounting"), targets.get("delta")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, None
    return (accounting if isinstance(accounting, str) else None), (float(delta) if delta is not None else None)


def _guarantee_pairs(event_json: str, notion: str, accounting: str | None, delta: float | None) -> list[Pair]:
    """The guarantee its tree replays to, then the one recorded before the recent composition
    methods (:func:`privrelease.mechanisms.composition.without_recent`) where it differs."""
    from privrelease.mechanisms import accountants, composition
    from privrelease.mechanisms.events import event_from_json

    event = event_from_json(event_json)
    found = accountants.account(event, composition.as_notion(notion))
    if notion != "approximate":
        return [(found.epsilon, found.delta) if found.supported else (None, None)]
    found, result = composition.release_approximate(event, found, accounting, delta)
    if not found.supported:
        return [(None, None)]
    earlier = None if result is None else composition.without_recent(result, solved_epsilon=delta is not None)
    return [(found.epsilon, found.delta), *([earlier] if earlier is not None else [])]


def _charges(entry: LedgerEntry, dataset: DatasetIdentity) -> list[Pair]:
    """The charge its tree replays to, then the one recorded before the recent composition
    methods where it differs (an approximate charge is the epsilon at the lifetime delta)."""
    from privrelease.audit import ledger
    from privrelease.mechanisms import composition
    from privrelease.mechanisms.events import event_from_json

    budget = ledger.entry_charge(entry, dataset)
    pairs: list[Pair] = [(budget.epsilon, budget.delta)]
    if entry.notion == "approximate" and 0 < dataset.lifetime_delta < 1:  # as ledger._account composes
        result = composition.epsilon_at([event_from_json(entry.event_json)], dataset.lifetime_delta)
        earlier = composition.without_recent(result, solved_epsilon=True)
        pairs += [(earlier[0], dataset.lifetime_delta)] if earlier is not None else []
    return pairs


class _NotInstalled(str):
    """Why a tree cannot be replayed here: its event kind's plugin is not installed."""


def _replayed(cache: dict[Any, Any], key: Any, compute: Callable[[], list[Pair]]) -> list[Pair] | str:
    """``compute()`` once per ``key`` (runs of one policy share their trees); the text of the
    error when the tree cannot be parsed or accounted for (a :class:`_NotInstalled` when the
    tree records the plugin distribution that defines a kind not installed here)."""
    from privrelease.mechanisms.events import UnknownEventKind

    if key not in cache:
        try:
            cache[key] = compute()
        except UnknownEventKind as error:
            cache[key] = _NotInstalled(error) if error.recorded else f"{type(error).__name__}: {error}"
        except Exception as error:  # an unparseable or unaccountable tree is a finding, never a crash
            cache[key] = " ".join(f"{type(error).__name__}: {error}".split())[:400]
    return cache[key]


def problems(session: Session, newest: dict[tuple[str, Any], int] | None = None) -> list[Problem]:
    """Every stored guarantee and ledger charge that its stored event tree does not replay to,
    and every tree that no longer parses or cannot be accounted for; ``newest`` maps
    ``(table, key)`` to the seq of the newest record describing the row (the finding's seq)."""
    newest = newest or {}
    found: list[Problem] = []
    cache: dict[Any, Any] = {}

    def report(table: str, key: Any, run_id: str, kind: str, message: str) -> None:
        found.append(Problem(newest.get((table, key)), kind, f"{table} row {key!r} of run {run_id}: {message}"))

    def check(table: str, key: Any, run_id: str, what: str, stored: Pair, replayed: list[Pair] | str) -> None:
        if isinstance(replayed, _NotInstalled):
            report(table, key, run_id, CANNOT_REPLAY, replayed)
        elif isinstance(replayed, str):
            report(table, key, run_id, "replay_failed", f"its stored event tree cannot be replayed ({replayed})")
        elif not any(all(_same(s, r) for s, r in zip(stored, pair, strict=True)) for pair in replayed):
            report(table, key, run_id, "guarantee_mismatch", _mismatch(what, stored, replayed[0]))

    versions = {version.sha256: version for version in session.exec(select(PolicyVersion)).all()}
    policies = {run.id: versions.get(run.policy_sha256) for run in session.exec(select(Run)).all()}
    for row in session.exec(select(Guarantee).order_by(col(Guarantee.id))).all():
        accounting, delta = _targets(policies.get(row.run_id))
        replayed = _replayed(
            cache,
            ("guarantee", row.event_json, row.notion, accounting, delta),
            partial(_guarantee_pairs, row.event_json, row.notion, accounting, delta),
        )
        check("guarantee", row.id, row.run_id, f"the {row.notion} guarantee", (row.epsilon, row.delta), replayed)

    for entry in session.exec(select(LedgerEntry).order_by(col(LedgerEntry.id))).all():
        dataset = session.get(DatasetIdentity, entry.dataset_id)
        if dataset is None:
            continue  # a foreign key: verification.verify names a deleted identity row
        budget = (dataset.lifetime_epsilon, dataset.lifetime_delta)
        replayed = _replayed(
            cache,
            ("ledger", entry.event_json, entry.notion, budget),
            partial(_charges, entry, dataset),
        )
        check(
            "ledger_entry",
            entry.id,
            entry.run_id,
            f"the charge to dataset {entry.dataset_id}'s lifetime budget ({entry.notion})",
            (entry.epsilon, entry.delta),
            replayed,
        )
    return found
