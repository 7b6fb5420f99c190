"""Noisy counts: every formula against an independent computation (50-digit mpmath sums over the
integer support, dp_accounting's PLDs, the continuous Gaussian's analytic delta, exact pmfs),
OpenDP's privacy maps against the claimed parameterization, and the samplers by chi-square."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterator
from pathlib import Path

import mpmath
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import cpu_seconds
from scipy import stats

from privrelease import demo
from privrelease.errors import UserError
from privrelease.flows import release_facts
from privrelease.flows.steps import release_plain
from privrelease.mechanisms import composition
from privrelease.mechanisms.events import Composed, event_from_json, event_to_json
from privrelease.mechanisms.kinds import noisy_counts
from privrelease.mechanisms.kinds import noisy_counts as nc
from privrelease.mechanisms.kinds.noisy_counts import approximate_delta, half_width, probabilistic_delta
from privrelease.planning import plan_policy
from privrelease.policies import load_policy


@pytest.fixture(scope="module", autouse=True)
def _fifty_digits() -> Iterator[None]:
    """mpmath at 50 digits for this module's references (other modules set their own)."""
    with mpmath.workdps(50):
        yield


ALPHA = 1e-6
"""Each statistical test rejects a correct sampler with probability below ALPHA."""

SLACK = mpmath.mpf(10) ** -40

GAUSSIAN_CASES = [(sigma, eps) for sigma in (0.5, 1.0, 3.0, 7.5, 20.0) for eps in (0.0, 0.05, 0.5, 1.0, 2.0)]
LAPLACE_CASES = [(scale, eps) for scale in (0.5, 2.0, 5.0) for eps in (0.0, 0.1, 0.19, 0.5, 1.0, 2.5)]


# --- independent references: 50-digit sums over the integer support -------------------------------


def mp_pmf(distribution: str, parameter: float) -> tuple[int, callable]:
    """(support bound N, pmf) with the mass beyond ±N below 1e-300 (never summed)."""
    t = mpmath.mpf(parameter)
    if distribution == "gaussian":
        n = int(40 * parameter) + 40  # e^(-N^2 / (2 sigma^2)) < e^-800
        norm = mpmath.fsum(mpmath.exp(-(mpmath.mpf(z) ** 2) / (2 * t**2)) for z in range(-n, n + 1))
        return n, lambda z: mpmath.exp(-(mpmath.mpf(z) ** 2) / (2 * t**2)) / norm
    n = int(700 * parameter) + 10  # r^N < e^-700
    r = mpmath.exp(-1 / t)
    return n, lambda z: (1 - r) / (1 + r) * r ** abs(z)


@functools.cache
def mp_table(distribution: str, parameter: float) -> tuple[int, dict[int, mpmath.mpf]]:
    """(N, the pmf at -N-1..N+1)."""
    n, p = mp_pmf(distribution, parameter)
    return n, {z: p(z) for z in range(-n - 1, n + 2)}


def mp_deltas(distribution: str, parameter: float, epsilon: float) -> tuple[mpmath.mpf, mpmath.mpf]:
    """(hockey-stick delta, P[loss > eps]) by definition, max over both neighbour directions:
    P = noise, Q = noise + 1 and the reverse; outputs o in [-N, N + 1]. A loss equal to eps
    (the discrete Laplace at eps = 1/t) differs from it by 50-digit rounding only: ``SLACK``
    tells such ties from real excesses."""
    n, table = mp_table(distribution, parameter)
    e = mpmath.exp(mpmath.mpf(epsilon))
    hockey, tail = [], []
    for first, second in ((0, 1), (1, 0)):  # P(o) = p(o - first), Q(o) = p(o - second)
        h = pr = mpmath.mpf(0)
        for o in range(-n, n + 2):
            a, b = table[o - first], table[o - second]
            if a - e * b > a * SLACK:
                h += a - e * b
            if mpmath.log(a) - mpmath.log(b) > epsilon + SLACK:
                pr += a
        hockey.append(h)
        tail.append(pr)
    return max(hockey), max(tail)


def assert_upper(value: float, exact: mpmath.mpf, rtol: float = 1e-9) -> None:
    """``value`` is never below ``exact`` and within ``rtol`` of it (or, where the exact value is
    below the smallest float, the smallest positive float)."""
    assert mpmath.mpf(value) >= exact, (value, exact)
    if exact < mpmath.mpf(2) ** -1074:
        assert value <= math.ulp(0.0)
    else:
        assert mpmath.mpf(value) <= exact * (1 + rtol) + mpmath.mpf(2) ** -1074, (value, exact)


@pytest.fixture(scope="module")
def references() -> dict:
    cases = [("gaussian", s, e) for s, e in GAUSSIAN_CASES] + [("laplace", t, e) for t, e in LAPLACE_CASES]
    return {case: mp_deltas(*case) for case in cases}


@pytest.mark.parametrize(("sigma", "epsilon"), GAUSSIAN_CASES)
def test_gaussian_deltas_match_mpmath(references: dict, sigma: float, epsilon: float) -> None:
    hockey, tail = references["gaussian", sigma, epsilon]
    assert_upper(nc.approximate_delta("gaussian", sigma, epsilon), hockey)
    assert_upper(nc.probabilistic_delta("gaussian", sigma, epsilon), tail)


@pytest.mark.parametrize(("scale", "epsilon"), LAPLACE_CASES)
def test_laplace_deltas_match_mpmath(references: dict, scale: float, epsilon: float) -> None:
    hockey, tail = references["laplace", scale, epsilon]
    assert_upper(nc.approximate_delta("laplace", scale, epsilon), hockey)
    assert_upper(nc.probabilistic_delta("laplace", scale, epsilon), tail)
    if epsilon >= 1 / scale:  # pure 1/t-DP: nothing above the loss 1/t
        assert nc.approximate_delta("laplace", scale, epsilon) == 0 == nc.probabilistic_delta("laplace", scale, epsilon)


