"""Composing releases under approximate (eps, delta)-DP by the tightest sound method.

Every method below is an upper bound on the composed hockey-stick divergence of the releases
(add/remove-one-row neighbours, adaptive composition), so the smallest answer is sound too:

* ``exact`` (one release with an exact curve, e.g. SDGS: :func:`~.sdgs_math.delta_exact`),
  inverted by bisection for an epsilon.
* ``privacy loss distribution`` (two or more releases): :mod:`.pld`, the composition of
  dominating pairs (Zhu, Dong, Wang 2022, Theorem 10).
* ``optimal composition`` (at most ``OPTIMAL_RELEASES`` releases): the exact composition of
  the releases' stated (eps_i, delta_i) points (Kairouz-Oh-Viswanath; Murtagh-Vadhan, heterogeneous).
* ``advanced composition`` (any number of releases, in closed form): Kairouz, Oh, Viswanath,
  "The composition theorem for differential privacy" (ICML 2015), Theorem 3.5, on the stated
  points. It answers where the PLD would be too large to build (more than
  ``PLD_MAX_RELEASES`` releases), so a question about a billion runs takes milliseconds.
* ``Rényi DP`` (two or more releases, any number, in closed form): :mod:`.renyi`, each
  release's Rényi divergences (the discrete Gaussian's ``a / (2 sigma^2)``, else those of its
  PLD) added up and converted by Canonne-Kamath-Steinke Proposition 12. Past
  ``PLD_MAX_RELEASES`` it is the tight answer (a billion Gaussian releases within 0.5% of the
  exact continuous composition); below, the PLD is usually tighter.
* ``basic composition``: the stated points add up, ``(sum eps_i, sum delta_i)``.

The stated point of a release is :func:`~.accountants.account` under ``approximate`` (for SDGS,
the policy's epsilon and the exact delta there). Under the papers' ``probabilistic`` notion the
only rule is ``sequential composition`` (Li-Qardaji-Su Theorem 2: the stated points under that
notion add up), which is what the ledger charges for a dataset accounted that way; every
function takes the ``notion`` so that ``guarantee compose``, the plan and the ledger agree.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any

from privrelease.mechanisms import pld, renyi
from privrelease.mechanisms.accountants import NOTIONS, Notion, account, optimal_composition_delta
from privrelease.mechanisms.events import Event, counted, leaf_counts, leaves, relation_of
from privrelease.mechanisms.guarantees import Guarantee, Unsupported

EXACT = "exact"
PLD = "privacy loss distribution"
OPTIMAL = "optimal composition"
ADVANCED = "advanced composition"
RENYI = "Renyi DP"
BASIC = "basic composition"
SEQUENTIAL = "sequential composition (Theorem 2)"

RECENT = (RENYI,)
"""Methods added after figures computed without them were stored: such a figure replays to the
tightest of the other methods (:func:`without_recent`), never to a mismatch."""

OPTIMAL_RELEASES = 10
"""The optimal composition sums over 2^m subsets: beyond this many releases the PLD, which is
never looser by more than its discretization (tested), answers alone."""

PLD_MAX_RELEASES = 1_000_000
"""Above this many releases the composed PLD's support (and its FFT) grows past seconds
(one Adult SDGS release composed 10^6 times: 0.9 s, 3 x 10^6: 5.5 s), so only the closed
forms answer."""

_EPSILON_TOLERANCE = 1e-9
_MAX_EPSILON = 64.0


@dataclass(frozen=True)
class Composition(Guarantee):
    """``releases`` releases composed are (epsilon, delta)-DP under ``notion``; ``method``
    gave the tightest answer; ``candidates`` holds every method's (epsilon, delta) for the same
    question."""

    releases: int = 0
    method: str = ""
    candidates: dict[str, tuple[float, float]] = field(default_factory=dict)

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
    composed ``times`` times. All under one neighbouring relation (:func:`.events.relation_of`)."""
    if times < 1:
        raise ValueError(f"times must be >= 1; got {times}")
    relation_of(events)
    return {leaf: count * times for leaf, count in leaf_counts(events).items()}


