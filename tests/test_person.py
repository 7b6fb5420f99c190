"""The unit of privacy is a person: the loader's checks of ``dataset.person``, the truncation of a
person's rows (uniform, by chi-square tests with a stated failure probability), the person-level
privacy of noisy counts (an empirical test of neighbouring files that differ by one whole person,
which catches a release that forgets the truncation or the factor m), the sensitivity-m privacy
maps against an independent computation, the neighbouring relation in the event trees and the
ledger, a release end to end (what the report and release.json say, what is never published), and
a Parquet file streamed row group by row group in this process with persons split across row groups
(two passes, as on Dask: every person bounded, the whole table never read).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from scipy import stats

from privrelease.errors import UserError
from privrelease.flows import data as flow_data
from privrelease.flows.data import mechanism_rows, person_rows
from privrelease.flows.scaled import Partials
from privrelease.flows.steps import release_plain
from privrelease.mechanisms import composition, persons, zcdp
from privrelease.mechanisms.events import Composed, event_from_json, event_to_json, person_level
from privrelease.mechanisms.kinds.noisy_counts import (
    DiscreteGaussian,
    DiscreteLaplace,
    add_noise,
    approximate_delta,
    probabilistic_delta,
    pure_delta,
)
from privrelease.mechanisms.persons import kept_rows
from privrelease.planning import plan_policy
from privrelease.policies import load_policy_text

ALPHA = 1e-6
"""Every statistical test below fails a correct implementation with probability at most ALPHA."""

POLICY = """
name: discharges-test
version: "1"
dataset:
  id: discharges-test
  path: discharges.csv
  PERSON
  columns:
    patient_id: {type: string}
    county: {type: string, values: [A, B, C]}
    diagnosis: {type: string, values: [x, y]}
    age: {type: integer}
generalization:
  county: keep
  diagnosis: keep
mechanisms:
  - {name: counts, type: noisy_counts, columns: [county, diagnosis], noise: {distribution: laplace, scale: 3}}
  - {name: hist, type: histogram, columns: [county, diagnosis], k: 2, beta: 0.5, epsilon: 2.0}
targets:
  accounting: approximate
  delta: 0.5
  lifetime_budget: {epsilon: 100, delta: 0.9}
