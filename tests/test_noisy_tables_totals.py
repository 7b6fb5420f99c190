"""Noisy tables with a ``total``: per-cell totals of a clamped numeric column measured once per
table with Gaussian noise and reconstructed by the counts' least squares, so they add up like the
counts, with means. The counts are tested in tests/test_noisy_tables.py; here: the policy's
``total`` section (errors naming the field), rho against an independent computation and OpenDP's
maps, totals adding up across files and levels in a run, coverage of the totals' and means'
intervals with the kind's own sampler, sigma_total chosen by plan, calibrate, and one release on
both engines."""

from __future__ import annotations

import csv
import json
import math
import os
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet as pq
import pytest
from scipy import stats
from test_noisy_tables import HIERARCHY, POLICY
from typer.testing import CliRunner

from privrelease.errors import UserError
from privrelease.mechanisms import tables
from privrelease.mechanisms.events import event_from_json, event_to_json
from privrelease.mechanisms.kinds.noisy_sums import mean_interval
from privrelease.mechanisms.kinds.noisy_tables import GaussianTables, NoisyTablesMechanism, measure
from privrelease.planning import plan_policy
from privrelease.policies import load_policy, load_policy_text
from privrelease.policies.loader import canonical_json

SIGMAS = [1.0, 2.0, 1.5, 3.0]
TAUS = [100.0, 200.0, 150.0, 300.0]
"""The counts' and the totals' sigmas of the default policy (totals in the column's units)."""

TOTAL = "{column: charges, bounds: [0, 500], resolution: 10}"
"""B = 500 in the column's units, 50 units of the resolution."""


def _text(
    tables_text: str = "[[county, sex], [county], [state], []]",
    noise: str = "{distribution: gaussian, sigma: [1, 2, 1.5, 3], sigma_total: [100, 200, 150, 300]}",
    accuracy: str = "[]",
    nonnegative: str = "false",
    total: str | None = TOTAL,
) -> str:
    text = POLICY.format(tables=tables_text, noise=noise, accuracy=accuracy, nonnegative=nonnegative)
    text = text.replace("    age: {type: string", "    charges: {type: float}\n    age: {type: string")
    if total is not None:
        text = text.replace("    noise:", f"    total: {total}\n    noise:")
    return text


