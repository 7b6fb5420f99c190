"""The privacy-accuracy frontier (issue 17, item 3): each kind's series against an independent
recomputation at its grid points, the policy's value on the curve, the chart for every example
policy (well-formed SVG), a kind without a frontier drawing nothing, and ``plan --chart``."""

from __future__ import annotations

import math
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from privrelease.mechanisms.accuracy import count_accuracy
from privrelease.mechanisms.kinds import Frontier, MechanismKind
from privrelease.mechanisms.kinds.noisy_counts import approximate_delta, half_width
from privrelease.mechanisms.sdgs_calibration import smallest_epsilon
from privrelease.planning import plan_policy
from privrelease.policies import load_policy
from privrelease.reports.charts import frontier_chart, frontier_charts, log_ticks

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((REPO / "policies" / "examples").glob("*.yaml"))


def _loaded(name: str):
    return load_policy(REPO / "policies" / "examples" / f"{name}.yaml")


def _svgs(markup: str) -> list[ET.Element]:
    """Every <svg> of a chart, parsed as XML (well-formed, or the parser raises)."""
    parts = ["<svg" + part for part in str(markup).split("<svg")[1:]]
    return [ET.fromstring(part.strip()) for part in parts]


def test_sdgs_series_recomputed_at_every_beta(adult_dir: Path) -> None:
    """Epsilon at the target delta: the exact SDGS delta inverted independently
    (:func:`smallest_epsilon` bisects delta_exact itself); accuracy: count_accuracy's within."""
    loaded = _loaded("adult-sdgs")
    (mechanism,) = loaded.policy.mechanisms
    frontier = mechanism.frontier(loaded)
    assert frontier is not None and frontier.setting == "beta" and frontier.chosen == 0.1
    assert len(frontier.values) >= 15 and all(0 < b < 1 for b in frontier.values)
    delta = loaded.policy.targets.delta
    assert delta == 1e-9
    for beta, epsilon, within in zip(frontier.values, frontier.privacy, frontier.accuracy, strict=True):
        if beta**mechanism.k > delta:  # all k copies of a k-cell sampled: delta >= beta^k, no epsilon reaches it
            assert epsilon == math.inf
        else:
            assert epsilon == pytest.approx(smallest_epsilon(mechanism.k, beta, delta, "approximate").epsilon, rel=1e-6)
        assert within == count_accuracy(mechanism.k, beta, 1000, relative_error=0.25).within
    finite = [e for e in frontier.privacy if math.isfinite(e)]
    assert finite == sorted(finite), "more sampling, less privacy"


def test_chosen_value_is_on_the_curve(adult_dir: Path) -> None:
    """The policy's beta is a grid point, with the plan's own epsilon and accuracy check value."""
    loaded = _loaded("adult-sdgs")
    plan = plan_policy(loaded)
    frontier = loaded.policy.mechanisms[0].frontier(loaded)
    assert frontier is not None
    at = frontier.chosen_index
    assert frontier.values[at] == 0.1
    assert frontier.privacy[at] == pytest.approx(plan.composed["approximate"].epsilon, rel=1e-9)
    (check,) = [c for c in plan.checks if "accuracy" in c.target]
    assert frontier.accuracy[at] == pytest.approx(check.value, rel=1e-12)
    assert frontier.privacy_target == 1.0 and frontier.accuracy_target == 0.95