"""


def _loaded(person: str = "person: {column: patient_id, max_rows: 3}", text: str = POLICY, base: str = "."):
    return load_policy_text(text.replace("PERSON", person), base)


# --------------------------------------------------------------------------- the loader


@pytest.mark.parametrize(
    ("person", "change", "message"),
    [
        ("person: {column: patient, max_rows: 3}", None, "person column 'patient' is not declared in dataset.columns"),
        (
            "person: {column: patient_id, max_rows: 3}",
            ("columns: [county, diagnosis], noise", "columns: [county, patient_id], noise"),
            "person column 'patient_id' is used by mechanisms[0] 'counts'",
        ),
        (
            "person: {column: patient_id, max_rows: 3}",
            ("  county: keep\n", "  county: keep\n  patient_id: keep\n"),
            "person column 'patient_id' has a scheme in generalization.patient_id",
        ),
        ("person: {column: patient_id, max_rows: 0}", None, "max_rows must be an integer in [1, 1000]"),
    ],
)
def test_the_person_column_is_declared_and_never_published(person: str, change, message: str) -> None:
    text = POLICY if change is None else POLICY.replace(*change)
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _loaded(person, text)


# --------------------------------------------------------------------------- truncation


def test_truncation_keeps_a_uniform_subset_of_at_most_m_rows() -> None:
    """30,000 people with 6 rows each, m = 2: each keeps exactly 2 rows, and which 2 is uniform
    over the C(6, 2) = 15 subsets (chi-square, 14 degrees of freedom, rejected above its
    1 - ALPHA quantile: a correct truncation fails with probability ALPHA); 1,000 people with
    one row keep it; people come out grouped, never in input order."""
    people, rows, m = 30_000, 6, 2
    codes = np.concatenate([np.repeat(np.arange(people), rows), np.arange(people, people + 1000)])
    kept = kept_rows(codes, m)
    per_person = np.bincount(codes[kept], minlength=people + 1000)
    assert (per_person[:people] == m).all() and (per_person[people:] == 1).all()
    position = kept[kept < people * rows] % rows
    masks = np.bincount(codes[kept][kept < people * rows], weights=1 << position, minlength=people).astype(int)
    subsets = {
        mask: i for i, mask in enumerate(sorted({(1 << a) | (1 << b) for a in range(6) for b in range(a + 1, 6)}))
    }
    observed = np.bincount([subsets[mask] for mask in masks], minlength=15)
    statistic = stats.chisquare(observed).statistic
    assert statistic < stats.chi2.isf(ALPHA, 14), observed
    assert not (np.diff(kept) > 0).all(), "the kept rows are not in input order"


@pytest.mark.parametrize("shuffled", [False, True])
def test_sorting_packed_keys_orders_rows_as_a_stable_sort(shuffled: bool, monkeypatch) -> None:
    """:func:`grouped_order`'s one sort of ``code * n + rank`` gives the very order and codes of
    the stable sort of the (shuffled) codes, as does its path from PACKED_ROWS rows on."""
    rng = np.random.default_rng(5)  # test data and a fixed permutation, not a mechanism
    codes = rng.integers(0, 400, 5_000)
    permutation = rng.permutation(codes.size) if shuffled else None
    order, grouped = persons.grouped_order(codes, permutation)
    stable = np.argsort(codes if permutation is None else codes[permutation], kind="stable")
    stable = stable if permutation is None else permutation[stable]
    assert np.array_equal(order, stable) and np.array_equal(grouped, codes[stable])
    monkeypatch.setattr(persons, "PACKED_ROWS", 0)
    for mine, theirs in zip(persons.grouped_order(codes, permutation), (order, grouped), strict=True):
        assert np.array_equal(mine, theirs)


@pytest.mark.parametrize(
    "values",
    [
        pa.array(np.random.default_rng(6).integers(-50, 50, 1_000)),  # dense, negative: counted
        pa.array(np.random.default_rng(7).integers(0, 10**12, 1_000)),  # sparse: hashed
        pa.array([2**64 - 3, 2**64 - 1, 2**64 - 3, 5], type=pa.uint64()),  # sparse unsigned
        pa.array([2**64 - 3, 2**64 - 1, 2**64 - 3], type=pa.uint64()),  # dense near the top of uint64
        pa.array(["x", "y", "x"]).dictionary_encode(),
        pa.chunked_array([[7, 8], [8, 7, 9]], type=pa.int8()),
        pa.array(["b", "a", "b"]),
    ],
)
def test_persons_of_numbers_equal_values_alike_whatever_the_path(values) -> None:
    """:func:`persons_of` (counting for dense integers, else hashing): each row's code names
    its value among the distinct persons, which are exactly the column's distinct values."""
    distinct, codes = persons.persons_of(values)
    listed = values.to_pylist()
    assert sorted(distinct.to_pylist(), key=str) == sorted(set(listed), key=str)
    assert distinct.take(pa.array(codes)).to_pylist() == listed


def test_one_row_kinds_read_one_uniform_row_of_all_of_a_persons_rows() -> None:
    """With max_rows 3, the histogram (one row per person) reads one row of each person, uniform
    over ALL of the person's 6 rows (the one of the 3 kept, itself uniform): chi-square over the 6
    positions, 5 degrees of freedom, failure probability ALPHA; noisy_counts reads the 3 kept."""
    loaded = _loaded()
    people = 30_000
    table = pa.table(
        {
            "patient_id": np.repeat(np.arange(people), 6).astype(str),
            "county": np.tile(["A", "B", "C", "A", "B", "C"], people),
            "diagnosis": np.full(6 * people, "x"),
            "age": np.tile(np.arange(6), people),
        }
    )
    kept = person_rows(loaded, table)
    counts, hist = loaded.policy.mechanisms
    assert mechanism_rows(loaded, counts, kept).num_rows == 3 * people
    one = mechanism_rows(loaded, hist, kept)
    assert one.num_rows == people and len(set(one["patient_id"].to_pylist())) == people
    observed = np.bincount(one["age"].to_numpy(), minlength=6)
    assert stats.chisquare(observed).statistic < stats.chi2.isf(ALPHA, 5), observed