def _folder(tmp_path: Path, rows: int = 400) -> Path:
    """The hierarchy file and ``rows`` people (county, sex, age, charges: some below 0 and above
    500, so clamping matters) in ``tmp_path``."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    with (tmp_path / "counties.csv").open("w", newline="") as handle:
        csv.writer(handle, delimiter=";").writerows((c, s, "*") for c, s in HIERARCHY)
    rng = np.random.default_rng(7)  # test data, not a mechanism
    with (tmp_path / "people.csv").open("w", newline="") as handle:
        writer = csv.writer(handle, delimiter=";")
        writer.writerow(("county", "sex", "age", "charges"))
        counties = rng.choice([c for c, _ in HIERARCHY], rows, p=[0.4, 0.3, 0.05, 0.2, 0.05])
        charges = np.round(rng.uniform(-50, 600, rows), 2)
        writer.writerows(
            zip(counties, rng.choice(["F", "M"], rows), rng.choice(["young", "old"], rows), charges, strict=True)
        )
    return tmp_path


def _loaded(tmp_path: Path, **parts: str | None):
    return load_policy_text(_text(**parts), _folder(tmp_path))  # type: ignore[arg-type]


def _mechanism(loaded) -> NoisyTablesMechanism:
    (mechanism,) = loaded.policy.mechanisms
    assert isinstance(mechanism, NoisyTablesMechanism)
    return mechanism


def _data(loaded) -> pa.Table:
    return pa.csv.read_csv(loaded.resolve("people.csv"), parse_options=pa.csv.ParseOptions(delimiter=";"))


# --------------------------------------------------------------------------- the policy


@pytest.mark.parametrize(
    ("total", "noise", "accuracy", "message"),
    [
        ("{column: charges, bounds: [500, 0]}", None, None, r"total\.bounds: bounds must be \[lo, hi\] with lo < hi"),
        (
            "{column: charges, bounds: [0, 505], resolution: 10}",
            None,
            None,
            r"total\.bounds\[1\]: each bound must be a multiple of resolution 10 .* got 505",
        ),
        ("{column: charges, bounds: [0, 5], resolution: 0}", None, None, r"total\.resolution: .*> 0"),
        ("{column: height, bounds: [0, 500]}", None, None, r"total\.column: column 'height' is not declared"),
        ("{column: sex, bounds: [0, 500]}", None, None, r"total\.column: column 'sex' must be integer or float"),
        (
            None,
            "{distribution: gaussian, sigma: 2, sigma_total: 100}",
            None,
            r"noise\.sigma_total: noise\.sigma_total is the totals' noise, but the mechanism has no total section",
        ),
        (
            None,
            None,
            "[{mechanism: census, statistic: total, absolute_error: 5}]",
            r"targets\.accuracy\[0\]\.statistic: statistic 'total' needs a total section on mechanism 'census'",
        ),
        (
            TOTAL,
            "{distribution: gaussian, sigma: 2}",
            "[{mechanism: census, absolute_error: 50}]",
            r"noise\.sigma_total: noise\.sigma_total is absent.*with statistic: total",
        ),
        (
            TOTAL,
            "{distribution: gaussian, sigma: 2, sigma_total: [1, 2]}",
            None,
            r"noise\.sigma_total: noise\.sigma_total lists 2 sigmas for 4 tables",
        ),
        (
            TOTAL,
            None,
            "[{mechanism: census, statistic: mean, absolute_error: 5}]",
            r"targets\.accuracy\[0\]\.statistic: statistic must be one of count, total; got 'mean'",
        ),
    ],
)
def test_a_bad_total_section_is_refused_naming_the_field(tmp_path, total, noise, accuracy, message) -> None:
    """Noisy sums' validation of column, bounds and resolution, at ``total``'s fields; the
    totals' sigma and targets only with a total section. Each is a UserError (exit 2, one line)."""
    parts = {"total": total}
    if noise is not None:
        parts["noise"] = noise
    elif total is None:
        parts["noise"] = "{distribution: gaussian, sigma: 2}"
    if accuracy is not None:
        parts["accuracy"] = accuracy
    with pytest.raises(UserError, match=message):
        _loaded(tmp_path, **parts)


def test_a_policy_without_total_keeps_its_hash_and_its_event_json(tmp_path) -> None:
    """``total`` and ``noise.sigma_total`` are left out of the canonical form when absent, and a
    counts-only event's JSON has no totals' fields: policies and stored events from before them
    keep their hashes and replay unchanged."""
    loaded = _loaded(tmp_path, noise="{distribution: gaussian, sigma: 2}", total=None)
    mechanism = json.loads(canonical_json(loaded))["policy"]["mechanisms"][0]
    assert "total" not in mechanism and "sigma_total" not in mechanism["noise"]
    (planned,) = plan_policy(loaded).mechanisms
    assert "total_sigmas_units" not in event_to_json(planned.event)
    with_total = json.loads(canonical_json(_loaded(tmp_path / "t")))["policy"]["mechanisms"][0]
    assert with_total["total"] == {"column": "charges", "bounds": [0, 500], "resolution": 10}


# --------------------------------------------------------------------------- privacy


