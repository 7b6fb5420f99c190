"""Accountants: turn a privacy event tree into guarantees, one notion at a time.

* ``probabilistic`` — the papers' notion: SDGS gets Theorem 1's delta = d(k, beta, eps);
  pure-DP events get (eps, 0); sampling amplifies pure DP by Corollary 4; composition adds
  epsilons and deltas (Theorem 2's argument: the bad events' probabilities add).
* ``approximate`` — standard (eps, delta)-DP under add/remove-one-row neighbours: SDGS gets the
  exact hockey-stick delta, Gaussian tables and sums the zCDP conversion (an upper bound); several releases compose by the optimal composition theorem for
  heterogeneous (eps_i, delta_i) (exact, never worse than adding; the tests cross-check it with
  privacy loss distributions from Google's ``dp_accounting``).
* ``identifiability`` (rho, Lee & Clifton) and ``f-smooth`` (Theorem 6) have functions of their own.

Each release carries its own rule (:meth:`~privrelease.mechanisms.events.Event.guarantee`);
this module combines them through sampling and composition. An event an accountant cannot
vouch for (SPLU-Gen, which is not DP; SDGS without sampling; Theorem 1 below
eps = -ln(1 - beta)) yields ``supported=False`` with infinite epsilon and delta 1 — fail
closed, never a guess.
"""

from __future__ import annotations

import math

import numpy as np

from privrelease.mechanisms.events import SDGS, Composed, Event, Laplace, Sampled, counted, leaves
from privrelease.mechanisms.guarantees import NOTIONS, Guarantee, Notion, pure, unsupported
from privrelease.mechanisms.identifiability import rho_of_epsilon
from privrelease.mechanisms.sdgs_math import FSmooth, amplified_epsilon

__all__ = ["NOTIONS", "Guarantee", "Notion", "account", "unsupported"]


# --- the combinators: sampling and composition (leaves carry their own rules) -----------------


def _sampled(event: Sampled, notion: Notion) -> Guarantee:
    inner = account(event.event, notion)
    if not inner.supported:
        return inner
    if inner.delta > 0:
        return unsupported(
            notion,
            "amplification by sampling is proven for pure eps-DP only (Li-Qardaji-Su Theorem 3 leaves delta > 0 open)",
        )
    return pure(
        notion,
        amplified_epsilon(event.beta, inner.epsilon),
        f"Corollary 4: ln(1 + {event.beta:g} (e^{inner.epsilon:.6g} - 1))",
    )


def _composed(event: Composed, notion: Notion) -> Guarantee:
    parts = [account(child, notion) for child in event.events]
    bad = [part.detail for part in parts if not part.supported]
    if bad:
        return unsupported(notion, "; ".join(bad))
    epsilon = math.fsum(part.epsilon for part in parts)
    delta = min(1.0, math.fsum(part.delta for part in parts))
    detail = f"sequential composition of {counted([event])}"
    if notion == "approximate" and 1 < len(leaves(event)) <= MAX_OPTIMAL_LEAVES and delta > 0:
        optimal = optimal_delta_for_epsilon(event, epsilon)
        if optimal < delta:
            delta, detail = optimal, detail + " (optimal composition)"
    return Guarantee(notion, epsilon, delta, True, detail)


def account(event: Event, notion: Notion) -> Guarantee:
    """The (epsilon, delta) guarantee of an event tree under ``notion``."""
    if notion not in NOTIONS:
        raise ValueError(f"notion must be one of {', '.join(NOTIONS)}; got {notion!r}")
    if isinstance(event, Composed):
        return _composed(event, notion)
    if isinstance(event, Sampled):
        return _sampled(event, notion)
    return event.guarantee(notion)


# --- optimal composition (approximate DP) -----------------------------------------------------

_U = 2.0**-52
"""The unit roundoff of a double."""

MAX_OPTIMAL_LEAVES = 16
"""Above this many releases the optimal composition (2^m terms) gives way to adding."""


def _points(event: Event) -> list[tuple[float, float]]:
    return [(g.epsilon, g.delta) for g in (account(leaf, "approximate") for leaf in leaves(event))]


def _signed_sums(signs: np.ndarray, values: np.ndarray, constant: float) -> tuple[np.ndarray, np.ndarray]:
    """``signs @ values + constant`` per row, by Neumaier's compensated summation, and a bound
    on each result's absolute error: ``2u|sum| + 4(m + 2)u^2 sum|x|`` (Higham, Accuracy and
    Stability of Numerical Algorithms, 4.3), for rows of m signs in {-1, 1}."""
    total = np.full(signs.shape[0], constant)
    carry = np.zeros_like(total)
    for column, value in zip(signs.T, values, strict=True):
        term = column * value
        after = total + term
        carry += np.where(np.abs(total) >= np.abs(term), (total - after) + term, (term - after) + total)
        total = after
    result = total + carry
    magnitude = float(np.abs(values).sum()) + abs(constant)
    return result, 2 * _U * np.abs(result) + 4 * (len(values) + 2) * _U**2 * magnitude


