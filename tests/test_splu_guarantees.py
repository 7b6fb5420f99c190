"""SPLU guarantees (Fu et al. 2014): Lemma 1 (T_f), Lemma 2 / Theorem 4 (T_p), Examples 1-2,
cross-checked with exact rational arithmetic and mpmath."""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from privrelease.errors import UserError
from privrelease.mechanisms.splu_guarantees import (
    calibrate,
    privacy_curve,
    privacy_probability,
    privacy_threshold,
    summation_limits,
    utility_error_bound,
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
    mpmath.mp.dps = 40
    lower = max(0, math.ceil((1 - Fraction(str(eps))) * f))
    n = gamma * f
    upper = min(n, math.floor((1 + Fraction(str(eps))) * f))
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


def test_lemma_1_utility_threshold() -> None:
    # T_f = (1 / (gamma eps^2 T_E))^(1/2)
    assert utility_threshold(10, 0.1, 0.01) == pytest.approx(math.sqrt(1 / (10 * 0.01 * 0.01)))
    t_f = utility_threshold(5, 0.2, 0.05)
    # at f = T_f the Chebyshev bound of Theorem 3 equals T_E, above it is smaller
    assert utility_error_bound(5, 0.2, t_f) == pytest.approx(0.05)
    assert utility_error_bound(5, 0.2, 2 * t_f) < 0.05


def test_calibrate_document() -> None:
    document = calibrate(10, 0.3, 3, t_e=0.05).as_dict()
    assert document["t_p"] == pytest.approx(0.6126, abs=1e-4)
    assert document["t_f"] == pytest.approx(math.sqrt(1 / (10 * 0.09 * 0.05)))
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
