"""Accountants: per-event rules, composition (cross-checked with dp_accounting), fail-closed."""

from __future__ import annotations

import math

import pytest

from privrelease.mechanisms import accountants
from privrelease.mechanisms.events import (
    SDGS,
    Composed,
    ExponentialSelection,
    Laplace,
    Sampled,
    SPLUGen,
    counted,
    event_from_json,
    event_to_json,
)
from privrelease.mechanisms.identifiability import calibrate, laplace_event
from privrelease.mechanisms.sdgs_math import delta_exact, delta_theorem1


def test_sdgs_under_both_notions() -> None:
    event = SDGS(k=20, beta=0.1, epsilon=1.0)
    probabilistic = accountants.account(event, "probabilistic")
    approximate = accountants.account(event, "approximate")
    assert probabilistic.delta == delta_theorem1(20, 0.1, 1.0).delta
    assert approximate.delta == delta_exact(20, 0.1, 1.0).delta
    assert approximate.delta < probabilistic.delta


def test_fail_closed() -> None:
    for event in (SPLUGen(gamma=5), SDGS(k=20, beta=1.0, epsilon=1.0)):
        for notion in accountants.NOTIONS:
            guarantee = accountants.account(event, notion)
            assert not guarantee.supported and guarantee.epsilon == math.inf and guarantee.delta == 1.0
    below = accountants.account(SDGS(k=20, beta=0.5, epsilon=0.1), "probabilistic")
    assert not below.supported and "ln(1 - beta)" in below.detail
    mixed = accountants.account(Composed(events=(SDGS(k=20, beta=0.1, epsilon=1.0), SPLUGen(gamma=5))), "approximate")
    assert not mixed.supported and "not differential privacy" in mixed.detail


def test_sampling_amplifies_pure_dp_only() -> None:
    inner = Laplace(scale=2.0, sensitivity=1.0)
    amplified = accountants.account(Sampled(beta=0.1, event=inner), "probabilistic")
    assert amplified.epsilon == pytest.approx(math.log(1 + 0.1 * (math.exp(0.5) - 1)))
    assert not accountants.account(Sampled(beta=0.1, event=SDGS(k=5, beta=0.2, epsilon=1.0)), "approximate").supported


def test_probabilistic_composition_adds() -> None:
    tree = Composed(
        events=(
            SDGS(k=20, beta=0.1, epsilon=1.0),
            Laplace(scale=2.0, sensitivity=1.0),
            ExponentialSelection(epsilon=0.1, candidates=3, sensitivity=1.0),
        )
    )
    g = accountants.account(tree, "probabilistic")
    assert g.epsilon == pytest.approx(1.6)
    assert g.delta == delta_theorem1(20, 0.1, 1.0).delta


def test_optimal_composition_against_privacy_loss_distributions() -> None:
    """An independent computation: dp_accounting's PLDs of the same (eps_i, delta_i) points
    (pessimistic discretization, so never below the exact value, and close to it)."""
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld

    points = [(1.0, 1e-9), (0.5, 1e-6), (0.3, 0.0), (0.8, 3e-7)]
    distributions = [
        pld.from_privacy_parameters(common.DifferentialPrivacyParameters(e, d), value_discretization_interval=1e-5)
        for e, d in points
    ]
    total = distributions[0]
    for distribution in distributions[1:]:
        total = total.compose(distribution)
    for eps in (0.5, 1.0, 1.5, 2.0, 2.5):
        ours = accountants.optimal_composition_delta(points, eps)
        reference = total.get_delta_for_epsilon(eps)
        assert ours <= reference * (1 + 1e-9) + 1e-15
        assert ours == pytest.approx(reference, rel=1e-4, abs=1e-12)


def _optimal_delta_mpmath(points: list[tuple[float, float]], epsilon: float) -> object:
    """The optimal-composition formula evaluated in 60-digit arithmetic (the independent truth)."""
    import itertools

    import mpmath

    with mpmath.workdps(60):
        eps = [mpmath.mpf(e) for e, _ in points]
        keep = mpmath.fprod(1 - mpmath.mpf(d) for _, d in points)
        total = mpmath.mpf(0)
        for chosen in itertools.product((0, 1), repeat=len(points)):
            inside = mpmath.fsum(e for e, c in zip(eps, chosen, strict=True) if c)
            outside = mpmath.fsum(e for e, c in zip(eps, chosen, strict=True) if not c)
            total += max(mpmath.mpf(0), mpmath.exp(inside) - mpmath.exp(mpmath.mpf(epsilon) + outside))
        return 1 - keep + keep * total / mpmath.fprod(1 + mpmath.exp(e) for e in eps)