def test_person_row_behaves_as_today() -> None:
    """``person: row`` and no person field: the same events (no relation, no sensitivity in the
    JSON), the same figures, and every row read as it is."""
    absent, row = _loaded(""), _loaded("person: row")
    plans = [plan_policy(loaded) for loaded in (absent, row)]
    assert event_to_json(plans[0].event) == event_to_json(plans[1].event)
    assert "neighbours" not in event_to_json(plans[0].event) and "sensitivity" not in event_to_json(plans[0].event)
    assert [m.guarantees for m in plans[0].mechanisms] == [m.guarantees for m in plans[1].mechanisms]
    assert plans[0].composed == plans[1].composed
    assert absent.sha256 != row.sha256  # stating the unit of privacy is part of what is approved
    table = pa.table({"patient_id": ["a", "a"], "county": ["A", "B"], "diagnosis": ["x", "x"], "age": [1, 2]})
    for loaded in (absent, row):
        assert person_rows(loaded, table) is table
        assert all(mechanism_rows(loaded, spec, table) is table for spec in loaded.policy.mechanisms)
    assert plans[1].unit_of_privacy["statement"] == "each row is taken to be a different person (dataset.person: row)"


# --------------------------------------------------------------------------- privacy maps


def _spreads(m: int, largest: int | None = None):
    """Every way of spreading m unit changes over cells (the partitions of m)."""
    largest = largest or m
    if m == 0:
        yield ()
        return
    for k in range(min(m, largest), 0, -1):
        for rest in _spreads(m - k, k):
            yield (k, *rest)


def _loss_pmf(distribution: str, parameter: float, k: int) -> dict[float, float]:
    """The privacy loss ln p(z) / p(z - k) of one cell moved by k, under z ~ p (exact pmf, float64)."""
    reach = int(40 * parameter) + 40
    z = np.arange(-reach, reach + 1)
    if distribution == "gaussian":
        weights = np.exp(-(z**2) / (2 * parameter**2))
        loss = (k * k - 2 * k * z) / (2 * parameter**2)  # ln p(z) / p(z + k): the direction is symmetric
    else:
        weights = np.exp(-np.abs(z) / parameter)
        loss = (np.abs(z + k) - np.abs(z)) / parameter
    found: dict[float, float] = {}
    for value, weight in zip(np.round(loss, 9), weights / weights.sum(), strict=True):
        found[float(value)] = found.get(float(value), 0.0) + float(weight)
    return found


def _spread_delta(distribution: str, parameter: float, spread: tuple[int, ...], epsilon: float) -> float:
    """The hockey-stick delta of a person moving cells by ``spread``: the cells' losses add."""
    total = {0.0: 1.0}
    for k in spread:
        cell = _loss_pmf(distribution, parameter, k)
        combined: dict[float, float] = {}
        for a, p in total.items():
            for b, q in cell.items():
                key = round(a + b, 9)
                combined[key] = combined.get(key, 0.0) + p * q
        total = combined
    return sum(
        p * -math.expm1(epsilon - loss) for loss, p in total.items() if loss > epsilon + 1e-8
    )  # losses rounded to 1e-9


@pytest.mark.parametrize(("distribution", "parameter"), [("gaussian", 1.0), ("gaussian", 2.5), ("laplace", 1.5)])
def test_person_level_delta_bounds_every_spread_of_a_persons_rows(distribution: str, parameter: float) -> None:
    """For m = 2 and 3, the stated delta (the proven bound: randomized response's at the pure
    m/t for the Laplace, the zCDP conversion at m^2 / (2 sigma^2) for the Gaussian) is at least
    the exact delta of every way of spreading m unit changes over cells (of which one cell moved
    by m is the largest, numerically)."""
    for m in (2, 3):
        for epsilon in np.linspace(
            0, m * m / (2 * parameter**2) + 1 if distribution == "gaussian" else m / parameter, 7
        ):
            stated = approximate_delta(distribution, parameter, float(epsilon), m)
            exact = {spread: _spread_delta(distribution, parameter, spread, float(epsilon)) for spread in _spreads(m)}
            assert stated >= max(exact.values()) - 1e-12, (m, epsilon, stated, exact)
            assert max(exact.values()) == pytest.approx(exact[(m,)], abs=1e-12)
            proven = (
                pure_delta(m / parameter, float(epsilon))
                if distribution == "laplace"
                else zcdp.approximate_delta(m * m / (2 * parameter**2), float(epsilon))
            )
            assert stated == proven