@pytest.mark.parametrize(("sigma", "epsilon"), [(1.0, 0.5), (3.0, 0.05), (7.5, 0.5), (20.0, 0.05)])
def test_canonne_kamath_steinke_theorem_7(references: dict, sigma: float, epsilon: float) -> None:
    """CKS Theorem 7 (sensitivity 1): delta = P[X > eps sigma^2 - 1/2] - e^eps P[X > eps sigma^2 + 1/2],
    X ~ N_Z(0, sigma^2), equals the hockey-stick sum by definition (50 digits) and our value."""
    _, table = mp_table("gaussian", sigma)
    s2 = mpmath.mpf(sigma) ** 2

    def above(a: mpmath.mpf) -> mpmath.mpf:
        return mpmath.fsum(prob for z, prob in table.items() if z > a)

    theorem = above(epsilon * s2 - mpmath.mpf(1) / 2) - mpmath.exp(epsilon) * above(epsilon * s2 + mpmath.mpf(1) / 2)
    hockey, _ = references["gaussian", sigma, epsilon]
    assert abs(theorem - hockey) <= hockey * mpmath.mpf(10) ** -30
    assert_upper(nc.approximate_delta("gaussian", sigma, epsilon), theorem)


def test_probabilistic_delta_bounds_approximate_delta() -> None:
    """E[(1 - e^(eps - L))_+] <= P[L > eps]: the papers' notion is the weaker bound."""
    for distribution, parameter in (("gaussian", 0.7), ("gaussian", 4.0), ("gaussian", 50.0), ("laplace", 3.0)):
        for epsilon in (0.0, 0.01, 0.3, 1.0, 3.0):
            approximate = nc.approximate_delta(distribution, parameter, epsilon)
            assert approximate <= nc.probabilistic_delta(distribution, parameter, epsilon)


def test_loss_boundary_on_an_integer() -> None:
    """eps sigma^2 + 1/2 an integer: the loss at that z equals eps exactly and must not count
    toward P[L > eps] (sigma = 2, eps = 1.125: z* = -4 has L = 9/8 = eps)."""
    sigma, epsilon = 2.0, 1.125
    hockey, tail = mp_deltas("gaussian", sigma, epsilon)
    assert_upper(nc.probabilistic_delta("gaussian", sigma, epsilon), tail)
    assert_upper(nc.approximate_delta("gaussian", sigma, epsilon), hockey)


# --- dp_accounting's PLDs -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("distribution", "parameter"), [("gaussian", 1.0), ("gaussian", 5.0), ("gaussian", 20.0), ("laplace", 2.0)]
)
def test_exact_delta_against_dp_accounting(distribution: str, parameter: float) -> None:
    """dp_accounting's pessimistic PLD (losses rounded up to the 1e-3 grid, discrete Gaussian tail
    beyond 1e-30 charged as an infinite loss) is >= the exact delta and close to it. Where every
    loss is already on the grid (sigma = 1 and 5: losses are odd multiples of 1/(2 sigma^2);
    the discrete Laplace of scale 2 has +-1/2) both sum the same terms and agree to float rounding, so the exact value may
    exceed the PLD's by its own rounding margin only."""
    pld = nc.noise_pld(distribution, parameter)
    half_step = 1 / parameter if distribution == "laplace" else 1 / (2 * parameter**2)
    on_grid = abs(half_step / 1e-3 - round(half_step / 1e-3)) < 1e-9
    for epsilon in (0.0, 0.05, 0.2, 0.5, 1.0):
        exact = nc.approximate_delta(distribution, parameter, epsilon)
        accounted = float(pld.get_delta_for_epsilon(epsilon))
        if exact < 1e-25:
            assert accounted < 1e-25
            continue
        assert accounted >= exact * (1 - (1e-11 if on_grid else 0.0)), (epsilon, accounted, exact)
        assert accounted <= exact * 1.05 + 1e-15, (epsilon, accounted, exact)


def test_dp_accounting_laplace_parameter_is_one_over_scale() -> None:
    """from_discrete_laplace_mechanism(a) is ∝ e^(-a|x|): a = 1/scale gives pure (1/scale)-DP."""
    pld = nc.noise_pld("laplace", 4.0)
    assert pld.get_delta_for_epsilon(0.25 + 1e-9) == 0
    assert pld.get_delta_for_epsilon(0.2) > 0
    assert nc.pure_epsilon("laplace", 4.0) == 0.25
    assert nc.pure_epsilon("gaussian", 4.0) is None


# --- the continuous Gaussian (Balle-Wang's analytic delta) ----------------------------------------


def continuous_delta(sigma: float, epsilon: float) -> float:
    """Balle & Wang (ICML 2018) Theorem 8, sensitivity 1: Phi(1/(2s) - eps s) - e^eps Phi(-1/(2s) - eps s)."""
    s, e = mpmath.mpf(sigma), mpmath.mpf(epsilon)
    return float(mpmath.ncdf(1 / (2 * s) - e * s) - mpmath.exp(e) * mpmath.ncdf(-1 / (2 * s) - e * s))


@pytest.mark.parametrize("sigma", [3.0, 10.0, 30.0, 100.0])
def test_total_variation_against_the_continuous_gaussian(sigma: float) -> None:
    """At eps = 0 the delta is the total variation. Discrete: P(X = 0) = 1 / C_sigma, and
    C_sigma = sigma sqrt(2 pi) (1 + 2 sum_k e^(-2 pi^2 sigma^2 k^2)) by Poisson summation (the
    correction is below 1e-70 here). Continuous: 2 Phi(1/(2 sigma)) - 1 = (1 - 1/(24 sigma^2) +
    O(sigma^-4)) / (sigma sqrt(2 pi)). So discrete / continuous - 1 = 1/(24 sigma^2) + O(sigma^-4)."""
    discrete = nc.approximate_delta("gaussian", sigma, 0.0)
    assert discrete == pytest.approx(1 / (sigma * math.sqrt(2 * math.pi)), rel=1e-10)
    excess = discrete / continuous_delta(sigma, 0.0) - 1
    assert excess == pytest.approx(1 / (24 * sigma**2), rel=0.1)