def test_probabilistic_frontier_uses_theorem1(adult_dir: Path) -> None:
    """Under the papers' notion the epsilon is the smallest where Theorem 1 reaches the target
    delta, to FRONTIER_PRECISION (relative) and never below it: Theorem 1 holds at the point."""
    from privrelease.mechanisms.kinds.sdgs import FRONTIER_PRECISION
    from privrelease.mechanisms.sdgs_math import delta_theorem1

    loaded = _loaded("demo")
    mechanism = loaded.policy.mechanism("microdata")
    frontier = mechanism.frontier(loaded)
    assert frontier is not None and "probabilistic" in frontier.privacy_label
    finite = 0
    for beta, epsilon in zip(frontier.values, frontier.privacy, strict=True):
        if math.isfinite(epsilon):
            finite += 1
            smallest = smallest_epsilon(mechanism.k, beta, 1e-9, "probabilistic").epsilon  # to 1e-10
            assert smallest * (1 - 1e-9) <= epsilon <= smallest * (1 + 2 * FRONTIER_PRECISION)
            assert (delta_theorem1(mechanism.k, beta, epsilon).delta or 1) <= 1e-9
    assert finite >= 10


def test_noisy_counts_series_recomputed(adult_dir: Path) -> None:
    """Sigma on a log grid a decade either side; epsilon: the exact delta is <= target there and
    above it just below; accuracy: half_width at the target's confidence."""
    loaded = _loaded("adult-noisy")
    (mechanism,) = loaded.policy.mechanisms
    frontier = mechanism.frontier(loaded)
    assert frontier is not None and frontier.log_x and frontier.setting == "noise.sigma"
    sigma = 4.231
    assert frontier.chosen == sigma and frontier.values[0] == pytest.approx(sigma / 10)
    assert frontier.values[-1] == pytest.approx(sigma * 10)
    ratios = [b / a for a, b in zip(frontier.values, frontier.values[1:], strict=False)]
    assert ratios == pytest.approx([10 ** (1 / 8)] * len(ratios))
    for value, epsilon, width in zip(frontier.values, frontier.privacy, frontier.accuracy, strict=True):
        assert approximate_delta("gaussian", value, epsilon) <= 1e-6
        assert approximate_delta("gaussian", value, epsilon * (1 - 1e-6)) > 1e-6
        assert width == half_width("gaussian", value, 0.95)
    assert frontier.privacy[frontier.chosen_index] == pytest.approx(plan_policy(loaded).composed["approximate"].epsilon)
    assert frontier.accuracy_target == 8


def test_laplace_noisy_counts_frontier(adult_dir: Path) -> None:
    """A Laplace table: epsilon = 1/scale exactly (pure DP)."""
    text = (REPO / "policies/examples/adult-noisy.yaml").read_text()
    text = text.replace("{distribution: gaussian, sigma: 4.231}", "{distribution: laplace, scale: 2.0}")
    from privrelease.policies.loader import load_policy_text

    loaded = load_policy_text(text, base_dir=REPO / "policies" / "examples")
    frontier = loaded.policy.mechanisms[0].frontier(loaded)
    assert frontier is not None and frontier.parameter == "scale" and frontier.chosen == 2.0
    for scale, epsilon, width in zip(frontier.values, frontier.privacy, frontier.accuracy, strict=True):
        assert epsilon == pytest.approx(1 / scale, rel=1e-12)
        assert width == half_width("laplace", scale, 0.95)


def test_noisy_counts_frontier_stays_within_the_noise_a_policy_allows(adult_dir: Path) -> None:
    """Laplace scale 0.02: the grid's decade below stops at 0.01, the smallest noise a policy
    may name (each point is built as a policy's noise section: 0.002 was refused mid-plan)."""
    from privrelease.mechanisms.kinds.noisy_counts import MIN_NOISE
    from privrelease.policies.loader import load_policy_text

    text = (REPO / "policies/examples/adult-noisy.yaml").read_text()
    text = text.replace("{distribution: gaussian, sigma: 4.231}", "{distribution: laplace, scale: 0.02}")
    loaded = load_policy_text(text, base_dir=REPO / "policies" / "examples")
    frontier = loaded.policy.mechanisms[0].frontier(loaded)
    assert frontier is not None and frontier.chosen == 0.02
    assert min(frontier.values) > MIN_NOISE > 0.02 / 10 and max(frontier.values) == pytest.approx(0.2)


