"""The noisy_sums kind: exact partials against an independent computation, the release's layout
(noise removed), its privacy figures against OpenDP and dp_accounting, the mean's interval
coverage by simulation, the policy's refusals, Dask's partials, and the discharge example end
to end."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from scipy import optimize, stats

from privrelease.errors import UserError
from privrelease.flows import release_facts
from privrelease.mechanisms import zcdp
from privrelease.mechanisms.kinds import noisy_sums
from privrelease.mechanisms.kinds.noisy_counts import add_noise, half_width
from privrelease.mechanisms.kinds.noisy_sums import GaussianSums, mean_interval
from privrelease.planning import plan_policy
from privrelease.policies import load_policy, load_policy_text

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "policies" / "examples"
EXAMPLE = EXAMPLES / "discharges.yaml"

POLICY = """
name: sums
version: "1"
dataset:
  id: sums-test
  path: data.csv
  person: {person}
  columns:
    pid: {{type: integer}}
    region: {{type: string, values: [north, south, east]}}
    kind: {{type: string, values: [a, b]}}
    label: {{type: string}}
    amount: {{type: float}}
generalization: {{region: keep, kind: keep}}
mechanisms:
  - name: sums
    type: noisy_sums
    column: {column}
    bounds: {bounds}
    resolution: {resolution}
    by: {by}
    noise: {{distribution: gaussian, sigma_total: {sigma_total}, sigma_count: 3}}
targets:
  accounting: approximate
  delta: 1.0e-6
  accuracy: {accuracy}
