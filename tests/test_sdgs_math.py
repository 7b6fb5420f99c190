"""(k, beta)-SDGS calculus against the paper's Table 1 and an independent mpmath brute force."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from pydantic import TypeAdapter, ValidationError
from scipy import special

from privrelease.errors import UserError
from privrelease.mechanisms import sdgs_math
from privrelease.mechanisms.limits import MIN_BETA
from privrelease.mechanisms.sdgs_calibration import (
    CalibrationError,
    auto_beta,
    largest_beta,
    sdgs_delta,
    smallest_epsilon,
    smallest_k,
)
from privrelease.mechanisms.sdgs_math import (
    FSmooth,
    amplified_epsilon,
    delta_exact,
    delta_theorem1,
    exact_grid,
    fsmooth_delta,
    theorem1_grid,
)
from privrelease.policies import fields, loader

# Li, Qardaji, Su, Table 1 (k = 20); rows beta = 0.05, 0.1, 0.2 (the first row's label is lost
# in the text copy; 0.05 is what reproduces it), columns eps.
TABLE1_EPS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
TABLE1 = {
    0.05: (6.83e-10, 2.50e-14, 3.19e-17, 1.76e-19, 3.97e-22, 2.00e-24),
    0.1: (4.19e-06, 1.61e-09, 3.44e-12, 4.07e-14, 3.22e-16, 1.89e-18),
    0.2: (2.16e-03, 8.02e-06, 1.89e-07, 6.03e-09, 4.79e-11, 1.59e-12),
}


@pytest.mark.parametrize("beta", sorted(TABLE1))
def test_table1_to_three_significant_digits(beta: float) -> None:
    results = theorem1_grid(20, beta, np.array(TABLE1_EPS))
    for eps, expected, result in zip(TABLE1_EPS, TABLE1[beta], results):
        assert float(f"{result.delta:.2e}") == expected, (beta, eps)
        assert result.argmax_n == math.ceil(20 / sdgs_math.gamma_of(beta, eps) - 1)


# --- independent brute force in mpmath ------------------------------------------------------


def _mp_pmfs(n: int, beta) -> list:
    """f(j; n, beta) for j = 0..n by the ratio recursion (independent of scipy)."""
    q = 1 - beta
    values = [q**n]
    for j in range(n):
        values.append(values[-1] * (n - j) / (j + 1) * beta / q)
    return values


def _mp_theorem1(k: int, beta: float, eps: float, extra: int = 200):
    b = mpmath.mpf(beta)
    gamma = 1 - (1 - b) * mpmath.exp(-eps)
    n_m = int(mpmath.ceil(k / gamma - 1))
    best, argmax = mpmath.mpf(0), None
    for n in range(n_m, n_m + extra):
        pmf = _mp_pmfs(n, b)
        value = mpmath.fsum(pmf[j] for j in range(n + 1) if j > gamma * n)
        if value > best:
            best, argmax = value, n
    return best, argmax


def _mp_hockey_stick(k: int, beta: float, eps: float, n_max: int):
    """max over 1 <= n <= n_max of both hockey-stick divergences between the output
    distributions of t's cell count (suppressed, k, ..., n) under D (n rows) and D - t;
    Bin(n) is built from Bin(n - 1) by f(j; n) = beta f(j-1; n-1) + (1 - beta) f(j; n-1)."""
    b, growth = mpmath.mpf(beta), mpmath.exp(eps)
    best = mpmath.mpf(0)
    previous = [mpmath.mpf(1)]
    for n in range(1, n_max + 1):
        current = [(1 - b) * x for x in previous] + [mpmath.mpf(0)]
        for j in range(1, n + 1):
            current[j] += b * previous[j - 1]
        p = [mpmath.fsum(current[:k])] + current[k:]
        q = [mpmath.fsum(previous[:k])] + previous[k:] + [mpmath.mpf(0)]
        q = q[: len(p)] if len(q) >= len(p) else q + [mpmath.mpf(0)] * (len(p) - len(q))
        add = mpmath.fsum(max(0, x - growth * y) for x, y in zip(p, q))
        remove = mpmath.fsum(max(0, y - growth * x) for x, y in zip(p, q))
        best = max(best, add, remove)
        previous = current
    return best


CASES = [
    (20, 0.1, 1.0),
    (5, 0.3, 1.0),
    (10, 0.05, 0.5),
    (3, 0.5, 1.2),
    (30, 0.2, 0.75),
    (1, 0.025, 2.0),
    (8, 0.36, 3.0),
]


@pytest.mark.parametrize("k, beta, eps", CASES)
def test_theorem1_matches_brute_force_and_is_never_below_it(k: int, beta: float, eps: float) -> None:
    with mpmath.workdps(40):
        truth, argmax = _mp_theorem1(k, beta, eps)
    result = delta_theorem1(k, beta, eps)
    assert result.argmax_n == argmax
    assert mpmath.mpf(result.delta) >= truth
    assert result.delta <= float(truth) * (1 + 1e-8)


EXACT_CASES = [
    (20, 0.1, 1.0),
    (5, 0.3, 1.0),
    (3, 0.5, 1.2),
    (1, 0.025, 2.0),
    (8, 0.36, 3.0),
    (5, 0.3, 0.0),
    (20, 0.2, 0.1),
    (4, 0.1, 0.05),
]


@pytest.mark.parametrize("k, beta, eps", EXACT_CASES)
def test_exact_delta_matches_brute_force(k: int, beta: float, eps: float) -> None:
    n_max = int(2 * max(k / beta, k / sdgs_math.gamma_of(beta, eps))) + 60
    with mpmath.workdps(25):
        truth = _mp_hockey_stick(k, beta, eps, n_max)
    result = delta_exact(k, beta, eps)
    assert mpmath.mpf(result.delta) >= truth
    assert result.delta <= float(truth) * (1 + 1e-8) + 1e-300


def test_exact_is_tighter_than_theorem1_on_a_grid() -> None:
    k, beta, eps = (a.ravel() for a in np.meshgrid([2, 5, 20, 50], [0.01, 0.1, 0.3], [0.5, 1.0, 2.0]))
    for t, x in zip(theorem1_grid(k, beta, eps), exact_grid(k, beta, eps)):
        assert x.delta <= t.delta * (1 + 1e-8)


def test_tiny_deltas_are_exact_in_log_space() -> None:
    with mpmath.workdps(50):
        truth, argmax = _mp_theorem1(200, 0.01, 3.0, extra=60)
        exact_truth = _mp_hockey_stick(200, 0.01, 3.0, 260)
    result = delta_theorem1(200, 0.01, 3.0)
    assert result.argmax_n == argmax
    assert result.log10_delta == pytest.approx(float(mpmath.log10(truth)), abs=1e-9)
    assert result.log10_delta >= float(mpmath.log10(truth))
    assert result.delta == 5e-324  # underflows a double: reported as the smallest positive one
    exact = delta_exact(200, 0.01, 3.0)
    assert exact.log10_delta == pytest.approx(float(mpmath.log10(exact_truth)), abs=1e-8)


def test_accurate_near_1e_300() -> None:
    k, beta, eps = 165, 0.01, 2.0
    with mpmath.workdps(50):
        truth, _ = _mp_theorem1(k, beta, eps, extra=60)
    assert 1e-301 < truth < 1e-298  # computed on the log-space path (below 1e-280)
    result = delta_theorem1(k, beta, eps)
    assert result.delta >= float(truth) and result.delta == pytest.approx(float(truth), rel=1e-8)


def test_incomplete_beta_error_is_far_inside_the_margin() -> None:
    """The tails come from scipy's betainc; their worst relative error over a broad grid stays
    far below _DOUBLE_ERROR (1e-12), on which the safety margin rests."""
    worst = 0.0
    with mpmath.workdps(40):
        for n in (10, 60, 300, 1500):
            for beta in (0.01, 0.1, 0.36, 0.7):
                for j in sorted({1, max(1, int(beta * n)), int(0.6 * n) + 1, n}):
                    ours = special.betainc(j, n - j + 1, beta)
                    truth = mpmath.betainc(j, n - j + 1, 0, beta, regularized=True)
                    if truth > 1e-290:
                        worst = max(worst, abs(ours - truth) / truth)
    assert worst < 1e-13


def test_outside_theorem1_range() -> None:
    low = delta_theorem1(20, 0.2, 0.1)
    assert low.delta is None and "-ln(1 - beta)" in low.reason
    assert delta_exact(20, 0.2, 0.1).delta is not None
    no_sampling = delta_theorem1(20, 1.0, 1.0)
    assert no_sampling.delta is None and "Proposition 4" in no_sampling.reason
    assert delta_exact(20, 1.0, 1.0).delta == 1.0


@pytest.mark.parametrize("bad", [(0, 0.1, 1.0), (5, 0.0, 1.0), (5, 1.2, 1.0), (5, 0.1, -0.5)])
def test_bad_parameters(bad) -> None:
    with pytest.raises(ValueError):
        delta_theorem1(*bad)


def test_corollary4_example() -> None:
    # beta = 0.1, e^eps = 2 gives e^eps' = 1.1 (Li, Qardaji, Su, after Corollary 4)
    assert math.exp(amplified_epsilon(0.1, math.log(2))) == pytest.approx(1.1, rel=1e-14)


def test_fsmooth_bound_definition5_and_theorem5() -> None:
    k, beta, eps0 = 20, 0.2, 0.5
    single = FSmooth(((k, beta, eps0),))
    assert single.f(1.0) == pytest.approx(1.0)
    xs = np.linspace(1, 6, 26)
    values = [single.f(x) for x in xs]
    assert all(a > b for a, b in zip(values, values[1:]))  # monotonically decreasing
    # it bounds the exact delta at every eps = x eps0
    for x in xs:
        assert delta_exact(k, beta, x * eps0).delta <= single.delta_at(x)
    # Theorem 6's closed form, recomputed independently
    gamma = 1 - (1 - beta) * math.exp(-eps0)
    assert single.delta0 == pytest.approx(math.exp(-k * (math.log(gamma / beta) - (gamma - beta) / gamma)), rel=1e-14)
    # Theorem 5: composing gives (eps1 + eps2, delta1 f1(x) + delta2 f2(x)) <= (delta1+delta2) max(f1, f2)(x)
    other = FSmooth(((30, 0.1, 0.8),))
    both = FSmooth(single.parts + other.parts)
    assert both.epsilon0 == pytest.approx(1.3)
    for x in (1.0, 1.5, 3.0):
        assert both.delta_at(x) == pytest.approx(single.delta_at(x) + other.delta_at(x))
        assert both.delta_at(x) <= (single.delta0 + other.delta0) * max(single.f(x), other.f(x)) * (1 + 1e-12)
    assert fsmooth_delta(k, beta, eps0) == pytest.approx(single.delta0)


# --- calibration ------------------------------------------------------------------------------


@pytest.mark.parametrize("notion", ["probabilistic", "approximate"])
@pytest.mark.parametrize(
    "beta, eps, target", [(0.1, 1.0, 1e-9), (0.2, 0.5, 1e-6), (0.05, 2.0, 1e-30), (0.36, 1.0, 1e-12)]
)
def test_smallest_k_is_exact(notion, beta, eps, target) -> None:
    result = smallest_k(beta, eps, target, notion)
    assert sdgs_delta(result.k, beta, eps, notion) <= target
    if result.k > 1:
        assert sdgs_delta(result.k - 1, beta, eps, notion) > target


def test_smallest_k_matches_a_linear_scan() -> None:
    for target in (1e-3, 1e-6, 1e-9):
        linear = next(k for k in range(1, 500) if delta_theorem1(k, 0.1, 1.0).delta <= target)
        assert smallest_k(0.1, 1.0, target, "probabilistic").k == linear


@pytest.mark.parametrize("notion", ["probabilistic", "approximate"])
def test_smallest_epsilon_and_largest_beta(notion) -> None:
    result = smallest_epsilon(20, 0.1, 1e-9, notion)
    assert sdgs_delta(20, 0.1, result.epsilon, notion) <= 1e-9
    below = sdgs_delta(20, 0.1, result.epsilon * (1 - 1e-8), notion)
    assert below is None or below > 1e-9
    widest = largest_beta(20, 1.0, 1e-9, notion)
    assert sdgs_delta(20, widest.beta, 1.0, notion) <= 1e-9
    assert sdgs_delta(20, widest.beta * (1 + 1e-8), 1.0, notion) > 1e-9


def _mp_log10_tail(j: int, n: int, beta: float):
    """log10 P[Bin(n, beta) >= j] for j far above the mean, summed in mpmath from f(j) until
    the terms (ratio below 1 and falling) add less than 1e-30."""
    b = mpmath.mpf(beta)
    term = mpmath.exp(mpmath.loggamma(n + 1) - mpmath.loggamma(j + 1) - mpmath.loggamma(n - j + 1)) * b**j
    term *= (1 - b) ** (n - j)
    total, i = term, 0
    while term > total * mpmath.mpf(10) ** -30:
        term *= mpmath.mpf(n - j - i) / (j + i + 1) * b / (1 - b)
        total += term
        i += 1
    return mpmath.log10(total)


@pytest.mark.parametrize("k, beta, eps", [(100_000, 0.01, 0.02), (100_000, 1e-4, 0.00011), (100_000, 1e-4, 100.0)])
def test_theorem1_at_the_largest_k_is_exact_at_its_argmax(k: int, beta: float, eps: float) -> None:
    """Underflowing deltas at k = 100,000 (the largest a policy allows): the log-space scan is
    vectorized and sums each tail from its first term (it summed the whole support one n at a
    time: `guarantee sdgs --k 100000 --beta 0.01 --epsilon 0.02` ran past 86 s). The value is
    never below the tail at the reported n (mpmath, 50 digits) and above it by at most the
    rounding bound of a log pmf at that n; no neighbour beats it."""
    result = delta_theorem1(k, beta, eps)
    gamma = sdgs_math.gamma_of(beta, eps)
    n = result.argmax_n
    assert n is not None and result.log10_delta is not None
    with mpmath.workdps(50):
        at = {m: _mp_log10_tail(int(sdgs_math._first_above(gamma, m)), m, beta) for m in range(n - 3, n + 4)}
    rounding = float(sdgs_math._log_rounding(n, beta)) / math.log(10)  # about 3e-7 and 6e-5 here
    assert at[n] <= result.log10_delta <= at[n] + 2 * rounding + 1e-9  # computed within one, then raised by it
    assert max(at.values()) == at[n] or n - 3 < sdgs_math._n_m(k, gamma)


def _mp_log10_exact_add(k: int, beta: float, eps: float, n: int):
    """log10 H(P_n || P_{n-1}) = log10(beta f(m-1; n-1) - (e^eps - 1) P[Bin(n-1) >= m]) in mpmath,
    m = max(k, first j > gamma n), the tail summed from its first term until it adds below 1e-40."""
    b, trials = mpmath.mpf(beta), n - 1
    m = max(k, int(sdgs_math._first_above(sdgs_math.gamma_of(beta, eps), n)))

    def pmf(j: int):
        log_choose = mpmath.loggamma(trials + 1) - mpmath.loggamma(j + 1) - mpmath.loggamma(trials - j + 1)
        return mpmath.exp(log_choose) * b**j * (1 - b) ** (trials - j)

    term = pmf(m)
    total, i = term, 0
    while term > total * mpmath.mpf(10) ** -40:
        term *= mpmath.mpf(trials - m - i) / (m + i + 1) * b / (1 - b)
        total += term
        i += 1
    return mpmath.log10(b * pmf(m - 1) - mpmath.expm1(eps) * total)


@pytest.mark.parametrize("k, beta, eps", [(100_000, 0.01, 0.02), (100_000, 1e-4, 0.001)])
def test_exact_delta_at_the_largest_k_is_exact_near_its_argmax(k: int, beta: float, eps: float) -> None:
    """The exact delta where it underflows, at k = 100,000: the add direction's difference
    beta f(m-1) - (e^eps - 1) P[Bin >= m] cancels to about 2e-5 of its terms near n = 9e7, so
    its log is taken from exact pmf ratios (d from two log-gamma differences gave 10^-64667.314 for the
    second case; the truth is 10^-64667.325). Never below the mpmath value (80 digits) of any
    n near the reported one, and above their max by less than 1e-4 in log10 (a relative 2.3e-4:
    the rounding bound of the terms, amplified by the cancellation)."""
    result = delta_exact(k, beta, eps)
    n = result.argmax_n
    assert n is not None and result.log10_delta is not None
    with mpmath.workdps(80):
        near = max(_mp_log10_exact_add(k, beta, eps, m) for m in range(n - 3, n + 4))
    assert near <= result.log10_delta <= near + 1e-4


@pytest.mark.parametrize("k, beta", [(20, 1e-4), (100_000, 0.5), (1000, 0.001)])
def test_exact_delta_at_epsilon_zero_is_the_largest_step_of_the_suppression(k: int, beta: float) -> None:
    """At eps = 0 the exact delta is the total variation max_n beta f(k-1; n-1) (the remove
    direction's suppressed outcome; Bin(n) = Bin(n-1) + Bernoulli(beta)), at n - 1 = (k-1)/beta
    (mpmath). Below n_lo the remove direction is now scanned down from n_lo with a monotone bound
    instead of up from n = 1: k 20, beta 1e-4 took 0.6 s, k 100,000, beta 0.5 took 2.1 s."""
    with mpmath.workdps(40):
        b, top = mpmath.mpf(beta), round((k - 1) / beta)
        truth = max(b * mpmath.binomial(m, k - 1) * b ** (k - 1) * (1 - b) ** (m - k + 1) for m in (top - 1, top))
    result = delta_exact(k, beta, 0.0)
    assert mpmath.mpf(result.delta) >= truth
    assert result.delta <= float(truth) * (1 + 1e-6)


@pytest.mark.parametrize("notion", ["probabilistic", "approximate"])
def test_largest_beta_stays_in_the_range_a_policy_allows(notion) -> None:
    """Solving for beta never returns one a policy refuses (it returned 4.01e-16 for k = 20,
    epsilon 1, delta 1e-300); delta(20, MIN_BETA, 1) is about 1e-73, so 1e-300 is out of reach."""
    assert sdgs_delta(20, MIN_BETA, 1.0, notion) > 1e-300
    with pytest.raises(CalibrationError, match=r"no beta in \[0.0001, 1\] \(the range a policy allows\)"):
        largest_beta(20, 1.0, 1e-300, notion)
    if notion == "probabilistic":  # Theorem 1 caps beta at 1 - e^-eps = 1e-5 here
        with pytest.raises(CalibrationError, match="below the smallest beta a policy allows"):
            largest_beta(20, 1e-5, 1e-3, notion)


def test_one_bound_on_beta_for_the_api_and_the_policy() -> None:
    """``check_parameters`` (the Python API) refused only beta <= 0 while a policy refuses
    beta < 1e-4: both now read ``mechanisms.limits.MIN_BETA``."""
    assert fields.MIN_BETA is MIN_BETA == 1e-4
    with pytest.raises(UserError, match=r"beta must be in \[0.0001, 1\]; got 5e-05"):
        sdgs_math.check_parameters(20, MIN_BETA / 2, 1.0)
    with pytest.raises(ValidationError, match="0.0001"):
        TypeAdapter(fields.Beta).validate_python(MIN_BETA / 2)
    sdgs_math.check_parameters(20, MIN_BETA, 1.0)
    assert loader._REQUIRED_HINTS["beta"] == "a number in [0.0001, 1]"  # it said (0, 1]


def test_auto_beta_is_theorem1s_largest() -> None:
    for eps in (0.1, 0.5, 1.0, 2.0):
        beta = auto_beta(eps)
        assert beta == pytest.approx(1 - math.exp(-eps), rel=1e-15)
        assert delta_theorem1(10, beta, eps).delta is not None


def test_calibration_errors() -> None:
    with pytest.raises(CalibrationError, match="Proposition 4"):
        smallest_k(1.0, 1.0, 1e-9, "approximate")
    with pytest.raises(CalibrationError, match="ln"):
        smallest_k(0.5, 0.1, 1e-9, "probabilistic")


@pytest.mark.parametrize("k, beta, eps", [(50, 0.05, 0.002), (50, 0.05, 0.005), (20, 0.1, 0.01), (100, 0.02, 0.02)])
def test_exact_stopping_rule_against_a_long_scan(k: int, beta: float, eps: float) -> None:
    """Small epsilon puts the worst cell size n in the thousands and flattens the stopping
    bounds: the maximum equals a plain scan of every n up to 200,000 (no stopping rule)."""
    n = np.arange(1.0, 200_001.0)
    add = sdgs_math._exact_add(k, beta, eps, n[n >= k])
    remove = sdgs_math._exact_remove(k, beta, eps, n)
    assert delta_exact(k, beta, eps).delta == pytest.approx(max(add.max(), remove.max()), rel=1e-8)


def test_exact_delta_under_the_suppression_threshold_never_drops_the_remove_direction() -> None:
    """Below eps = -ln(1 - beta) both directions count. Where both underflow the float scan
    (k 100000, beta 0.5, eps 0.5: every n of the remove direction below 1e-280), only the add
    direction is recomputed in log space, so the remove direction is charged its float bound,
    1e-280: the delta is never the add direction's alone (which is far smaller here)."""
    found = sdgs_math.delta_exact(100000, 0.5, 0.5)
    assert found.delta is not None and found.delta >= 1e-280
    assert found.log10_delta is not None and found.log10_delta >= -280
