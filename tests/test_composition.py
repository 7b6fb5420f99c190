"""Composition by the tightest sound method: exact for one SDGS release, privacy loss
distributions, optimal and basic composition of the stated points."""

from __future__ import annotations

import math

import pytest
from conftest import cpu_seconds

from privrelease.mechanisms import composition, pld
from privrelease.mechanisms.composition import smallest_epsilon
from privrelease.mechanisms.events import SDGS, Composed, Laplace, SPLUGen
from privrelease.mechanisms.sdgs_math import delta_exact

ADULT = SDGS(k=20, beta=0.1, epsilon=1.0)


def test_twelve_monthly_runs_by_pld_and_every_candidate_reported():
    result = composition.epsilon_at([ADULT], 1e-6, times=12)
    assert result.method == composition.PLD and result.releases == 12
    assert result.epsilon < 0.5
    assert result.candidates[composition.BASIC][0] == pytest.approx(12.0)
    assert result.epsilon == min(e for e, _ in result.candidates.values())
    assert composition.OPTIMAL not in result.candidates  # 2^12 subsets: beyond OPTIMAL_RELEASES
    six = composition.epsilon_at([ADULT], 1e-6, times=6)
    assert six.method == composition.PLD and six.epsilon < six.candidates[composition.OPTIMAL][0]


def test_one_sdgs_release_is_the_exact_profile_inverted():
    result = composition.epsilon_at([ADULT], 1e-9)
    assert result.method == composition.EXACT
    assert delta_exact(20, 0.1, result.epsilon).delta <= 1e-9
    assert delta_exact(20, 0.1, result.epsilon * (1 - 1e-6)).delta > 1e-9
    at = composition.delta_at([ADULT], 1.0)
    assert at.method == composition.EXACT and at.delta == delta_exact(20, 0.1, 1.0).delta


@pytest.mark.parametrize("epsilons", [(1.0, 1.0), (0.5, 1.0, 2.0), (1.0, 0.7, 0.7, 1.5)])
def test_pld_is_never_looser_than_optimal_composition_beyond_the_discretization(epsilons):
    releases = [SDGS(k=10, beta=0.2, epsilon=e) for e in epsilons]
    result = composition.epsilon_at(releases, 1e-5)
    pld_eps = result.candidates[composition.PLD][0]
    optimal_eps = result.candidates[composition.OPTIMAL][0]
    assert pld_eps <= optimal_eps + len(releases) * pld.DISCRETIZATION


def test_delta_and_epsilon_queries_agree():
    events = [ADULT, Laplace(scale=4.0, sensitivity=1.0)]
    at = composition.epsilon_at(events, 1e-6, times=6)
    back = composition.delta_at(events, at.epsilon, times=6)
    assert back.delta <= 1e-6 * (1 + 1e-9)
    assert composition.delta_at(events, at.epsilon * 0.98, times=6).delta > 1e-6


def test_trees_are_flattened_and_counted():
    tree = Composed(events=(ADULT, Laplace(scale=2.0, sensitivity=1.0)))
    assert composition.epsilon_at([tree], 1e-6, times=3).releases == 6


def test_what_is_not_dp_fails_closed():
    result = composition.epsilon_at([ADULT, SPLUGen(gamma=5)], 1e-6)
    assert not result.supported and math.isinf(result.epsilon) and result.delta == 1.0
    assert "not differential privacy" in result.detail
    assert not composition.delta_at([SDGS(k=5, beta=1.0, epsilon=1.0)], 1.0).supported


@pytest.mark.parametrize("bad", [0.0, 1.0, -1e-9, math.nan])
def test_delta_outside_the_unit_interval_is_refused(bad):
    with pytest.raises(ValueError, match="delta must be in"):
        composition.epsilon_at([ADULT], bad)