"""


def _text(**changes: str) -> str:
    """The test policy with ``changes`` to its fields."""
    fields = {
        "person": "{column: pid, max_rows: 3}",
        "column": "amount",
        "bounds": "[-5, 20]",
        "resolution": "0.5",
        "by": "[region, kind]",
        "sigma_total": "40",
        "accuracy": "[{mechanism: sums, statistic: total, absolute_error: 100}]",
    }
    fields.update(changes)
    return POLICY.format(**fields)


def _loaded(**changes: str):
    return load_policy_text(_text(**changes), REPO)


def _table(rng: np.random.Generator, rows: int) -> pa.Table:
    """Rows over 5 of the 6 cells (east/b stays empty), values inside and outside [-5, 20]."""
    cells = [("north", "a"), ("north", "b"), ("south", "a"), ("south", "b"), ("east", "a")]
    pick = rng.integers(0, len(cells), rows)
    return pa.table(
        {
            "pid": rng.integers(0, rows, rows),
            "region": [cells[i][0] for i in pick],
            "kind": [cells[i][1] for i in pick],
            "label": ["x"] * rows,
            "amount": np.round(rng.normal(6, 12, rows), 3),
        }
    )


def _independent(table: pa.Table, lo: float, hi: float, resolution: float) -> dict[tuple[str, str], tuple[int, float]]:
    """Per cell, the row count and the total of the values clamped then rounded to the
    resolution, by a plain Python loop (Python's round is round-half-even, as numpy's rint)."""
    found: dict[tuple[str, str], tuple[int, float]] = {}
    for region, kind, amount in zip(
        table["region"].to_pylist(), table["kind"].to_pylist(), table["amount"].to_pylist(), strict=True
    ):
        count, total = found.get((region, kind), (0, 0.0))
        found[(region, kind)] = (count + 1, total + round(min(max(amount, lo), hi) / resolution) * resolution)
    return found


def test_partials_and_the_noise_free_release_match_an_independent_computation(monkeypatch) -> None:
    """Counts, clamped totals and means of every cell (the empty one included, its mean null)
    equal a loop over the rows; on Dask, partials of the pieces merged equal the whole."""
    rng = np.random.default_rng(7)
    table = _table(rng, 2000)
    loaded = _loaded()
    (mechanism,) = loaded.policy.mechanisms
    job = mechanism.job(loaded)
    whole = job.partial(table)
    pieces = [table.slice(start, 333) for start in range(0, table.num_rows, 333)]
    assert np.array_equal(job.merge([job.partial(piece) for piece in pieces]), whole)

    monkeypatch.setattr(noisy_sums, "add_noise", lambda values, distribution, sigma: np.asarray(values))
    published = mechanism.run(loaded, table).table.to_pylist()
    assert mechanism.finish(loaded, whole).table.to_pylist() == published
    expected = _independent(table, -5, 20, 0.5)
    assert sorted((row["region"], row["kind"]) for row in published) == sorted(
        (r, k) for r in ("north", "south", "east") for k in ("a", "b")
    )
    for row in published:
        count, total = expected.get((row["region"], row["kind"]), (0, 0.0))
        assert row["count"] == count and row["total"] == pytest.approx(total, abs=1e-9)
        if count:
            assert row["mean"] == pytest.approx(total / count, rel=1e-12)
            assert row["mean_lower"] <= row["mean"] <= row["mean_upper"]
        else:
            assert row["mean"] is None and (row["mean_lower"], row["mean_upper"]) == (-5, 20)
    assert sum(expected[cell][0] for cell in expected) == table.num_rows


def test_grand_total_without_by(monkeypatch) -> None:
    """``by: []``: one cell, every row in it, published as one row without label columns (in
    process and from merged partials, as on Dask)."""
    rng = np.random.default_rng(3)
    table = _table(rng, 500)
    loaded = _loaded(by="[]")
    (mechanism,) = loaded.policy.mechanisms
    counts, totals = mechanism.job(loaded).partial(table)
    clamped = np.clip(table["amount"].to_numpy(), -5, 20)
    expected = sum(round(v / 0.5) * 0.5 for v in clamped.tolist())
    assert counts.tolist() == [500]
    assert totals[0] * 0.5 == pytest.approx(expected, abs=1e-9)
    monkeypatch.setattr(noisy_sums, "add_noise", lambda values, distribution, sigma: np.asarray(values))
    for published in (mechanism.run(loaded, table).table, mechanism.finish(loaded, np.stack([counts, totals])).table):
        (row,) = published.to_pylist()
        assert published.column_names[:2] == ["total", "total_lower"] and row["count"] == 500
        assert row["total"] == pytest.approx(expected, abs=1e-9) and row["mean"] == pytest.approx(expected / 500)
    (stated,) = mechanism.accuracy(loaded, mechanism.plan(loaded)).stated  # one cell: nothing "at once"
    assert stated.columns == ("statistic", "confidence", "each cell") and "at once" not in stated.caption
    assert {len(row) for row in stated.rows} == {3}


def test_sensitivity_and_rho_against_opendp() -> None:
    """rho = m^2 / (2 sigma_N^2) + (m B)^2 / (2 sigma_T^2), B = max(|lo|, |hi|) / r: OpenDP's own
    map of its discrete Gaussian on i64 vectors at L2 distance m (the counts) and m B (the totals)."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    loaded = _loaded()
    (mechanism,) = loaded.policy.mechanisms
    event = plan_policy(loaded).mechanisms[0].event
    assert isinstance(event, GaussianSums)
    m, units = 3, 20 / 0.5
    assert (event.count_sensitivity, event.total_sensitivity_units, event.sigma_total_units) == (m, m * units, 40 / 0.5)
    domain = dp.vector_domain(dp.atom_domain(T="i64"))
    opendp_rho = sum(
        dp.m.make_gaussian(domain, dp.l2_distance(T="i64"), scale=sigma).map(distance)
        for sigma, distance in ((3.0, m), (80.0, int(m * units)))
    )
    assert event.rho == pytest.approx(opendp_rho, rel=1e-12)
    assert event.rho >= opendp_rho
    # without a person column: m = 1; the bound of larger size counts, whatever its sign
    row = plan_policy(_loaded(person="row", bounds="[-30, 20]", resolution="1")).mechanisms[0].event
    assert (row.count_sensitivity, row.total_sensitivity_units) == (1, 30)


