"""Composing releases under approximate (eps, delta)-DP by the tightest sound method.

Every method below is an upper bound on the composed hockey-stick divergence of the releases
(add/remove-one-row neighbours, adaptive composition), so the smallest answer is sound too:

* ``exact`` (one SDGS release): the exact profile :func:`~.sdgs_math.delta_exact`, inverted by
  bisection for an epsilon.
* ``privacy loss distribution`` (two or more releases): :mod:`.pld`, the composition of
  dominating pairs (Zhu, Dong, Wang 2022, Theorem 10).
* ``optimal composition`` (at most ``OPTIMAL_RELEASES`` releases): the exact composition of
  the releases' stated (eps_i, delta_i) points (Kairouz-Oh-Viswanath; Murtagh-Vadhan, heterogeneous).
* ``basic composition``: the stated points add up, ``(sum eps_i, sum delta_i)``.

The stated point of a release is :func:`~.accountants.account` under ``approximate`` (for SDGS,
the policy's epsilon and the exact delta there). The ``probabilistic`` notion of the papers
composes by its own rule (Theorem 2: epsilons and deltas add) and is not handled here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from privrelease.mechanisms import pld
from privrelease.mechanisms.accountants import account, optimal_composition_delta
from privrelease.mechanisms.events import SDGS, Event, leaf_counts
from privrelease.mechanisms.sdgs_math import delta_exact

EXACT = "exact"
PLD = "privacy loss distribution"
OPTIMAL = "optimal composition"
BASIC = "basic composition"

OPTIMAL_RELEASES = 10
"""The optimal composition sums over 2^m subsets: beyond this many releases the PLD, which is
never looser by more than its discretization (tested), answers alone."""

_EPSILON_TOLERANCE = 1e-9
_MAX_EPSILON = 64.0


@dataclass(frozen=True)
class Composition:
    """``releases`` releases composed are (epsilon, delta)-DP; ``method`` gave the tightest
    answer; ``candidates`` holds every method's (epsilon, delta) for the same question."""

    epsilon: float
    delta: float
    releases: int
    method: str
    candidates: dict[str, tuple[float, float]] = field(default_factory=dict)
    supported: bool = True
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "epsilon": self.epsilon if math.isfinite(self.epsilon) else None,
            "delta": self.delta,
            "releases": self.releases,
            "method": self.method,
            "candidates": {
                name: {"epsilon": e if math.isfinite(e) else None, "delta": d}
                for name, (e, d) in self.candidates.items()
            },
            "supported": self.supported,
            "detail": self.detail,
        }


Releases = dict[Event, int]
"""A multiset of non-composed releases: release -> how many times it is composed (a ledger of
thousands of identical monthly releases is a handful of entries, not a list of thousands)."""


def releases_of(events: Sequence[Event] | Mapping[Event, int], times: int = 1) -> Releases:
    """The non-composed releases of ``events`` (event trees, or a multiset of releases), each
    composed ``times`` times."""
    if times < 1:
        raise ValueError(f"times must be >= 1; got {times}")
    return {leaf: count * times for leaf, count in leaf_counts(events).items()}


def _unsupported(releases: Releases) -> Composition | None:
    reasons = []
    for leaf in releases:
        guarantee = account(leaf, "approximate")
        if not guarantee.supported:
            reasons.append(guarantee.detail)
    if not reasons and releases:
        return None
    why = "; ".join(reasons) or "nothing to compose: no releases"
    return Composition(math.inf, 1.0, sum(releases.values()), "none", supported=False, detail=why)


def _points(releases: Releases) -> list[tuple[float, float, int]]:
    """Each release's stated (epsilon, delta) point and its multiplicity."""
    return [(*_stated(leaf), count) for leaf, count in releases.items()]


def _stated(leaf: Event) -> tuple[float, float]:
    guarantee = account(leaf, "approximate")
    return guarantee.epsilon, guarantee.delta


def _basic(points: list[tuple[float, float, int]]) -> tuple[float, float]:
    """Basic composition of the points: (sum eps_i, sum delta_i) with multiplicities."""
    return math.fsum(e * n for e, _, n in points), math.fsum(d * n for _, d, n in points)


def _each(points: list[tuple[float, float, int]]) -> list[tuple[float, float]]:
    """The points one per release (for the optimal composition, at most OPTIMAL_RELEASES)."""
    return [(e, d) for e, d, n in points for _ in range(n)]


def _only_sdgs(releases: Releases) -> SDGS | None:
    """The release when ``releases`` is one SDGS release."""
    if len(releases) == 1:
        ((leaf, count),) = releases.items()
        if count == 1 and isinstance(leaf, SDGS):
            return leaf
    return None