def test_statistic_series_recomputed(adult_dir: Path) -> None:
    """rho on a feasible log grid; lambda = S(f) / ln((m - 1) rho / (1 - rho)) (Lee & Clifton,
    Theorem 1) by hand: epsilon = Delta / lambda (add/remove), half-width = lambda ln(1 / 0.05)."""
    loaded = _loaded("adult-identifiable")
    mechanism = loaded.policy.mechanism("mean-age")
    frontier = mechanism.frontier(loaded)
    assert frontier is not None and frontier.setting == "rho" and frontier.chosen == 0.05
    assert frontier.accuracy_label == "95% half-width of the published value (clamped sum of age / declared rows)"
    m, rows = 90 - 17 + 1, loaded.policy.dataset.rows
    assert all(1 / m < rho < 1 for rho in frontier.values)
    for rho, epsilon, width in zip(frontier.values, frontier.privacy, frontier.accuracy, strict=True):
        lam = ((90 - 17) / rows) / math.log((m - 1) * rho / (1 - rho))
        assert epsilon == pytest.approx((90 / rows) / lam, rel=1e-9)
        assert width == pytest.approx(lam * math.log(1 / 0.05), rel=1e-9)
    finite = list(frontier.privacy)
    assert finite == sorted(finite) and list(frontier.accuracy) == sorted(frontier.accuracy, reverse=True)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_every_example_policy_renders(adult_dir: Path, path: Path) -> None:
    """One frontier chart per mechanism with a frontier (all but SPLU-Gen), SVG well-formed, the
    policy's value marked, a data table row per grid point."""
    loaded = load_policy(path)
    charts = frontier_charts(plan_policy(loaded))
    expected = [m for m in loaded.policy.mechanisms if m.type != "splu_gen"]
    assert len(charts) == len(expected)
    for chart, mechanism in zip(charts, expected, strict=True):
        frontier = mechanism.frontier(loaded)
        assert frontier is not None
        svgs = _svgs(chart.svg)
        assert [svg.get("id") for svg in svgs] == [f"{chart.id}-privacy", f"{chart.id}-accuracy"]
        for svg in svgs:
            assert svg.get("role") == "img" and svg.find("title") is not None and svg.find("desc") is not None
        assert len(chart.rows) == len(frontier.values)
        assert [row[3] for row in chart.rows].count("policy") == 1
        assert 'class="rule"' in str(chart.svg) and mechanism.name in chart.title
    assert len({chart.id for chart in charts}) == len(charts)


def _cks_epsilon(rho: float, delta: float) -> float:
    """The smallest epsilon of Canonne, Kamath, Steinke (2020), Proposition 12, for rho-zCDP at
    ``delta``, minimized over a continuous order (scipy), independently of privrelease's orders."""
    from scipy import optimize

    def epsilon(order: float) -> float:
        return order * rho + (math.log(1 / delta) + (order - 1) * math.log1p(-1 / order) - math.log(order)) / (
            order - 1
        )

    return float(
        optimize.minimize_scalar(epsilon, bounds=(1 + 1e-9, 1e7), method="bounded", options={"xatol": 1e-12}).fun
    )


