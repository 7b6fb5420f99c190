"""rho-differential identifiability calculus (Lee & Clifton, "Differential Identifiability").

Pins the paper's numbers (Table 4, Section 5's worked lambda, Section 3.5's posterior, Section
4's possible-worlds example) and cross-checks every formula against an independent mpmath
computation. The Section 4 check computes the adversary's exact supremum posterior over all
responses R by an independent piecewise analysis in 50-digit arithmetic.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from fractions import Fraction

import mpmath
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from privrelease.errors import TargetNotMet, UserError
from privrelease.mechanisms.events import Laplace, event_from_json, event_to_json
from privrelease.mechanisms.identifiability import (
    LAMBDA_MARGIN,
    calibrate,
    epsilon_of_rho,
    identifiability_bound,
    laplace_event,
    laplace_scale,
    rho_of_epsilon,
    world_posterior,
)


@pytest.fixture(scope="module", autouse=True)
def _fifty_digits() -> Iterator[None]:
    """mpmath at 50 digits for this module's references (other modules set their own)."""
    with mpmath.workdps(50):
        yield


ADULT_ROWS = 48_842
# Table 3 of the paper: attribute -> (min, max)
ADULT_BOUNDS = {
    "AG": (17, 90),
    "EN": (1, 16),
    "CG": (0, 99_999),
    "CL": (0, 4_356),
    "HW": (1, 99),
}
# Table 4, f = Mean: S(f), lambda at rho = 0.1, lambda at rho = 0.001 (None: printed as infinity)
TABLE4_MEAN = {
    "AG": ("0.0015", "0.0007", None),
    "EN": ("0.0003", "0.0006", None),
    "CG": ("2.0474", "0.2198", "0.4445"),
    "CL": ("0.0892", "0.0144", "0.0606"),
    "HW": ("0.0020", "0.0008", None),
}
# Table 4, f = Std. Dev.: S(f) as printed (data-dependent, from the actual D), lambda at 0.1, 0.001
TABLE4_STD = {
    "AG": ("0.0019", "0.0009", None),
    "EN": ("0.0251", "0.0491", None),
    "CG": ("26.8833", "2.8858", "5.8364"),
    "CL": ("0.4623", "0.0748", "0.3139"),
    "HW": ("0.0056", "0.0023", None),
}


def printed(x: float, like: str) -> str:
    """``x`` rounded to as many decimals as the paper printed in ``like``."""
    decimals = len(like.split(".")[1])
    return f"{x:.{decimals}f}"


def mp_lambda(sensitive_range, m: int, rho) -> mpmath.mpf:
    """Independent Eq. 15 in 50 digits from exact rationals."""
    s = mpmath.mpf(Fraction(sensitive_range).numerator) / Fraction(sensitive_range).denominator
    r = Fraction(rho)
    ratio = (m - 1) * r / (1 - r)
    return s / mpmath.log(mpmath.mpf(ratio.numerator) / ratio.denominator)


# --- Table 4 and Section 5 -------------------------------------------------------------------


@pytest.mark.parametrize("attribute", sorted(TABLE4_MEAN))
def test_table4_mean_rows(attribute: str) -> None:
    lower, upper = ADULT_BOUNDS[attribute]
    s_printed, lam_01, lam_0001 = TABLE4_MEAN[attribute]
    c01 = calibrate("mean", lower, upper, 0.1, rows=ADULT_ROWS)
    c0001 = calibrate("mean", lower, upper, 0.001, rows=ADULT_ROWS)
    assert c01.universe_size == upper - lower + 1
    assert printed(c01.sensitive_range, s_printed) == s_printed
    assert c01.feasible
    assert printed(c01.lambda_, lam_01) == lam_01
    if lam_0001 is None:
        assert not c0001.feasible
        assert c0001.lambda_ is None and c0001.epsilon is None
        assert "1/m" in c0001.reason
    else:
        assert c0001.feasible
        assert printed(c0001.lambda_, lam_0001) == lam_0001