@pytest.mark.parametrize(
    "points, epsilon",
    [
        ([(1.5, 1.2e-17), (1.5, 1.2e-17)], 3.0),  # two Adult SDGS runs at their summed epsilon
        ([(1.0, 1e-30), (0.5, 3e-25), (0.25, 0.0)], 1.75),
        ([(1.0, 1e-30), (0.5, 3e-25), (0.25, 0.0)], 1.2),
        ([(0.1, 4e-20)] * 6, 0.6),
        ([(0.1, 4e-20)] * 6, 0.3),
        ([(2.0, 1e-300), (2.0, 1e-300)], 3.9999999999),
    ],
)
def test_optimal_composition_never_rounds_delta_down(points, epsilon) -> None:
    """Tiny deltas survive: 1 - prod(1 - d_i) in plain floats is 0 below about 5.5e-17, which
    stated pure DP for two Adult SDGS runs (issue 15, item 11). Never below the 60-digit value,
    and within a relative 1e-9 of it."""
    truth = _optimal_delta_mpmath(points, epsilon)
    ours = accountants.optimal_composition_delta(points, epsilon)
    assert ours >= truth > 0
    assert ours <= truth * (1 + 1e-9)


def test_no_composition_candidate_is_below_a_real_neighbouring_pair() -> None:
    """Two (k=20, beta=0.1) SDGS runs at epsilon 1.5 composed at epsilon 3: a cell of exactly k
    rows is published with all k rows sampled (probability beta^k = 1e-20) only when the target
    is present, an infinite privacy loss; so the composed delta is at least 1 - (1 - beta^k)^2
    (about 2.0e-20) at every epsilon. Every candidate method, the tightest and the plan's
    accountant must state at least that (they stated 0)."""
    import mpmath

    from privrelease.mechanisms import composition

    release = SDGS(k=20, beta=0.1, epsilon=1.5)
    with mpmath.workdps(40):
        floor = float(1 - (1 - mpmath.mpf(0.1) ** 20) ** 2)
    for epsilon in (3.0, 2.5, 4.0, 10.0):
        result = composition.delta_at([Composed(events=(release, release))], epsilon)
        assert result.delta >= floor
        assert all(delta >= floor for _, delta in result.candidates.values()), result.candidates
    assert accountants.account(Composed(events=(release, release)), "approximate").delta >= floor


def test_approximate_composition_is_never_worse_than_adding() -> None:
    tree = Composed(events=(SDGS(k=10, beta=0.2, epsilon=0.5), SDGS(k=10, beta=0.2, epsilon=0.5)))
    g = accountants.account(tree, "approximate")
    single = delta_exact(10, 0.2, 0.5).delta
    assert g.epsilon == pytest.approx(1.0)
    assert g.delta <= 2 * single
    eps_at = accountants.optimal_epsilon_for_delta(tree, 2 * single)
    assert eps_at <= 1.0 + 1e-9


def test_identifiability_of_calibrated_laplace_and_composition() -> None:
    # Lee & Clifton: lambda = S / ln((m-1) rho / (1 - rho)) gives back rho exactly
    c = calibrate("mean", 1, 99, 0.1, rows=48842)
    event = laplace_event(c)
    assert accountants.identifiability(event) == pytest.approx(0.1, rel=1e-9)
    both = Composed(events=(event, event))
    rho2 = accountants.identifiability(both)
    expected = 1 / (1 + 98 * math.exp(-2 * math.log(98 * 0.1 / 0.9)))
    assert rho2 == pytest.approx(expected, rel=1e-9)
    assert accountants.identifiability(SDGS(k=5, beta=0.1, epsilon=1.0)) is None


def test_events_round_trip_as_json() -> None:
    tree = Composed(
        events=(
            Sampled(beta=0.5, event=Laplace(scale=1.0, sensitivity=1.0)),
            SDGS(k=3, beta=0.2, epsilon=1.0, output="histogram"),
            SPLUGen(gamma=4, sensitive=("a",)),
        )
    )
    assert event_from_json(event_to_json(tree)) == tree
    with pytest.raises(ValueError, match="schema_version"):
        event_from_json('{"schema_version": 99, "event": {}}')


def test_a_composition_names_the_releases_it_composes() -> None:
    """One policy mechanism with a scheme selection is two releases: the composed guarantee says
    which ("2 releases (scheme selection, SDGS microdata)"), not a bare count a reader would
    take for two mechanisms; identical releases are named once with their count; facts stored
    before the names fall back to the count."""
    from privrelease.mechanisms import composition
    from privrelease.reports.labels import composed

    selection = ExponentialSelection(epsilon=0.1, candidates=2, sensitivity=0.24)
    tree = Composed(events=(selection, SDGS(k=20, beta=0.1, epsilon=1.0)))
    for notion in ("probabilistic", "approximate"):
        detail = accountants.account(tree, notion).detail
        assert detail.startswith("sequential composition of 2 releases (scheme selection, SDGS microdata)"), detail
    stated = accountants.account(tree, "approximate")
    guarantee, result = composition.release_approximate(tree, stated, "approximate", 1e-9)
    assert result is not None and guarantee.detail.endswith("of 2 releases (scheme selection, SDGS microdata)")
    noise = Laplace(scale=2.0, sensitivity=1.0)
    assert counted({noise: 12, tree: 1}) == "14 releases (Laplace noise x12, scheme selection, SDGS microdata)"
    assert counted([Sampled(beta=0.5, event=noise)]) == "1 release (Laplace noise on a 0.5-sample)"
    assert composed({"releases": 3}) == "3 releases" and composed({"releases": 1, "composed": "x"}) == "x"