@pytest.mark.parametrize("name", ["adult-tables", "discharges-tables", "geo-tables"])
def test_noisy_tables_frontier_scales_every_sigma_together(adult_dir: Path, name: str) -> None:
    """Over the sigma of the first count target's table, every table's sigma (and sigma_total)
    scaled with it: at each point rho = m^2 sum 1/(2 sigma_t^2) (+ (m B)^2 sum 1/(2 tau_t^2) in
    units of the resolution) recomputed here, epsilon the zCDP conversion of Canonne, Kamath,
    Steinke (Prop. 12) minimized over a continuous order (privrelease's discrete orders: at most
    1e-3 above, never below); the half-width scales with sigma, at the release's sigma the plan's
    check value; the target drawn; the release's epsilon the plan's."""
    loaded = _loaded(name)
    (mechanism,) = loaded.policy.mechanisms
    release = mechanism.resolved(loaded)
    frontier = mechanism.frontier(loaded)
    target = next(t for t in loaded.policy.targets.accuracy if t.statistic in (None, "count") and t.table)
    assert frontier.setting.startswith(f"noise.sigma for table {'-'.join(target.table)}, every other σ")
    assert frontier.accuracy_target == target.absolute_error
    assert frontier.accuracy_label.endswith("(counts)")
    sigmas = np.array(release.sigmas(loaded))
    index = [set(t) for t in mechanism.tables].index(set(target.table))
    assert frontier.chosen == sigmas[index] and f"table {'-'.join(target.table)}" in frontier.accuracy_label
    m, delta = loaded.policy.dataset.rows_per_person, loaded.policy.targets.delta
    plan = plan_policy(loaded)
    at = frontier.chosen_index
    assert frontier.privacy[at] == plan.composed["approximate"].epsilon
    (check,) = [
        c
        for c in plan.checks
        if f"table {'-'.join(target.table)}, every cell at once: half-width" in c.target and "total" not in c.target
    ]
    assert check.achieved == f"{frontier.accuracy[at]:.4g}"
    for value, epsilon, width in zip(frontier.values, frontier.privacy, frontier.accuracy, strict=True):
        scale = value / frontier.chosen
        rho = m**2 * float(np.sum(1 / (2 * (sigmas * scale) ** 2)))
        if release.total is not None:
            taus = np.array(release.sigmas(loaded, "total")) / release.total.resolution * scale
            rho += (m * release.total.bound) ** 2 * float(np.sum(1 / (2 * taus**2)))
        expected = _cks_epsilon(rho, delta)
        assert expected * (1 - 1e-9) <= epsilon <= expected * (1 + 1e-3)
        assert width == pytest.approx(frontier.accuracy[at] * scale, rel=1e-9)
    assert list(frontier.privacy) == sorted(frontier.privacy, reverse=True)


def test_kind_without_frontier_draws_nothing(adult_dir: Path) -> None:
    loaded = _loaded("adult-splu")
    assert MechanismKind.frontier(loaded.policy.mechanisms[0], loaded) is None
    assert frontier_charts(plan_policy(loaded)) == []


def test_any_frontier_is_drawn() -> None:
    """The chart reads the Frontier alone (no kind): infinite epsilons are gaps and listed."""
    frontier = Frontier(
        "t",
        "t",
        (0.5, 1.0, 2.0),
        (0.2, 0.5, math.inf),
        "ε at δ = 1e-06 (approximate)",
        (3.0, 2.0, 1.0),
        "error",
        1.0,
        False,
        privacy_target=1.0,
        accuracy_target=2.5,
        accuracy_target_label="required ±2.5",
    )
    chart = frontier_chart("made-up", frontier, "chart-x")
    assert len(_svgs(chart.svg)) == 2
    assert "t = 2" in chart.caption and chart.rows[2][1] == "∞"
    assert 'data-epsilon="0.5"' in str(chart.svg) and 'data-accuracy="2.0"' in str(chart.svg)
    with pytest.raises(AssertionError):
        Frontier("t", "t", (0.5, 1.0), (0.1, 0.2), "", (1.0, 2.0), "", 0.7, True)


def test_log_ticks() -> None:
    assert [v for _, v in log_ticks(math.log10(0.42), math.log10(42))] == [0.5, 1, 2, 5, 10, 20]


def test_plan_chart_writes_the_charts(adult_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "charts.html"
    result = subprocess.run(
        [sys.executable, "-m", "privrelease", "plan", "policies/examples/adult-noisy.yaml", "--chart", str(out)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    html = out.read_text()
    assert 'id="chart-frontier-1-privacy"' in html and "Privacy-accuracy frontier of table" in html
    assert "<script" not in html and str(out) in result.stdout.replace("\n", "")