@pytest.mark.parametrize("sigma", [10.0, 30.0, 100.0])
def test_near_the_continuous_gaussian(sigma: float) -> None:
    """For sigma >= 10 and eps <= 1 the discrete delta is within a few percent of the continuous one
    (measured: discrete / continuous - 1 tends to about eps^2 / 24 as sigma grows, the lattice of
    losses of spacing 1/sigma^2 against a continuum; the envelope tested is eps^2 / 20 + 1/sigma)."""
    for epsilon in (0.01, 0.1, 0.5, 1.0):
        continuous = continuous_delta(sigma, epsilon)
        if continuous < 1e-250:
            continue
        ratio = nc.approximate_delta("gaussian", sigma, epsilon) / continuous
        assert abs(ratio - 1) <= epsilon**2 / 20 + 1 / sigma, (sigma, epsilon, ratio)


# --- half-widths ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("distribution", "parameter"),
    [("gaussian", 0.4), ("gaussian", 1.0), ("gaussian", 20.0), ("gaussian", 63.5), ("laplace", 0.3), ("laplace", 5.0)],
)
def test_half_width_against_the_exact_pmf(distribution: str, parameter: float) -> None:
    n, p = mp_pmf(distribution, parameter)
    for confidence in (0.01, 0.5, 0.9, 0.95, 0.99, 0.999999, 1 - 1e-12):
        w = nc.half_width(distribution, parameter, confidence)

        def central(width: int) -> mpmath.mpf:
            return mpmath.fsum(p(z) for z in range(-width, width + 1)) if width >= 0 else mpmath.mpf(0)

        assert central(w) >= confidence, (w, confidence)
        assert central(w - 1) < confidence, (w, confidence)


@pytest.mark.parametrize(
    ("distribution", "confidence", "absolute_error"),
    [("gaussian", 0.95, 8), ("gaussian", 0.99, 25), ("gaussian", 0.9, 1), ("laplace", 0.95, 8), ("laplace", 0.5, 3)],
)
def test_largest_noise_meets_the_half_width_and_no_more_noise_does(
    distribution: str, confidence: float, absolute_error: int
) -> None:
    """The noise plan chooses without a parameter: by the exact pmf (mpmath, by definition), each
    cell is within +-absolute_error with probability >= C at the chosen noise, and not at a
    relative 1e-8 more."""
    chosen = nc.largest_noise(distribution, confidence, absolute_error)

    def covered(parameter: float) -> mpmath.mpf:
        _, p = mp_pmf(distribution, parameter)
        return mpmath.fsum(p(z) for z in range(-absolute_error, absolute_error + 1))

    assert covered(chosen) >= confidence > covered(chosen * (1 + 1e-8))
    assert nc.MIN_NOISE < chosen < nc.MAX_NOISE


def test_noise_chosen_by_plan_is_the_most_meeting_every_target(tmp_path: Path) -> None:
    """``noise: {distribution: gaussian}`` without sigma: plan takes the largest sigma meeting
    every absolute_error target naming the table (here the tighter of two), states it, passes its
    checks, and the release adds exactly that noise; with no such target the policy is refused
    naming noise.sigma."""
    from privrelease.policies import load_policy_text

    text = """
name: chosen
version: "1"
dataset:
  id: chosen
  path: data.csv
  columns: {sex: {type: string, values: [F, M]}}
generalization: {sex: keep}
mechanisms:
  - {name: counts, type: noisy_counts, columns: [sex], noise: {distribution: gaussian}}
targets:
  accounting: approximate
  delta: 1.0e-6
  accuracy:
    - {mechanism: counts, absolute_error: 8, confidence: 0.95}
    - {mechanism: counts, absolute_error: 12, confidence: 0.999}
"""
    loaded = load_policy_text(text, tmp_path)
    sigma = nc.largest_noise("gaussian", 0.999, 12)
    assert sigma < nc.largest_noise("gaussian", 0.95, 8)
    plan = plan_policy(loaded)
    (mechanism,) = plan.mechanisms
    assert mechanism.event.sigma == sigma
    assert mechanism.facts["noise"] == (
        f"discrete Gaussian, sigma {sigma:.10g} (chosen by plan: the most noise meeting targets.accuracy, cell by cell)"
    )
    assert plan.passed and plan.accuracy["counts"].noise.scale == sigma
    (spec,) = loaded.policy.mechanisms
    released = spec.finish(loaded, np.array([100, 200]))
    assert released.event == mechanism.event
    # release.json (and the report) state the sigma that ran, naming it chosen by plan
    parameters = release_facts._parameters(spec, loaded)
    assert parameters["noise"] == {"distribution": "gaussian", "sigma": sigma}
    assert parameters["chosen_by_plan"] == ["noise.sigma"]
    assert spec.resolved(loaded).resolved(loaded) == spec.resolved(loaded) != spec
    without = text.replace("counts, absolute_error: 8", "other, absolute_error: 8").split("    - {mechanism: counts")[0]
    with pytest.raises(UserError, match=r"mechanisms\[0\]\.noise\.sigma: give noise\.sigma, or an accuracy target"):
        load_policy_text(without, tmp_path)


def test_half_width_reference_values() -> None:
    """Pinned: the discrete Gaussian sigma = 20 (sd ~ 20: the normal's 1.96 sd is 39.2) and the
    discrete Laplace scale 5 (continuous: 5 ln 20 = 15.0)."""
    assert nc.half_width("gaussian", 20.0, 0.95) == 39
    assert nc.half_width("laplace", 5.0, 0.95) == 15