@pytest.mark.parametrize("max_rows", [1, 3])
def test_rho_is_the_independent_sum_and_opendp_s_maps(tmp_path, max_rows) -> None:
    """rho = m^2 sum 1/(2 sigma_t^2) + (m B)^2 sum 1/(2 tau_t^2), B and tau in units of the
    resolution (B = 500 / 10 = 50, tau = 10, 20, 15, 30): computed here by hand, equal to the
    plan's fact, the event's rho and the sum of OpenDP's maps of the float Gaussians the kind
    measures with (at d_in = m for the counts, m B for the totals); the stored event replays it."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    text = _text()
    if max_rows > 1:
        text = text.replace(
            "  columns:\n", f"  person: {{column: id, max_rows: {max_rows}}}\n  columns:\n    id: {{type: string}}\n", 1
        )
    loaded = load_policy_text(text, _folder(tmp_path))
    (planned,) = plan_policy(loaded).mechanisms
    m, bound = max_rows, 50
    by_hand = m**2 * sum(1 / (2 * s**2) for s in SIGMAS) + (m * bound) ** 2 * sum(1 / (2 * (t / 10) ** 2) for t in TAUS)
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    gaussian = dp.m.make_gaussian
    opendp_rho = sum(gaussian(domain, dp.l2_distance(T=float), scale=s).map(float(m)) for s in SIGMAS) + sum(
        gaussian(domain, dp.l2_distance(T=float), scale=t / 10).map(float(m * bound)) for t in TAUS
    )
    event = planned.event
    assert isinstance(event, GaussianTables)
    assert event.total_sigmas_units == (10.0, 20.0, 15.0, 30.0) and event.total_sensitivity_units == m * bound
    assert planned.facts["zcdp_rho"] == pytest.approx(by_hand, rel=1e-12)
    assert opendp_rho == pytest.approx(by_hand, rel=1e-12)
    assert event.rho >= by_hand and event.rho == pytest.approx(by_hand, rel=1e-12)
    assert f"{m} x 500 = {m * 500} per table in L2" in planned.facts["total_sensitivity"]
    stored = event_from_json(event_to_json(event))  # what the ledger and audit verify replay
    assert stored == event and stored.rho == event.rho


# --------------------------------------------------------------------------- the estimate


@pytest.mark.parametrize("nonnegative", ["false", "true"])
def test_totals_add_up_across_files_and_levels_and_means_are_their_ratio(tmp_path, nonnegative) -> None:
    """In a run, every table's totals are margins of the finest (county x sex summed over sex is
    the county table, counties within their state the state table, everything the total, to
    float rounding), the intervals are the totals -+ each cell's 95% half-width of the totals'
    variances, the grand total is within 8 standard errors of the clamped data's (a correct
    release fails this with probability below 1e-14), and each mean is total / count of the
    published numbers, null below a count of 1, its interval noisy sums' ``mean_interval``."""
    loaded = _loaded(tmp_path, nonnegative=nonnegative)
    mechanism = _mechanism(loaded)
    data = _data(loaded)
    result = mechanism.run(loaded, data)
    assert result.tables["county-sex"].column_names == [
        "county",
        "sex",
        "estimate",
        "lower",
        "upper",
        "total",
        "total_lower",
        "total_upper",
        "mean",
        "mean_lower",
        "mean_upper",
    ]
    out = {name: t.column("total").to_numpy() for name, t in result.tables.items()}
    finest = out["county-sex"].reshape(5, 2)
    states = np.array([0, 0, 0, 1, 1])
    for summed, margin in [
        (finest.sum(axis=1), out["county"]),
        (np.bincount(states, out["county"]), out["state"]),
        (out["state"].sum(keepdims=True), out["total"]),
    ]:
        np.testing.assert_allclose(summed, margin, rtol=1e-12, atol=1e-6)
    layout = mechanism.layout(loaded)
    variances = tables.cell_variances(layout.domain, layout.tables, TAUS)
    for (name, published), variance in zip(result.tables.items(), variances, strict=True):
        width = np.ravel(variance) ** 0.5 * stats.norm.ppf(0.975)
        np.testing.assert_allclose(published.column("total_upper").to_numpy() - out[name], width, rtol=1e-12)
        np.testing.assert_allclose(out[name] - published.column("total_lower").to_numpy(), width, rtol=1e-12)
        count = published.column("estimate").to_numpy().astype(float)
        mean = published.column("mean").to_numpy(zero_copy_only=False)
        shift = result.public_facts.get("rounding_shift", {}).get(name, 0.0)
        half = stats.norm.ppf(1 - 0.05 / 4)
        count_var = tables.cell_variances(layout.domain, layout.tables, SIGMAS)[list(result.tables).index(name)]
        expected = mean_interval(
            out[name], count, np.ravel(variance) ** 0.5 * half, np.ravel(count_var) ** 0.5 * half + shift, (0, 500)
        )
        np.testing.assert_allclose(mean, expected[0], rtol=1e-12, equal_nan=True)
        assert np.isnan(mean[count < 1]).all()
        ok = count >= 1
        np.testing.assert_allclose(mean[ok], np.clip(out[name][ok] / count[ok], 0, 500), rtol=1e-12)
        np.testing.assert_allclose(published.column("mean_lower").to_numpy(), expected[1], rtol=1e-12)
        np.testing.assert_allclose(published.column("mean_upper").to_numpy(), expected[2], rtol=1e-12)
    clamped = np.clip(np.rint(data.column("charges").to_numpy() / 10), 0, 50).sum() * 10
    error = math.sqrt(float(variances[3]))
    assert abs(out["total"][0] - clamped) < 8 * error
    assert result.public_facts["total"] == "charges"