def _unsupported(releases: Releases, notion: Notion) -> Composition | None:
    reasons = []
    for leaf in releases:
        guarantee = account(leaf, notion)
        if not guarantee.supported:
            reasons.append(guarantee.detail)
    if not reasons and releases:
        return None
    why = "; ".join(reasons) or "nothing to compose: no releases"
    return Composition(notion, math.inf, 1.0, False, why, releases=sum(releases.values()), method="none")


def _points(releases: Releases, notion: Notion = "approximate") -> list[tuple[float, float, int]]:
    """Each release's stated (epsilon, delta) point under ``notion`` and its multiplicity."""
    return [(*_stated(leaf, notion), count) for leaf, count in releases.items()]


def _stated(leaf: Event, notion: Notion) -> tuple[float, float]:
    guarantee = account(leaf, notion)
    return guarantee.epsilon, guarantee.delta


def _basic(points: list[tuple[float, float, int]]) -> tuple[float, float]:
    """Basic composition of the points: (sum eps_i, sum delta_i) with multiplicities, each
    sum exact (rational) and rounded up to a double."""
    return _sum_up([(e, n) for e, _, n in points]), _sum_up([(d, n) for _, d, n in points])


def _sum_up(terms: list[tuple[float, int]]) -> float:
    """``sum value * count`` over ``(value, count)`` pairs, exactly, as the least double >= it."""
    if not all(math.isfinite(value) for value, _ in terms):
        return math.inf
    exact = sum((Fraction(value) * count for value, count in terms), Fraction(0))
    nearest = float(exact)
    return math.nextafter(nearest, math.inf) if nearest < exact else nearest


def _each(points: list[tuple[float, float, int]]) -> list[tuple[float, float]]:
    """The points one per release (for the optimal composition, at most OPTIMAL_RELEASES)."""
    return [(e, d) for e, d, n in points for _ in range(n)]


def _kov_terms(points: list[tuple[float, float, int]]) -> tuple[float, float, float]:
    """Of :func:`_advanced_epsilon`'s bound: A = sum eps_i tanh(eps_i / 2), B = sum eps_i^2, and
    ln prod(1 - delta_i), with multiplicities."""
    a = math.fsum(n * e * math.tanh(e / 2) for e, _, n in points)
    b = math.fsum(n * e * e for e, _, n in points)
    return a, b, math.fsum(n * math.log1p(-d) for _, d, n in points)


def _advanced_epsilon(points: list[tuple[float, float, int]], delta: float) -> float:
    """Kairouz-Oh-Viswanath Theorem 3.5: the releases compose to
    (eps~, 1 - (1 - d~) prod(1 - delta_i))-DP for every d~ in (0, 1], with
    eps~ = min(sum eps_i, A + sqrt(2B ln(e + sqrt(B) / d~)), A + sqrt(2B ln(1 / d~))),
    A = sum eps_i tanh(eps_i / 2) (= (e^eps_i - 1) eps_i / (e^eps_i + 1)), B = sum eps_i^2.
    The epsilon at ``delta`` takes d~ = 1 - (1 - delta) / prod(1 - delta_i), in logs (a billion
    stated deltas make the product underflow); inf when the stated deltas alone reach ``delta``.
    Rounded up."""
    a, b, log_keep = _kov_terms(points)
    log_ratio = math.log1p(-delta) - log_keep  # ln((1 - delta) / prod(1 - delta_i)); expm1 of it overflows past 709
    if log_ratio >= 0:
        return math.inf  # the stated deltas alone reach delta: d~ <= 0
    spare = -math.expm1(log_ratio)
    second = a + math.sqrt(2 * b * math.log(math.e + math.sqrt(b) / spare))
    third = a + math.sqrt(2 * b * -math.log(spare))
    return min(_basic(points)[0], second * (1 + 1e-12), third * (1 + 1e-12))