def mp_central(distribution: str, parameter: float, width: int) -> mpmath.mpf:
    """``P(|Z| <= width)``, a 50-digit sum of the exact pmf."""
    _, p = mp_pmf(distribution, parameter)
    return mpmath.fsum(p(z) for z in range(-width, width + 1)) if width >= 0 else mpmath.mpf(0)


@pytest.mark.parametrize(
    ("distribution", "parameter", "cells"),
    [
        ("gaussian", 4.231, 20),
        ("gaussian", 4.231, 100),
        ("gaussian", 4.231, 1000),
        ("gaussian", 0.7, 7),
        ("gaussian", 20.0, 1_000_000),
        ("laplace", 2.0, 12),
        ("laplace", 0.3, 1000),
    ],
)
def test_all_cells_half_width_against_the_exact_pmf(distribution: str, parameter: float, cells: int) -> None:
    """All N cells within +-w at once: P(|Z| <= w)^N >= C (i.i.d. noise), and not at w - 1."""
    for confidence in (0.5, 0.9, 0.95, 0.99):
        w = nc.all_cells_half_width(distribution, parameter, confidence, cells)
        assert mp_central(distribution, parameter, w) ** cells >= confidence, (w, confidence)
        assert mp_central(distribution, parameter, w - 1) ** cells < confidence, (w, confidence)
    assert nc.all_cells_half_width(distribution, parameter, 0.95, 1) == nc.half_width(distribution, parameter, 0.95)


def test_adult_noisy_each_cell_is_not_all_cells() -> None:
    """The issue's figures for adult-noisy (sigma 4.231, 20 cells), by the exact pmf: each cell
    within +-8 with probability 0.956, all 20 at once only 0.406; all cells at once at 95% need
    +-13 (100 cells +-15, 1,000 cells +-17)."""
    assert nc.half_width("gaussian", 4.231, 0.95) == 8
    each = mp_central("gaussian", 4.231, 8)
    assert round(float(each), 3) == 0.956 and round(float(each**20), 3) == 0.406
    widths = [nc.all_cells_half_width("gaussian", 4.231, 0.95, n) for n in (20, 100, 1000)]
    assert widths == [13, 15, 17]


def test_each_cell_miss() -> None:
    """1 - C for one cell; for N cells (1 - m)^N >= C with m within 1e-12 of 1 - C^(1/N)
    (50 digits); refuses what is not a count of cells or a confidence."""
    from privrelease.mechanisms.accuracy import each_cell_miss

    assert each_cell_miss(0.95, 1) == 1 - 0.95
    for confidence in (0.5, 0.95, 0.999999):
        for cells in (2, 20, 10**6, 10**12):
            m = each_cell_miss(confidence, cells)
            assert (1 - mpmath.mpf(m)) ** cells >= confidence
            exact = 1 - mpmath.mpf(confidence) ** (mpmath.mpf(1) / cells)
            assert abs(mpmath.mpf(m) / exact - 1) < 1e-12
    for cells in (0, -3, 2.5, True):
        with pytest.raises(UserError, match="cells must be an integer >= 1"):
            each_cell_miss(0.95, cells)
    with pytest.raises(UserError, match="confidence must be"):
        each_cell_miss(1.0, 3)


SIMULATED_TABLES = 10_000


def test_simultaneous_coverage_of_simulated_tables() -> None:
    """10,000 tables of 20 cells of OpenDP's discrete Gaussian (sigma 4.231): the share of tables
    with every cell within +-13 (the all-cells half-width) and within +-8 (each cell's) against
    the exact P(|Z| <= w)^20 (0.95... and 0.406), by a two-sided binomial test each: a correct
    sampler and formula fail either with probability below 2 ALPHA. The +-8 share is far below
    95%: the per-cell half-width does not cover the whole table."""
    cells = 20
    noise = nc.add_noise(np.zeros((SIMULATED_TABLES, cells), dtype=np.int64), "gaussian", 4.231)
    worst = np.abs(noise).max(axis=1)
    for width in (nc.all_cells_half_width("gaussian", 4.231, 0.95, cells), nc.half_width("gaussian", 4.231, 0.95)):
        exact = float(mp_central("gaussian", 4.231, width) ** cells)
        covered = int(np.sum(worst <= width))
        assert stats.binomtest(covered, SIMULATED_TABLES, exact).pvalue > ALPHA, (width, covered, exact)
    assert np.mean(worst <= 8) < 0.5 < 0.95 <= np.mean(worst <= 13) + 0.01


def test_per_cell_interval_holds_the_true_count() -> None:
    """[max(0, c - w), max(0, c + w)] holds t >= 0 whenever |c - t| <= w, and also when the
    count c = t + z was published as max(0, t + z) (``nonnegative``); it is no wider than 2w."""
    t, z = np.meshgrid(np.arange(0, 30), np.arange(-6, 7))
    t, z = t.ravel(), z.ravel()
    for published in (t + z, nc.nonnegative(t + z)):
        lower, upper = nc.per_cell_interval(published, 6)
        assert np.all((lower <= t) & (t <= upper)) and np.all(upper - lower <= 12)
    lower, upper = nc.per_cell_interval(np.array([-9, 0, 40]), 6)
    assert lower.tolist() == [0, 0, 34] and upper.tolist() == [0, 6, 46]


# --- calibration -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("epsilon", "delta"), [(1.0, 1e-6), (0.1, 1e-5), (0.5, 1e-9), (3.0, 1e-12), (0.05, 0.1)])
def test_calibrate_sigma_is_tight(epsilon: float, delta: float) -> None:
    sigma = nc.calibrate_sigma(epsilon, delta)
    assert nc.approximate_delta("gaussian", sigma, epsilon) <= delta
    assert nc.approximate_delta("gaussian", sigma * (1 - 1e-5), epsilon) > delta
    # and the exact delta is met by a smaller sigma than the continuous Gaussian's classic bound
    if epsilon < 1:
        assert sigma <= math.sqrt(2 * math.log(1.25 / delta)) / epsilon


