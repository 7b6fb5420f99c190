"""The ``noisy_tables`` kind (issue 26): a set of tables over declared domains and one hierarchy's
levels, measured with Gaussian noise and reconstructed into one consistent estimate.
The mathematics (:mod:`privrelease.mechanisms.tables`) is tested in tests/test_tables_math.py;
here: the policy (validation errors), the layout against an independent dense least-squares
computation, outputs that add up across files and levels, Dask's partials, accuracy targets,
the privacy event against OpenDP's map and dp_accounting, several rows per person, coverage with
the kind's own noise, calibrate, and both examples end to end."""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats
from typer.testing import CliRunner

from privrelease.errors import UserError
from privrelease.mechanisms import tables
from privrelease.mechanisms.kinds.noisy_tables import GaussianTables, NoisyTablesMechanism, measure
from privrelease.planning import plan_policy
from privrelease.policies import load_policy, load_policy_text
from privrelease.policies.loader import canonical_json

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "policies" / "examples"
sys.path.insert(0, str(REPO / "tools"))
import geo_tables  # noqa: E402  (the example's generator, a script in tools/)

HIERARCHY = [("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B"), ("b2", "B")]
"""A small unequal geography: 3 counties in state A, 2 in state B."""

POLICY = """
name: small-tables
version: "1"
dataset:
  id: small
  path: people.csv
  format: csv
  csv: {{delimiter: ";"}}
  columns:
    county: {{type: string}}
    sex: {{type: string, values: [F, M]}}
    age: {{type: string, values: [young, old, older]}}
generalization:
  county: {{hierarchy: counties.csv, level: 0}}
  sex: keep
  age: keep
mechanisms:
  - name: census
    type: noisy_tables
    tables: {tables}
    levels: {{state: {{of: county, level: 1}}}}
    noise: {noise}
    nonnegative: {nonnegative}
targets:
  accounting: approximate
  delta: 1.0e-6
  lifetime_budget: {{epsilon: 100, delta: 1.0e-3}}
  accuracy: {accuracy}
"""


def _folder(tmp_path: Path, rows: int = 400) -> Path:
    """The hierarchy file and ``rows`` people (county, sex, age) in ``tmp_path``."""
    tmp_path.mkdir(exist_ok=True)
    with (tmp_path / "counties.csv").open("w", newline="") as handle:
        csv.writer(handle, delimiter=";").writerows((c, s, "*") for c, s in HIERARCHY)
    rng = np.random.default_rng(3)  # test data, not a mechanism
    with (tmp_path / "people.csv").open("w", newline="") as handle:
        writer = csv.writer(handle, delimiter=";")
        writer.writerow(("county", "sex", "age"))
        counties = rng.choice([c for c, _ in HIERARCHY], rows, p=[0.4, 0.3, 0.05, 0.2, 0.05])
        writer.writerows(zip(counties, rng.choice(["F", "M"], rows), rng.choice(["young", "old"], rows), strict=True))
    return tmp_path


def _loaded(
    tmp_path: Path,
    tables_text: str = "[[county, sex], [county], [state], []]",
    noise: str = "{distribution: gaussian, sigma: [1, 2, 1.5, 3]}",
    accuracy: str = "[]",
    nonnegative: str = "false",
):
    text = POLICY.format(tables=tables_text, noise=noise, accuracy=accuracy, nonnegative=nonnegative)
    return load_policy_text(text, _folder(tmp_path))


def _mechanism(loaded) -> NoisyTablesMechanism:
    (mechanism,) = loaded.policy.mechanisms
    assert isinstance(mechanism, NoisyTablesMechanism)
    return mechanism


# --------------------------------------------------------------------------- the policy


@pytest.mark.parametrize(
    ("tables_text", "levels", "message"),
    [
        ("[[county, height]]", None, r"tables\[0\]\[1\].*height"),
        ("[[county, sex], [sex, county]]", None, r"tables\[1\]: table \['sex', 'county'\] is listed twice"),
        ("[[sex, sex]]", None, r"tables\[0\]: table \['sex', 'sex'\] names column 'sex' twice"),
        ("[[county, state]]", None, r"tables\[0\]: table \['county', 'state'\] names 'county', 'state': levels of one"),
        ("[[state]]", "{state: {of: county, level: 0}}", r"levels\.state\.level: level must be an integer >= 1"),
        ("[[state]]", "{state: {of: sex, level: 1}}", r"levels\.state\.of: column 'sex' has no hierarchy"),
        ("[[sex]]", "{sex: {of: county, level: 1}}", r"levels\.sex: level 'sex' is also a dataset column"),
        ("[[state]]", "{state: {of: county, level: 1}, region: {of: age, level: 1}}", r"levels: levels name several"),
    ],
)
def test_a_wrong_table_is_refused_naming_the_field_and_value(tmp_path, tables_text, levels, message) -> None:
    text = POLICY.format(
        tables=tables_text, noise="{distribution: gaussian, sigma: 2}", accuracy="[]", nonnegative="false"
    )
    if levels is not None:
        text = text.replace("levels: {state: {of: county, level: 1}}", f"levels: {levels}")
    with pytest.raises(UserError, match=message):
        load_policy_text(text, _folder(tmp_path))


def test_two_tables_published_under_one_file_name_are_refused(tmp_path) -> None:
    """A column named ``total`` would publish [total] and [] both as ``census-total``."""
    text = POLICY.format(
        tables="[[total], []]", noise="{distribution: gaussian, sigma: 2}", accuracy="[]", nonnegative="false"
    ).replace("    age: {type: string", "    total: {type: string, values: [x]}\n    age: {type: string")
    text = text.replace("  age: keep", "  age: keep\n  total: keep")
    with pytest.raises(
        UserError, match=r"tables\[1\]: tables\[0\] and tables\[1\] would both be published as file census-total"
    ):
        load_policy_text(text, _folder(tmp_path))