def _advanced_delta(points: list[tuple[float, float, int]], epsilon: float) -> float:
    """The smallest delta of :func:`_advanced_epsilon`'s family at ``epsilon``: the smallest
    d~ whose eps~ is at most ``epsilon`` (each of the three forms solved for d~), then
    1 - (1 - d~) prod(1 - delta_i). Rounded up; 1 when no d~ reaches ``epsilon``."""
    a, b, log_keep = _kov_terms(points)
    candidates = [1.0]
    if _basic(points)[0] <= epsilon:
        candidates.append(0.0)
    if epsilon > a and b > 0:
        exponent = (epsilon - a) ** 2 / (2 * b)
        candidates.append(math.exp(-exponent))
        if exponent > 1:  # sqrt(b) / (e (e^(x) - 1)), x = exponent - 1, as e^-x / (1 - e^-x): no overflow
            candidates.append(math.sqrt(b) / math.e * math.exp(1 - exponent) / -math.expm1(1 - exponent))
    spare = min(1.0, min(candidates) * (1 + 1e-12))
    return min(1.0, (-math.expm1(log_keep) + math.exp(log_keep) * spare) * (1 + 1e-12))


def _renyi(releases: Releases, answer: Callable[[], float]) -> float | None:
    """``answer()`` of the Rényi bound; None when some release has no Rényi divergences (no
    closed form and no PLD)."""
    try:
        return answer()
    except Unsupported:
        return None


def _by_pld(total: int) -> bool:
    """Whether ``total`` releases are composed by their PLD (several, and not too many)."""
    return 1 < total <= PLD_MAX_RELEASES


def _exact_curve(releases: Releases) -> Callable[[float], float] | None:
    """The exact curve of ``releases`` when they are one release that has one
    (:meth:`~privrelease.mechanisms.events.Event.exact_curve`)."""
    if len(releases) == 1:
        ((leaf, count),) = releases.items()
        if count == 1:
            return leaf.exact_curve()
    return None


def smallest_epsilon(delta_of: Callable[[float], float], delta: float, high: float) -> float:
    """The smallest epsilon in [0, high] with delta_of(epsilon) <= delta (nonincreasing), to a
    relative 1e-9 and rounded up; inf when even ``high`` does not reach it.

    A bracket [low, high] with delta_of(low) > delta >= delta_of(high) shrinks until it is that
    narrow, and its upper end is the answer (as bisection's). Each step tries the regula falsi
    point of log delta_of across the bracket, Illinois-modified (the log at an end kept twice
    is halved: Dowell and Jarratt 1971), at least 1/64 of the bracket from its ends; it bisects
    where delta_of(high) is 0, the two ends' logs are equal (within an ulp of delta) or the
    bracket did not halve in two steps. About 15 evaluations of an exact SDGS curve where
    bisection takes 40."""
    d_high = delta_of(high)
    if d_high > delta:
        return math.inf
    low, d_low = 0.0, delta_of(0.0)
    if d_low <= delta:
        return 0.0
    log_low, log_high = _log_ratio(d_low, delta), _log_ratio(d_high, delta)
    kept, widths = 0, [math.inf, math.inf]
    while high - low > _EPSILON_TOLERANCE * max(high, 1e-12):
        width = high - low
        middle = low + width / 2
        if math.isfinite(log_high) and log_low > log_high and width <= widths[0] / 2:
            guard = width / 64
            middle = min(max(high - log_high * width / (log_high - log_low), low + guard), high - guard)
        widths = [widths[1], width]
        value = delta_of(middle)
        if value <= delta:
            high, log_high = middle, _log_ratio(value, delta)
            log_low, kept = (log_low / 2 if kept == 1 else log_low), 1
        else:
            low, log_low = middle, _log_ratio(value, delta)
            log_high, kept = (log_high / 2 if kept == -1 else log_high), -1
    return high


def _log_ratio(value: float, delta: float) -> float:
    """ln(value / delta) (-inf where value is 0): where a curve crosses ``delta``, on a log scale."""
    return math.log(value) - math.log(delta) if value > 0 else -math.inf


def _candidates_epsilon(releases: Releases, delta: float) -> dict[str, tuple[float, float]]:
    """Every applicable method's epsilon at ``delta``, the preferred method first (ties)."""
    points, total = _points(releases), sum(releases.values())
    found: dict[str, tuple[float, float]] = {}
    basic_eps, basic_delta = _basic(points)
    if (curve := _exact_curve(releases)) is not None:
        found[EXACT] = (smallest_epsilon(curve, delta, _MAX_EPSILON), delta)
    if _by_pld(total):
        found[PLD] = (pld.epsilon_for_delta(pld.composed_pld(releases), delta), delta)
    if 1 < total <= OPTIMAL_RELEASES:
        each = _each(points)
        found[OPTIMAL] = (smallest_epsilon(lambda e: optimal_composition_delta(each, e), delta, basic_eps), delta)
    if total > 1:
        found[ADVANCED] = (_advanced_epsilon(points, delta), delta)
        if (by_renyi := _renyi(releases, lambda: renyi.epsilon_for_delta(releases, delta))) is not None:
            found[RENYI] = (by_renyi, delta)
    found[BASIC] = (basic_eps if basic_delta <= delta else math.inf, delta)
    return found