def test_calibrate_sigma_reference_value() -> None:
    """Pinned (measured here; the continuous Gaussian's analytic calibration gives about 4.22)."""
    assert nc.calibrate_sigma(1.0, 1e-6) == pytest.approx(4.2307811, rel=2e-6)


@pytest.mark.parametrize(("distribution", "parameter"), [("gaussian", 4.231), ("gaussian", 0.5), ("laplace", 0.5)])
def test_results_are_python_numbers(distribution: str, parameter: float) -> None:
    """Python floats and ints, never numpy scalars: a plan's checks compare them (np.bool_ is not
    a bool) and the audit chain's canonical JSON refuses numpy types (a Gaussian release with a
    max_epsilon target failed at publishing when the rounding margin was an np.float64)."""
    for epsilon in (0.0, 0.5, 1.0, 3.0):
        assert type(approximate_delta(distribution, parameter, epsilon)) is float
        assert type(probabilistic_delta(distribution, parameter, epsilon)) is float
    assert type(half_width(distribution, parameter, 0.95)) is int
    assert type(nc.calibrate_sigma(1.0, 1e-6)) is float and type(nc.calibrate_scale(0.5)) is float


def test_calibrate_scale() -> None:
    assert nc.calibrate_scale(0.5) == 2.0
    assert nc.approximate_delta("laplace", nc.calibrate_scale(0.5), 0.5) == 0


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: nc.approximate_delta("gaussian", 0.0, 1.0), "noise.sigma"),
        (lambda: nc.approximate_delta("laplace", -1.0, 1.0), "noise.scale"),
        (lambda: nc.approximate_delta("cauchy", 1.0, 1.0), "noise.distribution"),
        (lambda: nc.probabilistic_delta("gaussian", 1.0, -0.1), "epsilon"),
        (lambda: nc.half_width("gaussian", 1.0, 1.0), "confidence"),
        (lambda: nc.calibrate_sigma(1.0, 0.0), "delta"),
        (lambda: nc.calibrate_scale(0.0), "epsilon"),
        (lambda: nc.add_noise(np.array([1.5]), "laplace", 1.0), "counts"),
    ],
)
def test_user_errors_name_the_field(call, field: str) -> None:
    with pytest.raises(UserError) as caught:
        call()
    assert caught.value.field == field


# --- OpenDP: parameterization and sampling --------------------------------------------------------


def test_opendp_privacy_maps_match_the_claims() -> None:
    """OpenDP's vector measurements at sensitivity 1: Laplace epsilon = 1/scale; Gaussian zCDP
    rho = 1/(2 sigma^2) (CKS: the discrete Gaussian is (1/(2 sigma^2))-zCDP)."""
    for scale in (0.5, 5.0):
        assert nc._measurement("laplace", scale).map(1) == pytest.approx(1 / scale, rel=1e-12)
    for sigma in (1.0, 20.0):
        assert nc._measurement("gaussian", sigma).map(1) == pytest.approx(1 / (2 * sigma**2), rel=1e-12)


def exact_pmf(distribution: str, parameter: float, values: np.ndarray) -> np.ndarray:
    _, p = mp_pmf(distribution, parameter)
    return np.array([float(p(int(v))) for v in values])


@pytest.mark.parametrize(("distribution", "parameter"), [("gaussian", 3.0), ("laplace", 2.0)])
def test_add_noise_fits_the_exact_pmf(distribution: str, parameter: float) -> None:
    """200,000 cells (counts 0..49 repeated, shape 400 x 500): noisy - counts against the exact
    pmf by chi-square (bins with expected >= 5, each tail merged into one bin); a correct sampler
    fails with probability ALPHA."""
    counts = (np.arange(200_000, dtype=np.int64) % 50).reshape(400, 500)
    noisy = nc.add_noise(counts, distribution, parameter)
    assert noisy.dtype == np.int64 and noisy.shape == counts.shape
    noise = (noisy - counts).ravel()
    size = noise.size
    n, _ = mp_pmf(distribution, parameter)
    support = np.arange(-n, n + 1)
    probabilities = exact_pmf(distribution, parameter, support)
    inner = support[probabilities * size >= 5]
    low, high = int(inner.min()), int(inner.max())
    assert np.all(np.diff(inner) == 1)  # unimodal: the bins with expected >= 5 are contiguous
    expected = np.concatenate(
        [
            [probabilities[support < low].sum()],
            probabilities[(support >= low) & (support <= high)],
            [probabilities[support > high].sum()],
        ]
    )
    observed = np.concatenate(
        [
            [np.sum(noise < low)],
            np.bincount(noise[(noise >= low) & (noise <= high)] - low, minlength=high - low + 1),
            [np.sum(noise > high)],
        ]
    )
    assert observed.sum() == size
    result = stats.chisquare(observed, expected * size / expected.sum())
    assert result.pvalue > ALPHA, (distribution, result)


def test_add_noise_zeros_shape_and_empty() -> None:
    zeros = np.zeros((3, 4, 5), dtype=np.int32)
    noisy = nc.add_noise(zeros, "gaussian", 2.0)
    assert noisy.dtype == np.int64 and noisy.shape == (3, 4, 5)
    assert np.any(noisy != 0)  # P(all 60 zero) = P(X = 0)^60 < 0.2^60
    empty = nc.add_noise(np.zeros((0, 7), dtype=np.int64), "laplace", 1.0)
    assert empty.shape == (0, 7) and empty.dtype == np.int64