def test_dask_partials_merge_to_the_exact_counts_and_clamped_totals(tmp_path) -> None:
    """Each partition's counts and clamped totals (int64 units), merged by summing, are the whole
    table's, which are the counts and the rounded, clamped values summed by hand: both engines
    give finish the same exact input, so the same distribution."""
    loaded = _loaded(tmp_path)
    mechanism = _mechanism(loaded)
    job = mechanism.job(loaded)
    data = _data(loaded)
    merged = job.merge([job.partial(data.slice(start, 150)) for start in range(0, data.num_rows, 150)])
    whole = job.partial(data)
    for left, right in zip(merged, whole, strict=True):
        assert left.dtype == np.int64
        np.testing.assert_array_equal(left, right)
    counties = [c for c, _ in HIERARCHY]
    county = np.array([counties.index(c) for c in data.column("county").to_pylist()])
    units = np.clip(np.rint(data.column("charges").to_numpy() / 10), 0, 50).astype(np.int64)
    np.testing.assert_array_equal(whole[1][1], np.bincount(county, units, minlength=5))
    np.testing.assert_array_equal(whole[3], [[data.num_rows], [units.sum()]])


def test_totals_and_means_cover_as_stated_with_the_kind_s_sampler(tmp_path) -> None:
    """1,000 simulated releases of the four tables' counts and totals with the kind's own noise
    (:func:`measure`, at the policy's sigmas and taus in units) and reconstruction (batched): per
    table, the first cell's total is within its 95% "each cell" half-width (binomial, p = 0.95),
    every cell's total at once within the "every cell at once" half-width (at least 0.95: Sidak),
    and every cell's mean within its interval (at least 0.95: a union bound). Each check fails a
    correct statement with probability below 1e-6 (binomial tails at 5 standard errors or
    beyond), 12 checks: below 1.2e-5."""
    loaded = _loaded(tmp_path)
    mechanism = _mechanism(loaded)
    layout = mechanism.layout(loaded)
    releases = 1_000
    merged = mechanism.job(loaded).partial(_data(loaded))
    counts = [np.asarray(part[0]).reshape(layout.tables[i].shape(layout.domain)) for i, part in enumerate(merged)]
    totals = [np.asarray(part[1]).reshape(counts[i].shape) for i, part in enumerate(merged)]

    def noisy(values: list[np.ndarray], sigmas: list[float], sensitivity: int, unit: float) -> list[np.ndarray]:
        return [
            measure(np.repeat(v[..., None], releases, axis=-1), s / unit, sensitivity) * unit
            for v, s in zip(values, sigmas, strict=True)
        ]

    count_estimates = tables.reconstruct(
        layout.domain, layout.tables, SIGMAS, noisy(counts, SIGMAS, 1, 1.0), releases=releases
    )
    total_estimates = tables.reconstruct(
        layout.domain, layout.tables, TAUS, noisy(totals, TAUS, 50, 10.0), releases=releases
    )
    count_variances = tables.cell_variances(layout.domain, layout.tables, SIGMAS)
    total_variances = tables.cell_variances(layout.domain, layout.tables, TAUS)
    low = stats.binom.ppf(1e-6, releases, 0.95)  # fewer successes: probability below 1e-6 at p = 0.95
    high = stats.binom.isf(1e-6, releases, 0.95)
    for i in range(len(layout.tables)):
        truth, estimate = totals[i] * 10.0, total_estimates[i]
        error = (estimate - truth[..., None]).reshape(-1, releases)
        variance = np.ravel(total_variances[i])
        each = tables.each_cell_half_width(variance, 0.95)
        every = tables.simultaneous_half_width(variance, 0.95)
        covered = int(np.sum(np.abs(error[0]) <= each[0]))
        assert low <= covered <= high, (i, covered)
        assert np.sum(np.all(np.abs(error) <= every, axis=0)) >= low
        half = 1 - 0.05 / 2
        _, lower, upper = mean_interval(
            estimate.reshape(-1, releases),
            count_estimates[i].reshape(-1, releases),
            tables.each_cell_half_width(variance, half)[:, None],
            tables.each_cell_half_width(np.ravel(count_variances[i]), half)[:, None],
            (0, 500),
        )
        count = np.ravel(counts[i])[:, None]
        true_mean = np.ravel(truth)[:, None] / np.maximum(count, 1)
        inside = ((lower <= true_mean) & (true_mean <= upper))[np.ravel(counts[i]) >= 1]
        assert np.sum(np.all(inside, axis=0)) >= low, i


