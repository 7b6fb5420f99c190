"""The Rényi-DP closed form (:mod:`privrelease.mechanisms.renyi`) and the bounded-range selection,
against independent computations: the exact Gaussian curve (Balle-Wang, 40-digit mpmath), the
exact composition of the discrete Gaussian (convolution) and of randomized response (binomial
sums, scipy), Mironov's Rényi divergence of the Laplace mechanism, and the two-point pairs an
epsilon-bounded-range mechanism reaches (a lower bound, met by a two-candidate selection)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy.stats import binom

from privrelease.mechanisms import composition, renyi
from privrelease.mechanisms.events import (
    SDGS,
    BoundedRangeSelection,
    Composed,
    ExponentialSelection,
    Laplace,
    bounded_range_delta,
    event_to_json,
)
from privrelease.mechanisms.kinds.noisy_counts import DiscreteGaussian
from privrelease.mechanisms.selection import selection_probabilities, sensitivity

DIGITS = 40


def gaussian_delta(mu: float, epsilon: float) -> mpmath.mpf:
    """Exact delta of the Gaussian mechanism of sensitivity / sigma = mu (Balle-Wang Theorem 8)."""
    with mpmath.workdps(DIGITS):
        mu, epsilon = mpmath.mpf(mu), mpmath.mpf(epsilon)
        return mpmath.ncdf(mu / 2 - epsilon / mu) - mpmath.exp(epsilon) * mpmath.ncdf(-mu / 2 - epsilon / mu)


def smallest(delta_of, delta: float, high: float) -> float:
    """Bisection for the smallest epsilon in [0, high] with delta_of(epsilon) <= delta."""
    low = 0.0
    for _ in range(80):
        middle = (low + high) / 2
        low, high = (low, middle) if delta_of(middle) <= delta else (middle, high)
    return high


@pytest.mark.parametrize("mu", [0.05, 0.5, 2.0, 30.0, 236.35, 7474.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-6, 1e-9])
def test_conversion_is_never_below_the_exact_gaussian(mu: float, delta: float) -> None:
    """The Gaussian's divergences a mu^2 / 2 are exact, so the converted epsilon can never be
    below the exact one (the CKS conversion is sound) and is close: within 25% for one release
    at delta 1e-3 (where PLDs answer), within 0.6% and 0.02% at mu 236 and 7474 (10^6 and 10^9
    releases of sigma 4.231)."""
    epsilon = renyi.convert_epsilon(renyi.ORDERS * mu * mu / 2, 0.0, delta)
    assert gaussian_delta(mu, epsilon) <= delta
    exact = smallest(lambda e: gaussian_delta(mu, e), delta, mu * mu / 2 + 40 * mu + 10)
    assert exact <= epsilon <= exact * (1.25 if mu < 100 else 1.006 if mu < 1000 else 1.0002)
    assert renyi.convert_delta(renyi.ORDERS * mu * mu / 2, 0.0, epsilon) <= delta * (1 + 1e-9)


def discrete_gaussian_composed_delta(sigma: float, times: int, epsilon: float) -> float:
    """Exact delta of ``times`` discrete Gaussian releases (sensitivity 1): the loss is
    (times - 2 S) / (2 sigma^2), S the sum of the noises (pmf convolved, 40-digit weights)."""
    reach = int(12 * sigma) + 2
    z = range(-reach, reach + 1)
    with mpmath.workdps(DIGITS):
        weights = [mpmath.exp(-(mpmath.mpf(v) ** 2) / (2 * sigma**2)) for v in z]
        total = mpmath.fsum(weights)
        pmf = np.array([float(w / total) for w in weights])
    composed = pmf
    for _ in range(times - 1):
        composed = np.convolve(composed, pmf)
    sums = np.arange(-times * reach, times * reach + 1)
    losses = (times - 2 * sums) / (2 * sigma**2)
    return float(np.sum(composed * np.where(losses > epsilon, -np.expm1(np.minimum(epsilon - losses, 0.0)), 0.0)))


@pytest.mark.parametrize(("sigma", "times"), [(1.0, 3), (2.0, 5), (4.231, 40)])
def test_discrete_gaussian_by_renyi_is_never_below_its_exact_composition(sigma: float, times: int) -> None:
    event = DiscreteGaussian(sigma=sigma, epsilon=1.0)
    releases = {event: times}
    for delta in (1e-3, 1e-6):
        epsilon = renyi.epsilon_for_delta(releases, delta)
        assert discrete_gaussian_composed_delta(sigma, times, epsilon) <= delta
        for e in (0.5 * epsilon, epsilon):
            assert renyi.delta_for_epsilon(releases, e) >= discrete_gaussian_composed_delta(sigma, times, e)


def test_adult_noisy_beyond_the_pld_is_close_to_the_gaussian_composition() -> None:
    """Issue 25 item 8: 1,000,001 runs of adult-noisy (sigma 4.231) had no epsilon (advanced
    composition of the stated points: their deltas add past 1e-6); the Rényi bound answers
    within 0.5% of the exact continuous Gaussian composition (sigma / sqrt(n)), a billion runs
    within 0.02%, in closed form."""
    event = DiscreteGaussian(sigma=4.231, epsilon=1.0)
    for times, slack in ((1_000_001, 1.005), (10**9, 1.0002)):
        result = composition.epsilon_at([event], 1e-6, times=times)
        assert result.method == composition.RENYI and math.isinf(result.candidates[composition.ADVANCED][0])
        mu = math.sqrt(times) / 4.231
        exact = smallest(lambda e, mu=mu: gaussian_delta(mu, e), 1e-6, mu * mu / 2 + 40 * mu)
        assert exact <= result.epsilon <= exact * slack


def test_near_the_pld_limit_renyi_is_close_to_the_pld() -> None:
    """At 10^4 releases both answer: the Rényi epsilon is above dp_accounting's optimistic PLD
    (a lower bound) and within 5% of the pessimistic one."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    event = DiscreteGaussian(sigma=4.231, epsilon=1.0)
    result = composition.epsilon_at([event], 1e-6, times=10_000)
    lower = pld.from_discrete_gaussian_mechanism(4.231, pessimistic_estimate=False).self_compose(10_000)
    by_renyi, by_pld = result.candidates[composition.RENYI][0], result.candidates[composition.PLD][0]
    assert lower.get_epsilon_for_delta(1e-6) <= by_renyi <= 1.05 * by_pld