def _bisect_epsilon(delta_of, delta: float, high: float) -> float:
    """The smallest epsilon in [0, high] with delta_of(epsilon) <= delta (nonincreasing), to a
    relative 1e-9 and rounded up; inf when even ``high`` does not reach it."""
    if delta_of(high) > delta:
        return math.inf
    low = 0.0
    if delta_of(low) <= delta:
        return 0.0
    while high - low > _EPSILON_TOLERANCE * max(high, 1e-12):
        middle = (low + high) / 2
        if delta_of(middle) <= delta:
            high = middle
        else:
            low = middle
    return high


def _candidates_epsilon(releases: Releases, delta: float) -> dict[str, tuple[float, float]]:
    """Every applicable method's epsilon at ``delta``, the preferred method first (ties)."""
    points, total = _points(releases), sum(releases.values())
    found: dict[str, tuple[float, float]] = {}
    basic_eps, basic_delta = _basic(points)
    if (sdgs := _only_sdgs(releases)) is not None:
        k, beta = sdgs.k, sdgs.beta
        found[EXACT] = (_bisect_epsilon(lambda e: delta_exact(k, beta, e).delta, delta, _MAX_EPSILON), delta)
    if total > 1:
        found[PLD] = (pld.epsilon_for_delta(pld.composed_pld(releases), delta), delta)
    if 1 < total <= OPTIMAL_RELEASES:
        each = _each(points)
        found[OPTIMAL] = (_bisect_epsilon(lambda e: optimal_composition_delta(each, e), delta, basic_eps), delta)
    found[BASIC] = (basic_eps if basic_delta <= delta else math.inf, delta)
    return found


def _candidates_delta(releases: Releases, epsilon: float, composed: Any = None) -> dict[str, tuple[float, float]]:
    """Every applicable method's delta at ``epsilon``, the preferred method first (ties);
    ``composed``: the releases' PLD when already built."""
    points, total = _points(releases), sum(releases.values())
    found: dict[str, tuple[float, float]] = {}
    if (sdgs := _only_sdgs(releases)) is not None:
        found[EXACT] = (epsilon, float(delta_exact(sdgs.k, sdgs.beta, epsilon).delta))
    if total > 1:
        composed = composed if composed is not None else pld.composed_pld(releases)
        found[PLD] = (epsilon, pld.delta_for_epsilon(composed, epsilon))
    if 1 < total <= OPTIMAL_RELEASES:
        found[OPTIMAL] = (epsilon, optimal_composition_delta(_each(points), epsilon))
    basic_eps, basic_delta = _basic(points)
    found[BASIC] = (epsilon, min(1.0, basic_delta) if epsilon >= basic_eps else 1.0)
    return found


def _tightest(events: Sequence[Event] | Releases, times: int, candidates_of, solved: int) -> Composition:
    """The candidate with the smallest value in position ``solved`` (0: epsilon, 1: delta)."""
    releases = releases_of(events, times)
    refused = _unsupported(releases)
    if refused is not None:
        return refused
    candidates = candidates_of(releases)
    method = min(candidates, key=lambda name: candidates[name][solved])
    epsilon, delta = candidates[method]
    return Composition(epsilon, delta, sum(releases.values()), method, candidates)


def epsilon_at(events: Sequence[Event] | Releases, delta: float, times: int = 1) -> Composition:
    """The smallest epsilon at which ``events`` (event trees, or a multiset of releases)
    released ``times`` times are (epsilon, delta)-DP (inf when no epsilon reaches ``delta``),
    by the tightest method."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1); got {delta!r}")
    return _tightest(events, times, lambda releases: _candidates_epsilon(releases, delta), 0)


def delta_at(events: Sequence[Event] | Releases, epsilon: float, times: int = 1) -> Composition:
    """The smallest delta for which ``events`` released ``times`` times are (epsilon, delta)-DP,
    by the tightest method."""
    if not 0 <= epsilon < math.inf:
        raise ValueError(f"epsilon must be a finite number >= 0; got {epsilon!r}")
    return _tightest(events, times, lambda releases: _candidates_delta(releases, epsilon), 1)


def delta_curve(events: Sequence[Event], epsilons: Sequence[float]) -> list[float]:
    """The composed delta of ``events`` at each of ``epsilons`` (tightest method per point; the
    privacy loss distribution is built once)."""
    releases = releases_of(events)
    if _unsupported(releases) is not None:
        return [1.0] * len(epsilons)
    composed = pld.composed_pld(releases) if sum(releases.values()) > 1 else None
    return [min(d for _, d in _candidates_delta(releases, e, composed).values()) for e in epsilons]