@pytest.mark.parametrize("attribute", sorted(TABLE4_STD))
def test_table4_std_dev_rows_from_their_printed_sensitive_range(attribute: str) -> None:
    """S(f) of the standard deviation is data-dependent (the paper's own D); Eq. 15 applied to
    the printed S(f) must give the printed lambda."""
    lower, upper = ADULT_BOUNDS[attribute]
    m = upper - lower + 1
    s_printed, lam_01, lam_0001 = TABLE4_STD[attribute]
    assert printed(laplace_scale(float(s_printed), m, 0.1), lam_01) == lam_01
    lam = laplace_scale(float(s_printed), m, 0.001)
    if lam_0001 is None:
        assert lam is None
    else:
        assert printed(lam, lam_0001) == lam_0001


def test_section5_hours_per_week_worked_example() -> None:
    """S(f) = 98/48842 ~ 0.0020; lambda = 49 / (24421 ln(98/9)) ~ 8.4032e-4."""
    c = calibrate("mean", 1, 99, 0.1, rows=ADULT_ROWS)
    assert c.sensitive_range == pytest.approx(98 / 48842, rel=1e-15)
    exact = 49 / (24421 * math.log(98 / 9))
    assert c.lambda_ == pytest.approx(exact, rel=1e-11)
    assert f"{c.lambda_:.4e}" == "8.4032e-04"
    assert c.lambda_ >= exact


def test_section5_rho_one_and_a_half_percent_all_but_education() -> None:
    """Section 5: "for everything except years of education, answers for rho = 1.5% are highly
    likely to be close to the true answer": rho = 0.015 < 1/16 is infeasible for EN only."""
    feasible = {a: calibrate("mean", lo, hi, 0.015, rows=ADULT_ROWS).feasible for a, (lo, hi) in ADULT_BOUNDS.items()}
    assert feasible == {"AG": True, "EN": False, "CG": True, "CL": True, "HW": True}


def test_figure4_sum_noise_independent_of_size_mean_shrinks() -> None:
    """Section 5, Figure 4: sum noise is independent of the database size, mean noise shrinks."""
    sums = {n: calibrate("sum", 0, 4356, 0.1, rows=n).lambda_ for n in (1000, 10_000)}
    means = {n: calibrate("mean", 0, 4356, 0.1, rows=n).lambda_ for n in (1000, 10_000)}
    assert sums[1000] == sums[10_000]
    assert means[1000] == pytest.approx(10 * means[10_000], rel=1e-14)
    assert sums[1000] == pytest.approx(4356 / math.log(4356 * 0.1 / 0.9), rel=1e-11)


# --- cross-checks against mpmath --------------------------------------------------------------


@pytest.mark.parametrize(
    ("sensitive_range", "m", "rho"),
    [
        (98 / 48842, 99, 0.1),
        (99_999 / 48842, 100_000, 0.001),
        (4356 / 48842, 4357, 0.001),
        (1.0, 2, 0.5000000001),
        (1.0, 2, 1 - 1e-15),
        (2.0, 10**15, 0.3),
        (3.0, 10, math.nextafter(0.1, 1.0)),  # rho just above 1/m: ln(...) ~ 1e-16
        (3.0, 3, math.nextafter(1 / 3, 1.0)),
        (5.5, 1000, 0.001 + 1e-12),
    ],
)
def test_lambda_matches_mpmath_and_is_never_below(sensitive_range, m, rho) -> None:
    lam = laplace_scale(sensitive_range, m, rho)
    exact = mp_lambda(sensitive_range, m, rho)
    assert lam is not None
    assert mpmath.mpf(lam) >= exact
    assert float((mpmath.mpf(lam) - exact) / exact) <= LAMBDA_MARGIN * 1.01