def test_sigmas_one_per_table_or_targets_to_choose_them(tmp_path) -> None:
    with pytest.raises(UserError, match=r"noise\.sigma: noise\.sigma lists 2 sigmas for 4 tables"):
        _loaded(tmp_path, noise="{distribution: gaussian, sigma: [1, 2]}")
    with pytest.raises(UserError, match=r"noise\.sigma is absent.*no accuracy target names mechanism 'census'"):
        _loaded(tmp_path, noise="{distribution: gaussian}")
    with pytest.raises(UserError, match=r"targets\.accuracy\[0\]\.table: table \['age'\] is not one of"):
        _loaded(tmp_path, accuracy="[{mechanism: census, table: [age], absolute_error: 5}]")


def test_table_and_cells_on_another_kind_are_refused(tmp_path) -> None:
    text = (
        (EXAMPLES / "adult-noisy.yaml")
        .read_text()
        .replace(
            "{mechanism: table, absolute_error: 8, confidence: 0.95}",
            "{mechanism: table, absolute_error: 8, confidence: 0.95, cells: all}",
        )
    )
    with pytest.raises(UserError, match=r"targets\.accuracy\[0\]\.cells: cells applies to a noisy_tables mechanism"):
        load_policy_text(text, EXAMPLES)


def test_a_level_that_is_not_nested_is_refused(tmp_path) -> None:
    folder = _folder(tmp_path)
    (folder / "counties.csv").write_text("a1;x;A;*\na2;x;B;*\nb1;y;B;*\n")
    text = POLICY.format(
        tables="[[county], [region]]", noise="{distribution: gaussian, sigma: 2}", accuracy="[]", nonnegative="false"
    )
    text = text.replace(
        "levels: {state: {of: county, level: 1}}",
        "levels: {district: {of: county, level: 1}, region: {of: county, level: 2}}",
    )
    loaded = load_policy_text(text, folder)
    with pytest.raises(
        UserError, match=r"levels\.region: level 'region' is not nested in 'district': district 'x' lies"
    ):
        plan_policy(loaded)


def test_existing_accuracy_targets_keep_their_hash() -> None:
    """``table`` and ``cells`` are left out of the canonical form when absent: every policy
    written before them keeps its hash (and its approvals)."""
    loaded = load_policy_text((EXAMPLES / "adult-noisy.yaml").read_text(), EXAMPLES)
    document = json.loads(canonical_json(loaded))
    (target,) = document["policy"]["targets"]["accuracy"]
    assert set(target) == {"mechanism", "count", "relative_error", "absolute_error", "confidence"}


def test_too_many_cells_is_an_infeasible_plan(tmp_path, monkeypatch) -> None:
    """Every table's cells together, and for non-negative integer tables the one array they are
    margins of (5 counties x 2 sexes x 3 ages = 30 here, more than the tables' 13), are bounded."""
    from privrelease.mechanisms.kinds import noisy_tables

    monkeypatch.setattr(noisy_tables, "MAX_CELLS", 10)
    plan = plan_policy(_loaded(tmp_path))
    assert not plan.passed
    assert any(check.required == "at most 10 cells; the tables have 18" for check in plan.checks if not check.passed)
    monkeypatch.setattr(noisy_tables, "MAX_CELLS", 20)
    assert plan_policy(_loaded(tmp_path / "fits")).passed
    wide = _loaded(
        tmp_path / "wide", "[[county, sex], [age]]", "{distribution: gaussian, sigma: 2}", nonnegative="true"
    )
    failed = [check.required for check in plan_policy(wide).checks if not check.passed]
    assert failed == ["at most 20 cells in the array every table is a margin of; it has 30"]


# --------------------------------------------------------------------------- the estimate


def _dense(sigmas: list[float]) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """An independent dense GLS for [[county, sex], [county], [state], []] over HIERARCHY x (F, M):
    the measurement matrices, per table its map from cells, and the estimate's covariance."""
    counties = sorted(c for c, _ in HIERARCHY)
    states = sorted({s for _, s in HIERARCHY})
    cells = [(c, s) for c in counties for s in ("F", "M")]
    state_of = dict(HIERARCHY)
    maps = [
        np.eye(len(cells)),
        np.array([[float(cell[0] == c) for cell in cells] for c in counties]),
        np.array([[float(state_of[cell[0]] == s) for cell in cells] for s in states]),
        np.ones((1, len(cells))),
    ]
    a = np.vstack(maps)
    weights = np.concatenate([np.full(m.shape[0], 1 / s**2) for m, s in zip(maps, sigmas, strict=True)])
    covariance = np.linalg.inv(a.T @ (weights[:, None] * a))
    return a, maps, covariance


def test_layout_estimates_and_variances_match_a_dense_least_squares(tmp_path) -> None:
    """The kind's layout (labels, hierarchy parents, axis order) fed to the reconstruction gives
    the dense GLS's estimates and per-cell variances (np.linalg on the 10-cell domain)."""
    sigmas = [1.0, 2.0, 1.5, 3.0]
    loaded = _loaded(tmp_path)
    mechanism = _mechanism(loaded)
    layout = mechanism.layout(loaded)
    assert layout.labels["county"] == ["a1", "a2", "a3", "b1", "b2"] and layout.labels["state"] == ["A", "B"]
    assert layout.axes == (("county", "sex"), ("county",), ("state",), ())
    a, maps, covariance = _dense(sigmas)
    rng = np.random.default_rng(11)  # test data, not a mechanism
    measured = rng.normal(20, 5, a.shape[0])
    weights = np.concatenate([np.full(m.shape[0], 1 / s**2) for m, s in zip(maps, sigmas, strict=True)])
    estimate = covariance @ (a.T @ (weights * measured))
    shapes = [(5, 2), (5,), (2,), ()]
    pieces = np.split(measured, np.cumsum([m.shape[0] for m in maps])[:-1])
    got = tables.reconstruct(
        layout.domain, layout.tables, sigmas, [p.reshape(s) for p, s in zip(pieces, shapes, strict=True)]
    )
    variances = tables.cell_variances(layout.domain, layout.tables, sigmas)
    for m, value, variance in zip(maps, got, variances, strict=True):
        np.testing.assert_allclose(np.ravel(value), m @ estimate, rtol=1e-10, atol=1e-9)
        np.testing.assert_allclose(np.ravel(variance), np.diag(m @ covariance @ m.T), rtol=1e-10)
    statements = mechanism.statements(loaded)
    for m, row in zip(maps, statements, strict=True):
        assert row["standard_error"] == pytest.approx(math.sqrt(np.max(np.diag(m @ covariance @ m.T))), rel=1e-10)