def randomized_response_curve(epsilon: float, times: int):
    """The exact delta curve of ``times`` randomized responses of odds e^epsilon: the loss is
    epsilon (times - 2 K), K ~ Bin(times, 1 / (1 + e^epsilon)) (scipy, over 40 sd of K)."""
    q = 1 / (1 + math.exp(epsilon))
    center, spread = times * q, math.sqrt(times * q * (1 - q))
    k = np.arange(max(0, int(center - 40 * spread)), min(times, int(center + 40 * spread)) + 1)
    losses, weights = epsilon * (times - 2.0 * k), np.exp(binom.logpmf(k, times, q))
    return lambda at: float(np.sum(weights * np.where(losses > at, -np.expm1(np.minimum(at - losses, 0.0)), 0.0)))


@pytest.mark.parametrize("times", [10**4, 10**7, 10**9])
def test_pure_dp_by_renyi_against_exact_randomized_response(times: int) -> None:
    """A pure epsilon-DP release's PLD is randomized response: its exact composition (a binomial
    sum) is what the Rényi bound must not go below; it is within 5% of it at 10^4 releases and
    1% at 10^7 (the conversion's slack, as for the Gaussian)."""
    event = ExponentialSelection(epsilon=0.1, candidates=3, sensitivity=1.0)
    epsilon = renyi.epsilon_for_delta({event: times}, 1e-6)
    curve = randomized_response_curve(0.1, times)
    assert curve(epsilon) <= 1e-6
    assert epsilon <= (1.05 if times < 10**6 else 1.01) * smallest(curve, 1e-6, epsilon)


def test_laplace_divergences_against_mironov() -> None:
    """From the Laplace PLD (losses rounded up to the 1e-3 grid): never below Mironov's exact
    D_a = ln(a / (2a - 1) e^((a - 1) eps) + (a - 1) / (2a - 1) e^(-a eps)) / (a - 1), and above
    it by at most the grid step (plus the rounding allowance near a = 1)."""
    eps = 0.5
    found = renyi.of_event(Laplace(scale=2.0, sensitivity=1.0))
    assert found.infinite <= 1e-15  # dp_accounting's rounding
    for order, bound in zip(renyi.ORDERS[::20], found.divergences[::20], strict=True):
        a = mpmath.mpf(order)
        exact = mpmath.log(a / (2 * a - 1) * mpmath.exp((a - 1) * eps) + (a - 1) / (2 * a - 1) * mpmath.exp(-a * eps))
        exact /= a - 1
        assert exact <= bound <= exact + 1e-3 + 1e-9 / (order - 1)