def _candidates_delta(releases: Releases, epsilon: float, composed: Any = None) -> dict[str, tuple[float, float]]:
    """Every applicable method's delta at ``epsilon``, the preferred method first (ties);
    ``composed``: the releases' PLD when already built. One release without an exact curve is
    also read on its Rényi curve (a zCDP release's delta between its stated points; after
    basic, which wins a tie: at its stated epsilon the two agree)."""
    points, total = _points(releases), sum(releases.values())
    found: dict[str, tuple[float, float]] = {}
    if (curve := _exact_curve(releases)) is not None:
        found[EXACT] = (epsilon, curve(epsilon))
    if _by_pld(total):
        composed = composed if composed is not None else pld.composed_pld(releases)
        found[PLD] = (epsilon, pld.delta_for_epsilon(composed, epsilon))
    if 1 < total <= OPTIMAL_RELEASES:
        found[OPTIMAL] = (epsilon, optimal_composition_delta(_each(points), epsilon))
    if total > 1:
        found[ADVANCED] = (epsilon, _advanced_delta(points, epsilon))
        if (by_renyi := _renyi(releases, lambda: renyi.delta_for_epsilon(releases, epsilon))) is not None:
            found[RENYI] = (epsilon, by_renyi)
    basic_eps, basic_delta = _basic(points)
    found[BASIC] = (epsilon, min(1.0, basic_delta) if epsilon >= basic_eps else 1.0)
    if total == 1 and EXACT not in found:
        if (by_renyi := _renyi(releases, lambda: renyi.delta_for_epsilon(releases, epsilon))) is not None:
            found[RENYI] = (epsilon, by_renyi)
    return found


def _sequential(releases: Releases, epsilon: float | None, delta: float | None) -> dict[str, tuple[float, float]]:
    """The probabilistic notion's one rule: the stated points add up (Theorem 2); asked for the
    epsilon at ``delta`` (or the delta at ``epsilon``), that sum when it meets the question,
    else (inf, delta) (or (epsilon, 1))."""
    total = summed(releases, "probabilistic")
    total_eps, total_delta = total.epsilon, total.delta
    if delta is not None:
        return {SEQUENTIAL: (total_eps if total_delta <= delta else math.inf, delta)}
    assert epsilon is not None
    return {SEQUENTIAL: (epsilon, total_delta if epsilon >= total_eps else 1.0)}


def as_notion(text: str) -> Notion:
    """``text`` as an accounting notion; ValueError for any other text."""
    for notion in NOTIONS:
        if text == notion:
            return notion
    raise ValueError(f"notion must be one of {', '.join(NOTIONS)}; got {text!r}")


def _tightest(
    events: Sequence[Event] | Releases,
    times: int,
    notion: Notion,
    epsilon: float | None = None,
    delta: float | None = None,
) -> Composition:
    """The candidate with the smallest answer to the question (the epsilon at ``delta``, or the
    delta at ``epsilon``) under ``notion``; a question asked before in this process is answered
    from :func:`_answered` (the methods are deterministic: the same releases give the same bits)."""
    notion = as_notion(notion)
    answer = _answered(tuple(releases_of(events, times).items()), notion, epsilon, delta)
    return replace(answer, candidates=dict(answer.candidates))


@functools.lru_cache(maxsize=256)
def _answered(
    question: tuple[tuple[Event, int], ...], notion: Notion, epsilon: float | None, delta: float | None
) -> Composition:
    """:func:`_tightest` of the releases and multiplicities ``question`` (in their order, which
    sums follow), computed once per process: a release asks the same of its tree when it is
    planned, reserved, reported and published (about 20 ms each for one SDGS release's exact
    curve)."""
    releases = dict(question)
    refused = _unsupported(releases, notion)
    if refused is not None:
        return refused
    if notion == "probabilistic":
        candidates = _sequential(releases, epsilon, delta)
    elif delta is not None:
        candidates = _candidates_epsilon(releases, delta)
    else:
        assert epsilon is not None
        candidates = _candidates_delta(releases, epsilon)
    solved = 0 if delta is not None else 1
    method = min(candidates, key=lambda name: candidates[name][solved])
    answer_epsilon, answer_delta = candidates[method]
    return Composition(
        notion, answer_epsilon, answer_delta, releases=sum(releases.values()), method=method, candidates=candidates
    )


