"""Privacy loss distributions (PLDs) of release events: tight composition under approximate DP.

A PLD is the distribution of the privacy loss ``L = ln(P(o)/Q(o))``, ``o ~ P``, of a pair of
output distributions (P, Q); its hockey-stick curve is ``delta(eps) = E[(1 - e^(eps - L))_+]``
and composing mechanisms convolves their PLDs (Google's ``dp_accounting`` does the arithmetic;
it costs about 1.3 s to import, so it is imported inside the functions that need it).

Soundness rests on *dominating pairs* (Zhu, Dong, Wang, "Optimal accounting of differential
privacy via characteristic function", AISTATS 2022, Definition 7 and Theorem 10): if a pair
(P, Q) satisfies ``H_a(M(D) || M(D')) <= H_a(P || Q)`` for every ordered pair of neighbours and
every ``a >= 0`` (``H_a(P||Q) = sum_o (P(o) - a Q(o))_+``), then the product pairs dominate
the adaptive composition, so the composed PLD's curve bounds the composed mechanism's delta.

**SDGS** (and the crowd-blending histogram, which releases the same information). Its exact
add/remove profile ``delta(eps) = sup_n max(H(P_n || P_{n-1}), H(P_{n-1} || P_n))``
(:func:`~privrelease.mechanisms.sdgs_math.delta_exact`) is a supremum over the size n of the
target's cell, so no single pair (P_n, P_{n-1}) dominates it (that pair is a *lower* bound and
composing it is unsound: the worst n moves with eps). :func:`sdgs_pld` builds one symmetric
discrete pair whose curve lies above the whole profile, by connect-the-dots (Doroshenko, Ghazi,
Kamath, Kumar, Manurangsi, PETS 2022, Algorithm 1) from values of the profile:

1. ``h(a) = sup_{D ~ D'} H_a(M(D) || M(D'))`` over ordered neighbours is a supremum of convex
   functions of ``a``, hence convex; the family of ordered neighbours is closed under swapping,
   and ``H_a(P||Q) = 1 - a + a H_{1/a}(Q||P)``, so ``h`` on ``a < 1`` follows from
   ``delta(eps) = h(e^eps)`` on ``eps >= 0``. A pair dominates every neighbour pair for all
   ``a >= 0`` iff its curve lies above ``delta`` on ``eps >= 0`` **in both directions**.
2. On grid losses ``0 = e_0 < e_1 < ... < e_m`` take upper bounds ``d_j >= delta(e_j)`` and put
   mass ``m_j = (d_j - d_{j-1}) / (e^(e_{j-1} - e_j) - 1) + (d_{j+1} - d_j) / (e^(e_{j+1} - e_j) - 1)``
   on loss ``e_j`` (``j >= 1``, the second term 0 at ``j = m``), ``d_m`` on ``+inf``, the mirror
   mass ``e^(-e_j) m_j`` on ``-e_j`` and the rest on loss 0. For ``eps >= 0`` the curve of these
   masses is the chord interpolation of ``d_j`` in ``a = e^eps`` (constant ``d_m`` beyond
   ``e_m``), which lies above the convex ``delta``; the pair is symmetric (mirroring:
   ``Q(L = l) = P(L = -l)``), so both directions are covered; P and Q are probability
   distributions as long as the mass on 0 is >= 0 (checked).
3. Rounding: every mass is raised by a bound on its floating-point error and negative masses
   are set to 0. Adding mass at any loss only raises the composed curve (it is a polynomial
   with nonnegative coefficients in the masses), and the pair stays valid (the zero-loss mass
   absorbs it), so the result still dominates.

Every other release brings its own PLD (:meth:`~privrelease.mechanisms.events.Event.pld`):
Laplace events ``dp_accounting``'s own pessimistic Laplace PLD; the scheme selection
(``bounded_range_selection``) the connect-the-dots pair above its exact bounded-range profile
(:func:`profile_pld`, steps 2 and 3 with that profile); an ``exponential_selection`` (as stored
before) and sampled pure-DP events the PLD of a pure ``eps``-DP pair (randomized response,
which dominates every ``eps``-DP mechanism). SPLU-Gen is not DP: :class:`Unsupported`.

dp_accounting composes by FFT and truncates tails pessimistically (to the infinity mass). FFT
round-off is absolute and spread over all entries of the composed PMF; true masses are >= 0, so
the most negative entry shows its scale, and twice (entries x that scale) bounds the error of
any sum over the entries (:func:`fft_margin`; measured against direct convolution in the
tests). Every reported delta includes the margin, and every epsilon is computed for
``delta - margin``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from privrelease.mechanisms.events import Event, Sampled, event_to_json, leaf_counts
from privrelease.mechanisms.guarantees import Unsupported
from privrelease.mechanisms.sdgs_math import amplified_epsilon, exact_grid

__all__ = ["Unsupported", "composed_pld", "delta_for_epsilon", "epsilon_for_delta", "event_pld", "sdgs_pld"]

DISCRETIZATION = 1e-3
"""Width of the privacy-loss grid shared by every PLD (losses are multiples of it)."""

DENSE_POINTS = 100
"""The SDGS profile is evaluated at every grid loss below ``DENSE_POINTS`` grid steps (where it
bends most), then at relative steps of ``RELATIVE_STEP``: about 800 points in all, as tight as
every grid loss to 5 digits of the composed epsilon (measured in the tests)."""

RELATIVE_STEP = 0.01

MAX_LOSS = 64.0
"""The SDGS profile is evaluated up to this loss at most; beyond, its value there is charged
as the mass of an infinite loss (an upper bound, the profile being nonincreasing)."""

FFT_MARGIN = 1e-14
"""The least absolute allowance for floating-point error in a composed delta."""

_U = np.finfo(float).eps


# --- SDGS: a dominating pair from the exact profile --------------------------------------------


def _sdgs_support(k: int, beta: float) -> float:
    """The largest loss worth a grid point: the first power-of-two loss where the profile is
    within a relative 1e-9 of its floor beta^k (the mass of an infinite loss: all k copies of
    a cell of k rows sampled), capped at MAX_LOSS."""
    floor = beta**k
    loss = 1.0
    while loss < MAX_LOSS:
        delta = exact_grid(k, beta, loss)[0].delta
        if delta is not None and delta <= floor * (1 + 1e-9) + 1e-300:
            break
        loss *= 2
    return min(loss, MAX_LOSS)


def connect_the_dots(grid: np.ndarray, deltas: np.ndarray, discretization: float) -> tuple[dict[int, float], float]:
    """Masses of a symmetric privacy-loss pair whose curve on ``eps >= 0`` lies above the
    convex profile bounded by ``deltas`` at losses ``grid * discretization`` (``grid[0] == 0``,
    strictly increasing integers). Returns ``({grid index: mass}, infinity mass)``; see the
    module docstring (step 2 and 3) for the construction and its proof."""
    assert grid[0] == 0 and np.all(np.diff(grid) > 0) and len(grid) >= 2
    losses = grid * discretization
    d = np.minimum.accumulate(np.clip(deltas, 0.0, 1.0))  # a profile is nonincreasing: min is still an upper bound
    gaps = np.diff(losses)
    down = np.diff(d) / np.expm1(-gaps)  # (d_j - d_{j-1}) / (e^(e_{j-1} - e_j) - 1) >= 0, j = 1..m
    up = np.append(np.diff(d)[1:] / np.expm1(gaps[1:]), 0.0)  # (d_{j+1} - d_j) / (e^(e_{j+1} - e_j) - 1) <= 0
    masses = down + up
    masses = np.maximum(masses + 8 * _U * (np.abs(down) + np.abs(up)), 0.0)
    mirror = masses * np.exp(-losses[1:]) * (1 + 4 * _U)
    infinity = float(d[-1])
    zero = 1.0 - infinity - math.fsum(masses) - math.fsum(mirror)
    zero += 4 * _U * (len(grid) + 2)
    assert zero >= 0, f"connect-the-dots: negative mass {zero} on loss 0 (profile not convex?)"
    pmf = {0: zero}
    pmf.update(zip(grid[1:].tolist(), masses.tolist(), strict=True))
    pmf.update(zip((-grid[1:]).tolist(), mirror.tolist(), strict=True))
    return {index: mass for index, mass in pmf.items() if mass > 0}, infinity


def profile_grid(top: int) -> np.ndarray:
    """Grid indices 0, 1, ..., DENSE_POINTS, then steps of RELATIVE_STEP of the index, up to
    the first index >= ``top``."""
    points, index = [0], 0
    while index < top:
        index += max(1, int(index * RELATIVE_STEP)) if index >= DENSE_POINTS else 1
        points.append(index)
    return np.array(points)


def sdgs_profile(k: int, beta: float, discretization: float = DISCRETIZATION) -> tuple[np.ndarray, np.ndarray]:
    """Grid indices (:func:`profile_grid` up to :func:`_sdgs_support`) and upper bounds of the
    exact SDGS profile there."""
    grid = profile_grid(math.ceil(_sdgs_support(k, beta) / discretization))
    deltas = np.array([result.delta for result in exact_grid(k, beta, grid * discretization)], dtype=float)
    return grid, deltas


def _pld(pmf: dict[int, float], infinity: float, discretization: float) -> Any:
    from dp_accounting.pld import privacy_loss_distribution as pld

    return pld.PrivacyLossDistribution.create_from_rounded_probability(
        pmf, infinity, discretization, pessimistic_estimate=True
    )


def sdgs_pld(k: int, beta: float, discretization: float = DISCRETIZATION) -> Any:
    """A PLD dominating (k, beta)-SDGS over every cell size n (module docstring)."""
    if beta >= 1:
        raise Unsupported(
            f"k-DGS without sampling (beta = 1) has no (eps, delta)-DP for any delta < 1 "
            f"(Li-Qardaji-Su Proposition 4); k = {k}"
        )
    grid, deltas = sdgs_profile(k, beta, discretization)
    return _pld(*connect_the_dots(grid, deltas, discretization), discretization)


def profile_pld(profile: Callable[[float], float], top: float, discretization: float = DISCRETIZATION) -> Any:
    """A PLD dominating every pair whose delta is at most the convex ``profile`` in both
    directions, the profile 0 from ``top`` on: connect-the-dots over :func:`profile_grid` up to
    ``top`` (module docstring, steps 2 and 3)."""
    grid = profile_grid(math.ceil(top / discretization))
    deltas = np.array([profile(float(index * discretization)) for index in grid], dtype=float)
    return _pld(*connect_the_dots(grid, deltas, discretization), discretization)


def pure_dp_pld(epsilon: float, discretization: float = DISCRETIZATION) -> Any:
    """The PLD of randomized response with ``e^eps`` odds, which dominates every pure
    eps-DP mechanism (losses rounded up to the grid)."""
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld

    return pld.from_privacy_parameters(common.DifferentialPrivacyParameters(epsilon, 0.0), discretization)


def _event_pld(event: Event, discretization: float) -> Any:
    """A release's own PLD (:meth:`~privrelease.mechanisms.events.Event.pld`); a sampled
    pure-DP release gets the pure pair at its amplified epsilon (Li-Qardaji-Su Corollary 4)."""
    if isinstance(event, Sampled):
        from privrelease.mechanisms.accountants import account

        inner = account(event.event, "approximate")
        if not inner.supported or inner.delta > 0:
            raise Unsupported(f"no privacy loss distribution for a sampled {event.event.kind} event")
        return pure_dp_pld(amplified_epsilon(event.beta, inner.epsilon), discretization)
    return event.pld(discretization)


@functools.lru_cache(maxsize=256)
def _cached_pld(event_json: str, discretization: float) -> Any:
    from privrelease.mechanisms.events import event_from_json

    return _event_pld(event_from_json(event_json), discretization)


def event_pld(event: Event, discretization: float = DISCRETIZATION) -> Any:
    """The PLD of one non-composed event, cached by its canonical JSON (same event, same PLD)."""
    return _cached_pld(event_to_json(event), discretization)


def composed_pld(
    events: Sequence[Event] | Mapping[Event, int], times: int = 1, discretization: float = DISCRETIZATION
) -> Any:
    """The PLD of all ``events`` (trees are flattened to their releases; a mapping is a
    multiset of releases) released ``times`` times each; identical releases are composed by
    self-composition."""
    if times < 1:
        raise ValueError(f"times must be >= 1; got {times}")
    counts = leaf_counts(events)
    if not counts:
        raise ValueError("nothing to compose: no releases")
    result = None
    # dp_accounting bounds each convolution's truncation over several orders with scipy's
    # logsumexp, which overflows (a RuntimeWarning) where the PMF's extreme losses carry
    # subnormal masses (an SDGS profile of large k): that order's bound is then infinite and
    # the others decide, so the composition is unchanged and the warning only alarms the user
    with np.errstate(over="ignore"):
        for text, count in sorted((event_to_json(leaf), count) for leaf, count in counts.items()):
            part = _cached_pld(text, discretization)
            if count * times > 1:
                part = part.self_compose(count * times)
            result = part if result is None else result.compose(part)
    return result


# --- Rényi divergences of a PLD's pairs (for :mod:`.renyi`) -----------------------------------


def _log_moment(losses: np.ndarray, probs: np.ndarray, orders: np.ndarray) -> np.ndarray:
    """``ln sum_j probs_j e^((a - 1) losses_j)`` at every order, raised by a bound on its
    rounding: near ``a = 1`` as ``log1p(sum p - 1 + sum p expm1(x))`` (no cancellation), else
    by shifting the largest exponent out."""
    scale = (orders - 1)[:, None]
    x = scale * losses[None, :]
    small = np.abs(x).max(axis=1) < 0.5
    result = np.empty(len(orders))
    slack = 8 * (len(losses) + 8) * _U
    if small.any():
        terms = probs[None, :] * np.expm1(x[small])
        inner = (math.fsum(probs.tolist()) - 1.0) + terms.sum(axis=1)
        magnitude = np.abs(terms).sum(axis=1) + abs(math.fsum(probs.tolist()) - 1.0) + _U
        result[small] = np.log1p(inner + slack * magnitude) + slack
    if (~small).any():
        top = x[~small].max(axis=1)
        total = (probs[None, :] * np.exp(x[~small] - top[:, None])).sum(axis=1)
        result[~small] = top + np.log(total * (1 + slack)) + slack * (np.abs(top) + 1)
    return result


def pair_divergences(losses: np.ndarray, probs: np.ndarray, infinite: float, orders: np.ndarray) -> np.ndarray:
    """Upper bounds of the Rényi divergences at ``orders`` of the pair whose loss under P is
    ``losses`` with ``probs`` (finite part) and infinite with mass ``infinite``: of its finite
    part normalized, Q scaled to mass <= 1 (:mod:`.renyi`'s docstring), raised by a bound on
    the rounding."""
    if infinite >= 1.0 or not probs.size:
        return np.full(len(orders), math.inf)
    finite = math.log1p(-infinite)  # ln(1 - m)
    q_total = math.fsum((probs * np.exp(-losses)).tolist()) * (1 + 8 * (probs.size + 8) * _U)
    moment = _log_moment(losses, probs, orders)
    divergences = (moment - orders * finite) / (orders - 1) + max(0.0, math.log(q_total))
    return divergences * (1 + 1e-12)


def _direction_divergences(pmf: Any, orders: np.ndarray) -> tuple[np.ndarray, float]:
    """One direction of a ``dp_accounting`` PLD (the loss distribution under P): its
    :func:`pair_divergences` and infinite mass."""
    dense = pmf.to_dense_pmf()
    probs = np.asarray(dense._probs, dtype=float)
    keep = probs > 0
    losses = ((dense._lower_loss + np.arange(probs.size)) * dense._discretization)[keep]
    infinite = min(1.0, max(0.0, float(dense._infinity_mass)))
    return pair_divergences(losses, probs[keep], infinite, orders), infinite


def divergences(pld: Any, orders: np.ndarray) -> tuple[np.ndarray, float]:
    """Upper bounds of the Rényi divergences at ``orders`` of the finite parts of a PLD's
    dominating pairs and their infinite mass, the larger of the two directions (:mod:`.renyi`)."""
    found = [_direction_divergences(p, orders) for p in {id(p): p for p in (pld._pmf_remove, pld._pmf_add)}.values()]
    return np.max([d for d, _ in found], axis=0), max(m for _, m in found)


def fft_margin(pld: Any) -> float:
    """An allowance for the FFT round-off in ``pld``'s deltas: 2 x entries x the largest
    negative mass (pure round-off), at least :data:`FFT_MARGIN` (module docstring)."""
    margin = FFT_MARGIN
    for pmf in {id(p): p for p in (pld._pmf_remove, pld._pmf_add)}.values():  # dp_accounting's two PMFs
        probs = np.asarray(pmf.to_dense_pmf()._probs)
        if probs.size:
            margin = max(margin, 2.0 * probs.size * max(-float(probs.min()), 0.0))
    return margin


def delta_for_epsilon(pld: Any, epsilon: float) -> float:
    """The composed delta at ``epsilon``, raised by :func:`fft_margin` (at most 1)."""
    return min(1.0, float(pld.get_delta_for_epsilon(epsilon)) + fft_margin(pld))


def epsilon_for_delta(pld: Any, delta: float) -> float:
    """The smallest epsilon >= 0 at which the composed delta (with :func:`fft_margin`) is at
    most ``delta``; inf when none is."""
    margin = fft_margin(pld)
    if delta <= margin:
        return math.inf
    return float(pld.get_epsilon_for_delta(delta - margin))
