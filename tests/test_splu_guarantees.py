"""SPLU guarantees (Fu et al. 2014): Lemma 1 (T_f), Lemma 2 / Theorem 4 (T_p), Examples 1-2,
cross-checked with exact rational arithmetic and mpmath."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from scipy import stats

from privrelease.errors import UserError
from privrelease.mechanisms.splu_guarantees import (
    calibrate,
    chernoff_point,
    privacy_curve,
    privacy_probability,
    privacy_threshold,
    summation_limits,
    utility_miss_probability,
    utility_threshold,
)


def exact_privacy(gamma: int, eps: str, f: int) -> Fraction:
    """1 - sum_{x=ceil((1-eps) f)}^{floor((1+eps) f)} C(gamma f, x) (gamma-1)^(gamma f - x) /
    gamma^(gamma f), in integers."""
    e = Fraction(eps)
    lower = max(0, math.ceil((1 - e) * f))
    n = gamma * f
    upper = min(n, math.floor((1 + e) * f))
    inside = sum(math.comb(n, x) * (gamma - 1) ** (n - x) for x in range(lower, upper + 1))
    return 1 - Fraction(inside, gamma**n)


def mpmath_privacy(gamma: int, eps: float, f: int) -> mpmath.mpf:
    lower = max(0, math.ceil((1 - Fraction(str(eps))) * f))
    n = gamma * f
    upper = min(n, math.floor((1 + Fraction(str(eps))) * f))
    with mpmath.workdps(40):
        p = mpmath.mpf(1) / gamma
        inside = mpmath.fsum(mpmath.binomial(n, x) * p**x * (1 - p) ** (n - x) for x in range(lower, upper + 1))
        return 1 - inside


def test_example_1_pinned() -> None:
    # f_s = 5, gamma = 10, eps = 0.3: sum_{x=4}^{6} C(50, x) 0.1^x 0.9^(50-x) = 0.52 -> 0.48
    lower, upper = summation_limits(0.3, 5)
    assert (lower[0], upper[0]) == (4, 6)
    probability = privacy_probability(10, 0.3, 5)[0]
    assert round(probability, 2) == 0.48
    assert probability == pytest.approx(float(exact_privacy(10, "0.3", 5)), abs=1e-14)
    assert round(1 - probability, 2) == 0.52


def test_example_2_pinned() -> None:
    # alpha = 3, eps = 0.3: T_p = 0.6 is satisfied with gamma = 10 (Fig. 5)
    result = privacy_threshold(gamma=10, eps=0.3, alpha=3)
    assert result.t_p >= 0.6
    assert result.argmin_f == 1
    assert result.t_p == pytest.approx(float(exact_privacy(10, "0.3", 1)), abs=1e-14)
    assert result.t_p == pytest.approx(0.6126, abs=1e-4)  # 1 - C(10,1) 0.1 0.9^9
    # the limits of Example 2: ceil(0.7 f) .. floor(1.3 f)
    lower, upper = summation_limits(0.3, np.arange(1, 4))
    assert lower.tolist() == [1, 2, 3] and upper.tolist() == [1, 2, 3]


@pytest.mark.parametrize("gamma", [2, 5, 10])
@pytest.mark.parametrize("eps", ["0.1", "0.3", "0.5", "1.5"])
def test_matches_exact_arithmetic_and_mpmath(gamma: int, eps: str) -> None:
    counts, probability = privacy_curve(gamma, float(eps), 25)
    for f, value in zip(counts, probability, strict=True):
        exact = exact_privacy(gamma, eps, int(f))
        assert value == pytest.approx(float(exact), abs=1e-12)
        assert value == pytest.approx(float(mpmath_privacy(gamma, float(eps), int(f))), abs=1e-12)


def test_limits_are_exact_rationals() -> None:
    # (1 - 0.3) * 10 is 7.000000000000001 in binary floating point; the limit is 7
    lower, upper = summation_limits(0.3, [10, 20, 100])
    assert lower.tolist() == [7, 14, 70]
    assert upper.tolist() == [13, 26, 130]
    # eps >= 1: the sum starts at 0
    assert summation_limits(1.5, [4])[0].tolist() == [0]


def test_curve_is_the_sawtooth_of_fig_5() -> None:
    counts, probability = privacy_curve(10, 0.3, 10)
    assert counts.tolist() == list(range(1, 11))
    assert np.all((probability > 0) & (probability < 1))
    # rounding of the summation limits makes it jump up at f = 4 -> 5 -> 6 and down at 7
    assert probability[4] > probability[3] and probability[6] < probability[5]
    # gamma has little impact (Example 2)
    other = privacy_curve(5, 0.3, 10)[1]
    assert np.max(np.abs(other - probability)) < 0.1


def test_threshold_is_the_minimum_over_one_to_alpha() -> None:
    counts, probability = privacy_curve(5, 0.2, 40)
    result = privacy_threshold(5, 0.2, 40)
    assert result.t_p == probability.min()
    assert result.argmin_f == counts[np.argmin(probability)]


def _miss_mpmath(gamma: int, eps: str, f: int) -> float:
    """Pr[|X - f| >= eps f], X ~ Binomial(gamma f, 1/gamma), summed term by term in 40 digits."""
    import mpmath

    with mpmath.workdps(40):
        ratio, p, n = mpmath.mpf(eps), mpmath.mpf(1) / gamma, gamma * f
        return float(
            mpmath.fsum(
                mpmath.binomial(n, x) * p**x * (1 - p) ** (n - x)
                for x in range(n + 1)
                if abs(x - f) >= ratio * f - mpmath.mpf(10) ** -30
            )
        )


@pytest.mark.parametrize(
    ("gamma", "eps", "t_e"), [(5, "0.1", 0.05), (10, "0.3", 0.05), (2, "0.5", 0.1), (10, "0.2", 0.01)]
)
def test_utility_threshold_is_exact_in_the_binomial_model(gamma: int, eps: str, t_e: float) -> None:
    """T_f is the least count from which every larger count misses with probability <= T_E:
    the count below it misses more often (40-digit sum), every count from T_f up to the
    Chernoff point misses at most T_E (scipy, an independent implementation), and beyond it the
    Chernoff bound is at most T_E."""
    from scipy.stats import binom

    t_f = utility_threshold(gamma, float(eps), t_e)
    assert t_f > 1 and _miss_mpmath(gamma, eps, t_f - 1) > t_e
    assert _miss_mpmath(gamma, eps, t_f) <= t_e
    limit = chernoff_point(float(eps), t_e)
    f = np.arange(t_f, limit + 1)
    low = np.floor(np.round((1 - float(eps)) * f, 9))
    high = np.ceil(np.round((1 + float(eps)) * f, 9))
    missed = binom.cdf(low, gamma * f, 1 / gamma) + binom.sf(high - 1, gamma * f, 1 / gamma)
    assert missed.max() <= t_e
    e = float(eps)
    assert math.exp(-(e**2) * limit / (2 + e)) + math.exp(-(min(e, 1) ** 2) * limit / 2) <= t_e


def test_the_papers_lemma_1_is_caught_understating_t_f() -> None:
    """Lemma 1 as printed gives T_f = (gamma eps^2 T_E)^(-1/2) = 20 for the adult-splu setting
    (gamma 5, eps 0.1, T_E 0.05); a count of 20 is missed with probability 0.708, not <= 0.05.
    The exact T_f is 311: within 1.5x of the exact requirement by construction (it is it)."""
    printed = math.sqrt(1 / (5 * 0.1**2 * 0.05))
    assert printed == pytest.approx(20.0)
    assert utility_miss_probability(5, 0.1, 20)[0] == pytest.approx(_miss_mpmath(5, "0.1", 20), rel=1e-12)
    assert utility_miss_probability(5, 0.1, 20)[0] > 0.7
    assert utility_threshold(5, 0.1, 0.05) == 311


def test_utility_threshold_by_simulation() -> None:
    """20,000 simulated estimates of a count of T_f (adult-splu setting): the share missing by
    at least eps f is at most T_E, up to a binomial test at level 1e-6."""
    from scipy.stats import binom

    t_f = utility_threshold(5, 0.1, 0.05)
    draws = np.random.default_rng().binomial(5 * t_f, 1 / 5, size=20_000)
    misses = int(np.sum(np.abs(draws - t_f) >= 0.1 * t_f - 1e-9))
    assert misses <= binom.ppf(1 - 1e-6, 20_000, 0.05)
    assert misses >= binom.ppf(1e-6, 20_000, float(utility_miss_probability(5, 0.1, t_f)[0]))


def test_calibrate_document() -> None:
    document = calibrate(10, 0.3, 3, t_e=0.05).as_dict()
    assert document["t_p"] == pytest.approx(0.6126, abs=1e-4)
    assert document["t_f"] == utility_threshold(10, 0.3, 0.05) == 41
    assert "not differential privacy" in document["model"]
    assert "t_f" not in calibrate(10, 0.3, 3).as_dict()


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: privacy_threshold(1, 0.3, 3), "gamma"),
        (lambda: privacy_threshold(10, 0.0, 3), "eps"),
        (lambda: privacy_threshold(10, float("nan"), 3), "eps"),
        (lambda: privacy_threshold(10, 0.3, 0), "alpha"),
        (lambda: utility_threshold(10, 0.3, 0.0), "t_e"),
        (lambda: utility_threshold(10, 0.3, 1.5), "t_e"),
        (lambda: privacy_probability(10, 0.3, [0]), "f"),
    ],
)
def test_bad_parameters_name_the_field(call, field: str) -> None:
    with pytest.raises(UserError, match=field):
        call()


def test_docstring_examples() -> None:
    import doctest

    from privrelease.mechanisms import splu_guarantees

    result = doctest.testmod(splu_guarantees)
    assert result.attempted >= 2 and result.failed == 0


# --- the exact interval of a lone value's count ---------------------------------------------------


@pytest.mark.parametrize("gamma, confidence", [(2, 0.9), (5, 0.95), (10, 0.99)])
def test_count_interval_covers_every_true_count_exactly(gamma, confidence) -> None:
    """For every true count f up to 60, the probability (exact, summed over the published count
    x ~ Binomial(gamma f, 1/gamma)) that [f_L(x), f_U(x)] contains f is at least the confidence;
    and the interval is the tightest of its construction (f_L - 1 and f_U + 1 are rejected)."""
    from privrelease.mechanisms.splu_guarantees import count_interval

    alpha = (1 - confidence) / 2
    intervals = {x: count_interval(x, gamma, confidence) for x in range(0, 60 * gamma + 1)}
    for f in range(0, 61):
        n = gamma * f
        xs = np.arange(0, n + 1)
        covered = np.array([intervals[x][0] <= f <= intervals[x][1] for x in xs.tolist()])
        assert stats.binom.pmf(xs, n, 1 / gamma)[covered].sum() >= confidence - 1e-12, f
    for x, (low, high) in intervals.items():
        assert low <= x <= high
        if low > 0:
            assert stats.binom.sf(x - 1, gamma * (low - 1), 1 / gamma) <= alpha  # P[X >= x] at f_L - 1
        assert stats.binom.cdf(x, gamma * (high + 1), 1 / gamma) <= alpha  # P[X <= x] at f_U + 1


def test_count_interval_is_capped_by_the_published_rows() -> None:
    from privrelease.mechanisms.splu_guarantees import count_interval

    assert count_interval(10, 5, 0.95, rows=12) == (count_interval(10, 5, 0.95)[0], 12)
    with pytest.raises(UserError, match=r"confidence must be a number in \[0.5, 1\)"):
        count_interval(3, 5, 1.0)