def epsilon_at(
    events: Sequence[Event] | Releases, delta: float, times: int = 1, notion: Notion = "approximate"
) -> Composition:
    """The smallest epsilon at which ``events`` (event trees, or a multiset of releases)
    released ``times`` times are (epsilon, delta)-DP under ``notion`` (inf when no epsilon
    reaches ``delta``), by the tightest method."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1); got {delta!r}")
    return _tightest(events, times, notion, delta=delta)


def delta_at(
    events: Sequence[Event] | Releases, epsilon: float, times: int = 1, notion: Notion = "approximate"
) -> Composition:
    """The smallest delta for which ``events`` released ``times`` times are (epsilon, delta)-DP
    under ``notion``, by the tightest method."""
    if not 0 <= epsilon < math.inf:
        raise ValueError(f"epsilon must be a finite number >= 0; got {epsilon!r}")
    return _tightest(events, times, notion, epsilon=epsilon)


def without_recent(result: Composition, solved_epsilon: bool) -> tuple[float, float] | None:
    """The answer ``result`` had without the :data:`RECENT` methods (what a figure stored before
    they existed holds), the epsilon solved for (``solved_epsilon``) or the delta; None when a
    recent method did not give the answer."""
    if result.method not in RECENT:
        return None
    solved = 0 if solved_epsilon else 1
    older = [pair for name, pair in result.candidates.items() if name not in RECENT]
    return min(older, key=lambda pair: pair[solved]) if older else None


def summed(events: Sequence[Event] | Releases, notion: Notion) -> Composition:
    """The stated points of ``events`` added up under ``notion`` (sequential composition: the
    probabilistic notion's rule, Theorem 2, and basic composition under approximate DP)."""
    releases = releases_of(events)
    refused = _unsupported(releases, notion)
    if refused is not None:
        return refused
    total_eps, total_delta = _basic(_points(releases, notion))
    method = SEQUENTIAL if notion == "probabilistic" else BASIC
    return Composition(notion, total_eps, min(1.0, total_delta), releases=sum(releases.values()), method=method)


def release_approximate(
    tree: Event, stated: Guarantee, accounting: str | None, delta: float | None
) -> tuple[Guarantee, Composition | None]:
    """A release's approximate-DP guarantee by the tightest composition, as the plan states it
    and ``audit verify`` replays it: ``stated`` (:func:`~.accountants.account` of ``tree`` under
    ``approximate``) unless the tree is supported and either one release or accounted under
    ``approximate`` (the policy's ``targets.accounting``); then the smallest epsilon at the
    target ``delta`` (:func:`epsilon_at`) or, without a delta target, the delta at the stated
    epsilon (:func:`delta_at`). Returns the guarantee and the composition (None: ``stated``)."""
    releases = leaves(tree)
    if not stated.supported or not releases or (len(releases) > 1 and accounting != "approximate"):
        return stated, None  # composing several releases costs a PLD: only where the policy accounts so
    result = epsilon_at([tree], delta) if delta is not None else delta_at([tree], stated.epsilon)
    detail = f"{result.method} of {counted([tree])}"
    return Guarantee("approximate", result.epsilon, result.delta, True, detail), result


def delta_curve(events: Sequence[Event], epsilons: Sequence[float]) -> list[float]:
    """The composed delta of ``events`` at each of ``epsilons`` under approximate DP (tightest
    method per point; the privacy loss distribution is built once)."""
    releases = releases_of(events)
    if _unsupported(releases, "approximate") is not None:
        return [1.0] * len(epsilons)
    composed = pld.composed_pld(releases) if _by_pld(sum(releases.values())) else None
    return [min(d for _, d in _candidates_delta(releases, e, composed).values()) for e in epsilons]