def _counts(loaded) -> list[np.ndarray]:
    table = pa.csv.read_csv(loaded.resolve("people.csv"), parse_options=pa.csv.ParseOptions(delimiter=";"))
    return _mechanism(loaded).job(loaded).partial(table)


@pytest.mark.parametrize("nonnegative", ["false", "true"])
def test_outputs_add_up_across_files_and_levels(tmp_path, nonnegative) -> None:
    """Every published table is a margin of the finest: county x sex summed over sex is the
    county table, counties summed within their state the state table, everything the total
    (to float rounding; exactly, in integers, when nonnegative)."""
    loaded = _loaded(tmp_path, nonnegative=nonnegative)
    mechanism = _mechanism(loaded)
    table = pa.csv.read_csv(loaded.resolve("people.csv"), parse_options=pa.csv.ParseOptions(delimiter=";"))
    result = mechanism.run(loaded, table)
    assert list(result.tables) == ["county-sex", "county", "state", "total"]
    out = {name: t.column("estimate").to_numpy() for name, t in result.tables.items()}
    assert result.tables["county-sex"].column_names == ["county", "sex", "estimate", "lower", "upper"]
    assert result.tables["county-sex"].column("county").to_pylist() == [c for c, _ in HIERARCHY for _ in "FM"]
    finest = out["county-sex"].reshape(5, 2)
    states = np.array([0, 0, 0, 1, 1])
    sums = [
        (finest.sum(axis=1), out["county"]),
        (np.bincount(states, out["county"]), out["state"]),
        (out["state"].sum(keepdims=True), out["total"]),
    ]
    for summed, margin in sums:
        if nonnegative == "true":
            assert margin.dtype.kind == "i" and (margin >= 0).all()
            np.testing.assert_array_equal(summed, margin)
        else:
            np.testing.assert_allclose(summed, margin, rtol=1e-12, atol=1e-9)
    layout = mechanism.layout(loaded)
    variances = tables.cell_variances(layout.domain, layout.tables, [1.0, 2.0, 1.5, 3.0])
    for (name, published), variance in zip(result.tables.items(), variances, strict=True):
        lower, upper = published.column("lower").to_numpy(), published.column("upper").to_numpy()
        assert (lower <= np.maximum(out[name], 0)).all() and (upper >= out[name]).all() and (lower >= 0).all()
        width = np.ravel(variance) ** 0.5 * stats.norm.ppf(0.975)  # each cell's 95% interval
        if nonnegative == "false":
            np.testing.assert_allclose(upper - out[name], width, rtol=1e-12)
        else:  # widened by the table's largest shift from the linear estimate, at least the width
            assert (upper - out[name] >= width * (1 - 1e-12)).all()
    assert result.event == plan_policy(loaded).mechanisms[0].event
    # the words say how exactly they add up (audit 6: decimals off by up to 3.6e-12 were called exact)
    consistency = mechanism.accuracy(loaded, plan_policy(loaded).mechanisms[0]).stated[0].document["consistency"]
    assert "exactly with nonnegative (integers), else up to floating-point rounding" in consistency


def test_dask_partials_merge_to_the_whole_table_and_publish_the_same_layout(tmp_path) -> None:
    """What Dask runs (each partition's exact counts, merged, then finish) counts exactly what one
    process counts, and publishes the same files, columns and cells."""
    loaded = _loaded(tmp_path)
    mechanism = _mechanism(loaded)
    job = mechanism.job(loaded)
    table = pa.csv.read_csv(loaded.resolve("people.csv"), parse_options=pa.csv.ParseOptions(delimiter=";"))
    parts = [job.partial(table.slice(start, 150)) for start in range(0, table.num_rows, 150)]
    merged = job.merge(parts)
    whole = job.partial(table)
    for left, right in zip(merged, whole, strict=True):
        np.testing.assert_array_equal(left, right)
    assert int(whole[-1][0]) == table.num_rows == int(whole[0].sum())
    on_dask, in_process = mechanism.finish(loaded, merged), mechanism.run(loaded, table)
    assert list(on_dask.tables) == list(in_process.tables)
    for name, published in on_dask.tables.items():
        other = in_process.tables[name]
        assert published.schema == other.schema
        labels = [c for c in published.column_names if c not in ("estimate", "lower", "upper")]
        assert published.select(labels).equals(other.select(labels))
    assert on_dask.event == in_process.event


# --------------------------------------------------------------------------- targets and privacy


def test_accuracy_targets_pass_and_fail_by_the_statements(tmp_path) -> None:
    """A target on a table checks its simultaneous half-width (``cells: all``, the default) or
    each cell's (``cells: each``) at its confidence, as the plan states them."""
    loaded = _loaded(tmp_path)
    rows = {row["table"]: row for row in _mechanism(loaded).statements(loaded)}
    finest = rows["county-sex"]
    assert finest["all_cells_half_width"] > finest["each_cell_half_width"]
    every, each = finest["all_cells_half_width"], finest["each_cell_half_width"]
    accuracy = (
        f"[{{mechanism: census, table: [county, sex], absolute_error: {every * 1.001}}},"
        f" {{mechanism: census, table: [sex, county], absolute_error: {each * 1.001}, cells: each}},"
        f" {{mechanism: census, table: [county, sex], absolute_error: {every * 0.999}}},"
        f" {{mechanism: census, absolute_error: {each * 0.999}, cells: each}}]"
    )
    checks = [c for c in plan_policy(_loaded(tmp_path / "t", accuracy=accuracy)).checks if "half-width" in c.target]
    assert [c.passed for c in checks] == [True, True, False, False]


