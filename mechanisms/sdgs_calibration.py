"""Calibrating (k, beta)-SDGS: given three of (k, beta, epsilon, delta), the best fourth.

Either delta notion can be targeted: ``probabilistic`` (Theorem 1's d(k, beta, eps)) or
``approximate`` (the exact hockey-stick delta). Both are nonincreasing in k (a larger k merges
published outcomes into "suppressed": post-processing, and Theorem 1's max runs over fewer n),
so the smallest k is found exactly by exponential then binary search and checked at k - 1.
Epsilon and beta are found by bisection to a relative 1e-10 and the returned value is verified
to meet the target (delta is nonincreasing in epsilon and nondecreasing in beta).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from privrelease.mechanisms.limits import MIN_BETA
from privrelease.mechanisms.sdgs_math import delta_exact, delta_theorem1, min_theorem1_epsilon

Notion = Literal["probabilistic", "approximate"]
_MAX_K = 2**24
_MAX_EPSILON = 60.0


class CalibrationError(ValueError):
    """No parameter value meets the target (the message says why)."""


@dataclass(frozen=True)
class Calibrated:
    k: int
    beta: float
    epsilon: float
    delta: float
    """The delta the returned parameters achieve (at most the target)."""
    notion: Notion


def sdgs_delta(k: int, beta: float, epsilon: float, notion: Notion) -> float | None:
    """delta of (k, beta)-SDGS at eps under the notion (None where Theorem 1 gives none)."""
    result = delta_theorem1(k, beta, epsilon) if notion == "probabilistic" else delta_exact(k, beta, epsilon)
    return result.delta


def _meets(k: int, beta: float, epsilon: float, target: float, notion: Notion) -> bool:
    delta = sdgs_delta(k, beta, epsilon, notion)
    return delta is not None and delta <= target


def auto_beta(epsilon: float) -> float:
    """The largest beta Theorem 1 allows at eps: 1 - e^-eps, rounded down so that
    eps >= -ln(1 - beta) holds in floating point too."""
    beta = -math.expm1(-epsilon)
    while min_theorem1_epsilon(beta) > epsilon:
        beta = math.nextafter(beta, 0.0)
    return beta


def _calibrated(k: int, beta: float, epsilon: float, notion: Notion) -> Calibrated:
    delta = sdgs_delta(k, beta, epsilon, notion)
    assert delta is not None, "calibrated parameters meet the target, so they have a delta"
    return Calibrated(k, beta, epsilon, delta, notion)


def _narrow(meets, failing, passing, midpoint, close):
    """Bisect between a value that misses the target (``meets`` False) and one that meets it
    until ``close(failing, passing)``; returns the value that meets it."""
    while not close(failing, passing):
        middle = midpoint(failing, passing)
        if meets(middle):
            passing = middle
        else:
            failing = middle
    return passing


def _within(relative: float) -> Callable[[float, float], bool]:
    """Bisection's stop: the two ends within ``relative`` of each other."""
    return lambda failing, passing: abs(passing - failing) <= relative * max(abs(passing), abs(failing))


def smallest_k(beta: float, epsilon: float, delta: float, notion: Notion) -> Calibrated:
    """The smallest k with delta(k, beta, eps) <= target (exact, not off by one)."""
    if notion == "probabilistic" and epsilon < min_theorem1_epsilon(beta):
        raise CalibrationError(
            f"Theorem 1 gives no delta for epsilon {epsilon:g} < -ln(1 - beta) = "
            f"{min_theorem1_epsilon(beta):.6g}; raise epsilon or lower beta"
        )
    if beta >= 1:
        raise CalibrationError("beta = 1 (no sampling) gives no (eps, delta)-DP for any k (Proposition 4)")
    high = 1
    while not _meets(high, beta, epsilon, delta, notion):
        if high >= _MAX_K:
            raise CalibrationError(f"no k up to {_MAX_K} reaches delta {delta:g}")
        high *= 2
    k = _narrow(
        lambda k: _meets(k, beta, epsilon, delta, notion),
        high // 2,  # fails (or is 0)
        high,
        lambda a, b: (a + b) // 2,
        lambda a, b: b - a <= 1,
    )
    return _calibrated(k, beta, epsilon, notion)


def smallest_epsilon(k: int, beta: float, delta: float, notion: Notion, *, relative: float = 1e-10) -> Calibrated:
    """The smallest eps with delta(k, beta, eps) <= target (to ``relative``, verified: the
    epsilon returned meets the target, at most that much above the smallest)."""
    if beta >= 1:
        raise CalibrationError("beta = 1 (no sampling) gives no (eps, delta)-DP for any epsilon (Proposition 4)")
    low = min_theorem1_epsilon(beta) if notion == "probabilistic" else 0.0
    if _meets(k, beta, low, delta, notion):
        return _calibrated(k, beta, low, notion)
    high = max(2 * low, 0.5)
    while not _meets(k, beta, high, delta, notion):
        if high > _MAX_EPSILON:
            raise CalibrationError(
                f"no epsilon up to {_MAX_EPSILON:g} reaches delta {delta:g} with k = {k}, beta = {beta:g}"
            )
        low, high = high, 2 * high
    epsilon = _narrow(
        lambda e: _meets(k, beta, e, delta, notion), low, high, lambda a, b: (a + b) / 2, _within(relative)
    )
    return _calibrated(k, beta, epsilon, notion)


def largest_beta(k: int, epsilon: float, delta: float, notion: Notion) -> Calibrated:
    """The largest beta in [MIN_BETA, 1) with delta(k, beta, eps) <= target (to a relative
    1e-10, verified; CalibrationError where none is: a policy refuses a smaller beta).
    Under Theorem 1 beta is at most 1 - e^-eps (``auto_beta``)."""
    ceiling = auto_beta(epsilon) if notion == "probabilistic" else math.nextafter(1.0, 0.0)
    if ceiling < MIN_BETA:
        raise CalibrationError(
            f"Theorem 1 needs beta <= 1 - e^-epsilon = {ceiling:.6g} at epsilon {epsilon:g}, below the "
            f"smallest beta a policy allows ({MIN_BETA:g}); raise epsilon to -ln(1 - {MIN_BETA:g}) or more"
        )
    if _meets(k, ceiling, epsilon, delta, notion):
        return _calibrated(k, ceiling, epsilon, notion)
    if not _meets(k, MIN_BETA, epsilon, delta, notion):
        raise CalibrationError(
            f"no beta in [{MIN_BETA:g}, 1] (the range a policy allows) reaches delta {delta:g} "
            f"with k = {k}, epsilon = {epsilon:g}; raise k or epsilon"
        )
    beta = _narrow(
        lambda b: _meets(k, b, epsilon, delta, notion), ceiling, MIN_BETA, lambda a, b: (a + b) / 2, _within(1e-10)
    )
    return _calibrated(k, beta, epsilon, notion)