def test_add_noise_is_vectorized() -> None:
    """100,000 cells cost about what OpenDP's own vector measurement costs on one list of them
    (CPU time, summed over threads; measured in this test: no per-cell Python work on top)."""
    cells = 100_000
    counts = np.zeros(cells, dtype=np.int64)
    baseline_measurement = nc._measurement("laplace", 5.0)
    baseline = cpu_seconds(lambda: baseline_measurement(counts.tolist()))[1]
    ours = cpu_seconds(lambda: nc.add_noise(counts, "laplace", 5.0))[1]
    assert ours <= 2.0 * baseline + 0.05, (ours, baseline)


def test_nonnegative() -> None:
    noisy = np.array([[-3, 0, 2], [7, -1, -100]], dtype=np.int64)
    clipped = nc.nonnegative(noisy)
    assert clipped.tolist() == [[0, 0, 2], [7, 0, 0]]
    assert clipped.dtype == np.int64 and clipped.shape == noisy.shape
    assert noisy[0, 0] == -3  # the input is left alone


# --------------------------------------------------------------------------- the kind, end to end

TABLE = """  - name: table
    type: noisy_counts
    columns: [sex, race, salary-class]
    noise: NOISE
"""


def _policy(folder: Path, noise: str, extra: str = "", version: str = "nc") -> Path:
    """The demo policy with its mechanisms replaced by one noisy_counts table (and without the
    demo's accuracy targets, which name the demo's mechanisms)."""
    text = (folder / demo.POLICY_FILE).read_text()
    start, end = text.index("mechanisms:\n"), text.index("targets:\n")
    text = text[: start + len("mechanisms:\n")] + TABLE.replace("NOISE", noise) + extra + text[end:]
    text = re.sub(r"\n  accuracy:\n(    - .*\n)+", "\n", text)
    text = text.replace('version: "1"', f'version: "{version}"')
    path = folder / f"{version}.yaml"
    path.write_text(text)
    return path


def test_the_kind_is_one_module_found_by_the_registry():
    """noisy_counts is this module's KINDS, in the policy schema's union and type list, and its
    events parse from JSON by their kind tags (nothing else of the package names it but the
    command line's calculus of its noise, ``calibrate noisy-counts`` and ``guarantee accuracy
    noisy-counts``: a convenience over its functions, not needed by any policy, plan or run; and
    the noisy_sums and noisy_tables kinds, which build on it)."""
    from privrelease.mechanisms.kinds import all_kinds
    from privrelease.policies.schema import MECHANISM_TYPES

    assert all_kinds()["noisy_counts"] is noisy_counts.NoisyCountsMechanism
    assert "noisy_counts" in MECHANISM_TYPES
    for event in (noisy_counts.DiscreteGaussian(sigma=20, epsilon=0.5), noisy_counts.DiscreteLaplace(scale=5)):
        assert event_from_json(event_to_json(Composed(events=(event,)))) == Composed(events=(event,))
    package = Path(noisy_counts.__file__).parents[2]
    mentions = [
        path.relative_to(package)
        for folder in ("privrelease", "policies", "mechanisms", "flows", "reports", "audit")
        for path in (package / folder).rglob("*.py")
        if "noisy_counts" in path.read_text() and path.name != "noisy_counts.py"
    ]
    # noisy_sums builds on its discrete Gaussian (noise, half-widths, the cells of a declared domain),
    # noisy_tables on its exact partial counts of a declared domain
    assert sorted(mentions) == [
        Path("mechanisms/kinds/noisy_sums.py"),
        Path("mechanisms/kinds/noisy_tables.py"),
        Path("privrelease/cli/counts.py"),
    ]


def test_plan_states_the_exact_guarantees(demo_dir):
    """Gaussian: the stated epsilon is the smallest reaching targets.delta under the policy's
    notion (probabilistic for the demo), delta from the exact curves; Laplace: pure 1/scale."""
    gaussian = plan_policy(load_policy(_policy(demo_dir, "{distribution: gaussian, sigma: 20}")))
    (table,) = gaussian.mechanisms
    assert gaussian.passed, gaussian.checks
    stated = table.guarantees["probabilistic"]
    assert stated.delta <= 1e-9 < probabilistic_delta("gaussian", 20, stated.epsilon * (1 - 1e-6))
    assert table.guarantees["approximate"].delta == approximate_delta("gaussian", 20, stated.epsilon)
    assert table.facts["cells"] == 2 * 3 * 2  # race maps to White, Black, Other
    statement = gaussian.accuracy["table"]
    assert statement is not None and statement.noise is not None
    assert statement.noise.half_width[0.95] == half_width("gaussian", 20, 0.95)
    # each cell's half-width and the whole table's (all 12 cells at once), as release.json states them
    document = statement.as_dict()
    assert document["table_cells"] == 12
    assert document["all_cells_half_width"] == {
        f"{c:g}": nc.all_cells_half_width("gaussian", 20, c, 12) for c in (0.9, 0.95, 0.99)
    }
    assert document["all_cells_half_width"]["0.95"] > document["half_width"]["0.95"]
    assert document["interval_columns"] == {"columns": ["lower", "upper"], "confidence": 0.95}

    laplace = plan_policy(load_policy(_policy(demo_dir, "{distribution: laplace, scale: 4}", version="nl")))
    assert laplace.mechanisms[0].guarantees["approximate"].epsilon == 0.25
    assert laplace.mechanisms[0].guarantees["approximate"].delta == 0.0
    times = composition.epsilon_at([laplace.event], 1e-6, times=10)
    assert composition.PLD in times.candidates and times.epsilon < 2.5  # tighter than adding 10 x 0.25