def test_person_level_privacy_maps() -> None:
    """Discrete Laplace: pure m/t; discrete Gaussian: zCDP a m^2 / (2 sigma^2), the probabilistic
    delta Markov's bound e^(-(eps - rho)^2 / (4 rho)) (never below the approximate delta); m = 1
    keeps every figure of today."""
    assert DiscreteLaplace(scale=3, sensitivity=4).guarantee("approximate").epsilon == 4 / 3
    assert DiscreteLaplace(scale=3).guarantee("approximate").epsilon == 1 / 3
    gaussian = DiscreteGaussian(sigma=5, epsilon=2, sensitivity=3)
    assert gaussian.renyi(np.array([2.0]))[0] == pytest.approx(2 * 9 / 50)
    rho = 9 / 50
    assert probabilistic_delta("gaussian", 5, 2, 3) == pytest.approx(math.exp(-((2 - rho) ** 2) / (4 * rho)), rel=1e-12)
    assert probabilistic_delta("gaussian", 5, 2, 3) >= approximate_delta("gaussian", 5, 2, 3)
    assert gaussian.guarantee("approximate").delta == approximate_delta("gaussian", 5, 2, 3)
    one = DiscreteGaussian(sigma=5, epsilon=2)
    assert one.guarantee("approximate").delta == approximate_delta("gaussian", 5, 2)


def test_stored_trees_replay_unchanged_and_relations_do_not_mix() -> None:
    """A tree stored before the fields existed parses and writes back byte for byte; a
    person-level tree keeps its relation and sensitivity; composing it with a row-level release
    is refused, with itself it composes."""
    stored = '{"event":{"events":[{"kind":"discrete_gaussian","epsilon":1.0,"sigma":4.231}],"kind":"composed"},"schema_version":1}'
    stored = json.dumps(json.loads(stored), sort_keys=True, separators=(",", ":"))
    assert event_to_json(event_from_json(stored)) == stored
    person = person_level(Composed(events=(DiscreteLaplace(scale=3, sensitivity=3),)), "person:patient_id")
    text = event_to_json(person)
    assert '"neighbours":"person:patient_id"' in text and '"sensitivity":3' in text
    assert event_from_json(text) == person
    row = event_from_json(stored)
    with pytest.raises(UserError, match="different neighbouring relations"):
        composition.epsilon_at([row, person], 1e-6)
    assert composition.epsilon_at([person, person], 1e-6).epsilon <= 2.0


# --------------------------------------------------------------------------- empirical privacy

COPIES = 100_000
ROWS = 12  # the person's rows, all in the tested cell
SCALE, M = 3.0, 3


def _noisy_cell(loaded, *, with_person: bool, truncate: bool = True) -> np.ndarray:
    """COPIES independent releases of one cell of noisy_counts (discrete Laplace, scale 3), run
    at once: copy r of the file holds two people with one row in the cell and, on the larger
    neighbour, person P with 12 rows there. Truncation through :func:`person_rows` and
    :func:`mechanism_rows`, as a run reads (each copy's people are its own, so one call truncates
    every copy independently), noise through :func:`add_noise`."""
    people = 3 if with_person else 2
    rows_each = [1, 1] + ([ROWS] if with_person else [])
    ids = np.repeat(np.arange(COPIES * people), np.tile(rows_each, COPIES))
    table = pa.table({"patient_id": ids, "county": np.full(ids.size, "A"), "diagnosis": np.full(ids.size, "x")})
    if truncate:
        table = mechanism_rows(loaded, loaded.policy.mechanisms[0], person_rows(loaded, table))
    copy = table["patient_id"].to_numpy() // people
    return add_noise(np.bincount(copy, minlength=COPIES), "laplace", SCALE)