def test_feasibility_boundary_is_exact() -> None:
    """Eq. 14: rho <= 1/m is infeasible, including rho == 1/m exactly."""
    assert laplace_scale(1.0, 4, 0.25) is None
    assert laplace_scale(1.0, 4, math.nextafter(0.25, 1.0)) is not None
    assert laplace_scale(1.0, 4, math.nextafter(0.25, 0.0)) is None
    # 1/3 as a double is below 1/3, hence infeasible for m = 3
    assert Fraction(1 / 3) < Fraction(1, 3)
    assert laplace_scale(1.0, 3, 1 / 3) is None
    assert epsilon_of_rho(0.25, 4) is None


@pytest.mark.parametrize("m", [2, 3, 99, 4357, 10**6, 10**15])
@pytest.mark.parametrize("epsilon", [0.0, 1e-12, 1e-3, 0.5, 2.0, 20.0, 700.0, 1e4])
def test_rho_of_epsilon_matches_mpmath(m: int, epsilon: float) -> None:
    got = rho_of_epsilon(epsilon, m)
    want = 1 / (1 + (m - 1) * mpmath.exp(-mpmath.mpf(epsilon)))
    assert got == pytest.approx(float(want), rel=1e-13, abs=0)


@pytest.mark.parametrize("m", [2, 3, 99, 4357, 10**6])
@pytest.mark.parametrize("rho", [1e-9, 0.001, 0.015, 0.1, 1 / 3, 0.5, 0.9, 1 - 1e-12])
def test_epsilon_of_rho_matches_mpmath_and_round_trips(m: int, rho: float) -> None:
    got = epsilon_of_rho(rho, m)
    r = Fraction(rho)
    ratio = (m - 1) * r / (1 - r)
    if ratio <= 1:
        assert got is None
        return
    want = mpmath.log(mpmath.mpf(ratio.numerator) / ratio.denominator)
    assert got == pytest.approx(float(want), rel=1e-13)
    assert rho_of_epsilon(got, m) == pytest.approx(rho, rel=1e-12)


def test_rho_of_epsilon_zero_is_random_guess() -> None:
    """Section 4.1: the lower bound of Eq. 9 is 1/m (the random guess)."""
    for m in (2, 7, 99, 10**9):
        assert rho_of_epsilon(0.0, m) == pytest.approx(1 / m, rel=1e-15)


def test_calibration_epsilon_is_papers_upper_bound_and_round_trips() -> None:
    """For count/sum/mean S(f) equals the replace-one sensitivity, so the calibrated epsilon is
    ln((m-1) rho / (1-rho)) (Section 4.1) and gives back rho."""
    cases = [
        ("mean", 1, 99, 0.1, ADULT_ROWS, 1),
        ("sum", 0, 99_999, 0.001, None, 1),
        ("sum", -5, 10, 0.2, None, 4),
        ("count", 0, 1, 0.3, None, 12),
    ]
    for query, lo, hi, rho, rows, groups in cases:
        c = calibrate(query, lo, hi, rho, rows=rows, groups=groups)
        assert c.sensitivity == c.sensitive_range
        assert c.epsilon == pytest.approx(epsilon_of_rho(rho, c.universe_size), rel=1e-11)
        achieved = identifiability_bound(c.sensitive_range, c.lambda_, c.universe_size)
        assert achieved <= rho
        assert achieved == pytest.approx(rho, rel=1e-10)


def test_epsilon_is_sensitivity_over_lambda_rounded_up() -> None:
    c = calibrate("sum", 0, 4356, 0.1)
    assert c.epsilon >= c.sensitivity / c.lambda_
    assert c.epsilon == pytest.approx(c.sensitivity / c.lambda_, rel=1e-15)


# --- Section 3.5: the adversary's posterior under epsilon-DP ---------------------------------