# --------------------------------------------------------------------------- plan


def test_sigma_total_chosen_by_plan_is_the_largest_meeting_its_target(tmp_path) -> None:
    """Without sigma_total, plan chooses the totals' sigmas to meet a ``statistic: total`` target
    at the least cost: the target passes with them and fails with all of them 1.001 times as
    large (the constraint is tight); the counts' target and sigmas are untouched."""
    accuracy = (
        "[{mechanism: census, table: [county, sex], statistic: total, absolute_error: 4000},"
        " {mechanism: census, table: [state], absolute_error: 6}]"
    )
    loaded = _loaded(tmp_path, noise="{distribution: gaussian, sigma: 2}", accuracy=accuracy)
    plan = plan_policy(loaded)
    assert plan.passed, [c for c in plan.checks if not c.passed]
    (planned,) = plan.mechanisms
    taus = list(planned.facts["sigma_totals"].values())
    assert planned.facts["sigmas"] == {name: 2.0 for name in ("county-sex", "county", "state", "total")}
    checks = [c for c in plan.checks if "of the total" in c.target]
    assert len(checks) == 1 and checks[0].passed and checks[0].value <= 4000 < checks[0].value * 1.0001

    def check(scale: float) -> bool:
        given = ", ".join(f"{t * scale!r}" for t in taus)
        text = _text(noise=f"{{distribution: gaussian, sigma: 2, sigma_total: [{given}]}}", accuracy=accuracy)
        (found,) = [c for c in plan_policy(load_policy_text(text, tmp_path)).checks if "of the total" in c.target]
        return found.passed

    assert check(1.0) and not check(1.001)
    statement = plan.accuracy["census"].as_dict()
    assert [row["sigma"] for row in statement["totals"]["tables"]] == taus
    assert statement["totals"]["statements_of"].startswith("the totals are the unrounded least-squares estimate")


