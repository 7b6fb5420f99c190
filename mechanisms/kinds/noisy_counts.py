"""Noisy counts (the ``noisy_counts`` kind): every cell of a declared domain with discrete
Gaussian or discrete Laplace noise, the standard DP table of statistical agencies.

The release is a contingency table over a domain declared in the policy (each column's declared
values generalized by its scheme, or a hierarchy's labels at its level; zeros included, nothing
suppressed): ``columns``, ``noise: {distribution: gaussian, sigma: S}`` or
``{distribution: laplace, scale: T}``, optional ``nonnegative`` (post-processing) and
``epsilon`` (where a Gaussian table states its delta; default: the smallest epsilon reaching
``targets.delta``). On Dask each partition counts its cells exactly and the noise is added once,
to the merged counts. Under add/remove-one-row neighbours, one row changes one cell by 1 (at most one, if
rows outside the domain are dropped), so the table is ONE release of sensitivity 1 in both L1
and L2; the cells not touched have identical, independent noise on both sides and cancel out of
every divergence. Every privacy statement below is therefore the one of the scalar pair
``(Z, Z + 1)``, ``Z`` the noise. (Replace-one neighbours would move two cells: L1 sensitivity 2,
L2 sqrt(2); nothing here covers that.)

**Noise.** The discrete Gaussian ``N_Z(0, sigma^2)``: ``p(z) = e^(-z^2 / (2 sigma^2)) / C_sigma``,
``C_sigma = sum_z e^(-z^2 / (2 sigma^2))`` (Canonne, Kamath, Steinke, "The Discrete Gaussian for
Differential Privacy", NeurIPS 2020; ``sigma`` is its parameter, not exactly its standard
deviation). The discrete Laplace (two-sided geometric) ``p(z) = (1 - r) / (1 + r) r^|z|``,
``r = e^(-1/t)`` for scale ``t`` (Ghosh, Roughgarden, Sundararajan, "Universally
Utility-Maximizing Privacy Mechanisms", STOC 2009: the geometric mechanism).

**Privacy loss.** Measured from the smaller dataset's count, the cell's output is ``Z`` on one
neighbour and ``Z + 1`` on the other: the pair of output distributions is ``(p(o), p(o - 1))``
in one direction and ``(p(o - 1), p(o))`` in the other. Both noises are symmetric, so
``o -> 1 - o`` maps one direction onto the other: every number below holds for both. The loss at
output ``z`` of the first direction is ``L(z) = ln p(z) / p(z - 1)``:

* discrete Gaussian: ``L(z) = (1 - 2z) / (2 sigma^2)``, linear in ``z``;
* discrete Laplace: ``L(z) = +1/t`` for ``z <= 0`` and ``-1/t`` for ``z >= 1``.

* ``approximate_delta``: the hockey-stick divergence ``delta(eps) = sum_z (p(z) - e^eps p(z-1))_+
  = sum_{L(z) > eps} p(z) (1 - e^(eps - L(z)))``; for the discrete Gaussian this is CKS
  Theorem 7, ``P[X > eps sigma^2 - 1/2] - e^eps P[X > eps sigma^2 + 1/2]``, here summed term by
  term (each term positive: no cancellation). Discrete Laplace: ``(1 - e^(eps - 1/t)) / (1 + r)``
  for ``eps < 1/t`` (the geometric sum of the ``z <= 0`` terms), else 0: pure ``1/t``-DP.
* ``probabilistic_delta``: the papers' probabilistic DP, ``P[L > eps]``: a left tail of the
  discrete Gaussian, ``P[X <= z*]`` with ``z*`` the largest integer below ``1/2 - eps sigma^2``;
  for the discrete Laplace ``P[X <= 0] = 1 / (1 + r)`` when ``eps < 1/t``, else 0.

**Numerics.** Discrete Gaussian sums run in float64 over the integers where the weight is within
``e^-LOG_DROP`` of the largest term; what is left out is bounded by a geometric series
(``z^2 >= m^2 + 2m (z - m)`` for ``z >= m > 0``, so ``sum_{z >= m} e^(-z^2/(2s^2)) <=
e^(-m^2/(2s^2)) / (1 - e^(-m/s^2))``) and added. ``C_sigma`` is a partial sum (a lower bound:
probabilities are overestimated, deltas and tails too). Each result is finally raised by a
bound on its float rounding (relative about 1e-13 to 1e-11, far below the 1e-9 the tests demand)
so it is an upper bound of the exact value, never rounded down; a value below the smallest
float is returned as the smallest positive float. Sums cost O(sigma) (sigma = 1e5: 0.2 s).

**Sampling** is OpenDP's (``make_gaussian`` / ``make_laplace`` on a vector of i64 with the L2 /
L1 distance; exact samplers of CKS, randomness from the OS CSPRNG). OpenDP's own privacy map is
checked at every release: ``rho = 1 / (2 sigma^2)`` zCDP for the Gaussian (CKS: the discrete
Gaussian is ``Delta^2 / (2 sigma^2)``-concentrated DP, as the continuous one), ``eps = 1/t`` for
the Laplace.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, StrictBool

from privrelease.errors import UserError
from privrelease.mechanisms import zcdp
from privrelease.mechanisms.columns import NOISY_TABLE, taken_name
from privrelease.mechanisms.kinds import (
    AccuracyCheck,
    Axis,
    ColumnRef,
    Epsilon,
    Event,
    Frontier,
    Guarantee,
    Issue,
    Loc,
    MechanismKind,
    Model,
    Names,
    Notion,
    Planned,
    at_least,
    by_columns,
    checked,
    frontier_of,
    half_width_target,
    log_grid,
    pure,
)

if TYPE_CHECKING:
    from privrelease.mechanisms.kinds import AccuracyStatement, AccuracyTarget, LoadedPolicy, MechanismResult, Policy
    from privrelease.mechanisms.schemes import ColumnScheme

Distribution = Literal["gaussian", "laplace"]
DISTRIBUTIONS: tuple[Distribution, ...] = ("gaussian", "laplace")

LOG_DROP = 90.0
"""Discrete Gaussian sums stop where the weight is below ``e^-LOG_DROP`` (about 1e-39) of their
largest term; the rest is bounded and added (module docstring)."""

CHUNK = 1 << 20
"""Discrete Gaussian sums over more integers than this are summed in chunks (bounded memory)."""

SAMPLE_CHUNK = 50_000
"""Cells per OpenDP call when :func:`add_noise` splits a large table over threads (OpenDP's
samplers run in Rust without the GIL: two threads on two cores take about half the time)."""

_U = float(np.finfo(float).eps)  # a Python float: results stay floats (np.float64 would make np.bool_ comparisons)


# --- parameters ---------------------------------------------------------------------------------


def _parameter_name(distribution: str) -> str:
    return "sigma" if distribution == "gaussian" else "scale"


def _check(distribution: str, parameter: float) -> float:
    if distribution not in DISTRIBUTIONS:
        raise UserError(
            f"noise distribution must be one of {', '.join(DISTRIBUTIONS)}; got {distribution!r}",
            field="noise.distribution",
            allowed=", ".join(DISTRIBUTIONS),
        )
    name = _parameter_name(distribution)
    if (
        isinstance(parameter, bool)
        or not isinstance(parameter, (int, float, np.integer, np.floating))
        or not math.isfinite(parameter)
        or parameter <= 0
    ):
        raise UserError(
            f"noise {name} must be a finite number > 0; got {parameter!r}", field=f"noise.{name}", allowed="> 0"
        )
    return float(parameter)


def _check_epsilon(epsilon: float) -> float:
    if (
        isinstance(epsilon, bool)
        or not isinstance(epsilon, (int, float, np.integer, np.floating))
        or not 0 <= epsilon < math.inf
    ):
        raise UserError(f"epsilon must be a finite number >= 0; got {epsilon!r}", field="epsilon", allowed=">= 0")
    return float(epsilon)


# --- discrete Gaussian sums -------------------------------------------------------------------


def _reach(sigma: float) -> int:
    """Integers this far from a term are ``e^-LOG_DROP`` below it (``k^2 / (2 sigma^2) >= LOG_DROP``)."""
    return math.ceil(sigma * math.sqrt(2 * LOG_DROP)) + 1


def _tail_ratio(m: int, sigma: float) -> float:
    """``sum_{z >= m} e^(-z^2/(2 sigma^2)) / e^(-m^2/(2 sigma^2))`` bounded above, ``m >= 1``."""
    return 1.0 / -math.expm1(-m / sigma**2)


def _log_norm_bounds(sigma: float) -> tuple[float, float]:
    """Lower and upper bounds of ``ln C_sigma``: the partial sum over ``|z| <= M`` and that sum
    plus twice the tail bound beyond ``M`` (float rounding is covered by the callers' margins)."""
    m = _reach(sigma)
    total = 0.0
    for start in range(1, m + 1, CHUNK):
        z = np.arange(start, min(start + CHUNK, m + 1), dtype=np.float64)
        total += math.fsum(np.exp(-(z * z) / (2 * sigma**2)))
    partial = 1.0 + 2.0 * total
    tail = 2.0 * math.exp(-((m + 1) ** 2) / (2 * sigma**2)) * _tail_ratio(m + 1, sigma)
    return math.log(partial), math.log(partial + tail)


def _gaussian_left_tail(sigma: float, top: int, epsilon: float | None) -> float:
    """``sum_{z <= top} P(z) f(z)`` for ``top <= 0``, bounded above: ``f = 1`` (``epsilon`` None) or
    ``f(z) = 1 - e^(eps - L(z))``, ``L(z) = (1 - 2z) / (2 sigma^2) > eps`` on the whole range.

    Terms are scaled by the largest, ``w(top)``: ``ln w(z) - ln w(top) = (top - z)(top + z) / (2 sigma^2)``,
    at most about ``LOG_DROP`` in size over the summed range, so the scaled terms are exact
    to a relative ``~LOG_DROP u``. Float rounding of ``f`` is at most ``4u (|L| + 2 eps + 1)``
    absolute per unit of weight; it is added, as is the tail below the range."""
    assert top <= 0
    two_s2 = 2 * sigma**2
    reach = _reach(sigma)
    bottom = top - reach
    weighted = plain = 0.0
    loss_max = 0.0
    for stop in range(top, bottom - 1, -CHUNK):
        z = np.arange(stop, max(stop - CHUNK, bottom - 1), -1, dtype=np.float64)
        w = np.exp(-((top - z) * (-top - z)) / two_s2)  # w(z) / w(top); (top - z) >= 0, (-top - z) >= 0
        plain += math.fsum(w)
        if epsilon is not None:
            excess = ((1 - 2 * z) - 2 * epsilon * sigma**2) / two_s2  # L(z) - eps > 0
            weighted += math.fsum(w * -np.expm1(-excess))
            loss_max = max(loss_max, float((1 - 2 * z[-1]) / two_s2))
    # what lies below the range, relative to w(top): sum_{z <= bottom - 1} w(z) / w(top), f <= 1
    m = -(bottom - 1)
    below = math.exp(-(m * m - top * top) / two_s2) * _tail_ratio(m, sigma)
    if epsilon is None:
        scaled = plain * (1 + 4 * LOG_DROP * _U) + below
    else:
        rounding = 4 * _U * (loss_max + 2 * epsilon + 1) * plain
        scaled = weighted * (1 + 4 * LOG_DROP * _U) + rounding + below
    log_norm_low, _ = _log_norm_bounds(sigma)
    log_value = -(top * top) / two_s2 - log_norm_low + math.log(scaled)
    return _exp_up(log_value)


def _exp_up(log_value: float) -> float:
    """``e^x`` raised by a bound on the rounding of ``x`` (relative ``8u (|x| + LOG_DROP)``) and of
    ``exp``; the smallest positive float where it underflows (the true value being positive)."""
    value = math.exp(log_value) * (1 + 8 * _U * (abs(log_value) + LOG_DROP + 4))
    return min(1.0, max(value, math.ulp(0.0)))


def _loss_top(sigma: float, epsilon: float) -> int:
    """The largest integer ``z`` with ``L(z) = (1 - 2z) / (2 sigma^2) > eps``, i.e. ``z < 1/2 - eps sigma^2``."""
    bound = 0.5 - epsilon * sigma**2
    top = math.ceil(bound) - 1
    # exact check on the rounding of eps sigma^2 near an integer boundary: keep top where L(top) > eps
    while (1 - 2 * (top + 1)) / (2 * sigma**2) > epsilon:
        top += 1
    while (1 - 2 * top) / (2 * sigma**2) <= epsilon:
        top -= 1
    return top


# --- public functions ---------------------------------------------------------------------------


def noise_pld(distribution: Distribution, parameter: float, discretization: float = 1e-3) -> Any:
    """``dp_accounting``'s privacy loss distribution of the whole table (one release),
    pessimistic (its deltas are upper bounds): ``from_discrete_gaussian_mechanism(sigma)`` (its
    ``sigma`` is the discrete Gaussian's parameter, noise truncated where the mass left is below
    1e-30 and that mass charged as an infinite loss) or ``from_discrete_laplace_mechanism(a)``,
    whose pmf is ``∝ e^(-a |x|)``: ``a = 1 / scale`` (sensitivity 1; a person's m rows:
    :data:`PERSON_PAIR`)."""
    parameter = _check(distribution, parameter)
    from dp_accounting.pld import privacy_loss_distribution as pld

    if distribution == "gaussian":
        return pld.from_discrete_gaussian_mechanism(
            parameter, sensitivity=1, pessimistic_estimate=True, value_discretization_interval=discretization
        )
    return pld.from_discrete_laplace_mechanism(
        1.0 / parameter,
        sensitivity=1,
        pessimistic_estimate=True,
        value_discretization_interval=discretization,
    )


PERSON_PAIR = """One person with at most m rows moves the table by an integer vector v with
``sum |v_i| <= m``: L1 sensitivity m and L2 sensitivity m (one cell moved by m), the noise of
every other cell cancelling. Only bounds proven for EVERY such v are stated: the discrete
Laplace is pure (m/t)-DP (a cell moved by ``k`` has loss at most ``k/t``), so its delta at
``eps < m/t`` is randomized response's, ``(1 - e^(eps - m/t)) / (1 + e^(-m/t))``, the largest of
any (m/t)-DP pair, and its PLD randomized response's (:func:`.pld.pure_dp_pld`); the discrete
Gaussian is ``m^2 / (2 sigma^2)``-zCDP (CKS: ``D_a`` of a cell moved by ``k`` is
``a k^2 / (2 sigma^2)``, and ``sum k_i^2 <= m^2``), so its (epsilon, delta) is the zCDP
conversion (:func:`.zcdp.approximate_delta`, CKS Proposition 12) and its PLD the dominating pair
of that stated point. One cell moved by m, the worst spread in a numerical check
(``tests/test_person.py``), would give a smaller delta; it is not proven, so not used."""


def pure_epsilon(distribution: Distribution, parameter: float) -> float | None:
    """Pure DP of one table: the discrete Laplace of scale ``t`` (``P(z) ∝ e^(-|z|/t)``) is
    ``1/t``-DP for sensitivity 1 (its loss is ``±1/t``; Ghosh-Roughgarden-Sundararajan); the
    discrete Gaussian has no pure DP (its loss is unbounded): None."""
    parameter = _check(distribution, parameter)
    return 1.0 / parameter if distribution == "laplace" else None


def approximate_delta(distribution: Distribution, parameter: float, epsilon: float, sensitivity: int = 1) -> float:
    """The exact hockey-stick delta of one table at ``epsilon`` under add/remove-one-row neighbours
    (both directions; they coincide), an upper bound within a relative ~1e-11:
    ``sum_z (P(z) - e^eps P(z - 1))_+`` (CKS Theorem 7 for the discrete Gaussian; module docstring).
    ``sensitivity`` m > 1 (a person's rows): a bound for every spread of them (:data:`PERSON_PAIR`)."""
    parameter, epsilon = _check(distribution, parameter), _check_epsilon(epsilon)
    if sensitivity > 1:
        if distribution == "laplace":
            return pure_delta(sensitivity / parameter, epsilon)
        return zcdp.approximate_delta(sensitivity**2 / (2 * parameter**2), epsilon)
    if distribution == "laplace":
        if epsilon >= 1.0 / parameter:
            return 0.0
        # sum_{z <= 0} P(z) (1 - e^(eps - 1/t)) = (1 - e^(eps - 1/t)) / (1 + e^(-1/t))
        value = -math.expm1(epsilon - 1.0 / parameter) / (1.0 + math.exp(-1.0 / parameter))
        return min(1.0, value * (1 + 16 * _U))
    return _gaussian_left_tail(parameter, _loss_top(parameter, epsilon), epsilon)


def pure_delta(pure_epsilon: float, epsilon: float) -> float:
    """The largest delta at ``epsilon`` of any pure ``pure_epsilon``-DP pair: randomized
    response's, ``(1 - e^(eps - e0)) / (1 + e^(-e0))`` below ``e0``, 0 from it on; rounded up."""
    if epsilon >= pure_epsilon:
        return 0.0
    return min(1.0, -math.expm1(epsilon - pure_epsilon) / (1.0 + math.exp(-pure_epsilon)) * (1 + 16 * _U))


def probabilistic_delta(distribution: Distribution, parameter: float, epsilon: float, sensitivity: int = 1) -> float:
    """The papers' probabilistic-DP delta of one table: ``P[L > eps]`` under the worse neighbour
    direction (they coincide). Discrete Gaussian: ``L = (1 - 2z) / (2 sigma^2)``, so
    ``P[X <= z*]``, ``z*`` the largest integer ``< 1/2 - eps sigma^2``; discrete Laplace: 0 when
    ``eps >= 1/t``, else ``P[X <= 0] = 1 / (1 + e^(-1/t))``. Rounded up. ``sensitivity`` m > 1
    (a person's rows; Gaussian): Markov's inequality on ``e^((a - 1) L)`` with the zCDP bound
    ``D_a <= a rho``, ``rho = m^2 / (2 sigma^2)``: ``P[L > eps] <= e^((a - 1)(a rho - eps))``, least
    at ``a = (eps + rho) / (2 rho)``: ``e^(-(eps - rho)^2 / (4 rho))`` for ``eps > rho`` (a bound,
    for every spread of the person's rows; the Laplace's is 0 at ``eps >= m/t``, else 1)."""
    parameter, epsilon = _check(distribution, parameter), _check_epsilon(epsilon)
    if sensitivity > 1:
        if distribution == "laplace":
            return 0.0 if epsilon >= sensitivity / parameter else 1.0
        return zcdp.probabilistic_delta(sensitivity**2 / (2 * parameter**2), epsilon)
    if distribution == "laplace":
        if epsilon >= 1.0 / parameter:
            return 0.0
        return min(1.0, (1 + 8 * _U) / (1.0 + math.exp(-1.0 / parameter)))
    return _gaussian_left_tail(parameter, _loss_top(parameter, epsilon), None)


def half_width(distribution: Distribution, parameter: float, confidence: float) -> int:
    """The smallest integer ``w`` with ``P(|Z| <= w) >= confidence`` for the noise ``Z``: EACH
    published count is within ``±w`` of its true count with probability at least ``confidence``
    (each cell on its own, not all at once: :func:`all_cells_half_width`). Exact from the pmf:
    ``w`` is the first with ``P(|Z| > w) <= 1 - confidence`` (:func:`_width_for_miss`)."""
    if (
        isinstance(confidence, bool)
        or not isinstance(confidence, (int, float, np.integer, np.floating))
        or not 0 < confidence < 1
    ):
        raise UserError(f"confidence must be a number in (0, 1); got {confidence!r}", field="confidence")
    # 1 - C is exact for C >= 1/2 (Sterbenz); below, one rounding, taken downward
    slack = 1.0 - float(confidence) if confidence >= 0.5 else math.nextafter(1.0 - float(confidence), 0.0)
    return _width_for_miss(distribution, parameter, slack)


@functools.cache
def largest_noise(distribution: Distribution, confidence: float, absolute_error: float) -> float:
    """The largest noise parameter in [:data:`MIN_NOISE`, :data:`MAX_NOISE`], to a relative 1e-9
    and never above it, whose exact :func:`half_width` at ``confidence`` is at most
    ``absolute_error``: the least privacy cost (epsilon falls as the noise grows) at which each
    cell meets that accuracy. :data:`MIN_NOISE` when even it misses (the plan's accuracy check
    then fails). The half-width grows with the noise: bracketed by doubling from the normal
    approximation ``absolute_error / z`` (no sum over a far larger sigma's range), then halved
    geometrically."""

    def meets(parameter: float) -> bool:
        return half_width(distribution, parameter, confidence) <= absolute_error

    z = NormalDist().inv_cdf((1 + confidence) / 2)
    guess = min(max(absolute_error / z, MIN_NOISE), MAX_NOISE)
    low, high = guess, guess
    while meets(high) and high < MAX_NOISE:
        low, high = high, min(2 * high, MAX_NOISE)
    if meets(high):
        return MAX_NOISE
    while not meets(low) and low > MIN_NOISE:
        low, high = max(low / 2, MIN_NOISE), low
    if not meets(low):
        return MIN_NOISE
    while high / low > 1 + 1e-9:
        middle = math.sqrt(low * high)
        low, high = (middle, high) if meets(middle) else (low, middle)
    return low


CHOSEN_BY_PLAN = "chosen by plan: the most noise meeting targets.accuracy, cell by cell"
"""What a plan's noise fact says of a parameter it chose (:func:`most_noise`)."""


def error_targets(policy: Policy, name: str, statistic: str | None = None) -> list[tuple[float, float]]:
    """``(confidence, absolute_error)`` of each accuracy target naming mechanism ``name`` with an
    ``absolute_error`` (on ``statistic``, for a kind whose targets name one)."""
    return [
        (target.confidence, target.absolute_error)
        for target in policy.targets.accuracy
        if target.mechanism == name and target.statistic == statistic and target.absolute_error is not None
    ]


def most_noise(distribution: Distribution, targets: list[tuple[float, float]], unit: float = 1.0) -> float:
    """The largest noise parameter meeting every one of ``targets`` (:func:`error_targets`) cell
    by cell (:func:`largest_noise`), their absolute errors in ``unit`` s of the noise (noisy
    sums' totals: the resolution)."""
    assert targets, "policy_issues requires a target for noise left out"
    return min(largest_noise(distribution, confidence, error / unit) for confidence, error in targets)


def all_cells_half_width(distribution: Distribution, parameter: float, confidence: float, cells: int) -> int:
    """The smallest integer ``w`` with ``P(every one of the N cells within ±w) >= confidence``
    (simultaneous, the whole table at once): the noise of the cells is i.i.d., so that
    probability is ``P(|Z| <= w)^N``, and ``w`` is the first with ``P(|Z| > w) <= 1 -
    C^(1/N)`` (:func:`.accuracy.each_cell_miss`, rounded down; exact from the pmf as
    :func:`half_width`, which it equals for N = 1). Posting negative counts as 0 only shrinks
    errors: the statement holds for a ``nonnegative`` table too."""
    from privrelease.mechanisms.accuracy import each_cell_miss

    return _width_for_miss(distribution, parameter, each_cell_miss(confidence, cells))


def _width_for_miss(distribution: Distribution, parameter: float, slack: float) -> int:
    """The smallest integer ``w`` with ``P(|Z| > w) <= slack``, the tail bounded above (discrete
    Laplace ``2 r^(w+1) / (1 + r)``; discrete Gaussian tail sums from the far end, over the lower
    bound of ``C_sigma``, plus the bound beyond the summed range), so the coverage ``1 - slack``
    is never overstated. ``slack`` >= 2^-53 (a confidence < 1 as a float)."""
    parameter = _check(distribution, parameter)
    if distribution == "laplace":
        log_r = -1.0 / parameter

        def outside(w: int) -> float:  # P(|Z| > w) = 2 r^(w+1) / (1 + r), bounded above
            return 2 * math.exp((w + 1) * log_r) / (1 + math.exp(log_r)) * (1 + 8 * _U * (abs((w + 1) * log_r) + 4))

        guess = max(0, math.floor(math.log(slack * (1 + math.exp(log_r)) / 2) / log_r) - 1)
        while guess > 0 and outside(guess - 1) <= slack:
            guess -= 1
        while outside(guess) > slack:
            guess += 1
        return guess
    sigma = parameter
    reach = _reach(sigma)
    log_norm_low, _ = _log_norm_bounds(sigma)
    z = np.arange(1, reach + 1, dtype=np.float64)
    p = np.exp(-(z * z) / (2 * sigma**2) - log_norm_low)  # P(z) bounded above, z = 1..reach
    beyond = math.exp(-((reach + 1) ** 2) / (2 * sigma**2) - log_norm_low) * _tail_ratio(reach + 1, sigma)
    # outside_at[w] = P(|Z| > w) = 2 (sum_{z = w+1}^{reach} P(z) + beyond), w = 0..reach
    outside_at = 2 * (np.append(np.cumsum(p[::-1])[::-1], 0.0) + beyond) * (1 + 4 * _U * (reach + LOG_DROP + 4))
    # outside_at[reach] is below 1e-38 < any slack >= 2^-53 (confidence < 1 as a float)
    return int(np.flatnonzero(outside_at <= slack)[0])


NEGLIGIBLE_EPSILON = 1e-8
"""Below ``e^eps - 1 <= NEGLIGIBLE_EPSILON * delta`` sigma is calibrated at epsilon 0 (:func:`zero_epsilon_sigma`)."""


def zero_epsilon_sigma(epsilon: float, delta: float) -> float | None:
    """The sigma meeting (``epsilon``, ``delta``) in closed form when epsilon is negligible
    (``e^eps - 1 <= 1e-8 delta``), else None. At epsilon 0 the hockey-stick sum telescopes over
    ``z <= 0`` (where ``P(z) > P(z - 1)``) to ``P(0) = 1 / C_sigma``, and by Poisson summation
    ``C_sigma = sigma sqrt(2 pi) sum_k e^(-2 pi^2 sigma^2 k^2) >= sigma sqrt(2 pi)``; so
    ``sigma = 1 / (delta sqrt(2 pi))`` meets it (delta is nonincreasing in epsilon; raised by a
    relative 1e-9, :func:`approximate_delta`'s upper bound meets it too). It is the smallest to
    a relative 1e-7: ``delta(sigma, eps) >= P(0) - (e^eps - 1) / 2``, and the Poisson sum is
    below ``1 + 1e-8`` once ``sigma >= 1`` (a larger delta: None, searched)."""
    if math.expm1(epsilon) > NEGLIGIBLE_EPSILON * delta:
        return None
    sigma = 1.0 / (delta * math.sqrt(2 * math.pi)) * (1 + 1e-9)
    return sigma if sigma >= 1 else None


def calibrate_sigma(epsilon: float, delta: float, sensitivity: int = 1) -> float:
    """The smallest ``sigma`` (to a relative 1e-6, rounded up) whose discrete Gaussian table is
    ``(epsilon, delta)``-DP by its exact delta (:func:`approximate_delta`; for a person of
    ``sensitivity`` m > 1 rows, its zCDP bound): geometric bisection between a ``sigma`` that
    misses the target and one that meets it, returning the latter once they are within a
    relative 1e-6 (the smallest one when delta decreases in sigma, as it does on every grid the
    tests try)."""
    epsilon = _check_epsilon(epsilon)
    if epsilon <= 0:
        raise UserError(f"epsilon must be > 0 to calibrate sigma; got {epsilon!r}", field="epsilon")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise UserError(f"delta must be a number in (0, 1); got {delta!r}", field="delta")

    closed = zero_epsilon_sigma(epsilon, delta) if sensitivity == 1 else None
    if closed is not None:
        return closed

    def meets(sigma: float) -> bool:
        return approximate_delta("gaussian", sigma, epsilon, sensitivity) <= delta

    high = 1.0
    while not meets(high):
        high *= 2
    low = high / 2
    while meets(low):
        high, low = low, low / 2
        if low < 1e-6:
            return high  # noise this small already meets the target (delta near 1)
    while high / low > 1 + 1e-6:
        middle = math.sqrt(low * high)
        if meets(middle):
            high = middle
        else:
            low = middle
    return high


def calibrate_scale(epsilon: float, sensitivity: int = 1) -> float:
    """The discrete Laplace scale ``m / epsilon`` of a pure ``epsilon``-DP table of
    ``sensitivity`` m (1: one row a person; its loss is ``±m / scale``)."""
    epsilon = _check_epsilon(epsilon)
    if epsilon <= 0:
        raise UserError(f"epsilon must be > 0 to calibrate a scale; got {epsilon!r}", field="epsilon")
    return sensitivity / epsilon


def _measurement(distribution: Distribution, parameter: float) -> Any:
    """OpenDP's vector measurement of the table, its privacy map checked against the claim."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    domain = dp.vector_domain(dp.atom_domain(T="i64"))
    if distribution == "gaussian":
        measurement = dp.m.make_gaussian(domain, dp.l2_distance(T="i64"), scale=parameter)
        claimed = 1.0 / (2.0 * parameter**2)  # zCDP rho
    else:
        measurement = dp.m.make_laplace(domain, dp.l1_distance(T="i64"), scale=parameter)
        claimed = 1.0 / parameter  # pure epsilon
    granted = measurement.map(1)
    assert granted <= claimed * (1 + 1e-9), (distribution, parameter, granted, claimed)
    return measurement


def add_noise(counts: np.ndarray, distribution: Distribution, parameter: float) -> np.ndarray:
    """``counts`` (integers, any shape) plus i.i.d. noise, as int64 of the same shape: the discrete
    Gaussian of parameter ``sigma`` (OpenDP ``make_gaussian`` on i64, CKS's sampler) or the
    discrete Laplace of scale ``t`` (OpenDP ``make_laplace`` on i64). One measurement over the
    whole table (L2 / L1 distance, sensitivity 1); randomness only from OpenDP's samplers (OS
    CSPRNG). Large tables are cut into chunks sampled on up to ``os.cpu_count()`` threads."""
    parameter = _check(distribution, parameter)
    values = np.asarray(counts)
    if values.dtype.kind not in "iu" and values.size:
        raise UserError(f"counts must be integers; got an array of {values.dtype}", field="counts")
    flat = values.astype(np.int64, copy=False).ravel()
    if not flat.size:
        return flat.reshape(values.shape)
    return sample(_measurement(distribution, parameter), flat, np.int64).reshape(values.shape)


def sample(measurement: Any, flat: np.ndarray, dtype: Any) -> np.ndarray:
    """OpenDP vector ``measurement`` applied to ``flat`` (one dimension, not empty), as ``dtype``:
    cut into chunks of :data:`SAMPLE_CHUNK` cells sampled on up to ``os.cpu_count()`` threads."""
    parts = [flat[start : start + SAMPLE_CHUNK] for start in range(0, flat.size, SAMPLE_CHUNK)]
    workers = min(len(parts), os.cpu_count() or 1)
    if workers > 1:
        with ThreadPoolExecutor(workers) as pool:
            noisy = list(pool.map(lambda part: measurement(part.tolist()), parts))
    else:
        noisy = [measurement(part.tolist()) for part in parts]
    return np.concatenate([np.asarray(part, dtype=dtype) for part in noisy])


def nonnegative(noisy: np.ndarray) -> np.ndarray:
    """``max(0, x)`` cell by cell: post-processing of the released table, so it costs no privacy;
    it biases small cells upward (a true zero's clamped noise has a positive mean) and can only
    shrink each cell's error, never move it outside its ``±w`` interval."""
    return np.maximum(np.asarray(noisy, dtype=np.int64), 0)


def per_cell_interval(published: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray]:
    """Each published count ``c``'s interval ``[max(0, c - w), max(0, c + w)]`` for its true
    count ``t`` (>= 0): it holds ``t`` whenever ``|noise| <= w``, so with probability >= C for
    ``w = half_width(C)``, cell by cell (not all at once); a count published as 0 (``nonnegative``)
    had ``c + w`` above its noisy value's, so the same holds. Post-processing: no privacy cost."""
    values = np.asarray(published, dtype=np.int64)
    return np.maximum(values - width, 0), np.maximum(values + width, 0)


def domain_issues(
    policy: Policy, here: Loc, columns: tuple[str, ...], table: str, added: tuple[str, ...]
) -> Iterator[Issue]:
    """Every cell column of a table published whole (``columns``, at ``here``) has a declared
    domain (values, or a hierarchy's labels: a domain read from the data would disclose which
    values occur) and is not named like one of the columns ``added`` beside the labels."""
    from privrelease.policies.schema import HierarchyScheme

    for i, column in enumerate(columns):
        if (taken := taken_name(column, table, added)) is not None:
            yield Issue((*here, i), taken)
        spec = policy.dataset.columns.get(column)
        if spec is not None and spec.values is None and not isinstance(policy.scheme_for(column), HierarchyScheme):
            yield Issue(
                (*here, i),
                f"column {column!r} needs declared values (dataset.columns.{column}.values) or a hierarchy: "
                "every cell of the table is published, so its domain is fixed before the data is read",
            )


# --- the kind: policy section, events, accuracy, engines, report -------------------------------

MAX_CELLS = 1_000_000
"""The largest declared domain a table may have (every cell is published, with noise)."""

MAX_NOISE = 1e6
MIN_NOISE = 0.01
"""The smallest noise a policy may name: the discrete Laplace of scale 0.01 is 100-DP (the largest
epsilon a policy states); below it either noise is 0 except with probability under 2e^-100, the
counts published as they are (and the calculus's 1 / sigma^2 would overflow near 1e-154)."""


class DiscreteGaussian(Event):
    """A table of counts of sensitivity ``sensitivity`` (1: one row; ``m``: one person with at
    most ``m`` rows) with discrete Gaussian noise ``sigma``, its guarantee stated at ``epsilon``
    (delta from the exact curve; the module docstring; ``m > 1``: :func:`person_delta`)."""

    kind: Literal["discrete_gaussian"] = "discrete_gaussian"
    sigma: float = Field(gt=0)
    epsilon: float = Field(ge=0)
    sensitivity: int = Field(1, ge=1)
    omitted_at_default: ClassVar[dict[str, Any]] = {**Event.omitted_at_default, "sensitivity": 1}

    def noun(self) -> str:
        return "discrete Gaussian counts"

    def guarantee(self, notion: Notion) -> Guarantee:
        m = self.sensitivity
        if notion == "probabilistic":
            how = (
                "P[loss > eps]"
                if m == 1
                else f"P[loss > eps] <= min_a e^((a-1)(a rho - eps)), rho = {m}^2 / (2 sigma^2)"
            )
            delta = probabilistic_delta("gaussian", self.sigma, self.epsilon, m)
        else:
            how = (
                "exact hockey-stick delta"
                if m == 1
                else f"zCDP rho = {m}^2 / (2 sigma^2), CKS Proposition 12 (a bound for every spread of a person's rows)"
            )
            delta = approximate_delta("gaussian", self.sigma, self.epsilon, m)
        return Guarantee(notion, self.epsilon, delta, True, f"discrete Gaussian (sigma {self.sigma:g}), {how}")

    def pld(self, discretization: float) -> Any:
        if self.sensitivity == 1:
            return noise_pld("gaussian", self.sigma, discretization)
        delta = approximate_delta("gaussian", self.sigma, self.epsilon, self.sensitivity)
        return zcdp.stated_pair_pld(self.epsilon, delta, discretization)  # PERSON_PAIR

    def exact_curve(self) -> Callable[[float], float] | None:
        """The exact curve of one row's table; none for a person's rows (:data:`PERSON_PAIR`)."""
        sigma = self.sigma
        return None if self.sensitivity > 1 else lambda epsilon: approximate_delta("gaussian", sigma, epsilon)

    def renyi(self, orders: Any) -> Any:
        """``a m^2 / (2 sigma^2)``: the discrete Gaussian of sensitivity 1 is ``1 / (2 sigma^2)``-zCDP,
        as the continuous one (Canonne-Kamath-Steinke Theorem 4; OpenDP's map, checked at every
        release, says the same); a person moving cells by ``k_i`` (``sum k_i <= m``) adds the
        cells' divergences, ``a sum k_i^2 / (2 sigma^2) <= a m^2 / (2 sigma^2)``."""
        return np.asarray(orders, dtype=float) * self.sensitivity**2 / (2 * self.sigma**2)


class DiscreteLaplace(Event):
    """A table of counts of sensitivity ``sensitivity`` (L1: one person with at most ``m`` rows
    moves the cells by ``m`` in all) with discrete Laplace noise of scale ``scale``: pure
    (m/scale)-DP, exactly (the loss of a cell moved by ``k`` is at most ``k/t``, and one cell moved
    by ``m`` reaches ``m/t``)."""

    kind: Literal["discrete_laplace"] = "discrete_laplace"
    scale: float = Field(gt=0)
    sensitivity: int = Field(1, ge=1)
    omitted_at_default: ClassVar[dict[str, Any]] = {**Event.omitted_at_default, "sensitivity": 1}

    def noun(self) -> str:
        return "discrete Laplace counts"

    def guarantee(self, notion: Notion) -> Guarantee:
        m = self.sensitivity
        return pure(
            notion, m / self.scale, f"discrete Laplace (scale {self.scale:g})" + (f", sensitivity {m}" if m > 1 else "")
        )

    def pld(self, discretization: float) -> Any:
        from privrelease.mechanisms.kinds import pure_dp_pld

        if self.sensitivity == 1:
            return noise_pld("laplace", self.scale, discretization)
        return pure_dp_pld(self.sensitivity / self.scale, discretization)  # PERSON_PAIR


NOISE_RANGE = f"a number in [{MIN_NOISE:g}, {MAX_NOISE:g}]"
Sigma = Annotated[float, checked("sigma", NOISE_RANGE, lambda v: MIN_NOISE <= v <= MAX_NOISE)]
Scale = Annotated[float, checked("scale", NOISE_RANGE, lambda v: MIN_NOISE <= v <= MAX_NOISE)]


CHOSEN = Field(
    None,
    json_schema_extra={
        "x-default": "chosen by plan: the most noise meeting every targets.accuracy entry naming the mechanism"
    },
)


class GaussianNoise(Model):
    """Discrete Gaussian noise N_Z(0, sigma^2) on every cell; without ``sigma``, the largest one
    whose half-width meets every ``absolute_error`` target naming the mechanism (:func:`largest_noise`)."""

    distribution: Literal["gaussian"]
    sigma: Sigma | None = CHOSEN


class LaplaceNoise(Model):
    """Discrete Laplace noise of scale ``scale`` on every cell: (1/scale)-DP; without ``scale``,
    the largest one whose half-width meets every ``absolute_error`` target naming the mechanism."""

    distribution: Literal["laplace"]
    scale: Scale | None = CHOSEN


class NoisyCountsMechanism(MechanismKind):
    """Counts of every cell of the declared domain of ``columns`` (each column's declared
    values, generalized by its scheme; a hierarchy column's labels at its level), zeros
    included, nothing suppressed, each with discrete Gaussian or discrete Laplace noise; a
    person changes one cell by one (sensitivity 1), or, with ``dataset.person`` naming a column,
    up to ``max_rows`` cells by one, or one cell by ``max_rows`` (sensitivity ``max_rows`` in L1
    and L2). ``noise`` without its sigma or scale: the most noise meeting every ``absolute_error``
    target naming the table, cell by cell (:func:`largest_noise`). ``nonnegative``: negative noisy counts
    published as 0 (post-processing). ``epsilon``: where a Gaussian table states its delta
    (default: the smallest epsilon reaching ``targets.delta``). Each count comes with ``lower``
    and ``upper``: its interval at the accuracy target's confidence (default 95%), cell by cell."""

    type: Literal["noisy_counts"]
    columns: Annotated[Names, at_least(1, "column")]
    noise: Annotated[GaussianNoise | LaplaceNoise, Field(discriminator="distribution")]
    epsilon: Epsilon | None = None
    nonnegative: StrictBool = False

    label: ClassVar[str] = "noisy counts (discrete noise on every cell)"
    accuracy_fields: ClassVar[tuple[str, ...]] = ("absolute_error",)
    reads_max_rows: ClassVar[bool] = True

    @property
    def _distribution(self) -> Distribution:
        return "gaussian" if isinstance(self.noise, GaussianNoise) else "laplace"

    def _noise(self, loaded: LoadedPolicy) -> tuple[Distribution, float]:
        """The noise distribution and its parameter as the release runs (:meth:`resolved`)."""
        distribution = self._distribution
        return distribution, getattr(self.resolved(loaded).noise, _parameter_name(distribution))

    def resolved(self, loaded: LoadedPolicy) -> NoisyCountsMechanism:
        """With the noise parameter the plan chose when the policy leaves it out: the largest
        meeting every ``absolute_error`` target naming this mechanism (:func:`most_noise`, cell
        by cell)."""
        name = _parameter_name(self._distribution)
        if getattr(self.noise, name) is not None:
            return self
        chosen = most_noise(self._distribution, error_targets(loaded.policy, self.name))
        return self.model_copy(update={"noise": self.noise.model_copy(update={name: chosen})})

    def column_refs(self) -> list[ColumnRef]:
        return [ColumnRef(("columns", i), c) for i, c in enumerate(self.columns)]

    def policy_issues(self, policy: Policy, here: Loc) -> Iterator[Issue]:
        """Every column's domain is declared (values, or a hierarchy's labels): a domain read
        from the data would disclose which values occur. No column is named like the output's
        ``count``, ``lower`` or ``upper`` columns, which would take their place. Noise without
        its parameter needs an ``absolute_error`` target naming the mechanism to choose it by."""
        yield from domain_issues(policy, (*here, "columns"), self.columns, "a noisy table", NOISY_TABLE)
        name = _parameter_name(self._distribution)
        if getattr(self.noise, name) is None and not error_targets(policy, self.name):
            yield Issue(
                (*here, "noise", name),
                f"give noise.{name}, or an accuracy target naming {self.name!r} with absolute_error "
                f"(targets.accuracy) for plan to choose the most noise that meets it",
            )

    def delta_reason(self) -> str | None:
        return "has Gaussian noise" if isinstance(self.noise, GaussianNoise) else None

    def _event(self, loaded: LoadedPolicy) -> Event:
        """Its event for one person: sensitivity ``dataset.rows_per_person`` (:data:`PERSON_PAIR`)."""
        distribution, parameter = self._noise(loaded)
        m = loaded.policy.dataset.rows_per_person
        if distribution == "laplace":
            return DiscreteLaplace(scale=parameter, sensitivity=m)
        epsilon = self.epsilon
        if epsilon is None:
            targets = loaded.policy.targets
            assert targets.delta is not None, "the policy checks require targets.delta for Gaussian noise"
            delta_of = probabilistic_delta if targets.accounting == "probabilistic" else approximate_delta
            epsilon = zcdp.smallest_stated_epsilon(lambda e: delta_of("gaussian", parameter, e, m), targets.delta)
        return DiscreteGaussian(sigma=parameter, epsilon=epsilon, sensitivity=m)

    def plan(self, loaded: LoadedPolicy) -> Planned:
        distribution, parameter = self._noise(loaded)
        cells = self._cells(loaded)
        facts: dict[str, Any] = {
            "cells": cells,
            "noise": f"discrete {distribution.capitalize()}, {_parameter_name(distribution)} "
            + (
                f"{parameter:g}"
                if getattr(self.noise, _parameter_name(distribution)) is not None
                else f"{parameter:.10g} ({CHOSEN_BY_PLAN})"
            ),
            "sensitivity": _sensitivity_fact(loaded.policy.dataset.rows_per_person),
        }
        if distribution == "gaussian":
            facts["zcdp_rho"] = loaded.policy.dataset.rows_per_person**2 / (2 * parameter**2)
        if cells > MAX_CELLS:
            return Planned(None, facts, ("declared domain", f"at most {MAX_CELLS:,} cells; it has {cells:,}"))
        return Planned(self._event(loaded), facts)

    def accuracy(self, loaded: LoadedPolicy, planned: Planned) -> AccuracyStatement:
        """Each published count is within +-w of its true count with probability >= C, w the
        exact half-width of the discrete noise (:func:`half_width`); all N cells at once within
        +-w_N (:func:`all_cells_half_width`); the output's ``lower`` / ``upper`` columns at the
        confidence of the accuracy target naming it (default 95%)."""
        from privrelease.mechanisms.kinds import CONFIDENCES, AccuracyStatement, NoiseAccuracy

        distribution, parameter = self._noise(loaded)
        cells = self._cells(loaded)
        widths = {c: half_width(distribution, parameter, c) for c in CONFIDENCES}
        together = {c: all_cells_half_width(distribution, parameter, c, cells) for c in CONFIDENCES}
        clamping = "negative counts are published as 0: small cells are biased upwards" if self.nonnegative else None
        estimate = "the published count" + (" (negative counts published as 0)" if self.nonnegative else "")
        confidence = half_width_target(loaded, self.name)[0]
        noise = NoiseAccuracy(parameter, widths, clamping, cells, together, confidence)
        return AccuracyStatement(estimate, noise=noise)

    def accuracy_check(self, loaded: LoadedPolicy, target: AccuracyTarget, planned: Planned) -> AccuracyCheck:
        """Each cell within +-absolute_error with probability >= confidence (a per-cell target)."""
        assert target.absolute_error is not None
        distribution, parameter = self._noise(loaded)
        return AccuracyCheck(
            "each cell's noise half-width",
            "<=",
            target.absolute_error,
            half_width(distribution, parameter, target.confidence),
        )

    def _cells(self, loaded: LoadedPolicy) -> int:
        """The number of cells of the declared domain (every one published)."""
        return math.prod(len(labels) for labels in loaded.labels(self.columns).values())

    def frontier(self, loaded: LoadedPolicy) -> Frontier:
        """Over sigma (Gaussian) or scale (Laplace) on a log grid, a decade either side of the
        policy's: the table's epsilon at the target delta (its event with that noise,
        :func:`.epsilon_at_target`) and the half-width :func:`half_width` at the accuracy
        target's confidence (default 95%)."""
        distribution, parameter = self._noise(loaded)
        confidence, limit, label = half_width_target(loaded, self.name)
        axis = Axis(
            "σ" if distribution == "gaussian" else "scale",
            f"noise.{_parameter_name(distribution)}",
            f"{confidence:.0%} half-width of each count ("
            + ("people" if loaded.policy.dataset.rows_per_person == 1 else "rows kept")
            + ")",
            False,
            f"Accuracy: each published count (each cell on its own, not all at once) is within ± the half-width "
            f"of its true count with probability "
            f"at least {confidence:.0%} (discrete {distribution.capitalize()} noise, exact).",
            limit,
            label,
            log_x=True,
        )
        return frontier_of(
            loaded,
            axis,
            parameter,
            log_grid(parameter, low=MIN_NOISE, high=MAX_NOISE),
            lambda value: self._with_noise(value)._event(loaded),
            lambda value: half_width(distribution, value, confidence),
        )

    def _with_noise(self, value: float) -> NoisyCountsMechanism:
        """This table with noise parameter ``value`` (its delta stated at the target delta)."""
        distribution = self._distribution
        noise = GaussianNoise(distribution="gaussian", sigma=value) if distribution == "gaussian" else None
        return self.model_copy(
            update={"noise": noise or LaplaceNoise(distribution="laplace", scale=value), "epsilon": None}
        )

    def job(self, loaded: LoadedPolicy) -> CountJob:
        return CountJob.declared(loaded, self.columns)

    def finish(self, loaded: LoadedPolicy, merged: Any) -> MechanismResult:
        """Noise added once to the exact counts of every cell (merged over partitions on Dask)."""
        return self._release(loaded, self.job(loaded), merged)

    def _release(self, loaded: LoadedPolicy, job: CountJob, merged: Any) -> MechanismResult:
        """The table: ``merged`` (exact counts, row-major over ``job``'s domain) with noise."""
        from privrelease.mechanisms.kinds import MechanismResult

        distribution, parameter = self._noise(loaded)
        noisy = add_noise(np.asarray(merged, dtype=np.int64), distribution, parameter)
        if self.nonnegative:
            noisy = nonnegative(noisy)
        width = half_width(distribution, parameter, half_width_target(loaded, self.name)[0])
        columns = job.labels()
        lower, upper = per_cell_interval(noisy, width)
        for name, values in zip(NOISY_TABLE, (noisy, lower, upper), strict=True):
            columns[name] = pa.array(values)
        public = {"cells": int(noisy.size), "noise": f"discrete {distribution}", "nonnegative": self.nonnegative}
        return MechanismResult(pa.table(columns), self._event(loaded), public, {"rows_counted": int(np.sum(merged))})

    def explanations(self) -> tuple[str, ...]:
        return (EXPLANATION,)

    def example_run(self, loaded: LoadedPolicy, rows: int) -> tuple[dict[str, Any], int]:
        """Every cell of the declared domain published, each row counted."""
        return {"rows_counted": rows}, self.job(loaded).cells


KINDS = (NoisyCountsMechanism,)


def _sensitivity_fact(m: int) -> str:
    if m == 1:
        return "1 (one person changes one cell by one)"
    return f"{m} in L1 and L2 (one person, at most {m} rows, changes up to {m} cells by one, or one cell by {m})"


@dataclass(frozen=True)
class CountJob:
    """The exact count of every cell of ``domain`` (row-major over its columns)."""

    schemes: dict[str, ColumnScheme]
    domain: dict[str, tuple[Any, ...]]

    @classmethod
    def declared(cls, loaded: LoadedPolicy, columns: tuple[str, ...]) -> CountJob:
        """The cells of the declared domain of ``columns`` (:meth:`LoadedPolicy.labels`)."""
        domain = loaded.labels(columns)
        return cls(loaded.published_schemes(columns), {column: tuple(labels) for column, labels in domain.items()})

    def labels(self) -> dict[str, pa.Array]:
        """Each cell's labels, one array per column, row-major over ``domain`` (as :meth:`partial`);
        none for the one cell of no columns (a grand total)."""
        if not self.domain:
            return {}
        shape = tuple(len(labels) for labels in self.domain.values())
        position = np.unravel_index(np.arange(self.cells), shape)
        return {
            column: pa.array(labels).take(pa.array(index))
            for (column, labels), index in zip(self.domain.items(), position, strict=True)
        }

    @property
    def cells(self) -> int:
        """How many cells the table has (every one published)."""
        return math.prod(len(labels) for labels in self.domain.values())

    def partial(self, table: pa.Table) -> np.ndarray:
        return by_columns(self, table)

    def column_partial(self, rows: int) -> CountPartial:
        """:meth:`partial` one column at a time."""
        return CountPartial(CellIndex(self, rows))

    def index_of(self, name: str, column: pa.ChunkedArray) -> np.ndarray:
        """Each row's label of ``column`` (generalized by its scheme) as its index in the domain."""
        import pyarrow.compute as pc

        from privrelease.mechanisms.generalization import generalize

        values = generalize(pa.table({name: column}), {name: self.schemes[name]}).column(name)
        if pa.types.is_dictionary(values.type):
            values = values.cast(values.type.value_type)
        index = pc.index_in(values, value_set=pa.array(self.domain[name], type=values.type))
        if index.null_count:
            raise UserError(f"column {name!r} has a value outside its declared domain")  # data checks refuse earlier
        return index.to_numpy(zero_copy_only=False).astype(np.int64)

    def merge(self, parts: list[np.ndarray]) -> np.ndarray:
        return np.asarray(np.sum(parts, axis=0, dtype=np.int64))


class CellIndex:
    """Each of ``rows`` rows' cell of ``job``'s domain (its index, row-major; 0 without
    columns), built one column at a time: a domain column's label index times its stride
    (the product of the later columns' sizes) is added as the column comes."""

    def __init__(self, job: CountJob, rows: int):
        sizes = [len(labels) for labels in job.domain.values()]
        self.job = job
        self._added: set[str] = set()
        self._strides = {name: math.prod(sizes[i + 1 :]) for i, name in enumerate(job.domain)}
        self.cell = np.zeros(rows, dtype=np.int64)

    def add(self, name: str, column: pa.ChunkedArray) -> None:
        """Add column ``name``'s share of every row's cell (nothing when not in the domain)."""
        if name in self._strides:
            self.cell += self.job.index_of(name, column) * self._strides[name]
            self._added.add(name)

    def cells(self) -> np.ndarray:
        """Every row's cell, once each domain column was added."""
        assert self._added == set(self._strides), "every column of the domain is added"
        return self.cell


@dataclass
class CountPartial:
    """:meth:`CountJob.partial` one column at a time: the rows per cell."""

    index: CellIndex

    def add(self, name: str, column: pa.ChunkedArray) -> None:
        self.index.add(name, column)

    def result(self) -> np.ndarray:
        return np.bincount(self.index.cells(), minlength=self.index.job.cells).astype(np.int64)


EXPLANATION = """<dt>Noisy counts</dt>
<dd>Every cell of the table's declared domain is published, empty ones included, so which cells are empty is never revealed; each count has independent noise added, drawn from a discrete Gaussian or discrete Laplace distribution (OpenDP's exact samplers). Adding or removing one person changes one cell by one (a person with several rows, at most m kept: the cells by m in all, and the ε and δ shown are for that), so the table is ε-differentially private (Laplace, ε = 1/scale, or m/scale) or (ε, δ)-differentially private at the ε and δ shown (Gaussian, exact δ; Canonne, Kamath, Steinke 2020). Negative published counts, where the policy asks for them to be shown as 0, are post-processing and cost no privacy. Each published count comes with the columns lower and upper, the count ∓ the noise's half-width (never below 0): each cell's interval holds its true count with the stated probability, cell by cell; that every cell's interval holds at once is less likely, and the accuracy section states the wider half-width that covers the whole table at once.</dd>"""