def test_rho_is_opendp_s_map_and_epsilon_a_sound_conversion(tmp_path) -> None:
    """The plan's event is one zCDP Gaussian event: rho = sum_t 1/(2 sigma_t^2) is the sum of
    OpenDP's own maps of the float Gaussian the kind measures with; its approximate epsilon at
    the target delta (CKS Proposition 12 over the orders) is within 3% of dp_accounting's RDP
    accountant for the same Gaussian releases, and never below the exact (epsilon, delta) curve
    of the Gaussian mechanism of the combined sigma, 1/sigma_eff^2 = sum_t 1/sigma_t^2: it is a
    conversion of rho, an upper bound of that curve."""
    import opendp.prelude as dp
    from dp_accounting import dp_event, rdp
    from dp_accounting.pld import privacy_loss_distribution as pld

    dp.enable_features("contrib")
    sigmas = [1.0, 2.0, 1.5, 3.0]
    plan = plan_policy(_loaded(tmp_path))
    (mechanism,) = plan.mechanisms
    event = mechanism.event
    assert isinstance(event, GaussianTables) and list(event.sigmas) == sigmas and event.sensitivity == 1
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    opendp_rho = sum(dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=s).map(1.0) for s in sigmas)
    assert mechanism.facts["zcdp_rho"] == pytest.approx(opendp_rho, rel=1e-12)
    assert event.rho == pytest.approx(opendp_rho, rel=1e-12) and event.rho >= mechanism.facts["zcdp_rho"]
    ours = plan.composed["approximate"].epsilon
    accountant = rdp.RdpAccountant()
    for sigma in sigmas:
        accountant.compose(dp_event.GaussianDpEvent(sigma))
    assert ours == pytest.approx(accountant.get_epsilon(1e-6), rel=0.03)
    effective = 1 / math.sqrt(sum(1 / s**2 for s in sigmas))
    exact = pld.from_gaussian_mechanism(effective, value_discretization_interval=1e-5).get_epsilon_for_delta(1e-6)
    assert exact <= ours < 1.3 * exact


def test_several_rows_per_person_plan_run_and_cost_m_squared(tmp_path, work, monkeypatch) -> None:
    """A person column with max_rows 3: plan passes with zCDP rho 9 times the one-row-per-person
    rho (L2 sensitivity 3 per table, any spread of a person's rows), the release reads up to 3
    rows of each person (200 people of 5 rows: the total near 600, not 200 nor 1,000; the
    interval is 10 standard errors wide: a correct release fails with probability below 1e-20)
    and its ledger charges the person-level event."""
    from privrelease.flows.steps import release_plain

    monkeypatch.setenv("PRIVRELEASE_AUTO_INIT", "true")
    monkeypatch.setenv("PRIVRELEASE_DATA_ROOTS", str(tmp_path))
    one = _loaded(tmp_path / "one")
    folder = _folder(tmp_path / "person")
    rng = np.random.default_rng(5)  # test data, not a mechanism
    with (folder / "people.csv").open("w", newline="") as handle:
        writer = csv.writer(handle, delimiter=";")
        writer.writerow(("id", "county", "sex", "age"))
        for person in range(200):
            county = rng.choice([c for c, _ in HIERARCHY])
            writer.writerows((f"p{person}", county, rng.choice(["F", "M"]), "young") for _ in range(5))
    text = POLICY.format(
        tables="[[county, sex], [county], [state], []]",
        noise="{distribution: gaussian, sigma: [1, 2, 1.5, 3]}",
        accuracy="[]",
        nonnegative="false",
    ).replace("  columns:\n", "  person: {column: id, max_rows: 3}\n  columns:\n    id: {type: string}\n", 1)
    path = folder / "policy.yaml"
    path.write_text(text)
    loaded = load_policy(path)
    plan = plan_policy(loaded)
    assert plan.passed, [check for check in plan.checks if not check.passed]
    (mechanism,) = plan.mechanisms
    (single,) = plan_policy(one).mechanisms
    assert mechanism.facts["zcdp_rho"] == pytest.approx(9 * single.facts["zcdp_rho"], rel=1e-15)
    assert isinstance(mechanism.event, GaussianTables) and mechanism.event.sensitivity == 3
    assert "3 per table in L2" in mechanism.facts["sensitivity"]
    published = release_plain(policy_path=str(path))
    total = pq.read_table(Path(published.release_dir) / "census-total.parquet").column("estimate").to_numpy()
    (row,) = [r for r in _mechanism(loaded).statements(loaded) if r["table"] == "total"]
    assert abs(total[0] - 600) < 10 * row["standard_error"] < 100
    facts = json.loads((Path(published.release_dir) / "release.json").read_text())
    assert facts["unit_of_privacy"]["rules"] == {"census": "at most 3 random rows per person, sensitivity 3"}
    from test_flow_steps import ledger_entries

    (entry,) = ledger_entries()
    assert '"kind":"gaussian_tables"' in entry.event_json and '"neighbours":"person:id"' in entry.event_json


# --------------------------------------------------------------------------- what the words say


def _text(html: str) -> str:
    """A report's words: tags dropped, entities decoded, white space single."""
    import html as markup

    return " ".join(markup.unescape(re.sub(r"<[^>]+>", " ", html)).split())