def test_calibrate_prints_the_total_sigmas_and_their_cost(tmp_path) -> None:
    """``calibrate noisy-tables`` with a ``statistic: total`` target: the totals' sigmas plan
    chooses, their half-widths, and a cost that is the plan's rho (counts and totals together)."""
    from privrelease.cli import app

    accuracy = (
        "[{mechanism: census, table: [county, sex], statistic: total, absolute_error: 4000},"
        " {mechanism: census, table: [state], absolute_error: 6}]"
    )
    path = _folder(tmp_path) / "policy.yaml"
    path.write_text(_text(noise="{distribution: gaussian}", accuracy=accuracy))
    result = CliRunner().invoke(app, ["calibrate", "noisy-tables", str(path), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    (planned,) = plan_policy(load_policy(path)).mechanisms
    assert [row["sigma"] for row in document["totals"]] == list(planned.facts["sigma_totals"].values())
    assert document["cost"]["sigma_totals"] == list(planned.facts["sigma_totals"].values())
    assert document["cost"]["zcdp_rho"] == pytest.approx(planned.facts["zcdp_rho"], rel=1e-12)
    assert document["totals"][0]["all_cells_half_width"] <= 4000
    text = CliRunner(env={"COLUMNS": "300"}).invoke(app, ["calibrate", "noisy-tables", str(path)]).output
    assert "totals of charges (its units)" in text and "sigma_total: [" in text


# --------------------------------------------------------------------------- end to end


def test_a_release_with_totals_on_both_engines(tmp_path, work, monkeypatch) -> None:
    """One policy with totals released in one process and on a local Dask cluster (4
    partitions): the same files, columns and cells, totals adding up on both; release.json and
    the report state the totals' statements."""
    import logging

    from distributed import LocalCluster

    from privrelease.flows.engines import LOCAL_HTTP
    from privrelease.flows.steps import release_plain

    monkeypatch.setenv("PRIVRELEASE_AUTO_INIT", "true")
    folder = _folder(tmp_path)
    data = pa.csv.read_csv(folder / "people.csv", parse_options=pa.csv.ParseOptions(delimiter=";"))
    pq.write_table(data, folder / "people.parquet", row_group_size=100)
    text = _text().replace(
        '  path: people.csv\n  format: csv\n  csv: {delimiter: ";"}\n', "  path: people.parquet\n  format: parquet\n"
    )
    (folder / "local.yaml").write_text(text)
    in_process = release_plain(policy_path=str(folder / "local.yaml"))
    logging.getLogger("distributed").setLevel(logging.ERROR)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=LOCAL_HTTP) as cluster:
        (folder / "dask.yaml").write_text(
            text.replace("name: small-tables", "name: small-tables-dask")
            + f"engine: {{name: dask, address: '{cluster.scheduler_address}', rows_per_partition: 100}}\n"
        )
        on_dask = release_plain(policy_path=str(folder / "dask.yaml"))
    assert "4 partitions on a cluster of 2 workers" in Path(on_dask.report).read_text()
    values = ("estimate", "lower", "upper", "total", "total_lower", "total_upper", "mean", "mean_lower", "mean_upper")
    for release in (in_process, on_dask):
        out = {
            name: pq.read_table(Path(release.release_dir) / f"census-{name}.parquet")
            for name in ("county-sex", "county", "state", "total")
        }
        finest = out["county-sex"].column("total").to_numpy().reshape(5, 2)
        np.testing.assert_allclose(finest.sum(axis=1), out["county"].column("total").to_numpy(), rtol=1e-12)
        np.testing.assert_allclose(finest.sum(), out["total"].column("total").to_numpy()[0], rtol=1e-12)
        (entry,) = json.loads((Path(release.release_dir) / "release.json").read_text())["outputs"]
        assert [row["table"] for row in entry["accuracy"]["totals"]["tables"]] == [
            "county-sex",
            "county",
            "state",
            "total",
        ]
        assert "the total of charges (total, total_lower, total_upper)" in entry["reading"]
        report = Path(release.report).read_text()
        assert "Totals of charges that add up" in report and "Totals and means that add up" in report
        local = pq.read_table(Path(in_process.release_dir) / "census-county-sex.parquet")
        assert out["county-sex"].schema == local.schema and out["county-sex"].column_names[-9:] == list(values)
        labels = ["county", "sex"]
        assert out["county-sex"].select(labels).equals(local.select(labels))


def test_the_readme_totals_snippet_plans(tmp_path) -> None:
    """The README's "Totals and means that add up" YAML (its mechanisms and targets), on a dataset
    declaring its columns and a county -> state hierarchy, passes plan: sigma_total chosen to meet
    its total target, the count target met at its sigma."""
    import re

    import yaml

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    intro = "**Totals and means that add up.**"
    snippet = re.search(r"```yaml\n(.*?)```", readme[readme.index(intro) :], re.S)
    assert snippet is not None
    section = yaml.safe_load(snippet.group(1))
    (tmp_path / "counties.csv").write_text(
        "Alder;North;*\nBirch;North;*\nCedar;South;*\nDogwood;South;*\nElm;South;*\n"
    )
    (tmp_path / "discharges.csv").write_text("county,diagnosis,charges\n")
    policy = {
        "name": "readme-totals",
        "version": "1",
        "dataset": {
            "id": "readme",
            "path": "discharges.csv",
            "format": "csv",
            "columns": {
                "county": {"type": "string", "values": ["Alder", "Birch", "Cedar", "Dogwood", "Elm"]},
                "diagnosis": {"type": "string", "values": ["circulatory", "respiratory", "injury"]},
                "charges": {"type": "integer"},
            },
        },
        "generalization": {"county": {"hierarchy": "counties.csv", "level": 0}, "diagnosis": "keep"},
        "mechanisms": section["mechanisms"],
        "targets": {"accounting": "approximate", "delta": 1e-6, **section["targets"]},
    }
    plan = plan_policy(load_policy_text(yaml.safe_dump(policy), tmp_path))
    assert plan.passed, [c for c in plan.checks if not c.passed]
    (planned,) = plan.mechanisms
    assert set(planned.facts["sigma_totals"]) == {"county-diagnosis", "state", "total"}


def test_plan_s_lines_say_whose_statement_they_are(tmp_path) -> None:
    """plan prints the counts' and the totals' rows of each table on lines that say which they
    are (audit 7: two "accuracy of census: table county ..." lines with different figures)."""
    import subprocess
    import sys

    folder = _folder(tmp_path)
    (folder / "tables.yaml").write_text(_text())
    done = subprocess.run(
        [sys.executable, "-m", "privrelease", "plan", "tables.yaml"],
        capture_output=True,
        text=True,
        cwd=folder,
        env={**os.environ, "COLUMNS": "250"},
    )
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip().startswith("accuracy of census")]
    assert sum(line.startswith("accuracy of census (tables): table county,") for line in lines) == 1, lines
    assert sum(line.startswith("accuracy of census (totals): table county,") for line in lines) == 1, lines


