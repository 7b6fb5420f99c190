"""What SPLU-Gen guarantees: small-sum privacy and large-sum utility (Fu, Wang, Wong, Wang,
Jiang, "Small sum privacy and large sum utility in data publishing", J. Biomed. Inform. 2014).

These are **not** differential-privacy guarantees. SPLU-Gen promises that counts estimated
from the published table are *inaccurate* when the true count is small and *accurate* when it
is large, each promise with its own scope:

- **large-sum utility** (Definition 1, Theorem 3, Lemma 1): for the count of one sensitive value
  on its own, over all rows (its published count ``f'``), if its true count is ``f >= T_f`` the
  estimate is off by at least ``eps * f`` with probability at most ``T_E``. That is all Lemma 1
  claims ("for each sensitive value"): counts that also condition on non-sensitive columns or
  on other sensitive values (Section 5's reconstruction) have no such guarantee and miss far
  more often (:mod:`.splu_scope` says so in words; tested by simulation). The paper's
  Inequality (3) has an arithmetic error: the estimate ``f' ~ Binomial(gamma f, 1/gamma)`` has
  variance ``f (1 - 1/gamma)``, so Chebyshev gives ``Pr[|f' - f| >= eps f] <= (1 - 1/gamma) /
  (eps^2 f)``, not the printed ``1 / (gamma eps^2 f^2)``, and Lemma 1's
  ``T_f = (gamma eps^2 T_E)^(-1/2)`` is far too small (gamma 5, eps 0.1, T_E 0.05: 20, where the
  miss probability at f = 20 is 0.71). :func:`utility_threshold` computes T_f exactly from the
  binomial model instead: every ``f`` below a Chernoff point F is checked exactly, and beyond F
  ``exp(-eps^2 f / (2 + eps)) + exp(-min(eps, 1)^2 f / 2)``, decreasing in f, bounds the miss
  probability by ``T_E`` (Mitzenmacher-Upfal, Theorems 4.4 and 4.5).
- **small-sum privacy** (Definition 2, Lemma 2, Theorem 4; Lemma 3 for conjunctions): for every
  true count ``f <= alpha`` the estimate is off by more than ``eps * f`` with probability at least

  ``T_p = min_{f in 1..alpha} 1 - sum_{x = ceil((1-eps) f)}^{floor((1+eps) f)}
  binom(gamma f, x) (1/gamma)^x (1 - 1/gamma)^(gamma f - x)``

  because the published count of a value that truly occurs ``f`` times is
  Binomial(gamma * f, 1/gamma). The lower summation limit is rounded *up* as in the paper's
  Examples 1 and 2 (Theorem 4 prints a floor; the Examples and Fig. 5 use the ceiling:
  ``f = 5, eps = 0.3`` sums ``x = 4..6``). With closed limits the sum counts a deviation of
  exactly ``eps * f`` as "close", so ``T_p`` bounds ``Pr[|f' - f| > eps f]`` and hence also
  Definition 2's ``Pr[|f' - f| >= eps f]`` from below: the stated guarantee is conservative.

``eps`` is read as the decimal number it prints as (``0.3`` is 3/10 exactly), so the summation
limits are exact integers, not the result of binary floating-point rounding.

The guarantees depend only on gamma, eps, alpha and T_E: not on the data, not on N.

>>> round(privacy_probability(gamma=10, eps=0.3, f=5).item(), 2)  # Example 1
0.48
>>> privacy_threshold(gamma=10, eps=0.3, alpha=3).t_p >= 0.6  # Example 2
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from privrelease.errors import UserError
from privrelease.mechanisms.binomial import lower_tail, upper_tail
from privrelease.mechanisms.confidence import check_confidence
from privrelease.mechanisms.splu_scope import UTILITY_SCOPE


def _check_gamma(gamma: int) -> int:
    if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)) or gamma < 2:
        raise UserError(f"gamma must be an integer >= 2; got {gamma!r}")
    return int(gamma)


def _check_eps(eps: float) -> Fraction:
    if isinstance(eps, bool) or not isinstance(eps, (int, float, np.floating, np.integer)):
        raise UserError(f"eps must be a number > 0; got {eps!r}")
    if not math.isfinite(float(eps)) or eps <= 0:
        raise UserError(f"eps (relative error bound) must be a finite number > 0; got {eps!r}")
    return Fraction(str(float(eps)))


def _check_positive_int(name: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise UserError(f"{name} must be an integer >= 1; got {value!r}")
    return int(value)


def summation_limits(eps: float, f: np.ndarray | int) -> tuple[np.ndarray, np.ndarray]:
    """``(ceil((1 - eps) f), floor((1 + eps) f))`` per true count ``f``, in exact rational
    arithmetic (the lower limit clipped at 0). These are the published counts the paper counts
    as "within eps of f" (Lemma 2, Examples 1-2)."""
    ratio = _check_eps(eps)
    counts = np.atleast_1d(np.asarray(f, dtype=np.int64)).astype(object)
    p, q = ratio.numerator, ratio.denominator
    lower = -((-(q - p) * counts) // q)  # ceil((1 - eps) f) = ceil((q - p) f / q)
    upper = ((q + p) * counts) // q  # floor((1 + eps) f)
    lower = np.maximum(lower.astype(np.int64), 0)
    return lower, upper.astype(np.int64)


def privacy_probability(gamma: int, eps: float, f: np.ndarray | int) -> np.ndarray:
    """Probability that the published count of a value with true count ``f`` falls outside
    ``[ceil((1 - eps) f), floor((1 + eps) f)]``: ``1 - sum_x binom(gamma f, x) gamma^-x
    (1 - 1/gamma)^(gamma f - x)`` (Fu et al., Section 4.2, Example 1). Vectorized over ``f``.

    This is a small-sum *privacy* figure (higher = less accurate estimate = more private), not a
    differential-privacy epsilon.
    """
    gamma = _check_gamma(gamma)
    counts = np.atleast_1d(np.asarray(f))
    if counts.size and (counts.min() < 1 or not np.all(counts == np.floor(counts))):
        raise UserError(f"true counts f must be integers >= 1; got {counts.min()!r}")
    counts = counts.astype(np.int64)
    lower, upper = summation_limits(eps, counts)
    n = gamma * counts
    inside = lower_tail(upper, n, 1.0 / gamma) - lower_tail(lower - 1, n, 1.0 / gamma)
    return np.clip(1.0 - inside, 0.0, 1.0)


def privacy_curve(gamma: int, eps: float, f_max: int) -> tuple[np.ndarray, np.ndarray]:
    """``(f, probability)`` for ``f = 1..f_max``: the sawtooth curve of Fu et al., Fig. 5
    (probability that the estimated count misses the true count by more than ``eps f``), for
    report charts. Not differential privacy."""
    f_max = _check_positive_int("f_max", f_max)
    counts = np.arange(1, f_max + 1, dtype=np.int64)
    return counts, privacy_probability(gamma, eps, counts)


@dataclass(frozen=True)
class SmallSumPrivacy:
    """Small-sum privacy of SPLU-Gen (Fu et al., Theorem 4): for every concept whose true count
    is at most ``alpha``, ``Pr[relative error > eps] >= t_p``; ``argmin_f`` is the count that
    attains the minimum. Not differential privacy."""

    gamma: int
    eps: float
    alpha: int
    t_p: float
    argmin_f: int


def privacy_threshold(gamma: int, eps: float, alpha: int) -> SmallSumPrivacy:
    """T_p of Lemma 2 / Theorem 4: the minimum of :func:`privacy_probability` over
    ``f in [1..alpha]`` (Fu et al.; Example 2: gamma = 10, eps = 0.3, alpha = 3 gives
    T_p >= 0.6)."""
    alpha = _check_positive_int("alpha", alpha)
    counts, probability = privacy_curve(gamma, eps, alpha)
    index = int(np.argmin(probability))
    return SmallSumPrivacy(
        gamma=int(gamma),
        eps=float(eps),
        alpha=alpha,
        t_p=float(probability[index]),
        argmin_f=int(counts[index]),
    )


def utility_miss_probability(gamma: int, eps: float, f: np.ndarray | int) -> np.ndarray:
    """``Pr[|f' - f| >= eps f]`` for ``f' ~ Binomial(gamma f, 1/gamma)``, the estimate of a true
    count ``f``: the exact probability that large-sum utility (Definition 1) misses at ``f``.
    The limits ``floor((1 - eps) f)`` and ``ceil((1 + eps) f)`` are exact rationals. Vectorized."""
    gamma = _check_gamma(gamma)
    ratio = _check_eps(eps)
    counts = np.atleast_1d(np.asarray(f))
    if counts.size and (counts.min() < 1 or not np.all(counts == np.floor(counts))):
        raise UserError(f"true counts f must be integers >= 1; got {counts.min()!r}")
    exact = counts.astype(np.int64).astype(object)
    p, q = ratio.numerator, ratio.denominator
    low = ((q - p) * exact) // q  # floor((1 - eps) f): estimates at most this are misses
    high = -((-(q + p) * exact) // q)  # ceil((1 + eps) f): estimates at least this are misses
    n = gamma * counts.astype(np.int64)
    below = lower_tail(low.astype(np.float64), n, 1.0 / gamma)
    above = upper_tail(high.astype(np.float64), n, 1.0 / gamma)
    return np.clip(below + above, 0.0, 1.0)


_BLOCK = 1 << 20
"""Counts checked per vectorized step of :func:`utility_threshold`."""

_MAX_EXACT = 1 << 21
"""Beyond this many counts to check, the Chernoff point itself is T_f (sound, less tight)."""

_PROBABILITY_SLACK = 1e-9
"""A computed miss probability counts as above T_E once within this relative amount of it
(the binomial tails are accurate to far better than that)."""


def chernoff_point(eps: float, t_e: float) -> int:
    """The least integer F with ``exp(-eps^2 F / (2 + eps)) <= T_E / 2`` and
    ``exp(-min(eps, 1)^2 F / 2) <= T_E / 2``: for every ``f >= F`` the miss probability is at
    most T_E (multiplicative Chernoff bounds of the upper and lower tail, mean f)."""
    e = float(eps)
    log_ratio = math.log(2.0 / t_e)
    return max(1, math.ceil(max((2 + e) / e**2, 2 / min(e, 1.0) ** 2) * log_ratio * (1 + 1e-12)))


def utility_threshold(gamma: int, eps: float, t_e: float) -> int:
    """T_f of large-sum utility, exact in the binomial model: the least integer T such that
    every lone sensitive value's true count ``f >= T`` is estimated within relative error ``eps`` except with
    probability at most ``t_e`` (:func:`utility_miss_probability`; the paper's Lemma 1 formula
    is wrong, see the module docstring). Counts below the :func:`chernoff_point` are checked
    exactly, from the top down."""
    gamma = _check_gamma(gamma)
    _check_eps(eps)
    if isinstance(t_e, bool) or not isinstance(t_e, (int, float, np.floating)):
        raise UserError(f"t_e must be a number in (0, 1]; got {t_e!r}")
    if not 0.0 < float(t_e) <= 1.0:
        raise UserError(f"t_e (utility error probability) must be in (0, 1]; got {t_e!r}")
    limit = chernoff_point(eps, float(t_e))
    if limit > _MAX_EXACT:
        return limit
    top = limit - 1
    while top >= 1:
        counts = np.arange(max(1, top - _BLOCK + 1), top + 1, dtype=np.int64)
        missed = utility_miss_probability(gamma, eps, counts) > float(t_e) * (1 - _PROBABILITY_SLACK)
        if missed.any():
            return int(counts[np.flatnonzero(missed)[-1]]) + 1
        top = int(counts[0]) - 1
    return 1


@dataclass(frozen=True)
class SPLUCalibration:
    """Both SPLU guarantees for one parameter set (what ``privrelease calibrate splu`` prints).
    ``t_e`` / ``t_f`` are None when no utility error probability was asked for."""

    gamma: int
    eps: float
    alpha: int
    t_p: float
    argmin_f: int
    t_e: float | None
    t_f: int | None

    def as_dict(self) -> dict[str, object]:
        """JSON-ready fields, with a note that this is not differential privacy."""
        document: dict[str, object] = {
            "gamma": self.gamma,
            "eps": self.eps,
            "alpha": self.alpha,
            "t_p": self.t_p,
            "argmin_f": self.argmin_f,
        }
        if self.t_e is not None:
            document["t_e"] = self.t_e
            document["t_f"] = self.t_f
            document["large_sum_covers"] = UTILITY_SCOPE
        document["model"] = "SPLU small-sum privacy / large-sum utility (not differential privacy)"
        return document


def calibrate(gamma: int, eps: float, alpha: int, t_e: float | None = None) -> SPLUCalibration:
    """T_p (Theorem 4) for counts up to ``alpha`` and, when ``t_e`` is given, T_f (large-sum
    utility, exact in the binomial model: :func:`utility_threshold`)."""
    privacy = privacy_threshold(gamma, eps, alpha)
    t_f = None if t_e is None else utility_threshold(gamma, eps, t_e)
    return SPLUCalibration(
        gamma=privacy.gamma,
        eps=privacy.eps,
        alpha=privacy.alpha,
        t_p=privacy.t_p,
        argmin_f=privacy.argmin_f,
        t_e=None if t_e is None else float(t_e),
        t_f=t_f,
    )


_TAIL_SLACK = 1e-9
"""Relative slack on the tails' comparisons, towards a wider interval (the tails carry a
relative error of about 1e-12)."""


def count_interval(observed: int, gamma: int, confidence: float, rows: int | None = None) -> tuple[int, int]:
    """An exact confidence interval for the true count f of one sensitive value from its
    published count x (SPLU-Gen: X ~ Binomial(gamma f, 1/gamma), Fu et al. Theorem 2), by
    inverting the two one-sided binomial tests (Clopper-Pearson): ``[f_L, f_U]`` with f_L the
    smallest f with P_f[X >= x] > (1 - C)/2 and f_U the largest f with P_f[X <= x] > (1 - C)/2
    (at most ``rows``, the published rows). Both tails are monotone in f, so for every f the
    interval misses f with probability at most (1 - C)/2 on each side: coverage >= C, whatever
    f is (tested against the exact distribution)."""
    _check_gamma(gamma)
    check_confidence(confidence)
    if observed < 0 or (rows is not None and observed > rows):
        raise ValueError(f"observed count {observed} outside [0, {rows}]")
    half = (1 - confidence) / 2 * (1 - _TAIL_SLACK)
    p = 1 / gamma

    def above(f: int) -> bool:  # P_f[X >= x] > half: f not rejected from below
        return bool(upper_tail(observed, gamma * f, p) > half)

    def below(f: int) -> bool:  # P_f[X <= x] > half: f not rejected from above
        return bool(lower_tail(observed, gamma * f, p) > half)

    low, high = 0, observed  # above(observed) holds: the median of Bin(gamma x, 1/gamma) is x
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if above(middle) else (middle + 1, high)
    f_low = low
    top = max(2 * observed, 16)
    while below(top) and (rows is None or top < rows):
        top *= 2
    low, high = observed, top if rows is None else min(top, rows)
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if below(middle) else (low, middle - 1)
    return f_low, low