@pytest.mark.parametrize("nonnegative", ["false", "true"])
def test_targets_say_what_they_checked_each_table_and_rounded_or_not(tmp_path, nonnegative) -> None:
    """A target without ``table`` is checked per table: it says "each table: every cell of that
    table at once", never "every table". Without nonnegative the statements are the published
    estimate's; with it, the plan (checks, captions, columns, JSON) says they are the unrounded
    estimate's, which is not published, and the published integers differ by a rounding shift."""
    accuracy = "[{mechanism: census, absolute_error: 50}, {mechanism: census, table: [state], absolute_error: 50}]"
    plan = plan_policy(_loaded(tmp_path, accuracy=accuracy, nonnegative=nonnegative))
    labels = [check.target for check in plan.checks if "half-width" in check.target]
    rounded = nonnegative == "true"
    of = ", not of the published integers" if rounded else ""
    unrounded = " of the unrounded least-squares estimate" if rounded else ""
    assert labels == [
        f"census: accuracy at 95% (each table: every cell of that table at once: half-width{unrounded}{of})",
        f"census: accuracy at 95% (table state, every cell at once: half-width{unrounded}{of})",
    ]
    statement = plan.accuracy["census"]
    (stated,) = statement.stated
    document = statement.as_dict()
    if rounded:
        assert statement.estimate.startswith("the unrounded least-squares estimate (every table a margin of it), not")
        assert stated.columns[4:6] == ("each cell (unrounded)", "every cell at once (unrounded)")
        assert "Per table, for the unrounded least-squares estimate (not published): each cell" in stated.caption
        assert "the half-widths and the accuracy target checks hold for the unrounded" in document["tables"]["rounding"]
        assert document["tables"]["statements_of"] == "the unrounded least-squares estimate"
    else:
        assert statement.estimate == "the published estimate (every table a margin of one estimate)"
        assert stated.columns[4:6] == ("each cell", "every cell at once") and "unrounded" not in stated.caption
        assert "rounding" not in document["tables"] and document["tables"]["statements_of"] == "the published tables"


def test_a_nonnegative_release_states_its_shifts_tables_and_generalization(tmp_path, work, monkeypatch) -> None:
    """End to end, nonnegative: the report, the public statement and release.json say the
    statements hold for the unrounded estimate and give each table's actual rounding shift
    (the one lower/upper are widened by); the files are named as separate tables, never "one
    dataset"; the parameters show every table, the total included; release.json's
    generalization covers every published column, a geography level as its hierarchy column."""
    from privrelease.flows.steps import release_plain

    monkeypatch.setenv("PRIVRELEASE_AUTO_INIT", "true")
    monkeypatch.setenv("PRIVRELEASE_DATA_ROOTS", str(tmp_path))
    path = _folder(tmp_path / "data") / "policy.yaml"
    path.write_text(
        POLICY.format(
            tables="[[county, sex], [county], [state], []]",
            noise="{distribution: gaussian, sigma: [1, 2, 1.5, 3]}",
            accuracy="[]",
            nonnegative="true",
        )
    )
    loaded = load_policy(path)
    published = release_plain(policy_path=str(path))
    folder = Path(published.release_dir)
    (entry,) = json.loads((folder / "release.json").read_text())["outputs"]
    names = ["county-sex", "county", "state", "total"]
    layout = _mechanism(loaded).layout(loaded)
    variances = tables.cell_variances(layout.domain, layout.tables, [1.0, 2.0, 1.5, 3.0])
    shifts = entry["facts"]["rounding_shift"]
    for name, variance in zip(names, variances, strict=True):
        out = pq.read_table(folder / f"census-{name}.parquet")
        width = np.ravel(variance) ** 0.5 * stats.norm.ppf(0.975)
        widened = out.column("upper").to_numpy() - out.column("estimate").to_numpy() - width
        np.testing.assert_allclose(widened, shifts[name], atol=1e-9)
    assert "file" not in entry and "rows" not in entry and entry["files"] == 4
    assert [(t["file"], t["rows"]) for t in entry["tables"]] == [
        ("census-county-sex.parquet", 10),
        ("census-county.parquet", 5),
        ("census-state.parquet", 2),
        ("census-total.parquet", 1),
    ]
    reading = (
        "census publishes 4 tables, one file each: "
        + "; ".join(
            f"{name} (census-{name}.parquet: {cells} cell{'s' if cells > 1 else ''}; its published integers within "
            f"±{shifts[name]:.4g} of the unrounded estimate)"
            for name, cells in zip(names, (10, 5, 2, 1), strict=True)
        )
        + ". Every table is a margin of one estimate (its cells add up to the others): do not add the files "
        "together or read them as one dataset: each table counts the same rows again."
    )
    assert entry["reading"] == reading
    assert entry["generalization"] == {
        "county": "hierarchy counties.csv, level 0",
        "sex": "kept as is",
        "state": "hierarchy counties.csv, level 1",
    }
    assert entry["accuracy"]["estimate"].startswith("the unrounded least-squares estimate")
    for page in (published.report, published.statement):
        text = _text(Path(page).read_text())
        assert reading in text and "read them all (one dataset)" not in text
        assert "estimate = the unrounded least-squares estimate (every table a margin of it), not published" in text
        assert "the published estimate" not in text
        assert "tables [county, sex]; [county]; [state]; [] (total)" in text
        assert "levels state (of = county, level = 1)" in text and "state = of = county" not in text


# --------------------------------------------------------------------------- examples


def test_the_committed_hierarchy_is_the_generator_s(tmp_path) -> None:
    """geo-counties.csv is what `python tools/geo_tables.py` writes (seed 26): 3,000 counties in
    50 states of unequal sizes."""
    hierarchy, people = geo_tables.write(tmp_path, rows=1_000)
    assert hierarchy.read_bytes() == (EXAMPLES / "geo-counties.csv").read_bytes()
    rows = list(csv.reader(hierarchy.open(), delimiter=";"))
    sizes = np.unique([row[1] for row in rows], return_counts=True)[1]
    assert len(rows) == 3_000 and len(sizes) == 50 and sizes.max() >= 10 * sizes.min()
    assert sum(1 for _ in people.open()) == 1_001