def test_sdgs_splits_off_its_infinite_loss() -> None:
    """SDGS publishes all k copies of a cell with probability beta^k, an infinite loss: n releases
    hit one with probability 1 - (1 - beta^k)^n, below which no delta can go; the Rényi bound
    charges exactly that far out, and the rest by its divergences."""
    event = SDGS(k=20, beta=0.1, epsilon=1.0)
    found = renyi.of_event(event)
    assert found.infinite == pytest.approx(0.1**20, rel=1e-6)
    floor = float(-mpmath.expm1(10**9 * mpmath.log1p(-(mpmath.mpf(0.1) ** 20))))
    assert floor <= renyi.delta_for_epsilon({event: 10**9}, 1e6) <= floor * (1 + 1e-5)


# --- the bounded-range selection (issue 25 item 9) ---------------------------------------------


def two_point_delta(width: float, t: float, epsilon: float) -> mpmath.mpf:
    """Delta at ``epsilon`` of the pair with losses t (P-mass (e^w - e^t) / (e^w - 1)) and t - w."""
    with mpmath.workdps(DIGITS):
        w, t = mpmath.mpf(width), mpmath.mpf(t)
        p = (mpmath.exp(w) - mpmath.exp(t)) / mpmath.expm1(w)
        return p * max(0, 1 - mpmath.exp(epsilon - t))


@pytest.mark.parametrize("width", [0.1, 1.0, 3.0])
def test_bounded_range_profile_is_the_largest_two_point_delta(width: float) -> None:
    """The closed form equals the maximum over t (mpmath's root of the derivative, and never
    below a grid of t) and is met by a two-candidate selection whose first score is up by the
    sensitivity on the larger table (scores chosen to put the loss range at that t): exact."""
    for epsilon in (0.0, 0.25 * width, 0.9 * width):
        best = mpmath.findroot(
            lambda t, e=epsilon: mpmath.diff(lambda s: two_point_delta(width, s, e), t),
            epsilon + 0.6 * (width - epsilon),
        )
        truth = two_point_delta(width, best, epsilon)
        assert truth <= bounded_range_delta(width, epsilon) <= truth * (1 + 1e-12)
        grid = max(two_point_delta(width, t, epsilon) for t in np.linspace(0, width, 101))
        assert grid <= bounded_range_delta(width, epsilon)
        t = float(best)  # the losses t and t - width: e^(width g) = (1 - e^(t - width)) / (e^t - 1)
        gap = math.log(-math.expm1(t - width) / math.expm1(t)) / width
        before = selection_probabilities([gap, 0.0], epsilon=width, sensitivity=1.0)
        after = selection_probabilities([gap + 1.0, 0.0], epsilon=width, sensitivity=1.0)
        reached = math.fsum(max(0.0, a - math.exp(epsilon) * b) for a, b in zip(after, before, strict=True))
        assert reached == pytest.approx(bounded_range_delta(width, epsilon), rel=1e-9, abs=1e-15)
    assert bounded_range_delta(width, width) == 0.0


@pytest.mark.parametrize("width", [0.1, 1.0, 3.0])
def test_bounded_range_is_an_eighth_of_epsilon_squared_concentrated(width: float) -> None:
    """Cesar-Rogers: the Rényi divergence of every two-point pair of range ``width`` is at most
    a width^2 / 8 (checked on a grid of t and orders, 40 digits)."""
    with mpmath.workdps(DIGITS):
        _check_an_eighth(width)


def _check_an_eighth(width: float) -> None:
    for order in (1.001, 1.5, 3.0, 30.0):
        a = mpmath.mpf(order)
        for t in np.linspace(0.01, width - 0.01, 25):
            p = (mpmath.exp(width) - mpmath.exp(t)) / mpmath.expm1(width)
            moment = p * mpmath.exp((a - 1) * t) + (1 - p) * mpmath.exp((a - 1) * (t - width))
            assert mpmath.log(moment) / (a - 1) <= a * width**2 / 8