def test_section35_posterior_of_dp_mean() -> None:
    """D = {1,2,3,10} from U = {1,2,3,4,5,10}, f = mean, Delta f = 9/4, epsilon = 2, R = 5.041:
    likelihoods 0.1762 / 0.0464 / 0.0580 and confidence 0.6278 that the missing value is 10."""
    worlds = [2.5, 2.75, 4.0]  # means of {1,2,3,4}, {1,2,3,5}, {1,2,3,10}
    scale = (9 / 4) / 2
    densities = stats.laplace.pdf(5.041, loc=worlds, scale=scale)
    assert [f"{d:.4f}" for d in densities] == ["0.0464", "0.0580", "0.1762"]
    posterior = world_posterior(5.041, worlds, scale)
    assert f"{posterior[2]:.4f}" == "0.6278"
    assert posterior == pytest.approx(densities / densities.sum(), rel=1e-12)
    # any 2-DP mechanism is rho_of_epsilon(2, 3)-identifiable over these 3 worlds
    assert posterior.max() <= rho_of_epsilon(2.0, 3)


def test_world_posterior_matches_mpmath_on_vectors() -> None:
    worlds = [[0.0, 1.0, 5.0], [2.0, 0.0, 5.0], [0.0, 0.0, 7.0]]
    response = [0.3, 0.9, 5.5]
    lam = 0.7
    got = world_posterior(response, worlds, lam)
    w = [mpmath.exp(-sum(abs(mpmath.mpf(a) - b) for a, b in zip(x, response)) / lam) for x in worlds]
    want = [float(x / sum(w)) for x in w]
    assert got == pytest.approx(want, rel=1e-13)


# --- Section 4: possible worlds U = {1..10}, D' = {1, 3}, rho = 1/3 ----------------------------


def sup_posterior(world_values: list[Fraction], lam: mpmath.mpf) -> tuple[mpmath.mpf, int]:
    """Exact sup over all responses R of the largest world posterior (uniform prior, Laplace
    noise): an implementation independent of the module.

    For world j the posterior is 1 / sum_k exp((|R - f_j| - |R - f_k|) / lambda). Between two
    consecutive breakpoints (the f values) each exponent is linear in R with slope -2/lambda, 0
    or 2/lambda, so the denominator is A e^(2R/lambda) + B + C e^(-2R/lambda), convex, with its
    minimum at R = lambda/4 ln(C/A) or at an end; beyond the extreme breakpoints it is
    constant."""
    fs = [mpmath.mpf(v.numerator) / v.denominator for v in world_values]
    points = sorted(set(fs))
    best, best_world = mpmath.mpf(0), -1
    segments = [(points[0] - 1, points[0])]
    segments += list(itertools.pairwise(points))
    segments += [(points[-1], points[-1] + 1)]
    for j, fj in enumerate(fs):
        for a, b in segments:
            mid = (a + b) / 2
            sj = 1 if mid > fj else -1
            a_coef = b_coef = c_coef = mpmath.mpf(0)
            for fk in fs:
                sk = 1 if mid > fk else -1
                slope = sj - sk  # in {-2, 0, 2}
                const = mpmath.exp((-sj * fj + sk * fk) / lam)
                if slope > 0:
                    a_coef += const
                elif slope < 0:
                    c_coef += const
                else:
                    b_coef += const

            def denominator(r, a_coef=a_coef, b_coef=b_coef, c_coef=c_coef):
                return a_coef * mpmath.exp(2 * r / lam) + b_coef + c_coef * mpmath.exp(-2 * r / lam)

            candidates = [a, b]
            if a_coef > 0 and c_coef > 0:
                r_star = lam / 4 * mpmath.log(c_coef / a_coef)
                if a < r_star < b:
                    candidates.append(r_star)
            for r in candidates:
                value = 1 / denominator(r)
                if value > best:
                    best, best_world = value, j
    return best, best_world


# Table 2 (the printed means of omega_3 and omega_6, 3/2 and 4/3, are misprints of 9/3 and 12/3)
SECTION4_WORLDS = [Fraction(sum(s), 3) for s in ([1, 2, 3], *([1, 3, v] for v in range(4, 11)))]


def test_section4_table2_worlds() -> None:
    assert SECTION4_WORLDS == [
        Fraction(2),
        Fraction(8, 3),
        Fraction(3),
        Fraction(10, 3),
        Fraction(11, 3),
        Fraction(4),
        Fraction(13, 3),
        Fraction(14, 3),
    ]
    assert max(SECTION4_WORLDS) - min(SECTION4_WORLDS) == Fraction(8, 3)  # S(f_mean)