def test_calibrate_states_the_cost_of_the_targets_and_the_naive_alternative(tmp_path) -> None:
    """``calibrate noisy-tables POLICY``: the sigmas plan chooses, their privacy cost as plan states
    it, each table's half-widths, and the naive alternative, which costs more; a policy without
    a noisy_tables mechanism is a UserError (one line on stderr, exit 2)."""
    from privrelease.cli import app

    path = EXAMPLES / "geo-tables.yaml"
    result = CliRunner().invoke(app, ["calibrate", "noisy-tables", str(path), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    plan = plan_policy(load_policy(path))
    (mechanism,) = plan.mechanisms
    assert document["cost"]["sigmas"] == list(mechanism.facts["sigmas"].values())
    assert document["cost"]["zcdp_rho"] == mechanism.facts["zcdp_rho"]
    assert document["cost"]["epsilon"] == plan.composed["approximate"].epsilon
    assert document["naive"]["zcdp_rho"] == mechanism.facts["naive_zcdp_rho"] > document["cost"]["zcdp_rho"]
    assert document["naive"]["epsilon"] == mechanism.facts["naive_epsilon"] > document["cost"]["epsilon"]
    widths = [row["all_cells_half_width"] for row in document["tables"]]
    assert all(w <= limit for w, limit in zip(widths, [25, 25, 20, 10], strict=True))
    # geo-tables is nonnegative: the half-widths are of the unrounded estimate, as plan says
    assert document["statements_of"] == "the unrounded least-squares estimate" and document["rounding"]
    text = CliRunner(env={"COLUMNS": "400"}).invoke(app, ["calibrate", "noisy-tables", str(path)]).output
    assert "naive (each table on its own, budget split equally): zCDP rho" in text
    assert "each cell (unrounded)" in text and "every cell at once (unrounded)" in text
    assert " ".join(document["rounding"].split()) in " ".join(text.split())
    refused = CliRunner().invoke(app, ["calibrate", "noisy-tables", str(EXAMPLES / "adult-noisy.yaml")])
    assert isinstance(refused.exception, UserError)  # main() prints it in one line, exit 2
    assert "calibrate noisy-tables needs one noisy_tables mechanism" in str(refused.exception)


def test_plan_s_sigmas_on_geo_tables_cost_less_than_bounding_every_cell_by_the_largest_variance() -> None:
    """geo-tables' county tables have cells of different variances (counties in states of 1 to
    over 100 counties): plan's sigmas meet every target as plan checks it (Sidak's product over
    the real variances) at a rho below the least one with every cell at its table's largest
    variance (measured: 0.93% below, the independent optimum within 1e-9)."""
    loaded = load_policy(EXAMPLES / "geo-tables.yaml")
    plan = plan_policy(loaded)
    assert plan.passed, [check for check in plan.checks if not check.passed]
    (planned,) = plan.mechanisms
    mechanism = _mechanism(loaded)
    layout = mechanism.layout(loaded)
    bound = tables.allocate(layout.domain, layout.tables, mechanism._limits(loaded))
    assert planned.facts["zcdp_rho"] < 0.995 * tables.privacy_cost(bound)
    variances = tables.cell_variances(layout.domain, layout.tables, list(planned.facts["sigmas"].values()))
    for variance, target in zip(variances, loaded.policy.targets.accuracy, strict=True):
        assert tables.simultaneous_half_width(variance.ravel(), target.confidence) <= target.absolute_error


def test_the_geography_example_plans_runs_reports_and_reruns(tmp_path, work, monkeypatch) -> None:
    """policies/examples/geo-tables.yaml on the generator's data (20,000 people here): the plan
    passes, the release publishes one file per table, non-negative integers adding up from
    counties to states to the total; the report and release.json state both statements; a rerun
    publishes the same files; audit verify checks every file of both and replays the charges."""
    from privrelease.flows.steps import release_plain

    monkeypatch.setenv("PRIVRELEASE_AUTO_INIT", "true")
    monkeypatch.setenv("PRIVRELEASE_DATA_ROOTS", str(tmp_path))
    geo_tables.write(tmp_path, rows=20_000)
    path = tmp_path / "geo-tables.yaml"
    path.write_text((EXAMPLES / "geo-tables.yaml").read_text())
    assert plan_policy(load_policy(path)).passed
    first = release_plain(policy_path=str(path))
    folder = Path(first.release_dir)
    files = ["census-county-age-sex", "census-county", "census-state-sex", "census-total"]
    assert sorted(p.stem for p in folder.glob("*.parquet")) == sorted(files)
    out = {name: pq.read_table(folder / f"{name}.parquet") for name in files}
    hierarchy = list(csv.reader((tmp_path / "geo-counties.csv").open(), delimiter=";"))
    states = sorted({row[1] for row in hierarchy})
    state_of = np.array([states.index(row[1]) for row in sorted(hierarchy)])
    finest = out["census-county-age-sex"].column("estimate").to_numpy().reshape(3_000, 4, 2)
    county = out["census-county"].column("estimate").to_numpy()
    state_sex = out["census-state-sex"].column("estimate").to_numpy().reshape(50, 2)
    total = out["census-total"].column("estimate").to_numpy()
    assert finest.dtype.kind == "i" and finest.min() >= 0
    np.testing.assert_array_equal(finest.sum(axis=(1, 2)), county)
    np.testing.assert_array_equal(
        np.stack([np.bincount(state_of, finest[:, :, s].sum(axis=1)) for s in (0, 1)], 1), state_sex
    )
    np.testing.assert_array_equal(state_sex.sum(keepdims=True).ravel(), total)
    assert abs(int(total[0]) - 20_000) < 200
    document = json.loads((folder / "release.json").read_text())
    (entry,) = document["outputs"]
    assert [t["file"] for t in entry["tables"]] == [f"{name}.parquet" for name in files]
    stated = entry["accuracy"]["tables"]
    assert [row["table"] for row in stated["tables"]] == ["county-age-sex", "county", "state-sex", "total"]
    assert stated["naive"]["zcdp_rho"] > plan_policy(load_policy(path)).mechanisms[0].facts["zcdp_rho"]
    report = Path(first.report).read_text()
    assert "every cell at once" in report and "Tables that add up" in report
    again = release_plain(rerun_of=first.run_id)
    assert sorted(p.name for p in Path(again.release_dir).glob("*.parquet")) == sorted(f"{n}.parquet" for n in files)
    from privrelease.api import verify

    verified = verify(head=Path(again.release_dir) / "chain-head.json")
    assert verified.ok and verified.files_checked >= 2 * len(files), verified.problems


def test_the_readme_figures_come_from_the_code(adult_dir) -> None:
    """adult-tables.yaml's targets pass in plan, and the figures of the README's "Publishing
    tables that add up" and of the example's comments are its plan's: its epsilon, the naive
    alternative's, the finest table's two half-widths."""
    plan = plan_policy(load_policy(EXAMPLES / "adult-tables.yaml"))
    assert plan.passed, [check for check in plan.checks if not check.passed]
    (mechanism,) = plan.mechanisms
    finest = plan.accuracy["tables"].stated[0].document["tables"][0]
    readme = " ".join((REPO / "README.md").read_text().split())
    assert (
        f"chooses five sigmas at epsilon {plan.composed['approximate'].epsilon:.2g} (delta 1e-06), where the naive "
        f"alternative needs epsilon {mechanism.facts['naive_epsilon']:.3g} for the same targets; the 100 cells of age "
        f"group x sex x race: each cell within +-{finest['each_cell_half_width']:.3g} with probability 0.95, all 100 "
        f"at once within +-{finest['all_cells_half_width']:.3g}."
    ) in readme
    comments = re.sub(r"\s*\n\s*#\s*", " ", (EXAMPLES / "adult-tables.yaml").read_text())
    assert (
        f"age x sex x race each cell (cell by cell) within +-{finest['each_cell_half_width']:.3g} of its true count "
        f"at 95%; all 100 cells at once within +-{finest['all_cells_half_width']:.3g} (plan and the report state both)"
    ) in comments


def test_a_release_on_dask_publishes_the_in_process_layout(tmp_path, work, monkeypatch) -> None:
    """On a local Dask cluster (4 partitions of a Parquet file) the release publishes the files,
    columns and cells an in-process release does, still adding up, and the ledger charges the
    planned event."""
    import logging

    from distributed import LocalCluster

    from privrelease.flows.engines import LOCAL_HTTP
    from privrelease.flows.steps import release_plain

    monkeypatch.setenv("PRIVRELEASE_AUTO_INIT", "true")
    folder = _folder(tmp_path)
    table = pa.csv.read_csv(folder / "people.csv", parse_options=pa.csv.ParseOptions(delimiter=";"))
    pq.write_table(table, folder / "people.parquet", row_group_size=100)
    text = POLICY.format(
        tables="[[county, sex], [county], [state], []]",
        noise="{distribution: gaussian, sigma: 2}",
        accuracy="[]",
        nonnegative="false",
    )
    text = text.replace(
        '  path: people.csv\n  format: csv\n  csv: {delimiter: ";"}\n', "  path: people.parquet\n  format: parquet\n"
    )
    local = folder / "local.yaml"
    local.write_text(text)
    in_process = release_plain(policy_path=str(local))
    logging.getLogger("distributed").setLevel(logging.ERROR)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=LOCAL_HTTP) as cluster:
        path = folder / "dask.yaml"
        path.write_text(
            text.replace("name: small-tables", "name: small-tables-dask")
            + f"engine: {{name: dask, address: '{cluster.scheduler_address}', rows_per_partition: 100}}\n"
        )
        on_dask = release_plain(policy_path=str(path))
    assert "4 partitions on a cluster of 2 workers" in Path(on_dask.report).read_text()
    names = ["census-county-sex", "census-county", "census-state", "census-total"]
    for name in names:
        dask_table = pq.read_table(Path(on_dask.release_dir) / f"{name}.parquet")
        local_table = pq.read_table(Path(in_process.release_dir) / f"{name}.parquet")
        assert dask_table.schema == local_table.schema and dask_table.num_rows == local_table.num_rows
        labels = [c for c in dask_table.column_names if c not in ("estimate", "lower", "upper")]
        assert dask_table.select(labels).equals(local_table.select(labels))
    finest = pq.read_table(Path(on_dask.release_dir) / "census-county-sex.parquet").column("estimate").to_numpy()
    county = pq.read_table(Path(on_dask.release_dir) / "census-county.parquet").column("estimate").to_numpy()
    np.testing.assert_allclose(finest.reshape(5, 2).sum(axis=1), county, rtol=1e-12, atol=1e-9)


def _reconstruction(layout, sigmas) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """The matrix taking every table's measurement noise (stacked, tables in order, cells
    row-major) to every table's estimation error (the estimator is linear), and the shapes."""
    shapes = [tuple(len(layout.labels[a]) for a in axes) for axes in layout.axes]
    sizes = [math.prod(shape) for shape in shapes]
    columns = []
    for k in range(sum(sizes)):
        unit = np.zeros(sum(sizes))
        unit[k] = 1
        pieces = np.split(unit, np.cumsum(sizes)[:-1])
        estimate = tables.reconstruct(
            layout.domain, layout.tables, sigmas, [p.reshape(s) for p, s in zip(pieces, shapes, strict=True)]
        )
        columns.append(np.concatenate([np.ravel(e) for e in estimate]))
    return np.array(columns).T, shapes


def _coverage(layout, sigmas, noise: np.ndarray) -> list[tuple[float, float]]:
    """Per table, over the releases whose measurement noise is ``noise`` (stacked as
    :func:`_reconstruction`'s rows, one column per release), the share of cells within the 95%
    "each cell" half-width and of releases with every cell within the 95% "every cell at once"
    half-width."""
    matrix, shapes = _reconstruction(layout, sigmas)
    errors = np.split(matrix @ noise, np.cumsum([math.prod(shape) for shape in shapes])[:-1])
    found = []
    for error, variance in zip(errors, tables.cell_variances(layout.domain, layout.tables, sigmas), strict=True):
        each = tables.each_cell_half_width(np.ravel(variance), 0.95)[:, None]
        every = tables.simultaneous_half_width(np.ravel(variance), 0.95)
        found.append((float(np.mean(np.abs(error) <= each)), float(np.mean(np.all(np.abs(error) <= every, axis=0)))))
    return found


def test_a_single_table_at_sigma_1_covers_as_stated_with_the_kind_s_noise(tmp_path) -> None:
    """One table (county x sex, 10 cells) measured at sigma 1, its estimate its measurement: over
    4,000 releases with the kind's own noise (:func:`measure`, OpenDP's float Gaussian) each
    cell's 95% interval covers within 1 point of 95% (40,000 independent cells: standard error
    0.0011, 1 point is 9 of them: a correct statement fails with probability below 1e-18) and
    every cell at once at least 93.5% (Sidak is exact for independent cells; standard error
    0.0034, 1.5 points is 4.4 of them: below 1e-5). With OpenDP's discrete Gaussian (integer
    noise, the kind's noise before) each cell covers 88.3% here and this test fails."""
    loaded = _loaded(tmp_path, tables_text="[[county, sex]]", noise="{distribution: gaussian, sigma: 1}")
    mechanism = _mechanism(loaded)
    noise = measure(np.zeros((10, 4_000), dtype=np.int64), 1.0, 1)
    ((each, every),) = _coverage(mechanism.layout(loaded), mechanism.sigmas(loaded), noise)
    assert abs(each - 0.95) < 0.01
    assert every > 0.935


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.0])
def test_the_kind_s_noise_is_gaussian_of_its_sigma(sigma: float) -> None:
    """10,000 draws of :func:`measure` around the counts 0 and 7 pass Kolmogorov-Smirnov against
    N(0, sigma^2) at level 1e-6 (a correct sampler fails with probability 1e-6; integer noise of
    sigma 1 is 0.19 away in KS distance, p below 1e-300); the same shape as the counts, floats."""
    counts = np.tile([[0], [7]], (1, 5_000))
    noisy = measure(counts, sigma, 1)
    assert noisy.shape == counts.shape and noisy.dtype == np.float64
    assert stats.kstest(np.ravel(noisy - counts), stats.norm(scale=sigma).cdf).pvalue > 1e-6