def _violations(smaller: np.ndarray, larger: np.ndarray, epsilon: float) -> list[int]:
    """Outputs o in a range fixed in advance (2 - 20 .. 2 + ROWS + 20) where the samples show
    p_larger(o) > e^eps p_smaller(o) or the reverse: the lower Clopper-Pearson bound of one side
    above e^eps times the upper bound of the other, each bound at level ALPHA / (2K) for K
    outputs, so every bound holds at once with probability >= 1 - ALPHA and a release that is
    eps-DP for the pair shows no violation except with probability ALPHA."""
    outputs = range(2 - 20, 2 + ROWS + 21)
    level = ALPHA / (2 * len(outputs))
    found = []
    for o in outputs:
        bounds = []
        for sample in (smaller, larger):
            hits = int(np.sum(sample == o))
            low = stats.beta.ppf(level, hits, sample.size - hits + 1) if hits else 0.0
            high = stats.beta.isf(level, hits + 1, sample.size - hits) if hits < sample.size else 1.0
            bounds.append((low, high))
        (low_s, high_s), (low_l, high_l) = bounds
        if low_l > math.exp(epsilon) * high_s or low_s > math.exp(epsilon) * high_l:
            found.append(o)
    return found


@pytest.fixture(scope="module")
def _samples():
    loaded = _loaded()
    return (
        loaded,
        _noisy_cell(loaded, with_person=False),
        _noisy_cell(loaded, with_person=True),
        _noisy_cell(loaded, with_person=True, truncate=False),
    )


def test_neighbours_differing_by_one_whole_person_stay_within_the_stated_epsilon(_samples) -> None:
    """The stated epsilon (m / scale = 1) holds for files differing by a person with 12 rows: no
    output's probability ratio exceeds e^1 beyond sampling error (failure probability ALPHA)."""
    loaded, smaller, larger, _ = _samples
    stated = plan_policy(loaded).mechanisms[0].guarantees["approximate"]
    assert stated.epsilon == M / SCALE and stated.delta == 0
    assert _violations(smaller, larger, stated.epsilon) == []


def test_forgetting_the_truncation_or_the_factor_m_is_caught(_samples) -> None:
    """Without the truncation the person moves the cell by 12 (ratio e^4 against the stated e^1);
    with it, a statement forgetting the factor m (epsilon 1/3) is exceeded (ratio e^1): both show
    violations (the ratios are so far apart that missing them has probability far below ALPHA:
    at o = 14, about 16,500 samples against 300)."""
    _, smaller, larger, untruncated = _samples
    assert _violations(smaller, untruncated, M / SCALE)
    assert _violations(smaller, larger, 1 / SCALE)


# --------------------------------------------------------------------------- a release


def _write_release_files(folder: Path, person: str, version: str = "1") -> Path:
    rng = np.random.default_rng(3)  # test data, not a mechanism
    if not (folder / "discharges.csv").exists():
        lines = ["patient_id,county,diagnosis,age"]
        for patient in range(400):
            for _ in range(int(rng.integers(1, 13))):
                lines.append(
                    f"P{patient:04d},{rng.choice(['A', 'B', 'C'])},{rng.choice(['x', 'y'])},{rng.integers(0, 90)}"
                )
        (folder / "discharges.csv").write_text("\n".join(lines) + "\n")
    path = folder / f"policy-{version}.yaml"
    path.write_text(POLICY.replace("PERSON", person).replace('version: "1"', f'version: "{version}"'))
    return path


