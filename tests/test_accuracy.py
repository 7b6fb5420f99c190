"""Data-free accuracy statements (mechanisms/accuracy.py) against independent computations
(scipy, 40-digit mpmath), exact coverage, simulated releases, and a broken variant each."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import mpmath
import numpy as np
import pytest
from scipy.stats import binom

from privrelease.errors import UserError
from privrelease.mechanisms.accuracy import count_accuracy, laplace_half_width, selection_gap
from privrelease.mechanisms.selection import selection_probabilities

REPO = Path(__file__).resolve().parents[1]
CELLS = [(20, 0.1, 200), (20, 0.1, 1000), (10, 0.5, 25), (5, 0.3, 40), (50, 0.05, 3000), (1, 0.2, 7)]


@pytest.mark.parametrize(("k", "beta", "n"), CELLS)
def test_publication_probability_error_and_bias_against_independent_computations(k, beta, n) -> None:
    """P[Bin(N, beta) >= k] and the relative standard error against scipy; the suppression
    bias E[X/beta | X >= k] / N - 1 summed term by term in 40 digits."""
    result = count_accuracy(k, beta, n)
    assert result.publish_probability == pytest.approx(binom.sf(k - 1, n, beta), rel=1e-10)
    assert result.relative_standard_error == pytest.approx(binom.std(n, beta) / beta / n, rel=1e-12)
    with mpmath.workdps(40):
        p = mpmath.mpf(beta)
        terms = [(x, mpmath.binomial(n, x) * p**x * (1 - p) ** (n - x)) for x in range(k, n + 1)]
        mass = mpmath.fsum(t for _, t in terms)
        bias = mpmath.fsum(x * t for x, t in terms) / mass / p / n - 1
    assert result.suppression_bias == pytest.approx(float(bias), rel=1e-9, abs=1e-12)


FAR_ABOVE_THE_MEAN = [(100, 0.01, 1000), (20, 0.01, 200), (5, 0.01, 7), (20, 0.1, 10**15)]
"""k far above n beta (the old 12-sigma window held only k: the interval [k, k] covered 0.91 at
C = 0.95), and the largest count a target may name (its support was materialized: 5.6 GB)."""


@pytest.mark.parametrize(("k", "beta", "n"), CELLS + FAR_ABOVE_THE_MEAN)
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_interval_is_a_central_interval_of_published_estimates(k, beta, n, confidence) -> None:
    """Exact: at most (1 - C)/2 of the published estimates' distribution (X / beta given
    X >= k, scipy) lies on each side, so the coverage is at least C; it is the shortest such
    interval of that construction (one step in from either end breaks a tail)."""
    result = count_accuracy(k, beta, n, confidence=confidence)
    lo, hi = (round(end * beta) for end in result.interval)
    published = binom.sf(k - 1, n, beta)
    below = (binom.cdf(lo - 1, n, beta) - binom.cdf(k - 1, n, beta)) / published
    above = binom.sf(hi, n, beta) / published
    tail = (1 - confidence) / 2
    assert below <= tail + 1e-12 and above <= tail + 1e-12
    assert result.coverage == pytest.approx(1 - below - above, abs=1e-9) and result.coverage >= confidence
    if lo > k:
        assert (binom.cdf(lo, n, beta) - binom.cdf(k - 1, n, beta)) / published > tail
    if hi < n:
        assert binom.sf(hi - 1, n, beta) / published > tail


@pytest.mark.parametrize(("k", "beta", "n"), [(20, 0.1, 200), (20, 0.1, 1000), (10, 0.5, 25), (5, 0.3, 40)])
def test_interval_coverage_by_simulated_releases(k, beta, n) -> None:
    """20,000 simulated releases of a cell: among those published, the share of estimates
    inside the 95% interval is within 1 point of the exact coverage (sampling sd <= 0.2 point)."""
    result = count_accuracy(k, beta, n, confidence=0.95)
    draws = np.random.default_rng().binomial(n, beta, size=40_000)
    published = draws[draws >= k][:20_000]
    assert published.size >= 10_000
    estimates = published / beta
    inside = np.mean((estimates >= result.interval[0] - 1e-9) & (estimates <= result.interval[1] + 1e-9))
    assert abs(inside - result.coverage) < 0.01
    assert np.mean(estimates) / n - 1 == pytest.approx(result.suppression_bias, abs=5 * np.std(estimates) / n / 100)


def test_an_interval_that_ignores_suppression_is_caught() -> None:
    """The broken variant: an interval around N, N (1 +- z RSE), stated for published
    estimates. For a cell of 100 people (k 20, beta 0.1) every published estimate is >= 200:
    that interval covers none of them; ours covers at least 95%."""
    result = count_accuracy(20, 0.1, 100, confidence=0.95)
    naive = (100 * (1 - 1.96 * result.relative_standard_error), 100 * (1 + 1.96 * result.relative_standard_error))
    published = np.arange(20, 101)
    weights = binom.pmf(published, 100, 0.1)
    covered = weights[(published / 0.1 >= naive[0]) & (published / 0.1 <= naive[1])].sum() / weights.sum()
    assert covered == 0.0 and result.coverage >= 0.95
    assert result.interval[0] >= 200 and result.suppression_bias > 1


@pytest.mark.parametrize(("k", "beta", "n", "r"), [(20, 0.1, 1000, 0.25), (20, 0.1, 200, 0.3), (10, 0.5, 30, 0.1)])
def test_within_target_against_a_term_by_term_sum(k, beta, n, r) -> None:
    """P[published and |X / beta - N| <= r N], with the limits decided in exact rationals."""
    b, ratio = Fraction(str(beta)), Fraction(str(r))
    with mpmath.workdps(40):
        p = mpmath.mpf(beta)
        truth = mpmath.fsum(
            mpmath.binomial(n, x) * p**x * (1 - p) ** (n - x)
            for x in range(k, n + 1)
            if abs(Fraction(x) / b - n) <= ratio * n
        )
    assert count_accuracy(k, beta, n, relative_error=r).within == pytest.approx(float(truth), rel=1e-9, abs=1e-15)


def test_a_cell_smaller_than_k_is_never_published() -> None:
    result = count_accuracy(20, 0.1, 19, relative_error=0.5)
    assert result.publish_probability == 0 and result.interval is None and result.within == 0


def test_laplace_half_width_by_opendps_own_sampler() -> None:
    """20,000 draws of OpenDP's Laplace sampler (the one the releases use): the share within
    b ln(1/(1-C)) is within 1 point of C; a Gaussian-quantile width (1.96 b) is caught: it
    covers 1 - e^-1.96 = 86%."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    scale, confidence = 3.0, 0.95
    measurement = dp.m.make_laplace(
        dp.vector_domain(dp.atom_domain(T=float, nan=False)), dp.l1_distance(T=float), scale=scale
    )
    noise = np.asarray(measurement([0.0] * 20_000))
    half_width = laplace_half_width(scale, confidence)
    assert half_width == pytest.approx(scale * math.log(20))
    assert abs(np.mean(np.abs(noise) <= half_width) - confidence) < 0.01
    assert np.mean(np.abs(noise) <= 1.96 * scale) < confidence - 0.05