def lower_bound(width: float, times: int, delta: float, ts: np.ndarray | None = None) -> float:
    """The largest epsilon at ``delta`` of ``times`` runs on one neighbouring pair of a
    two-candidate selection (a fixed t, composed exactly: a binomial sum over 40 sd), over
    ``ts`` (199 values by default): no sound accountant may state less."""
    best = 0.0
    for t in np.linspace(0, width, 201)[1:-1] if ts is None else ts:
        p = (math.exp(width) - math.exp(t)) / math.expm1(width)
        spread = math.sqrt(times * p * (1 - p))
        k = np.arange(max(0, int(times * p - 40 * spread)), min(times, int(times * p + 40 * spread)) + 1)
        losses, weights = k * t + (times - k) * (t - width), binom.pmf(k, times, p)

        def delta_of(e: float, losses=losses, weights=weights) -> float:
            return float(np.sum(weights * np.where(losses > e, -np.expm1(np.minimum(e - losses, 0.0)), 0.0)))

        if delta_of(0.0) > delta:
            best = max(best, smallest(delta_of, delta, times * width))
    return best


@pytest.mark.parametrize(
    ("times", "delta", "old", "new"),
    [(1, 1e-3, 1.2, 1.001), (2, 1e-3, 1.4, 1.03), (12, 1e-6, 1.7, 1.12), (12, 1e-9, 1.3, 1.07)],
)
def test_selection_composes_close_to_the_lower_bound(times: int, delta: float, old: float, new: float) -> None:
    """Issue 25 item 9: composed as randomized response the selection was charged 1.24x / 1.43x /
    1.71x / 1.34x the lower bound at these points; by its bounded range never below it and within
    1.001x / 1.03x / 1.12x / 1.07x."""
    lower = lower_bound(0.1, times, delta)
    charged = composition.epsilon_at(
        [BoundedRangeSelection(epsilon=0.1, candidates=2, sensitivity=1.0)], delta, times=times
    )
    as_before = composition.epsilon_at(
        [ExponentialSelection(epsilon=0.1, candidates=2, sensitivity=1.0)], delta, times=times
    )
    assert lower <= charged.epsilon <= new * lower
    assert as_before.epsilon >= old * lower


def test_adult_select_beyond_the_pld() -> None:
    """Issue 25 item 8: 10^6 runs of adult-select's release (selection at 0.1, then SDGS k 20,
    beta 0.1) were charged 472,396 by advanced composition of the stated points; the Rényi bound
    gives under 2,400, above the selection's own lower bound (fixed t, exact binomial sum)."""
    tree = Composed(
        events=(
            BoundedRangeSelection(epsilon=0.1, candidates=2, sensitivity=sensitivity(20, 0.1)),
            SDGS(k=20, beta=0.1, epsilon=1.0),
        )
    )
    result = composition.epsilon_at([tree], 1e-6, times=10**6)
    assert result.method == composition.RENYI
    assert result.epsilon * 150 < result.candidates[composition.ADVANCED][0]
    assert lower_bound(0.1, 10**6, 1e-6, np.array([0.05])) <= result.epsilon < 2400


def test_stored_trees_replay_as_recorded() -> None:
    """An ``exponential_selection`` tree stored before the bounded-range kind still composes as
    randomized response (the figures in old audit databases), and a figure recorded before the
    Rényi bound existed replays to what the other methods give (never smaller than today's)."""
    from privrelease.audit import replay
    from privrelease.mechanisms import pld

    old = Composed(
        events=(ExponentialSelection(epsilon=0.1, candidates=2, sensitivity=0.24), SDGS(k=20, beta=0.1, epsilon=1.0))
    )
    recorded = pld.epsilon_for_delta(pld.sdgs_pld(20, 0.1).compose(pld.pure_dp_pld(0.1)), 1e-9)
    ((epsilon, delta),) = replay._guarantee_pairs(event_to_json(old), "approximate", "approximate", 1e-9)
    assert epsilon == pytest.approx(recorded, rel=1e-12) and delta == 1e-9

    twenty = Composed(events=(BoundedRangeSelection(epsilon=0.1, candidates=2, sensitivity=1.0),) * 20)
    today, before = replay._guarantee_pairs(event_to_json(twenty), "approximate", "approximate", 1e-6)
    result = composition.epsilon_at([twenty], 1e-6)
    assert result.method == composition.RENYI and today == (result.epsilon, 1e-6)
    assert before == (result.candidates[composition.PLD][0], 1e-6) and before[0] > today[0]