def test_a_release_states_its_unit_of_privacy_and_never_publishes_the_person_column(tmp_path, work, monkeypatch):
    """End to end: release.json and the report's public statement name the unit of privacy and
    each mechanism's rule; no output has the person column; the ledger's tree carries the
    relation; a row-level policy of the same dataset.id is then refused (relations do not mix)."""
    monkeypatch.setenv("PRIVRELEASE_DATA_ROOTS", str(tmp_path))
    path = _write_release_files(tmp_path, "person: {column: patient_id, max_rows: 3}")
    published = release_plain(policy_path=str(path))
    folder = Path(published.release_dir)
    facts = json.loads((folder / "release.json").read_text())
    unit = facts["unit_of_privacy"]
    assert unit["statement"].startswith("one person = all rows with the same patient_id, at most 3 kept")
    assert unit["rules"] == {
        "counts": "at most 3 random rows per person, sensitivity 3",
        "hist": "one random row per person",
    }
    statement = (folder / "disclosure-statement.html").read_text()
    assert "one person = all rows with the same patient_id, at most 3 kept" in statement
    counted = {output["mechanism"]: output["accuracy"].get("counted") for output in facts["outputs"]}
    assert counted["counts"].startswith("true values are of the rows kept, at most 3 random rows per person")
    assert counted["hist"].startswith("true values are of one random row per person (each person counted once)")
    hist = next(output for output in facts["outputs"] if output["mechanism"] == "hist")
    assert hist["estimation"].startswith("one random row of each person was read and kept with probability beta = 0.5")
    assert "to estimate the number of people in a cell" in hist["estimation"]
    report = Path(published.report).read_text()
    assert f"With the person column: {counted['counts']}." in report
    # the internal report counts the rows the person bound dropped apart from those dropped for missing values
    per_person = Counter(line.split(",")[0] for line in (tmp_path / "discharges.csv").read_text().splitlines()[1:])
    over = sum(max(0, rows - 3) for rows in per_person.values())
    assert over > 0
    assert '<tr><td>rows dropped for missing values</td><td class="num">0</td></tr>' in report
    bound = "rows dropped by the person bound (dataset.person max_rows)"
    assert f'<tr><td>{bound}</td><td class="num">{over:,}</td></tr>' in report
    assert "<td>rows dropped</td>" not in report and "rows dropped" not in statement
    for file in folder.glob("*.parquet"):
        assert "patient_id" not in pq.read_schema(file).names
        assert not any("P0" in str(value) for column in pq.read_table(file).columns for value in column.to_pylist())
    assert facts["outputs"][0]["guarantees"]["approximate"]["epsilon"] == 1.0

    from test_flow_steps import ledger_entries

    (entry,) = ledger_entries()
    assert '"neighbours":"person:patient_id"' in entry.event_json

    row_policy = _write_release_files(tmp_path, "", version="2")
    assert all(
        "counted" not in statement.as_dict() for statement in plan_policy(_loaded("")).accuracy.values() if statement
    )
    with pytest.raises(UserError, match="different neighbouring relations"):
        release_plain(policy_path=str(row_policy))


@pytest.mark.parametrize("declared", [400, 2600])
def test_with_a_person_column_dataset_rows_counts_people(tmp_path, work, monkeypatch, declared: int) -> None:
    """With a person column, ``dataset.rows`` is a number of people (a mean reads one row a
    person): the data's 400 patients with about 2,600 rows match 400; a policy declaring the row
    count is warned in people, the report states the declared size in people, and a mean with no
    ``dataset.rows`` is refused naming people."""
    monkeypatch.setenv("PRIVRELEASE_DATA_ROOTS", str(tmp_path))
    path = _write_release_files(tmp_path, "person: {column: patient_id, max_rows: 3}")
    mean = (
        "  - {name: mean-age, type: identifiable_statistic, query: mean, column: age, lower: 0, upper: 90, rho: 0.05}\n"
    )
    text = path.read_text().replace("targets:", mean + "targets:")
    with pytest.raises(UserError, match=r"a mean needs dataset.rows \(the public number of people, its denominator\)"):
        load_policy_text(text, tmp_path)
    path.write_text(text.replace("  path: discharges.csv\n", f"  path: discharges.csv\n  rows: {declared}\n"))
    published = release_plain(policy_path=str(path))
    expected = [] if declared == 400 else [f"mean-age: the data has 400 people where dataset.rows declares {declared}"]
    assert [line.split(";")[0] for line in published.warnings if "dataset.rows" in line] == expected
    report = Path(published.report).read_text()
    assert f"<dd>{declared} people (a public fact the policy declares)</dd>" in report


def test_dask_takes_a_person_column() -> None:
    """Bounded across partitions as in-process (``test_person_dask.py``): no refusal."""
    from privrelease.flows.engines import Engine
    from privrelease.flows.scaled import check_engine

    for person in ("person: {column: patient_id, max_rows: 3}", "person: row"):
        check_engine(_loaded(person), Engine(name="dask"))


def test_policy_init_asks_who_a_person_is(tmp_path) -> None:
    """The draft says what a person is in a commented ``person:`` line, and suggests a column
    whose name looks like an identifier (from the header only); uncommented, the suggestion
    loads once the column is published nowhere."""
    import yaml

    from privrelease.drafting import draft_policy

    (tmp_path / "plain.csv").write_text("county,diagnosis\nA,x\n")
    (tmp_path / "visits.csv").write_text("patient_id,county\nP1,A\n")
    plain = draft_policy(tmp_path / "plain.csv", "plain", tmp_path)
    assert "  # person: row " in plain and "at most 5 of them kept at random" in plain
    assert "looks like a person identifier" not in plain
    visits = draft_policy(tmp_path / "visits.csv", "visits", tmp_path)
    suggestion = next(line for line in visits.splitlines() if "looks like a person identifier" in line)
    assert suggestion.startswith('  # person: {column: "patient_id", max_rows: 5}')
    document = yaml.safe_load(visits)
    document["dataset"]["person"] = {"column": "patient_id", "max_rows": 5}
    del document["generalization"]["patient_id"]
    document["mechanisms"][0]["columns"].remove("patient_id")
    loaded = load_policy_text(yaml.safe_dump(document), str(tmp_path))
    assert loaded.policy.dataset.rows_per_person == 5