@pytest.mark.parametrize(("epsilon", "candidates", "failure"), [(1.0, 3, 0.05), (0.2, 20, 0.1), (2.0, 2, 0.01)])
def test_selection_gap_holds_for_the_worst_score_configuration(epsilon, candidates, failure) -> None:
    """Exact probabilities of the mechanism as run: with every other candidate just beyond the
    gap below the best, the chance of choosing one of them is at most t, and nearly t: there it
    is t / (1 + t) (the union runs over the c - 1 candidates other than the best: with ln c in
    place of ln(c - 1) it was (c - 1) t / c / (1 + (c - 1) t / c), 1.25x loose in the gap for
    two candidates at t = 0.01)."""
    bound = 0.24
    gap = selection_gap(bound, epsilon, candidates, failure)
    scores = [100.0] + [100.0 - gap * (1 + 1e-12)] * (candidates - 1)
    miss = selection_probabilities(scores, epsilon=epsilon, sensitivity=bound)[1:].sum()
    assert miss <= failure
    assert miss == pytest.approx(failure / (1 + failure), rel=1e-9)


def test_selection_gap_of_one_candidate_is_zero() -> None:
    """With one candidate the mechanism always picks the best: no gap."""
    assert selection_gap(0.24, 1.0, 1, 0.05) == 0.0


def test_bad_parameters_name_the_field() -> None:
    with pytest.raises(UserError, match="confidence"):
        count_accuracy(20, 0.1, 100, confidence=1.0)
    with pytest.raises(UserError, match="count"):
        count_accuracy(20, 0.1, 0)
    with pytest.raises(UserError, match="relative_error"):
        count_accuracy(20, 0.1, 100, relative_error=-0.1)
    with pytest.raises(UserError, match="scale"):
        laplace_half_width(0.0)


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "privrelease", *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )


def test_guarantee_accuracy_commands() -> None:
    result = cli("guarantee", "accuracy", "sdgs", "--k", "20", "--beta", "0.1", "--count", "200,1000", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)["rows"]
    assert [row["count"] for row in rows] == [200, 1000]
    assert rows[1] == count_accuracy(20, 0.1, 1000).as_dict() | {"interval": rows[1]["interval"]}
    assert {"publish_probability", "relative_standard_error", "interval", "coverage", "suppression_bias"} <= rows[
        0
    ].keys()
    laplace = json.loads(cli("guarantee", "accuracy", "laplace", "--scale", "2", "--json").stdout)
    assert laplace["half_width"] == laplace_half_width(2.0, 0.95)
    bad = cli("guarantee", "accuracy", "sdgs", "--k", "20", "--beta", "0.1", "--count", "0")
    assert bad.returncode == 2 and "count" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.parametrize(("k", "count", "r", "confidence"), [(20, 1000, 0.1, 0.95), (10, 200, 0.2, 0.9)])