def test_section4_mean_example_posterior_never_exceeds_rho() -> None:
    """lambda = 8 / (3 ln(7/2)); at R = 2 (the paper's worst case) Gamma(2) = 0.2294 < 1/3.
    Definition 4 bounds the posterior for every response R: the exact supremum over all R and
    all 8 worlds is Gamma(2), attained by omega_1 = D for R <= 2."""
    lam = laplace_scale(8 / 3, 8, 1 / 3)
    assert lam == pytest.approx(8 / (3 * math.log(3.5)), rel=1e-11)
    posterior_at_2 = world_posterior(2.0, [float(f) for f in SECTION4_WORLDS], lam)
    assert f"{posterior_at_2[0]:.4f}" == "0.2294"

    mp_lam = mpmath.mpf(8) / (3 * mpmath.log(mpmath.mpf(7) / 2))
    sup, world = sup_posterior(SECTION4_WORLDS, mp_lam)
    assert world == 0
    assert sup == pytest.approx(float(posterior_at_2[0]), rel=1e-12)
    assert sup < mpmath.mpf(1) / 3


def test_section4_median_example_bound_is_tight() -> None:
    """Theorem 2 / Figure 1(b): for the median every other world is at distance S(f) = 1, so
    the supremum posterior equals rho exactly."""
    medians = [Fraction(2)] + [Fraction(3)] * 7
    mp_lam = 1 / mpmath.log(mpmath.mpf(7) / 2)
    sup, world = sup_posterior(medians, mp_lam)
    assert world == 0
    assert sup == pytest.approx(1 / 3, rel=1e-30)
    lam = laplace_scale(1.0, 8, 1 / 3)
    assert lam == pytest.approx(float(mp_lam), rel=1e-11)


def test_section4_with_declared_bounds_calibration() -> None:
    """The release planned before data access: bounds [1, 10], N = 3 rows, multiset worlds
    D' + {v} for v = 1..10 (m = 10, S = 9/3). The exact supremum posterior stays below rho for
    those worlds (0.1895), and also for the paper's 8 set-worlds of Table 2 (0.2377)."""
    c = calibrate("mean", 1, 10, 1 / 3, rows=3)
    assert (c.universe_size, c.sensitive_range) == (10, 3.0)
    assert c.lambda_ == pytest.approx(3 / math.log(4.5), rel=1e-11)
    lam = mpmath.mpf(c.lambda_)
    multiset_worlds = [Fraction(1 + 3 + v, 3) for v in range(1, 11)]
    sup, _ = sup_posterior(multiset_worlds, lam)
    # evenly spaced worlds: far below rho (Eq. 9 replaces every distance by S(f))
    assert sup < mpmath.mpf(1) / 3
    assert float(sup) == pytest.approx(0.1895, abs=5e-5)
    sup_set, _ = sup_posterior(SECTION4_WORLDS, lam)
    assert sup_set < mpmath.mpf(1) / 3
    assert float(sup_set) == pytest.approx(0.2377, abs=5e-5)


@settings(max_examples=40, deadline=None)
@given(
    lower=st.integers(-20, 20),
    width=st.integers(1, 12),
    rows=st.integers(1, 6),
    rho=st.floats(0.05, 0.95),
    query=st.sampled_from(["sum", "mean"]),
)
def test_theorem1_supremum_posterior_at_most_rho(lower, width, rows, rho, query) -> None:
    """Theorem 1 over the multiset worlds D' + {v}, v in [lower, upper], for any D'."""
    upper = lower + width
    c = calibrate(query, lower, upper, rho, rows=rows if query == "mean" else None)
    if not c.feasible:
        assert rho <= 1 / c.universe_size
        return
    known = Fraction(7 * (rows - 1))  # f(D') part: any constant; it shifts every world alike
    divisor = rows if query == "mean" else 1
    worlds = [(known + v) / divisor for v in range(lower, upper + 1)]
    sup, _ = sup_posterior(worlds, mpmath.mpf(c.lambda_))
    assert sup <= mpmath.mpf(rho) * (1 + mpmath.mpf(1e-12))