def test_readme_figures_come_from_the_code() -> None:
    """README "Who is a person": the Laplace (scale 5) and adult-noisy's Gaussian (sigma 4.231,
    delta 1e-6) epsilons for max_rows 5 and for one row per person."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme[readme.index("## Who is a person") : readme.index("## What the guarantees mean")]
    laplace = [DiscreteLaplace(scale=5, sensitivity=m).guarantee("approximate").epsilon for m in (5, 1)]
    gaussian = [
        zcdp.smallest_stated_epsilon(lambda e, m=m: approximate_delta("gaussian", 4.231, e, m), 1e-6) for m in (5, 1)
    ]
    assert f"scale 5 is epsilon {laplace[0]:.3g} ({laplace[1]:.3g} for one row" in section
    assert f"delta 1e-6 is epsilon {gaussian[0]:.3g} ({gaussian[1]:.3g} for one row)" in section


def test_every_example_policy_states_its_unit_of_privacy() -> None:
    """Each policy in policies/examples says who a person is (``person: row``: each row is one;
    or a person column with its ``max_rows``), and one of them has people with several rows."""
    import yaml

    folder = Path(__file__).resolve().parents[1] / "policies" / "examples"
    examples = sorted(folder.glob("*.yaml"))
    assert examples
    units = {path.name: yaml.safe_load(path.read_text())["dataset"].get("person") for path in examples}
    for name, person in units.items():
        assert person == "row" or set(person) == {"column", "max_rows"}, name
    assert units["discharges.yaml"] == {"column": "patient_id", "max_rows": 4}


# --------------------------------------------------------------------------- across row groups

VISITS = """
name: visits
version: "1"
dataset:
  id: visits-test
  path: visits.parquet
  person: {column: patient_id, max_rows: 3}
  missing: drop
  columns:
    patient_id: {type: string}
    county: {type: string, values: [A, B, C]}
    visit: {type: integer}
generalization:
  county: keep
mechanisms:
  - {name: counts, type: noisy_counts, columns: [county], noise: {distribution: laplace, scale: 3}}
  - {name: hist, type: histogram, columns: [county], k: 2, beta: 1.0, epsilon: 2.0}
  - {name: hist2, type: histogram, columns: [county], k: 2, beta: 1.0, epsilon: 2.0}
targets:
  accounting: approximate
  delta: 0.5
  lifetime_budget: {epsilon: 100, delta: 0.9}