@pytest.mark.parametrize("rho", [0.005, 0.07, 0.5])
def test_deltas_against_dp_accounting_and_an_independent_minimization(rho: float) -> None:
    """Approximate: CKS Proposition 12 over the orders, against dp_accounting's RDP accountant
    for the Gaussian of the same Rényi curve (a / (2 z^2) with z = 1 / sqrt(2 rho)), which
    converts by the same proposition over its own orders: within 2%, and never below the
    continuous Gaussian's exact curve (Balle-Wang: Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu),
    mu = sqrt(2 rho); the conversion is an upper bound of it). Probabilistic:
    the closed form against a numerical minimization of e^((a - 1)(a rho - eps))."""
    from dp_accounting import dp_event, rdp

    event = GaussianSums(
        sigma_count=1.0, sigma_total_units=1.0, count_sensitivity=1, total_sensitivity_units=0, epsilon=1.0
    )
    event = event.model_copy(update={"sigma_count": 1 / math.sqrt(2 * rho)})
    assert event.rho == pytest.approx(rho, rel=1e-12)
    z = 1 / math.sqrt(2 * rho)
    accountant = rdp.RdpAccountant(orders=list(np.linspace(1.01, 200, 4000)))
    accountant.compose(dp_event.GaussianDpEvent(z))
    mu = math.sqrt(2 * rho)
    for epsilon in (0.3, 1.0, 2.5):
        ours = zcdp.approximate_delta(event.rho, epsilon)
        assert ours == pytest.approx(accountant.get_delta(epsilon), rel=0.02)
        exact = stats.norm.cdf(mu / 2 - epsilon / mu) - math.exp(epsilon) * stats.norm.cdf(-mu / 2 - epsilon / mu)
        assert ours >= exact * (1 - 1e-6)
        found = optimize.minimize_scalar(
            lambda a, e=epsilon: (a - 1) * (a * rho - e), bounds=(1 + 1e-9, 1e6), method="bounded"
        )
        closed = zcdp.probabilistic_delta(event.rho, epsilon)
        assert closed == pytest.approx(min(1.0, math.exp(found.fun)), rel=1e-6)
        assert event.guarantee("approximate").delta == zcdp.approximate_delta(event.rho, 1.0)


def test_plan_states_the_event_s_epsilon_at_the_target_delta_and_the_renyi_curve_composes() -> None:
    """The stated epsilon is the smallest whose delta reaches targets.delta; its Rényi
    divergences are a rho (what the composition adds up); its PLD is sound at the stated point."""
    (planned,) = plan_policy(_loaded()).mechanisms
    event = planned.event
    assert event.guarantee("approximate").delta <= 1e-6
    assert zcdp.approximate_delta(event.rho, event.epsilon * (1 - 1e-6)) > 1e-6
    assert np.allclose(event.renyi(np.array([2.0, 10.0])), [2 * event.rho, 10 * event.rho], rtol=1e-12)
    # pessimistic: its losses are rounded up to the discretization grid
    assert event.pld(1e-4).get_delta_for_epsilon(event.epsilon + 2e-4) <= 1e-6 * (1 + 1e-6)


def test_accuracy_half_widths_and_the_target_check() -> None:
    """The total's half-width is r times the discrete Gaussian's at sigma_T / r; the target
    names its statistic; all cells at once are wider."""
    loaded = _loaded()
    (mechanism,) = loaded.policy.mechanisms
    accuracy = plan_policy(loaded).accuracy["sums"]
    assert accuracy is not None
    document = accuracy.as_dict()["sums"]
    assert document["total"]["half_width"]["0.95"] == 0.5 * half_width("gaussian", 80.0, 0.95)
    assert document["count"]["half_width"]["0.95"] == half_width("gaussian", 3.0, 0.95)
    assert document["total"]["all_cells_half_width"]["0.95"] > document["total"]["half_width"]["0.95"]
    assert document["cells"] == 6 and "moved to the nearer bound" in document["clamping"]
    (target,) = loaded.policy.targets.accuracy
    check = mechanism.accuracy_check(loaded, target, mechanism.plan(loaded))
    assert check.value == document["total"]["half_width"]["0.95"] and check.passed


COVERAGE_RELEASES = 2000
COVERAGE_FAILURE = 1e-7
"""Each cell's interval misses with probability at most 1 - C = 0.05; the test fails a cell
when its misses exceed the binomial (2000, 0.05) quantile at 1 - 1e-7 (at most 6e-7 over the
cells by a union bound, when the intervals are right)."""