@pytest.mark.parametrize(
    ("total", "noise", "message"),
    [
        (
            "{column: charges, bounds: [17]}",
            None,
            r"total\.bounds: bounds has too few entries: entry 2 is missing; got \[17\]$",
        ),
        (
            None,
            "{distribution: gaussian, sigma: 1, sigma_total: -5}",
            r"noise\.sigma_total: sigma_total must be a number >= 0\.01 \(or a list of such values\); got -5$",
        ),
        (
            None,
            "{distribution: gaussian, sigma: 1, sigma_total: .inf}",
            r"sigma_total must be a number >= 0\.01, a finite number \(or a list of such values\); got inf$",
        ),
        (
            None,
            "{distribution: gaussian, sigma: 1, sigma_total: [100, -5, 1, 1]}",
            r"noise\.sigma_total\[1\]: sigma_total must be a number >= 0\.01; got -5$",
        ),
    ],
)
def test_a_value_or_a_list_is_refused_once_in_words_that_fit(tmp_path, total, noise, message) -> None:
    """One problem, in words that fit what was given (audit 7): a short [lo, hi] says what is
    missing, not "bounds is required"; a bad number for a number-or-list field says both are
    allowed, not also "must be a list"; a list's bad entry is named alone; inf is not finite."""
    parts = {"total": total} if total is not None else {}
    if noise is not None:
        parts["noise"] = noise
    with pytest.raises(UserError) as caught:
        _loaded(tmp_path, **parts)
    lines = str(caught.value).splitlines()
    assert len(lines) == 1 and re.search(message, lines[0]), lines