"""


def write_visits(work: Path, missing: str = "drop") -> tuple[int, np.ndarray, np.ndarray]:
    """600 persons with 1 to 12 visits each, their rows shuffled over a Parquet file in row
    groups of 300 rows (persons split across row groups), and with ``missing: drop`` 100 persons
    whose one row is dropped (a missing county; its value stays in the row group's dictionary);
    VISITS beside it (``missing: reject``: without those rows, and refusing a missing value).
    The file's rows, each person's visits and county."""
    rng = np.random.default_rng(11)  # test data, not a mechanism
    sizes = rng.integers(1, 13, size=600)
    county = rng.choice(["A", "B", "C"], size=600)
    rows = [(f"P{p}", county[p], visit) for p in range(600) for visit in range(sizes[p])]
    if missing == "drop":
        rows += [(f"Q{p}", "?", 0) for p in range(100)]  # dropped (missing county): persons with no row left
    rows = [rows[i] for i in rng.permutation(len(rows))]
    columns = dict(zip(["patient_id", "county", "visit"], map(list, zip(*rows, strict=True)), strict=True))
    pq.write_table(pa.table(columns), work / "visits.parquet", row_group_size=300)
    (work / "visits.yaml").write_text(VISITS.replace("  missing: drop\n", f"  missing: {missing}\n"))
    return len(rows), sizes, county


def assert_every_person_bounded(read: Partials, sizes: np.ndarray, county: np.ndarray) -> None:
    """The merged exact counts of the noisy counts' job are sum min(n, 3) per county, each
    histogram (one row per person, at beta 1) counts every person exactly once, and the read
    counts the rows the bound dropped, sum max(0, n - 3)."""
    assert read.rows_over_person_bound == int(np.maximum(sizes - 3, 0).sum()) > 0
    by_county = {c: county == c for c in ("A", "B", "C")}
    assert list(read.partials["counts"]) == [int(np.minimum(sizes, 3)[by_county[c]].sum()) for c in "ABC"]
    for name in ("hist", "hist2"):
        cells = read.partials[name]
        assert dict(zip(cells.labels["county"].take(cells.codes["county"]).to_pylist(), cells.counts.tolist())) == {
            c: int(by_county[c].sum()) for c in "ABC"
        }


@pytest.mark.parametrize("missing", ["drop", "reject"])
def test_in_process_a_streamed_read_bounds_every_person_across_row_groups(tmp_path, missing: str) -> None:
    """:func:`write_visits` in this process, row group by row group (two passes, never the
    whole table): every person bounded across row groups as on Dask. The first pass reads
    every column when a row with a missing value is dropped (it changes who is counted), the
    person column alone when one is refused (the second pass checks every column)."""
    from privrelease.datasets import read_row_groups
    from privrelease.flows.partitions import ReadSpec
    from privrelease.flows.scaled import stream_partials
    from privrelease.policies import load_policy

    rows, sizes, county = write_visits(tmp_path, missing)
    loaded = load_policy(tmp_path / "visits.yaml")
    spec = ReadSpec.of(loaded.policy.dataset)
    path, passes = tmp_path / "visits.parquet", []

    def reads(column: str | None):
        passes.append(column)
        columns = spec.columns if column is None else {column: spec.columns[column]}
        domains = {name: values for name, values in spec.domains.items() if name in columns}
        return read_row_groups(path, columns=columns, missing=spec.missing, domains=domains)

    read = stream_partials(loaded, reads, path.name)
    assert read.partitions == -(-rows // 300)
    assert (read.rows_read, read.rows_dropped) == (rows, 100 if missing == "drop" else 0)
    assert passes == ([None, None] if missing == "drop" else ["patient_id", None])
    assert_every_person_bounded(read, sizes, county)


@pytest.mark.parametrize("missing", ["drop", "reject"])
def test_a_person_column_parquet_release_streams_and_never_reads_one_table(
    tmp_path, work, monkeypatch, missing: str
) -> None:
    """End to end in this process: the visits file (its histograms sampled) is released row
    group by row group (reading it as one table fails here; refusing missing values, its
    first pass reads the person column alone), every mechanism published with its person rule."""
    monkeypatch.setenv("PRIVRELEASE_DATA_ROOTS", str(tmp_path))
    _, sizes, _ = write_visits(tmp_path, missing)

    def never_one_table(*args, **kwargs):
        raise AssertionError("a streamed release never reads the whole table")

    monkeypatch.setattr(flow_data, "_read", never_one_table)
    policy = tmp_path / "sampled.yaml"  # beta 1 has no (epsilon, delta) guarantee: sampled, it meets the targets
    policy.write_text((tmp_path / "visits.yaml").read_text().replace("k: 2, beta: 1.0", "k: 20, beta: 0.2"))
    published = release_plain(policy_path=str(policy))
    facts = json.loads((Path(published.release_dir) / "release.json").read_text())
    assert facts["unit_of_privacy"]["rules"] == {
        "counts": "at most 3 random rows per person, sensitivity 3",
        "hist": "one random row per person",
        "hist2": "one random row per person",
    }
    assert pq.read_table(next(o["path"] for o in published.outputs if o["mechanism"] == "counts")).num_rows == 3
    over = int(np.maximum(sizes - 3, 0).sum())  # counted from the shares of the two passes, as on Dask
    bound = "rows dropped by the person bound (dataset.person max_rows)"
    assert f'<tr><td>{bound}</td><td class="num">{over:,}</td></tr>' in Path(published.report).read_text()