def test_mean_interval_covers_by_simulation() -> None:
    """2,000 releases of cells with 1 to 2,000 rows (totals at the bounds and inside), exact
    discrete Gaussian noise from OpenDP: the mean's interval holds the clamped mean in at least
    95% of them (binomial test, failure probability 6e-7); it is informative for large cells and
    the whole range where the noisy count is below 1."""
    lo, hi, sigma_t, sigma_n, confidence = 0.0, 100.0, 400.0, 4.0, 0.95
    counts = np.array([1, 2, 5, 30, 300, 2000])
    totals = np.array([100, 0, 260, 1500, 29_000, 40_000])  # means 100, 0, 52, 50, 96.7, 20
    releases = COVERAGE_RELEASES
    noisy_total = add_noise(np.tile(totals, releases), "gaussian", sigma_t).reshape(releases, -1)
    noisy_count = add_noise(np.tile(counts, releases), "gaussian", sigma_n).reshape(releases, -1)
    halves = (
        half_width("gaussian", sigma_t, 1 - (1 - confidence) / 2),
        half_width("gaussian", sigma_n, 1 - (1 - confidence) / 2),
    )
    mean, lower, upper = mean_interval(noisy_total.astype(float), noisy_count, *halves, (lo, hi))
    truth = totals / counts
    misses = ((lower > truth) | (upper < truth)).sum(axis=0)
    limit = stats.binom.isf(COVERAGE_FAILURE, releases, 1 - confidence)
    assert (misses <= limit).all(), (misses, limit)
    assert np.median(upper[:, -1] - lower[:, -1]) < 2.0  # 2,000 rows: within about +-1 of 20
    tiny = noisy_count[:, 0] + halves[1] < 1
    assert tiny.any() and np.all(lower[tiny, 0] == lo) and np.all(upper[tiny, 0] == hi)
    assert np.all(np.isnan(mean[noisy_count < 1])) and not np.isnan(mean[noisy_count >= 1]).any()
    assert np.all((lower <= upper) & (lower >= lo) & (upper <= hi))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"bounds": "[20, 20]"}, r"mechanisms\[0\]\.bounds: bounds must be \[lo, hi\] with lo < hi; got \[20, 20\]"),
        ({"bounds": "[30, -5]"}, r"lo < hi; got \[30, -5\]"),
        ({"bounds": "[-5, 20.25]"}, r"bounds\[1\]: each bound must be a multiple of resolution 0\.5.*got 20\.25"),
        ({"column": "wages"}, r"mechanisms\[0\]\.column.*'wages'"),
        ({"column": "label"}, r"mechanisms\[0\]\.column: column 'label' must be integer or float"),
        ({"by": "[region, label]"}, r"by\[1\]: column 'label' needs declared values"),
        ({"by": "[region, mean]"}, r"by\[1\]"),
        ({"sigma_total": "1e9"}, r"noise\.sigma_total: sigma_total / resolution must be in \[0\.01, 1e\+06\]"),
        ({"accuracy": "[{mechanism: sums, absolute_error: 100}]"}, r"statistic must be one of total, count; got None"),
        (
            {"accuracy": "[{mechanism: sums, statistic: mean, absolute_error: 1}]"},
            r"statistic must be one of total, count; got 'mean'",
        ),
    ],
)
def test_policy_mistakes_name_the_field_the_value_and_what_is_allowed(changes: dict[str, str], message: str) -> None:
    with pytest.raises(UserError, match=message):
        _loaded(**changes)


def test_statistic_is_refused_on_a_kind_with_one_statistic() -> None:
    text = (EXAMPLES / "adult-noisy.yaml").read_text()
    text = text.replace(
        "{mechanism: table, absolute_error: 8", "{mechanism: table, statistic: total, absolute_error: 8"
    )
    with pytest.raises(UserError, match="statistic must be absent: noisy_counts publishes one statistic"):
        load_policy_text(text, EXAMPLES)