def optimal_composition_delta(points: list[tuple[float, float]], epsilon: float) -> float:
    """The exact delta at ``epsilon`` of composing (eps_i, delta_i)-DP mechanisms, over all
    mechanisms with those guarantees (optimal composition; Murtagh & Vadhan 2016, Theorem 1.5,
    heterogeneous Kairouz-Oh-Viswanath):
    1 - prod(1 - d_i) + prod(1 - d_i) / prod(1 + e^eps_i)
        * sum_{S} max(0, e^{sum_{i in S} eps_i} - e^eps e^{sum_{i not in S} eps_i}).

    Rounded up, never down. ``1 - prod(1 - d_i)`` is ``-expm1(sum log1p(-d_i))`` (in plain
    floats it is 0 for every d_i below about 5.5e-17, which stated pure DP). Dividing by
    ``e^{sum eps}``, a term is ``e^{-out_S} (1 - e^{-g_S})`` with the gap
    ``g_S = sum_S eps_i - eps - out_S`` summed with compensation: a term counts when its gap is
    positive (its sign exact from ``math.fsum`` when the gap is within its error bound of 0)
    and is raised by a bound on its relative error. Cross-checked against privacy loss
    distributions (dp_accounting) and 60-digit mpmath in the tests."""
    eps = np.array([p[0] for p in points], dtype=float)
    log_keep = math.fsum(math.log1p(-p[1]) for p in points)
    lost = -math.expm1(log_keep)  # 1 - prod(1 - d_i), to full relative precision
    chosen = (np.arange(2 ** len(points))[:, None] >> np.arange(len(points))) & 1
    gaps, gap_error = _signed_sums(2 * chosen - 1, eps, -epsilon)
    for row in np.flatnonzero(np.abs(gaps) <= gap_error):  # a sign the bound leaves open: exactly
        gaps[row] = math.fsum([*np.where(chosen[row] == 1, eps, -eps).tolist(), -epsilon])
        gap_error[row] = 0.0 if gaps[row] <= 0 else 2 * _U * abs(gaps[row])
    counts = gaps > 0
    outside = (1 - chosen[counts]) @ eps
    terms = np.exp(-outside) * -np.expm1(-gaps[counts])
    relative = 4 * _U * (len(points) + 2) * (outside + 1) + gap_error[counts] / gaps[counts]
    total = math.fsum(terms * (1 + relative))
    log_norm = math.fsum(np.log1p(np.exp(-eps)).tolist())  # log(prod(1 + e^eps_i) / e^{sum eps})
    return min(1.0, (lost + math.exp(log_keep) * total / math.exp(log_norm)) * (1 + 1e-12))


def optimal_delta_for_epsilon(event: Event, epsilon: float) -> float:
    """delta at ``epsilon`` of a tree's releases under optimal composition."""
    return optimal_composition_delta(_points(event), epsilon)


def optimal_epsilon_for_delta(event: Event, delta: float) -> float:
    """The smallest epsilon (to a relative 1e-9, rounded up) at which the tree's releases,
    optimally composed, are (epsilon, delta)-DP; inf when no epsilon reaches delta."""
    points = _points(event)
    if any(not math.isfinite(e) for e, _ in points) or len(points) > MAX_OPTIMAL_LEAVES:
        guarantee = account(event, "approximate")
        return guarantee.epsilon if guarantee.delta <= delta else math.inf
    low, high = 0.0, math.fsum(e for e, _ in points)
    if optimal_composition_delta(points, high) > delta:
        return math.inf
    while high - low > 1e-9 * max(high, 1e-12):
        middle = (low + high) / 2
        if optimal_composition_delta(points, middle) <= delta:
            high = middle
        else:
            low = middle
    return high


# --- identifiability and f-smooth -------------------------------------------------------------


def identifiability(event: Event) -> float | None:
    """rho of an event tree (Lee & Clifton): a Laplace event calibrated with universe size m and
    sensitive range S(f) gives rho = 1 / (1 + (m - 1) e^(-S(f)/lambda)). Several such releases
    about the same people multiply the adversary's posterior odds, so their exponents add, over
    the smallest declared universe. None when some leaf is not a calibrated Laplace release
    (eps-DP mechanisms give rho only for a declared universe size)."""
    releases = leaves(event)
    calibrated = [
        (leaf.sensitive_range / leaf.scale, leaf.universe_size)
        for leaf in releases
        if isinstance(leaf, Laplace) and leaf.universe_size and leaf.sensitive_range
    ]
    if not releases or len(calibrated) < len(releases):
        return None
    exponent = math.fsum(ratio for ratio, _ in calibrated)
    universe = min(size for _, size in calibrated)
    return rho_of_epsilon(exponent, universe)


def fsmooth(event: Event) -> FSmooth | None:
    """The f-smooth guarantee (Theorem 6) of the SDGS releases in a tree, composed by Theorem 5;
    None when the tree has no sampled SDGS release or any other kind of release."""
    releases = leaves(event)
    sampled = [(leaf.k, leaf.beta, leaf.epsilon) for leaf in releases if isinstance(leaf, SDGS) and leaf.beta < 1]
    if not releases or len(sampled) < len(releases):
        return None
    return FSmooth(tuple(sampled))