def test_coverage_on_the_adult_example(adult_dir) -> None:
    """20,000 simulated releases of adult-tables.yaml's allocation with Gaussian noise (the kind's,
    test above; drawn here by numpy, independently of the code under test, the estimator being
    linear: errors = reconstruction matrix x noise): each cell's 95% interval covers within 1
    point of 95% and every cell at once at least 94%. A correct statement fails this with
    probability below 1e-8 (each rate's standard error is at most 0.0016; 1 point is 6 of them)."""
    loaded = load_policy(EXAMPLES / "adult-tables.yaml")
    mechanism = _mechanism(loaded)
    layout, sigmas = mechanism.layout(loaded), mechanism.sigmas(loaded)
    sizes = [layout.cells(i) for i in range(len(sigmas))]
    rng = np.random.default_rng()
    noise = np.concatenate([rng.normal(0.0, s, (n, 20_000)) for s, n in zip(sigmas, sizes, strict=True)])
    for each, every in _coverage(layout, sigmas, noise):
        assert abs(each - 0.95) < 0.01
        assert every > 0.94


def test_the_report_s_zcdp_rho_label_fits_every_kind() -> None:
    """The report's label of the ``zcdp_rho`` fact (noisy counts, sums, tables) states rho as
    Delta^2/(2 sigma^2) summed over the measurements, true for noisy sums' totals (Delta = m B)
    and for m > 1 rows per person, not 1/(2 sigma^2), which is one measurement of sensitivity 1."""
    from privrelease.reports.render import FACT_LABELS

    label = FACT_LABELS["zcdp_rho"]
    assert "1/(2σ²)" not in label
    assert "Δ²/(2σ²) summed over its noisy measurements" in label