# --- definitions, choices and errors ---------------------------------------------------------


def test_sensitive_ranges_and_universe_sizes() -> None:
    assert calibrate("sum", 0, 4356, 0.1).sensitive_range == 4356
    assert calibrate("sum", 17, 90, 0.1).universe_size == 74
    assert calibrate("sum", 17, 90, 0.1).sensitivity_add_remove == 90
    grouped = calibrate("sum", -30, 20, 0.1, groups=5)
    assert grouped.sensitive_range == 60  # the missing row moves between two groups
    assert grouped.universe_size == 51
    assert grouped.sensitivity_add_remove == 30
    count = calibrate("count", 0, 1, 0.1, groups=40)
    assert (
        count.sensitive_range,
        count.universe_size,
        count.sensitivity_add_remove,
    ) == (2, 40, 1)
    mean = calibrate("mean", 1, 99, 0.1, rows=100)
    assert mean.sensitive_range == pytest.approx(0.98)
    assert mean.sensitivity_add_remove == pytest.approx(0.99)
    assert mean.epsilon_add_remove == pytest.approx(0.99 / mean.lambda_)


def test_real_valued_columns_use_two_worlds() -> None:
    c = calibrate("sum", 0.0, 2.5, 0.9, integer=False)
    assert c.universe_size == 2
    assert c.lambda_ == pytest.approx(2.5 / math.log(9), rel=1e-11)
    infeasible = calibrate("sum", 0.0, 2.5, 0.5, integer=False)
    assert not infeasible.feasible
    assert "m=2" in infeasible.reason


def test_laplace_event() -> None:
    c = calibrate("mean", 1, 99, 0.1, rows=ADULT_ROWS)
    event = laplace_event(c)
    assert event == Laplace(
        scale=c.lambda_,
        sensitivity=c.sensitivity_add_remove,
        sensitive_range=c.sensitive_range,
        universe_size=99,
    )
    assert event_from_json(event_to_json(event)) == event
    with pytest.raises(TargetNotMet, match="1/m"):
        laplace_event(calibrate("mean", 1, 99, 0.001, rows=ADULT_ROWS))


@pytest.mark.parametrize("rho", [0, 0.0, 1, 1.0, -0.1, 1.2, float("nan"), True, "0.5"])
def test_rho_outside_open_unit_interval_is_a_user_error(rho) -> None:
    with pytest.raises(UserError, match="rho must be in"):
        calibrate("sum", 0, 10, rho)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"query": "median"}, "query must be one of"),
        ({"lower": 10, "upper": 10}, "upper must be > lower"),
        ({"lower": 10, "upper": 1}, "upper must be > lower"),
        ({"lower": 0.5}, "lower must be an integer"),
        ({"upper": float("inf")}, "upper must be finite"),
        ({"query": "mean"}, "rows"),
        ({"query": "mean", "rows": 0}, "rows"),
        ({"query": "mean", "rows": 10, "groups": 3}, "by group is not supported"),
        ({"query": "count"}, "needs a group domain"),
        ({"groups": 0}, "groups must be"),
    ],
)
def test_user_errors(kwargs, match) -> None:
    args = {"query": "sum", "lower": 0, "upper": 10, "rho": 0.5} | kwargs
    with pytest.raises(UserError, match=match):
        calibrate(**args)


def test_conversion_inputs_are_checked() -> None:
    with pytest.raises(UserError, match="epsilon"):
        rho_of_epsilon(-1.0, 10)
    with pytest.raises(UserError, match="universe_size"):
        rho_of_epsilon(1.0, 1)
    with pytest.raises(UserError, match="rho"):
        epsilon_of_rho(1.0, 10)