def _generator():
    spec = importlib.util.spec_from_file_location("discharges", REPO / "tools" / "discharges.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_example_data_is_the_generator_s_byte_for_byte(tmp_path: Path) -> None:
    """policies/examples/data/discharges.csv is tools/discharges.py's output for its default seed;
    patients have 1 to 12 discharges, unequally."""
    generator = _generator()
    rows = generator.write(tmp_path / "d.csv")
    committed = EXAMPLES / "data" / "discharges.csv"
    assert (tmp_path / "d.csv").read_bytes() == committed.read_bytes()
    assert committed.stat().st_size < 500_000
    ids = generator.discharges()["patient_id"]
    per_patient = np.unique(ids, return_counts=True)[1]
    assert rows == ids.size and per_patient.min() == 1 and per_patient.max() == 12
    assert np.bincount(per_patient)[1] > 3 * np.bincount(per_patient)[4] > 3 * np.bincount(per_patient)[8]


@pytest.mark.system
def test_the_discharge_example_plans_runs_and_reports(tmp_path: Path, monkeypatch) -> None:
    """discharges.yaml end to end without Prefect: plan meets every target, the run publishes 25
    cells of counts and of charges (total, count, mean with intervals), release.json states the
    accuracy, the report explains noisy sums, and the ledger charges the composed epsilon."""
    from privrelease.flows.steps import release_plain

    plan = plan_policy(load_policy(EXAMPLE))
    assert plan.checks and all(check.passed for check in plan.checks)
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("PRIVRELEASE_AUTO_INIT", "true")
    for name in ("PRIVRELEASE_DB_URL", "PRIVRELEASE_PRODUCTION", "PRIVRELEASE_SIGNING_KEY"):
        monkeypatch.delenv(name, raising=False)
    published = release_plain(policy_path=str(EXAMPLE))
    outputs = {output["mechanism"]: output for output in published.outputs}
    assert {name: output["rows"] for name, output in outputs.items()} == {"discharges": 25, "charges": 25}
    charges = pa.parquet.read_table(outputs["charges"]["path"]).to_pylist()
    assert all(row["total_lower"] <= row["total"] <= row["total_upper"] for row in charges)
    assert all(row["mean_lower"] <= row["mean_upper"] for row in charges)
    release = json.loads((Path(published.release_dir) / "release.json").read_text())
    (sums,) = [output for output in release["outputs"] if output["mechanism"] == "charges"]
    assert sums["accuracy"]["sums"]["interval_confidence"] == 0.95
    assert sums["generalization"] == {"county": "kept as is", "diagnosis": "kept as is"}  # by: the cells' labels
    report = re.sub(r"\s+", " ", Path(published.report).read_text())
    assert "Noisy sums" in report
    from test_flow_steps import ledger_entries

    from privrelease.mechanisms.events import event_from_json, leaves

    (entry,) = ledger_entries()
    assert entry.dataset_id == "discharges-synthetic"
    assert entry.epsilon == pytest.approx(plan.composed["approximate"].epsilon)
    assert plan.mechanisms[1].event in leaves(event_from_json(entry.event_json))


def test_calibrate_finds_the_smallest_sigmas_for_a_target() -> None:
    """The sigmas calibrate names meet (epsilon, delta) for one person of m rows; 0.1% less noise
    on both misses it; the count takes count_share of rho."""
    sigma_total, sigma_count = noisy_sums.calibrate(1.0, 1e-6, 4, 60000, count_share=0.3)
    event = GaussianSums(
        sigma_count=sigma_count,
        sigma_total_units=sigma_total,
        count_sensitivity=4,
        total_sensitivity_units=240000,
        epsilon=1.0,
    )
    assert event.guarantee("approximate").delta <= 1e-6
    assert (4 / sigma_count) ** 2 / 2 == pytest.approx(0.3 * event.rho, rel=1e-9)
    tighter = event.model_copy(update={"sigma_count": sigma_count * 0.999, "sigma_total": sigma_total * 0.999})
    assert tighter.guarantee("approximate").delta > 1e-6
    with pytest.raises(UserError, match="count_share must be in"):
        noisy_sums.calibrate(1.0, 1e-6, 4, 60000, count_share=1.0)


def test_frontier_over_sigma_total() -> None:
    """The discharge example's frontier: the policy's sigma_total on a decade-wide log grid,
    epsilon falling and the total's half-width rising with it, the total target as the rule."""
    loaded = load_policy(EXAMPLE)
    charges = loaded.policy.mechanism("charges")
    frontier = charges.frontier(loaded)
    assert frontier.chosen == 760000 and frontier.accuracy_target == 1600000
    assert list(frontier.privacy) == sorted(frontier.privacy, reverse=True)
    assert list(frontier.accuracy) == sorted(frontier.accuracy)
    assert frontier.accuracy[frontier.chosen_index] == charges._widths("total", 0.95)
    assert frontier.privacy[frontier.chosen_index] == pytest.approx(plan_policy(loaded).mechanisms[1].event.epsilon)


def test_frontier_draws_no_requirement_for_the_total_from_a_target_on_the_count() -> None:
    """Only the count has a target: the total's frontier draws no required half-width (the
    count's ±40 is not a requirement of the totals) and reads the half-widths at the published
    intervals' confidence."""
    loaded = _loaded(accuracy="[{mechanism: sums, statistic: count, absolute_error: 40, confidence: 0.9}]")
    (mechanism,) = loaded.policy.mechanisms
    frontier = mechanism.frontier(loaded)
    assert frontier.accuracy_target is None
    assert frontier.accuracy[frontier.chosen_index] == mechanism._widths("total", 0.9)


def test_on_dask_the_merged_partials_give_the_in_process_release(tmp_path: Path, monkeypatch) -> None:
    """A Parquet file of 8 row groups on a local Dask cluster, noise removed: the published
    totals, counts and means are the in-process ones of the whole file (each partition's exact
    per-cell counts and clamped totals, merged, then ``finish`` once), and the report says Dask ran it."""
    pytest.importorskip("distributed", reason="the dask extra is not installed: pip install -e '.[dask]'")
    import logging

    import pyarrow.parquet as pq
    from distributed import LocalCluster

    from privrelease.flows.engines import LOCAL_HTTP
    from privrelease.flows.steps import release_plain

    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "work"))
    for name in ("PRIVRELEASE_DB_URL", "PRIVRELEASE_PRODUCTION", "PRIVRELEASE_DEFAULT_LIFETIME_BUDGET"):
        monkeypatch.delenv(name, raising=False)
    table = _table(np.random.default_rng(11), 1600)
    pq.write_table(table, tmp_path / "data.parquet", row_group_size=200)
    text = _text(person="row", accuracy="[]").replace("path: data.csv", "path: data.parquet\n  format: parquet")
    text += "  lifetime_budget: {epsilon: 100, delta: 1.0e-3}\n"
    monkeypatch.setattr(noisy_sums, "add_noise", lambda values, distribution, sigma: np.asarray(values))
    loaded = load_policy_text(text, tmp_path)
    expected = (
        loaded.policy.mechanisms[0].run(loaded, table).table.sort_by([("region", "ascending"), ("kind", "ascending")])
    )
    logging.getLogger("distributed").setLevel(logging.ERROR)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=LOCAL_HTTP) as cluster:
        path = tmp_path / "sums-dask.yaml"
        path.write_text(
            text + f"engine: {{name: dask, address: '{cluster.scheduler_address}', rows_per_partition: 200}}\n"
        )
        published = release_plain(policy_path=str(path))
    assert "8 partitions on a cluster of 2 workers" in Path(published.report).read_text()
    output = pq.read_table(Path(published.release_dir) / "sums.parquet").sort_by(
        [("region", "ascending"), ("kind", "ascending")]
    )
    assert output.to_pylist() == expected.to_pylist()