def test_plan_warns_of_an_untargeted_table_finer_than_every_targeted_one(tmp_path) -> None:
    """With sigmas chosen by plan, a table no target names is measured at the least precision:
    finer than every targeted table (county x sex under a grand-total target) its cells are all
    but unknown and plan warns, naming it, its half-width and the target to add; a margin of a
    targeted table (county under a county x sex target) borrows from it: no warning (audit 7)."""
    chosen = "{distribution: gaussian}"
    loaded = _loaded(tmp_path / "a", noise=chosen, accuracy="[{mechanism: census, table: [], absolute_error: 10}]")
    (warning,) = [w for w in _mechanism(loaded).plan_warnings(loaded) if "county-sex" in w]
    assert "no accuracy target names the counts of table county-sex" in warning
    assert "add a target naming it (table: [county, sex])" in warning
    width = float(re.search(r"within ±([0-9.e+]+)", warning).group(1))
    assert width > 100
    loaded = _loaded(
        tmp_path / "b", noise=chosen, accuracy="[{mechanism: census, table: [county, sex], absolute_error: 10}]"
    )
    assert _mechanism(loaded).plan_warnings(loaded) == ()


def test_the_approximate_accountant_is_not_called_exact_where_it_converts_zcdp() -> None:
    """Gaussian tables are accounted by the zCDP conversion (an upper bound on their exact
    curve): plan --chart and the report name the approximate accountant without claiming an exact
    delta, and the report says which mechanisms get an exact one and which a bound (audit 9)."""
    from privrelease.reports.render import plan_charts_html

    plan = plan_policy(load_policy(REPO / "policies" / "examples" / "geo-tables.yaml"))
    import html as markup

    html = markup.unescape(plan_charts_html(plan))
    assert "exact hockey-stick δ)" not in html
    assert "approximate (ε, δ)-DP (δ exact where the mechanism's curve is known, else a proven bound)" in html
    template = (REPO / "reports" / "templates" / "report.html.j2").read_text(encoding="utf-8")
    assert "with δ computed exactly (never larger than Theorem 1's)" not in template
    assert "otherwise bounded by the tightest proven conversion, which each mechanism's row names" in template