def test_the_mean_s_probability_is_a_figure_when_every_table_shares_one(tmp_path) -> None:
    """The totals' statement words the mean's probability as the figure every table's totals
    share (0.95), not as an unexplained "C" (audit 7)."""
    loaded = _loaded(tmp_path)
    mechanism = _mechanism(loaded)
    (totals,) = [s for s in mechanism.accuracy(loaded, plan_policy(loaded).mechanisms[0]).stated if s.key == "totals"]
    assert "with probability >= 0.95 (for a cell with rows)" in totals.document["mean"]
    assert "(C the table's probability)" not in totals.caption


def test_the_discharges_tables_example_adds_up_for_patients(work, monkeypatch) -> None:
    """policies/examples/discharges-tables.yaml (patients of up to 4 discharges): plan meets all
    eight targets at the README's epsilon; the release's four files are margins of one estimate
    (counts and totals of county x diagnosis add up to county, diagnosis and the statewide
    total), each mean is its cell's total / count moved into the bounds, and release.json states
    the patient as the unit of privacy."""
    from privrelease.flows.steps import release_plain

    monkeypatch.setenv("PRIVRELEASE_AUTO_INIT", "true")
    path = Path(__file__).resolve().parents[1] / "policies" / "examples" / "discharges-tables.yaml"
    plan = plan_policy(load_policy(path))
    assert plan.passed and sum("discharges: accuracy" in check.target for check in plan.checks) == 8
    epsilon = plan.composed["approximate"].epsilon
    readme = (path.parents[2] / "README.md").read_text()
    assert f"targets (each table's counts and totals, every cell at once) at epsilon {epsilon:.3g} (delta 1e-06)" in (
        readme.replace("\n", " ")
    )
    release = release_plain(policy_path=str(path))
    out = {
        name: pq.read_table(Path(release.release_dir) / f"discharges-{name}.parquet")
        for name in ("county-diagnosis", "county", "diagnosis", "total")
    }
    assert out["county-diagnosis"].num_rows == 25
    for value in ("estimate", "total"):
        finest = out["county-diagnosis"].column(value).to_numpy().reshape(5, 5)
        np.testing.assert_allclose(finest.sum(axis=1), out["county"].column(value).to_numpy(), rtol=1e-12)
        np.testing.assert_allclose(finest.sum(axis=0), out["diagnosis"].column(value).to_numpy(), rtol=1e-12)
        np.testing.assert_allclose(finest.sum(), out["total"].column(value).to_numpy()[0], rtol=1e-12)
    for table in out.values():
        count, total, mean = (table.column(c).to_numpy(zero_copy_only=False) for c in ("estimate", "total", "mean"))
        has = count >= 1
        np.testing.assert_allclose(mean[has], np.clip(total[has] / count[has], 0, 60000), rtol=1e-12)
    document = json.loads((Path(release.release_dir) / "release.json").read_text())
    assert document["unit_of_privacy"]["rules"] == {"discharges": "at most 4 random rows per person, sensitivity 4"}