def test_release_publishes_every_cell_with_noise(demo_dir):
    """An in-process release: all 12 cells of the declared domain, zeros included (a declared
    value the data never has), integer counts near the truth; the event realized is the plan's."""
    path = _policy(
        demo_dir,
        "{distribution: laplace, scale: 2}\n    nonnegative: true",
        extra="",
        version="run",
    )
    published = release_plain(policy_path=str(path))
    table = pq.read_table(Path(published.release_dir) / "table.parquet")
    assert table.num_rows == 12 and table.column_names == ["sex", "race", "salary-class", "count", "lower", "upper"]
    # each count's 95% interval: the count -+ each cell's half-width, never below 0
    width = half_width("laplace", 2, 0.95)
    assert table.column("lower").to_pylist() == [max(0, c - width) for c in table.column("count").to_pylist()]
    assert table.column("upper").to_pylist() == [c + width for c in table.column("count").to_pylist()]
    cells = set(zip(*(table.column(c).to_pylist() for c in ("sex", "race", "salary-class")), strict=True))
    assert len(cells) == 12
    counts = table.column("count").to_numpy()
    assert counts.dtype == np.int64 and (counts >= 0).all()
    # 50,000 rows; 12 independent Laplace(2) draws: |sum of noise| <= 12 x 2 x ln(1 / 1e-9) / ... generously 500
    assert abs(int(counts.sum()) - 50_000) < 500


def test_a_column_without_a_declared_domain_is_refused(demo_dir):
    path = _policy(demo_dir, "{distribution: laplace, scale: 2}", version="bad")
    text = path.read_text().replace("columns: [sex, race, salary-class]", "columns: [sex, hours-per-week]")
    path.write_text(text)
    with pytest.raises(
        UserError, match=r"line \d+, mechanisms\[0\]\.columns\[1\]: column 'hours-per-week' needs declared values"
    ):
        load_policy(path)


@pytest.mark.parametrize("name", ["count", "lower", "upper"])
def test_a_column_named_like_an_output_column_is_refused(demo_dir, name):
    """The output's ``count``, ``lower`` and ``upper`` columns would replace a kept column of that name."""
    path = _policy(demo_dir, "{distribution: laplace, scale: 2}", version=name)
    text = path.read_text().replace(
        "    sex: {type: string, values: [Male, Female]}", f"    {name}: {{type: string, values: [Male, Female]}}"
    )
    text = text.replace("  sex: keep", f"  {name}: keep").replace(
        "columns: [sex, race, salary-class]", f"columns: [{name}, race]"
    )
    path.write_text(text)
    with pytest.raises(
        UserError,
        match=rf"mechanisms\[0\]\.columns\[0\]: a noisy table cannot generalize a column named '{name}': the output uses",
    ):
        load_policy(path)


def test_gaussian_needs_a_delta_target(demo_dir):
    path = _policy(demo_dir, "{distribution: gaussian, sigma: 20}", version="nodelta")
    path.write_text(path.read_text().replace("  delta: 1.0e-9\n", ""))
    with pytest.raises(UserError, match="targets.delta is required.*Gaussian noise"):
        load_policy(path)


def test_finish_adds_noise_of_the_stated_distribution(demo_dir):
    """The table's noise (published minus exact counts) over 40,000 cells: a chi-square fit to
    the exact discrete Gaussian pmf (rejects a correct sampler with probability < 1e-6)."""
    loaded = load_policy(_policy(demo_dir, "{distribution: gaussian, sigma: 3}", version="chi"))
    spec = loaded.policy.mechanisms[0]
    noise = np.concatenate(
        [spec.finish(loaded, np.zeros(12, dtype=np.int64)).table.column("count").to_numpy() for _ in range(3334)]
    )
    support = np.arange(-15, 16)
    weights = np.exp(-(support.astype(float) ** 2) / (2 * 9.0))
    expected = weights / weights.sum() * noise.size
    observed = np.array([(noise == z).sum() for z in support])
    keep = expected >= 5
    statistic = (((observed - expected) ** 2 / expected)[keep]).sum()
    assert stats.chi2.sf(statistic, keep.sum() - 1) > 1e-6


def test_an_entry_point_kind_is_found(monkeypatch):
    """A kind shipped in another package is found through the privrelease.mechanisms entry
    points (a module with KINDS, or one class); a type defined twice is refused, never replaced."""
    from typing import Literal

    from privrelease.mechanisms import kinds

    class AgencyCounts(kinds.MechanismKind):
        type: Literal["agency_counts"]

    class Impostor(kinds.MechanismKind):
        type: Literal["noisy_counts"]

    def points(*classes):
        return [
            type(
                "Point",
                (),
                {
                    "name": c.__name__,
                    "value": f"agency:{c.__name__}",
                    "module": "agency",
                    "dist": None,
                    "load": lambda self, c=c: c,
                },
            )()
            for c in classes
        ]

    try:
        monkeypatch.setattr(kinds, "entry_points", lambda group: points(AgencyCounts))
        kinds.all_kinds.cache_clear()
        found = kinds.all_kinds()
        assert found["agency_counts"] is AgencyCounts and list(found)[-1] == "agency_counts"
        monkeypatch.setattr(kinds, "entry_points", lambda group: points(Impostor))
        kinds.all_kinds.cache_clear()
        with pytest.raises(UserError, match="'noisy_counts' is defined twice"):
            kinds.all_kinds()
    finally:
        monkeypatch.undo()
        kinds.all_kinds.cache_clear()
    assert "agency_counts" not in kinds.all_kinds()


# --- on Dask: exact counts per partition, merged, noise added once ---------------------------------

DASK_GROUPS = [f"g{i:02d}" for i in range(20)]
"""Declared values of ``group``; the data never has the last one (a true zero, published)."""
DASK_PARTITIONS, DASK_ROWS = 40, 500


def _dask_policy(folder: Path, address: str) -> Path:
    path = folder / "nc-dask.yaml"
    path.write_text(
        f"""
name: nc-dask
version: "1"
dataset:
  id: nc-dask-population
  path: data.parquet
  format: parquet
  columns:
    sex: {{type: string, values: [F, M]}}
    group: {{type: string, values: [{", ".join(DASK_GROUPS)}]}}
mechanisms:
  - {{name: table, type: noisy_counts, columns: [sex, group], noise: {{distribution: gaussian, sigma: 20}}}}
targets:
  accounting: approximate
  delta: 1.0e-6
  lifetime_budget: {{epsilon: 100, delta: 1.0e-3}}
engine: {{name: dask, address: '{address}', rows_per_partition: {DASK_ROWS}}}
"""
    )
    return path