def test_calibrate_command_prints_noise_that_meets_the_target() -> None:
    """``calibrate noisy-sums --json``: the printed noise section, pasted into a policy, meets
    (epsilon, delta) for one person of m rows by the event's own guarantee; the half-widths are
    the kind's; a wrong option is one line on stderr, exit 2."""
    import subprocess
    import sys

    args = ["--epsilon", "1", "--delta", "1e-6", "--bound", "60000", "--max-rows", "4", "--resolution", "10"]
    result = subprocess.run(
        [sys.executable, "-m", "privrelease", "calibrate", "noisy-sums", *args, "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    document = json.loads(result.stdout)
    noise = document["noise"]
    event = GaussianSums(
        sigma_count=noise["sigma_count"],
        sigma_total_units=noise["sigma_total"] / 10,
        count_sensitivity=4,
        total_sensitivity_units=4 * 6000,
        epsilon=1.0,
    )
    assert event.guarantee("approximate").delta <= 1e-6
    assert document["count_half_width"] == half_width("gaussian", noise["sigma_count"], 0.95)
    assert document["total_half_width"] == 10 * half_width("gaussian", noise["sigma_total"] / 10, 0.95)
    wrong = subprocess.run(
        [sys.executable, "-m", "privrelease", "calibrate", "noisy-sums", *args[:6], "--max-rows", "0"],
        capture_output=True,
        text=True,
    )
    assert wrong.returncode == 2 and wrong.stderr.strip() == "error: --max-rows must be an integer in [1, 1000]; got 0"


def test_plan_prints_each_cell_s_half_widths_of_the_totals_and_counts() -> None:
    """``plan`` on the discharge example prints the kind's own accuracy statement row by row
    (the figures are the kind's: r times the discrete Gaussian half-width at sigma_total / r)."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "privrelease", "plan", str(EXAMPLE)], capture_output=True, text=True, check=True
    )
    total = 10 * half_width("gaussian", 76000.0, 0.95)
    count = half_width("gaussian", 20.0, 0.95)
    assert f"accuracy of charges: statistic total, confidence 95%, each cell ±{total}," in result.stdout
    assert f"accuracy of charges: statistic count, confidence 95%, each cell ±{count}," in result.stdout


def test_sigmas_left_out_are_the_most_noise_meeting_the_targets() -> None:
    """Without sigma_total and sigma_count, plan takes for each the largest whose exact
    half-width meets every absolute_error target on its statistic (the total in units of the
    resolution), states them, passes its checks, and the release adds exactly that noise; a
    sigma left out without a target on its statistic is refused naming it."""
    from privrelease.mechanisms.kinds.noisy_counts import largest_noise

    text = _text(
        person="row",
        accuracy="[{mechanism: sums, statistic: total, absolute_error: 100, confidence: 0.95},"
        " {mechanism: sums, statistic: count, absolute_error: 12, confidence: 0.99}]",
    ).replace("sigma_total: 40, sigma_count: 3", "")
    loaded = load_policy_text(text, REPO)
    plan = plan_policy(loaded)
    (mechanism,) = plan.mechanisms
    units = largest_noise("gaussian", 0.95, 100 / 0.5)
    assert mechanism.event.sigma_count == largest_noise("gaussian", 0.99, 12)
    assert (
        mechanism.event.sigma_total_units == pytest.approx(units, rel=2e-12)
        and mechanism.event.sigma_total_units <= units
    )
    assert half_width("gaussian", mechanism.event.sigma_total_units, 0.95) * 0.5 <= 100
    assert half_width("gaussian", units * (1 + 1e-8), 0.95) * 0.5 > 100
    assert mechanism.facts["noise"].endswith(
        "(sigma_total and sigma_count chosen by plan: the most noise meeting targets.accuracy, cell by cell)"
    )
    assert plan.passed and all(check.passed for check in plan.checks)
    (spec,) = loaded.policy.mechanisms
    released = spec.finish(loaded, np.zeros((2, 6), dtype=np.int64))
    assert released.event == mechanism.event
    parameters = release_facts._parameters(spec, loaded)
    assert parameters["noise"]["sigma_count"] == mechanism.event.sigma_count
    assert parameters["chosen_by_plan"] == ["noise.sigma_total", "noise.sigma_count"]
    with pytest.raises(UserError, match=r"noise\.sigma_count: give noise\.sigma_count, or an accuracy target"):
        load_policy_text(
            text.replace(", {mechanism: sums, statistic: count, absolute_error: 12, confidence: 0.99}", ""), REPO
        )


def test_the_words_name_the_rounded_values_the_statistics_are_of() -> None:
    """With a resolution above 1 the published statistics, and what their intervals hold, are of
    the values rounded to the resolution, then clamped (ages 14 and 36 at resolution 10 total
    10 + 40, a mean of 25, not 25 +- rounding): the accuracy statement, report and release.json
    words say so, not "the clamped values" (audit 6: the interval missed the clamped mean of age
    by sex at resolution 10 in 93% of releases while it held the rounded one's)."""
    loaded = _loaded(resolution="10", bounds="[0, 100]", sigma_total="400")
    mechanism = loaded.policy.mechanisms[0]
    job = mechanism.job(loaded)
    table = pa.table(
        {"region": ["north", "north"], "kind": ["a", "a"], "amount": [14.0, 36.0], "pid": [1, 2], "label": ["x", "y"]}
    )
    counts, totals = job.partial(table)
    cell = int(np.flatnonzero(counts)[0])
    assert (counts[cell], totals[cell] * 10) == (2, 50)  # 10 + 40: the rounded values' total
    stated = mechanism.accuracy(loaded, plan_policy(loaded).mechanisms[0]).stated[0]
    assert "rounded and clamped values" in stated.document["mean"]
    # the published mean is total / count moved into the bounds (audit 7: worded as total / count alone)
    assert "mean = total / count moved into [0, 100]" in stated.document["mean"]
    mean, _, _ = mean_interval(np.array([-500.0, 900.0]), np.array([2.0, 3.0]), 10.0, 1.0, (0.0, 100.0))
    assert mean.tolist() == [0.0, 100.0]
    assert "are those of these rounded and clamped values" in stated.document["clamping"]
    assert "of the clamped values" not in stated.caption