def test_the_readme_figure_comes_from_the_code():
    """The README's twelve-month figure is what the composition computes (to its two digits)."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    match = re.search(
        r"twelve monthly runs of `adult-sdgs` compose to epsilon\s+([0-9.]+) at delta ([0-9e.-]+)", readme
    )
    assert match, "the README no longer states the twelve-month figure"
    stated, delta = float(match.group(1)), float(match.group(2))
    assert round(composition.epsilon_at([ADULT], delta, times=12).epsilon, 2) == stated


def test_releases_compose_as_a_multiset():
    """Thousands of identical runs are one entry with a multiplicity: the same composition as
    the list of copies (the list is slow: every copy hashed and flattened), at a cost that does
    not grow with the count."""
    tree = Composed(events=(ADULT, Laplace(scale=4.0, sensitivity=1.0)))
    assert (
        composition.releases_of([tree] * 40)
        == composition.releases_of([tree], times=40)
        == {ADULT: 40, Laplace(scale=4.0, sensitivity=1.0): 40}
    )
    as_list = composition.epsilon_at([tree] * 40, 1e-6)
    as_multiset = composition.epsilon_at({tree: 40}, 1e-6)
    assert as_list == as_multiset and as_list.releases == 80
    # CPU time, not wall time: a machine busy with other tests slows it less (a pause of 0.3 s
    # in wall time would exceed 20 times the 50 runs' 15 ms); each answer computed, not recalled.
    composition._answered.cache_clear()
    few = cpu_seconds(lambda: composition.epsilon_at({ADULT: 50}, 1e-6))[1]
    composition._answered.cache_clear()
    many, seconds = cpu_seconds(lambda: composition.epsilon_at({ADULT: 50_000}, 1e-6))  # 1000 times the count
    assert seconds < 20 * few and many.method == composition.PLD, f"{seconds:.3f} s CPU; 50 runs {few:.3f} s"
    assert many.epsilon > composition.epsilon_at({ADULT: 25_000}, 1e-6).epsilon


def _kov_epsilon_mpmath(points: list[tuple[float, float, int]], delta: float) -> float:
    """Kairouz-Oh-Viswanath Theorem 3.5 at ``delta``, in 50-digit arithmetic."""
    import mpmath

    with mpmath.workdps(50):
        keep = mpmath.fprod((1 - mpmath.mpf(d)) ** n for _, d, n in points)
        spare = 1 - (1 - mpmath.mpf(delta)) / keep
        a = mpmath.fsum(n * mpmath.mpf(e) * (mpmath.exp(e) - 1) / (mpmath.exp(e) + 1) for e, _, n in points)
        b = mpmath.fsum(n * mpmath.mpf(e) ** 2 for e, _, n in points)
        return float(
            min(
                mpmath.fsum(n * mpmath.mpf(e) for e, _, n in points),
                a + mpmath.sqrt(2 * b * mpmath.log(mpmath.e + mpmath.sqrt(b) / spare)),
                a + mpmath.sqrt(2 * b * mpmath.log(1 / spare)),
            )
        )


def test_a_billion_releases_answer_in_closed_form_without_a_pld(monkeypatch) -> None:
    """Beyond PLD_MAX_RELEASES no composed PLD is built (its FFT would take hours); advanced
    composition equals an independent 50-digit evaluation, rounded up, and the Rényi bound
    (tests/test_renyi.py) answers, tighter."""
    monkeypatch.setattr(pld, "composed_pld", lambda *a, **k: pytest.fail("a PLD was built"))
    laplace = Laplace(scale=10.0, sensitivity=1.0)
    result = composition.epsilon_at([laplace], 1e-6, times=10**9)
    assert result.method == composition.RENYI and result.releases == 10**9
    truth = _kov_epsilon_mpmath([(0.1, 0.0, 10**9)], 1e-6)
    assert truth <= result.candidates[composition.ADVANCED][0] <= truth * (1 + 1e-9)
    assert result.epsilon < truth
    back = composition.delta_at([laplace], result.epsilon, times=10**9)
    assert back.method == composition.RENYI and 0 < back.delta <= 1e-6 * (1 + 1e-9)
    assert 0 < back.candidates[composition.ADVANCED][1] <= 1


def test_a_billion_stated_deltas_do_not_overflow() -> None:
    """Issue 25 item 7: a billion releases of a stated delta 1e-6 (adult-noisy) made
    ln((1 - delta) / prod(1 - delta_i)) past 709 and expm1 raised OverflowError; the stated
    deltas alone exceed delta, so advanced composition has no epsilon (inf), as 50 digits say."""
    import mpmath

    points = [(1.0, 1e-6, 10**9)]
    assert composition._advanced_epsilon(points, 1e-6) == math.inf
    assert 1 - (1 - mpmath.mpf(1e-6)) / (1 - mpmath.mpf(1e-6)) ** 10**9 < 0
    assert composition._advanced_epsilon([(1.0, 1e-12, 10**3)], 1e-6) == pytest.approx(
        float(_kov_epsilon_mpmath([(1.0, 1e-12, 10**3)], 1e-6)), rel=1e-9
    )


@pytest.mark.parametrize("points", [[(0.5, 1e-9, 6)], [(1.0, 1e-7, 2), (0.3, 0.0, 4)], [(0.1, 0.0, 10)]])
def test_advanced_composition_is_never_below_the_optimal_composition(points) -> None:
    """The optimal composition is exact over all (eps_i, delta_i)-DP mechanisms, so a sound
    closed form can never state less: at every epsilon its delta, and at every delta its
    epsilon, are at least the optimal ones."""
    from privrelease.mechanisms.accountants import optimal_composition_delta

    each = [(e, d) for e, d, n in points for _ in range(n)]
    total = sum(e * n for e, _, n in points)
    for fraction in (0.2, 0.4, 0.6, 0.8, 1.0):
        epsilon = fraction * total
        assert composition._advanced_delta(points, epsilon) >= optimal_composition_delta(each, epsilon)
    for delta in (1e-3, 1e-6):
        advanced = composition._advanced_epsilon(points, delta)
        assert optimal_composition_delta(each, advanced) <= delta * (1 + 1e-9)
        assert advanced == pytest.approx(_kov_epsilon_mpmath(points, delta), rel=1e-9)


def test_a_question_asked_again_is_answered_from_memory(monkeypatch) -> None:
    """The same releases asked the same question give the same answer, computed once per
    process; each caller gets its own candidates to keep."""
    asked = []
    candidates = composition._candidates_epsilon
    monkeypatch.setattr(composition, "_candidates_epsilon", lambda *a: asked.append(a) or candidates(*a))
    composition._answered.cache_clear()
    event = SDGS(k=17, beta=0.07, epsilon=1.0)
    first = composition.epsilon_at([event], 1e-7)
    first.candidates.clear()
    second = composition.epsilon_at([event], 1e-7)
    assert len(asked) == 1 and second.candidates and second.epsilon == first.epsilon
    composition.epsilon_at([event], 1e-7, times=2)
    assert len(asked) == 2


def test_advanced_delta_far_beyond_the_composed_epsilon_does_not_overflow() -> None:
    """The third form's e^((eps - a)^2 / 2b - 1) overflowed past 709 (planning a policy with a
    lifetime budget of epsilon 100 crashed with OverflowError); it is computed as e^-x / (1 - e^-x).
    Each answer equals a 50-digit evaluation of the same family, rounded up."""
    import mpmath

    points = [(1.0, 1e-6, 10)]
    a, b, log_keep = composition._kov_terms(points)
    with mpmath.workdps(50):
        for epsilon in (3.0, 5.0, 8.0, 1000.0):
            candidates = [mpmath.mpf(1)]
            if sum(e * n for e, _, n in points) <= epsilon:
                candidates.append(mpmath.mpf(0))
            if epsilon > a:
                x = (mpmath.mpf(epsilon) - a) ** 2 / (2 * mpmath.mpf(b))
                candidates.append(mpmath.exp(-x))
                if x > 1:
                    candidates.append(mpmath.sqrt(b) / mpmath.expm1(x - 1) / mpmath.e)
            keep = mpmath.exp(log_keep)
            truth = 1 - keep + keep * min(candidates)
            got = composition._advanced_delta(points, epsilon)
            assert truth <= got <= truth * (1 + 1e-9), (epsilon, got, truth)


@pytest.mark.parametrize("epsilon", [0.5, 2.0, 4.0, 8.0])
def test_one_zcdp_release_is_read_on_its_renyi_curve_between_its_stated_points(epsilon: float) -> None:
    """A Gaussian tables release (one zCDP event) asked its delta at an epsilon other than its
    stated one: the CKS conversion of its rho (Proposition 12, minimized over the order by
    mpmath, independent of :mod:`.renyi`'s grid), never below the Gaussian mechanism's exact
    curve (Balle-Wang, mu = sqrt(2 rho)), within 25% of the continuous minimum (the grid of
    orders: 16% at epsilon 8); basic composition
    of the stated point alone said 1 below the stated epsilon and the stated delta above it."""
    import mpmath

    from privrelease.mechanisms.kinds.noisy_tables import GaussianTables

    event = GaussianTables(sigmas=(4.0, 6.0, 9.0), sensitivity=1, epsilon=2.0)
    rho = sum(1 / (2 * sigma**2) for sigma in event.sigmas)
    found = composition.delta_at([event], epsilon)

    def cks(order: mpmath.mpf) -> mpmath.mpf:
        return mpmath.exp((order - 1) * (order * rho - epsilon)) / order * (1 - 1 / order) ** (order - 1)

    with mpmath.workdps(30):
        best = min(cks(mpmath.mpf(1) + mpmath.mpf(10) ** (k / 200)) for k in range(-1600, 801))
        mu = mpmath.sqrt(2 * rho)
        exact = mpmath.ncdf(mu / 2 - epsilon / mu) - mpmath.exp(epsilon) * mpmath.ncdf(-mu / 2 - epsilon / mu)
    assert exact <= found.delta <= min(1.0, best * 1.25)
    if epsilon == event.epsilon:  # at the stated point the stated delta, by basic (ties keep it)
        assert found.method == composition.BASIC
    else:
        assert found.method == composition.RENYI


def _bisected(delta_of, delta: float, high: float) -> float:
    """The reference: plain bisection of [0, high] to a relative 1e-9, rounded up."""
    low = 0.0
    while high - low > 1e-9 * high:
        middle = (low + high) / 2
        low, high = (low, middle) if delta_of(middle) <= delta else (middle, high)
    return high


@pytest.mark.parametrize(
    "name",
    ["sdgs k=20 beta=0.1", "sdgs k=50 beta=0.05", "exp", "step", "step to zero", "flat then drop"],
)
@pytest.mark.parametrize("delta", [1e-6, 1e-9, 1e-12])
def test_smallest_epsilon_is_bisection_s_answer_in_fewer_evaluations(name: str, delta: float) -> None:
    """The bracketing search answers as bisection does (within a relative 2e-9, delta_of of the
    answer at most delta: rounded up) on real curves in at most half of bisection's evaluations,
    and on curves with a jump or a flat stretch still correctly."""
    curves = {
        "sdgs k=20 beta=0.1": SDGS(k=20, beta=0.1, epsilon=1.0).exact_curve(),
        "sdgs k=50 beta=0.05": SDGS(k=50, beta=0.05, epsilon=1.0).exact_curve(),
        "exp": lambda e: math.exp(-50 * e),
        "step": lambda e: 1.0 if e < 0.3 else delta / 10,
        "step to zero": lambda e: 1.0 if e < 0.3 else 0.0,
        "flat then drop": lambda e: 2 * delta if e < 5 else delta * max(0.0, 1 - e / 10),
    }
    curve, calls = curves[name], []

    def counted(epsilon: float) -> float:
        calls.append(epsilon)
        return curve(epsilon)

    found = smallest_epsilon(counted, delta, 64.0)
    reference = _bisected(curve, delta, 64.0)
    assert curve(found) <= delta
    assert abs(found - reference) <= 2e-9 * reference
    if name.startswith("sdgs") or name == "exp":
        assert len(calls) <= 22, len(calls)
    else:
        assert len(calls) <= 90, len(calls)


def test_smallest_epsilon_bisects_where_the_logs_at_both_ends_are_equal() -> None:
    """A curve whose values straddle delta within an ulp (the logs of both ends of the bracket
    round to the same number) gives no regula falsi point: the search bisects, no division by 0."""
    delta = 1e-6
    above = math.nextafter(delta, 1.0)
    assert math.log(above) == math.log(delta)
    found = smallest_epsilon(lambda e: above if e < 0.5 else delta, delta, 64.0)
    assert 0.5 <= found <= 0.5 * (1 + 2e-9)