def test_release_on_dask_adds_the_noise_once_to_the_merged_counts(tmp_path, monkeypatch):
    """A gaussian (sigma 20) table of 2 x 20 cells over 40 partitions of a Parquet file, on a
    local Dask cluster: every declared cell published once (the empty one included), integer
    counts, the ledger's event the plan's, and the noise the one draw per cell of ``finish``:
    every cell within the exact half-width at confidence 1 - ALPHA / 40 of its true count (a
    correct release fails with probability <= ALPHA = 1e-6, union bound), the total within the
    sub-Gaussian bound of 40 draws (CKS Corollary 9: ``P(|sum| > T) <= 2 e^(-T^2 / (2 * 40 *
    sigma^2))``, ALPHA again). Noise added per partition instead would be 40 draws per cell
    (standard deviation about 126, against a half-width of 111): each cell inside with
    probability about 0.62, all 40 about 0.62^40 < 1e-8, so such a release fails this test."""
    pytest.importorskip("distributed", reason="the dask extra is not installed: pip install -e '.[dask]'")
    import logging

    from distributed import LocalCluster
    from test_flow_steps import ledger_entries

    from privrelease.flows.engines import LOCAL_HTTP
    from privrelease.mechanisms.events import event_from_json

    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "work"))
    for name in ("PRIVRELEASE_DB_URL", "PRIVRELEASE_PRODUCTION", "PRIVRELEASE_DEFAULT_LIFETIME_BUDGET"):
        monkeypatch.delenv(name, raising=False)
    rng = np.random.default_rng(5)  # test data, not a mechanism
    sex = rng.choice(["F", "M"], DASK_PARTITIONS * DASK_ROWS)
    group = rng.choice(DASK_GROUPS[:-1], DASK_PARTITIONS * DASK_ROWS)
    pq.write_table(pa.table({"sex": sex, "group": group}), tmp_path / "data.parquet", row_group_size=DASK_ROWS)
    truth = {(s, g): 0 for s in ("F", "M") for g in DASK_GROUPS}
    for cell in zip(sex.tolist(), group.tolist(), strict=True):
        truth[cell] += 1

    logging.getLogger("distributed").setLevel(logging.ERROR)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=LOCAL_HTTP) as cluster:
        path = _dask_policy(tmp_path, cluster.scheduler_address)
        published = release_plain(policy_path=str(path))

    report = Path(published.report).read_text()
    assert f"{DASK_PARTITIONS} partitions on a cluster of 2 workers" in report, "the release ran on Dask"
    table = pq.read_table(Path(published.release_dir) / "table.parquet")
    assert table.column_names == ["sex", "group", "count", "lower", "upper"] and table.num_rows == len(truth) == 40
    cells = list(zip(table.column("sex").to_pylist(), table.column("group").to_pylist(), strict=True))
    assert sorted(cells) == sorted(truth), "every declared cell once, the empty ones included"
    counts = table.column("count").to_numpy()
    assert counts.dtype == np.int64
    (entry,) = ledger_entries()
    assert event_from_json(entry.event_json) == plan_policy(load_policy(path)).event

    noise = counts - np.array([truth[cell] for cell in cells])
    width = nc.all_cells_half_width("gaussian", 20, 1 - ALPHA, len(cells))  # all 40 at once
    assert np.abs(noise).max() <= width, (noise.tolist(), width)
    total = 20 * math.sqrt(2 * len(cells) * math.log(2 / ALPHA))
    assert abs(int(counts.sum()) - DASK_PARTITIONS * DASK_ROWS) <= total
    assert np.any(noise != 0)  # all 40 draws 0: probability below 0.02^40


@pytest.mark.parametrize("delta", [0.3, 1e-3, 1e-6])
@pytest.mark.parametrize("epsilon", [1e-300, 1e-20, 1e-18])
def test_sigma_at_a_negligible_epsilon_in_closed_form(delta: float, epsilon: float) -> None:
    """Where e^eps - 1 <= 1e-8 delta, sigma = 1 / (delta sqrt(2 pi)) (+1e-9): the exact delta at
    eps meets the target and a sigma 1e-7 smaller misses it; where sigma is small enough to sum
    in mpmath, P(0) = 1 / sum_z e^(-z^2 / (2 sigma^2)) is at most delta and within 1e-7 of it
    (the bisection took 40 s at eps 1e-300 and is not run)."""
    sigma = nc.zero_epsilon_sigma(epsilon, delta)
    assert sigma is not None and nc.calibrate_sigma(epsilon, delta) == sigma
    assert approximate_delta("gaussian", sigma, epsilon) <= delta
    assert approximate_delta("gaussian", sigma * (1 - 1e-7), epsilon) > delta
    if sigma < 1000:
        with mpmath.workdps(30):
            s2 = 2 * mpmath.mpf(sigma) ** 2
            p0 = 1 / (1 + 2 * mpmath.fsum(mpmath.exp(-(z**2) / s2) for z in range(1, math.ceil(40 * sigma))))
        assert delta * (1 - 1e-7) <= p0 <= delta


def test_sigma_closed_form_only_where_epsilon_is_negligible() -> None:
    assert nc.zero_epsilon_sigma(1e-12, 1e-6) is None  # e^eps - 1 = 1e-12 > 1e-14
    assert nc.zero_epsilon_sigma(1e-300, 0.5) is None  # sigma 0.8 < 1: the Poisson sum is not ~1
    assert nc.zero_epsilon_sigma(1e-300, 1e-9) > nc.MAX_NOISE  # the CLI: no sigma up to 1e6 reaches it