def test_smallest_beta_is_the_first_grid_point_meeting_the_target(k, count, r, confidence) -> None:
    """Every grid beta below the answer misses the target and the answer meets it, each judged
    by scipy with the limits decided in exact rationals (an independent evaluation)."""
    from privrelease.mechanisms.accuracy import BETA_STEP, smallest_beta

    beta = smallest_beta(k, count, r, confidence)
    steps = round(beta / float(BETA_STEP))
    ratio = Fraction(str(r))

    def within(step: int) -> float:
        b = step * BETA_STEP
        low, high = max(k, math.ceil(b * count * (1 - ratio))), min(count, math.floor(b * count * (1 + ratio)))
        return 0.0 if high < low else binom.cdf(high, count, float(b)) - binom.cdf(low - 1, count, float(b))

    assert within(steps) >= confidence
    assert all(within(step) < confidence for step in range(1, steps))


def test_calibrate_accuracy_reports_the_privacy_cost() -> None:
    from privrelease.mechanisms.accuracy import smallest_beta
    from privrelease.mechanisms.sdgs_calibration import smallest_epsilon

    result = cli(
        "calibrate", "accuracy", "--k", "20", "--count", "1000", "--relative-error", "0.1", "--delta", "1e-6", "--json"
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["beta"] == smallest_beta(20, 1000, 0.1, 0.95) and document["within"] >= 0.95
    assert document["epsilon"] == smallest_epsilon(20, document["beta"], 1e-6, "approximate").epsilon
    text = cli("calibrate", "accuracy", "--k", "20", "--count", "1000", "--relative-error", "0.1", "--delta", "1e-6")
    assert "a cell of 1000 people is published and within +-10% (+-100 people) with probability" in text.stdout
    unreachable = cli("calibrate", "accuracy", "--k", "200", "--count", "100", "--relative-error", "0.1")
    assert unreachable.returncode == 1 and "no beta reaches it" in unreachable.stderr


@pytest.mark.parametrize(("scale", "groups"), [(1.0, 2), (3.9152303779463504, 16), (0.0014, 1000), (50.0, 10**6)])
def test_laplace_all_groups_half_width_against_scipy(scale: float, groups: int) -> None:
    """All N i.i.d. Laplace noises within +-h at once: scipy's Laplace cdf gives
    P(|X| <= h)^N >= C, equal to C within 1e-12 (h is the exact quantile, rounded up)."""
    from scipy.stats import laplace

    from privrelease.mechanisms.accuracy import laplace_all_half_width

    for confidence in (0.5, 0.9, 0.95, 0.99):
        h = laplace_all_half_width(scale, confidence, groups)
        with mpmath.workdps(50):
            inside = mpmath.mpf(1) - mpmath.mpf(2) * mpmath.mpf(float(laplace.sf(h, scale=scale)))
            assert inside**groups >= confidence * (1 - 1e-14)  # scipy's sf in floats: relative 1e-16
            assert abs(inside**groups / confidence - 1) < 1e-12
        assert h > laplace_half_width(scale, confidence)
    assert laplace_all_half_width(scale, 0.95, 1) == laplace_half_width(scale, 0.95)


def test_a_grouped_statistic_states_each_group_and_all_groups() -> None:
    """adult-identifiable counts people per education (16 groups): each group's half-width and
    the wider one of all 16 at once; an ungrouped mean states one value's only."""
    from privrelease.mechanisms.accuracy import laplace_all_half_width
    from privrelease.planning import plan_policy
    from privrelease.policies import load_policy

    plan = plan_policy(load_policy(Path(__file__).resolve().parents[1] / "policies/examples/adult-identifiable.yaml"))
    grouped, mean = plan.accuracy["people-by-education"], plan.accuracy["mean-age"]
    assert grouped is not None and grouped.noise is not None and mean is not None and mean.noise is not None
    scale = grouped.noise.scale
    assert grouped.noise.cells == 16 and grouped.noise.unit == "group"
    assert grouped.noise.all_cells_half_width == {c: laplace_all_half_width(scale, c, 16) for c in (0.9, 0.95, 0.99)}
    assert grouped.as_dict()["all_cells_half_width"]["0.95"] > grouped.as_dict()["half_width"]["0.95"]
    assert "all_cells_half_width" not in mean.as_dict()
