"""rho-differentially identifiable count / sum / mean (mechanisms.statistics).

Statistical tests have a stated failure probability when the code is right: the KS tests
reject at p < 1e-4 (so each fails with probability 1e-4); the tolerance tests use
``P(|Laplace(lambda)| > t) = exp(-t / lambda)`` with ``t = lambda ln(1e9)`` per value.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import opendp.measurements
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from scipy import stats

from privrelease.errors import TargetNotMet, UserError
from privrelease.mechanisms.events import Laplace
from privrelease.mechanisms.identifiability import calibrate
from privrelease.mechanisms.statistics import (
    _clamped_values,
    exact_terms,
    identifiable_statistic,
    merge_partials,
    noisy_statistic,
    statistic_partial,
)

KS_ALPHA = 1e-4
TAIL = math.log(1e9)  # |noise| > TAIL * lambda with probability 1e-9


def grouped_table(groups: int, per_group: int) -> tuple[pa.Table, list[str]]:
    labels = [f"g{i:05d}" for i in range(groups)]
    g = np.repeat(np.arange(groups), per_group)
    table = pa.table({"g": [labels[i] for i in g], "x": (g % 7).astype(np.int64)})
    return table, labels


# --- the noise: scale, and that OpenDP produces it --------------------------------------------


def test_grouped_count_noise_is_laplace_of_lambda() -> None:
    """3,000 groups in one release: value - true count ~ Laplace(lambda) (KS, alpha = 1e-4)."""
    groups, per_group = 3000, 2
    table, labels = grouped_table(groups, per_group)
    result = identifiable_statistic(table, "x", "count", 0, 6, 0.5, group_domain={"g": labels})
    lam = result.public_facts["lambda"]
    assert lam == pytest.approx(2 / math.log(groups - 1), rel=1e-11)
    noise = result.table.column("value").to_numpy() - per_group
    assert stats.kstest(noise, stats.laplace(scale=lam).cdf).pvalue > KS_ALPHA
    assert np.all(result.table.column("lambda").to_numpy() == lam)


def test_mean_noise_is_laplace_of_lambda() -> None:
    """600 independent ungrouped releases of a mean: response - mean ~ Laplace(lambda)."""
    table = pa.table({"x": np.arange(100, dtype=np.int64) % 10})
    calibration = calibrate("mean", 0, 9, 0.5, rows=100)
    assert calibration.lambda_ == pytest.approx(0.09 / math.log(9), rel=1e-11)
    responses = np.array([noisy_statistic(table, "x", calibration).table["value"][0].as_py() for _ in range(600)])
    noise = responses - 4.5
    assert stats.kstest(noise, stats.laplace(scale=calibration.lambda_).cdf).pvalue > KS_ALPHA


def test_real_valued_grouped_sum_noise_is_laplace_of_lambda() -> None:
    groups = 2000
    rng_values = (np.arange(groups * 3) % 11) / 4.0  # 0 .. 2.5, exact in binary
    table = pa.table({"g": [f"h{i % groups}" for i in range(groups * 3)], "y": rng_values})
    domain = {"g": [f"h{i}" for i in range(groups)]}
    result = identifiable_statistic(table, "y", "sum", 0.0, 2.5, 0.9, integer=False, group_domain=domain)
    lam = result.public_facts["lambda"]
    assert lam == pytest.approx(5.0 / math.log(9), rel=1e-11)  # m = 2, S = 2 max|bound|
    truth = np.bincount(np.arange(groups * 3) % groups, weights=rng_values, minlength=groups)
    got = dict(zip(result.table["g"].to_pylist(), result.table["value"].to_numpy(), strict=True))
    noise = np.array([got[f"h{i}"] for i in range(groups)]) - truth
    assert stats.kstest(noise, stats.laplace(scale=lam).cdf).pvalue > KS_ALPHA


def test_opendp_produces_the_noise_once_per_release(monkeypatch) -> None:
    calls = []
    real = opendp.measurements.make_laplace

    def spy(input_domain, input_metric, scale, *args, **kwargs):
        calls.append((str(input_domain), str(input_metric), scale))
        return real(input_domain, input_metric, scale, *args, **kwargs)

    def forbidden(*args, **kwargs):
        raise AssertionError("numpy randomness used for noise")

    monkeypatch.setattr(opendp.measurements, "make_laplace", spy)
    monkeypatch.setattr(np.random, "laplace", forbidden)
    monkeypatch.setattr(np.random, "default_rng", forbidden)

    table, labels = grouped_table(50, 3)
    result = identifiable_statistic(table, "x", "sum", 0, 6, 0.5, group_domain={"g": labels})
    assert len(calls) == 1
    domain, metric, scale = calls[0]
    assert "VectorDomain" in domain and "size=50" in domain
    assert "L1Distance" in metric
    assert scale == result.public_facts["lambda"]

    mean_table = pa.table({"x": np.arange(40, dtype=np.int64)})
    mean = identifiable_statistic(mean_table, "x", "mean", 0, 39, 0.5, rows=40)
    assert len(calls) == 2
    # the mean is released through the sum, with scale lambda * N
    assert calls[1][2] == pytest.approx(mean.public_facts["lambda"] * 40, rel=1e-15)
    assert calls[1][2] >= mean.public_facts["lambda"] * 40
    assert "opendp" in result.public_facts["noise"].lower()


# --- clamping and exact aggregation ------------------------------------------------------------


def test_values_are_clamped_before_aggregation() -> None:
    table = pa.table({"x": pa.array([-1000, 5, 1000, 7], pa.int64())})
    calibration = calibrate("sum", 0, 10, 0.5)
    values, below, above = _clamped_values(table, "x", calibration)
    assert values.tolist() == [0, 5, 10, 7]
    assert (below, above) == (1, 1)
    assert statistic_partial(table, "x", calibration).terms == ((22.0,),)


def test_float_values_clamped_and_summed_exactly() -> None:
    table = pa.table({"y": [-math.inf, 0.1, 0.2, 0.3, math.inf], "g": ["a", "b", "b", "b", "a"]})
    calibration = calibrate("sum", -1.0, 1.0, 0.9, integer=False, groups=2)
    values, below, above = _clamped_values(table, "y", calibration)
    assert values.tolist() == [-1.0, 0.1, 0.2, 0.3, 1.0]
    assert (below, above) == (1, 1)
    partial = statistic_partial(table, "y", calibration, {"g": ["a", "b"]})
    assert [math.fsum(terms) for terms in partial.terms] == [0.0, math.fsum([0.1, 0.2, 0.3])]


def exact_sum(values) -> Fraction:
    return sum((Fraction(float(v)) for v in values), Fraction(0))


@pytest.mark.parametrize("seed", range(5))
def test_exact_terms_sum_exactly_and_partials_merge_to_the_whole(seed) -> None:
    """The terms' exact sum (Fractions, an independent computation) is the values' exact sum;
    partials of a random split merge to the whole table's statistic bit for bit, where
    adding the partitions' rounded sums (the broken variant) differs."""
    rng = np.random.default_rng(seed)
    values = rng.uniform(-1, 1, 3000) * 10.0 ** rng.integers(-8, 8, 3000)
    terms = exact_terms(values)
    assert exact_sum(terms) == exact_sum(values)
    assert math.fsum(terms) == math.fsum(values.tolist())
    calibration = calibrate("sum", -1e8, 1e8, 0.9, integer=False)
    table = pa.table({"y": values})
    cuts = np.sort(rng.choice(np.arange(1, 3000), 7, replace=False))
    parts = [statistic_partial(table.slice(lo, hi - lo), "y", calibration) for lo, hi in zip([0, *cuts], [*cuts, 3000])]
    merged = merge_partials(parts)
    whole = statistic_partial(table, "y", calibration)
    assert math.fsum(merged.terms[0]) == math.fsum(whole.terms[0]) == float(exact_sum(values))
    assert merged.rows == 3000


def test_adding_rounded_partition_sums_is_not_exact() -> None:
    """What merge_partials avoids: the partitions' correctly rounded sums, added, lose the
    exact sum (1 + 2^-53 + 2^-53 = 1 + 2^-52, but each part rounds to 1)."""
    tiny = 2.0**-53
    parts = [np.array([1.0, tiny]), np.array([tiny])]
    rounded = math.fsum(math.fsum(part.tolist()) for part in parts)
    exact = math.fsum(exact_terms(parts[0]) + exact_terms(parts[1]))
    assert exact == 1 + 2.0**-52 == math.fsum([1.0, tiny, tiny]) and rounded == 1.0


def test_clamping_shows_in_the_release() -> None:
    """Clamped sum 150 vs unclamped 50: with lambda ~ 3.1 the response is within TAIL * lambda
    (~ 64) of 150 except with probability 1e-9."""
    table = pa.table({"x": pa.array([-1000, 50, 1000], pa.int64())})
    result = identifiable_statistic(table, "x", "sum", 0, 100, 1 - 1e-12)
    lam = result.public_facts["lambda"]
    assert TAIL * lam < 100
    assert abs(result.table["value"][0].as_py() - 150) < TAIL * lam
    assert result.internal_facts["values_clamped_below"] == 1
    assert result.internal_facts["values_clamped_above"] == 1


# --- groups --------------------------------------------------------------------------------------


def test_grouped_release_covers_the_declared_domain_in_random_order() -> None:
    labels = [f"c{i:02d}" for i in range(20)]
    present = labels[:15]  # the last 5 declared groups have no rows
    rows = [label for label in present for _ in range(1 + int(label[1:]))]
    table = pa.table({"g": rows, "x": pa.array(np.ones(len(rows), dtype=np.int64))})
    result = identifiable_statistic(table, "x", "count", 0, 1, 1 - 1e-12, group_domain={"g": labels})
    out = result.table
    assert out.column_names == ["g", "value", "lambda"]
    assert sorted(out["g"].to_pylist()) == labels
    # a fixed order, e.g. the domain's, has probability 1/20! < 1e-18
    assert out["g"].to_pylist() != labels
    lam = result.public_facts["lambda"]
    truth = {label: rows.count(label) for label in labels}
    for label, value in zip(out["g"].to_pylist(), out["value"].to_pylist(), strict=True):
        assert abs(value - truth[label]) < TAIL * lam
    # the event carries the add/remove sensitivity (1 for a grouped count) for the DP accountants
    assert result.event == Laplace(scale=lam, sensitivity=1.0, sensitive_range=2.0, universe_size=20)
    facts = {**result.public_facts, **result.internal_facts}
    assert result.public_facts["groups"] == 20
    assert result.public_facts["group_by"] == ["g"]
    # no true group size anywhere in the facts
    assert not any(isinstance(v, (list, dict, np.ndarray)) and len(v) == 20 for v in facts.values())
    assert set(result.internal_facts) == {
        "rows_in",
        "values_clamped_below",
        "values_clamped_above",
    }


def test_two_group_columns_form_the_product_domain() -> None:
    table = pa.table(
        {
            "sex": ["F", "M", "M", "F", "M"],
            "age": ["20-29", "20-29", "30-39", "30-39", "30-39"],
            "hours": pa.array([40, 50, 60, 10, 99], pa.int64()),
        }
    )
    domain = {"sex": ["F", "M"], "age": ["20-29", "30-39", "40-49"]}
    result = identifiable_statistic(table, "hours", "sum", 1, 99, 1 - 1e-12, group_domain=domain)
    lam = result.public_facts["lambda"]
    assert result.event.sensitive_range == 2 * 99
    got = {
        (s, a): v
        for s, a, v in zip(
            result.table["sex"].to_pylist(),
            result.table["age"].to_pylist(),
            result.table["value"].to_pylist(),
            strict=True,
        )
    }
    truth = {
        ("F", "20-29"): 40,
        ("F", "30-39"): 10,
        ("F", "40-49"): 0,
        ("M", "20-29"): 50,
        ("M", "30-39"): 159,
        ("M", "40-49"): 0,
    }
    assert set(got) == set(truth)
    for key, value in got.items():
        assert abs(value - truth[key]) < TAIL * lam


# --- errors ----------------------------------------------------------------------------------------


def test_non_numeric_column_is_a_user_error_naming_it() -> None:
    table = pa.table({"workclass": ["Private", "State-gov"]})
    with pytest.raises(UserError, match="'workclass' must be numeric"):
        identifiable_statistic(table, "workclass", "sum", 0, 10, 0.5)
    with pytest.raises(UserError, match="'nope' not found"):
        identifiable_statistic(table, "nope", "sum", 0, 10, 0.5)


@pytest.mark.parametrize(
    ("table", "match"),
    [
        (pa.table({"x": pa.array([1, None], pa.int64())}), "'x' has missing values"),
        (pa.table({"x": [1.0, float("nan")]}), "'x' has NaN"),
        (pa.table({"x": [1.0, 2.5]}), "'x' has non-integer values"),
        (pa.table({"x": [True, False]}), "'x' must be numeric"),
    ],
)
def test_bad_values_are_user_errors(table, match) -> None:
    with pytest.raises(UserError, match=match):
        identifiable_statistic(table, "x", "sum", 0, 10, 0.5)


def test_group_errors() -> None:
    table = pa.table({"g": ["a", "b", "zzz"], "x": pa.array([1, 2, 3], pa.int64())})
    with pytest.raises(UserError, match="'g': 1 rows have labels outside the declared"):
        identifiable_statistic(table, "x", "sum", 0, 10, 0.5, group_domain={"g": ["a", "b"]})
    with pytest.raises(UserError, match="group column 'h' not found"):
        identifiable_statistic(table, "x", "sum", 0, 10, 0.5, group_domain={"h": ["a", "b"]})
    with pytest.raises(UserError, match="calibrate with groups=2"):
        noisy_statistic(table, "x", calibrate("sum", 0, 10, 0.5), group_domain={"g": ["a", "b"]})
    with pytest.raises(UserError, match="duplicate"):
        identifiable_statistic(table, "x", "sum", 0, 10, 0.5, group_domain={"g": ["a", "a"]})


@pytest.mark.parametrize(
    ("query", "use"), [("mean", "the mean divides by the declared"), ("sum", "the sum does not use it")]
)
def test_the_mean_divides_by_the_declared_count_whatever_the_table_has(query: str, use: str) -> None:
    """N is a public constant: a table of 3 rows with N = 4 is released as (sum + noise) / 4,
    never refused. A refusal would be an output telling a table of N rows from the same table
    without one person (issue 15, item 13); the count is an internal fact and an operator
    warning, which says what the declared count is for: a mean's denominator, nothing to a sum.
    The noise is the same for every table (scale lambda, independent of the data)."""
    from privrelease.flows.context import OutputFacts
    from privrelease.flows.release_facts import warnings

    table = pa.table({"x": pa.array([1, 2, 3], pa.int64())})
    for rows in (3, 4, 1000):
        result = identifiable_statistic(table, "x", query, 0, 10, 0.5, rows=rows)
        assert result.public_facts["rows"] == rows and result.internal_facts["rows_in"] == 3
        assert result.table.num_rows == 1
        assert result.public_facts["lambda"] == calibrate(query, 0, 10, 0.5, rows=rows).lambda_
        output = OutputFacts(
            "mean-x", "identifiable", "mean-x.csv", "0" * 64, 1, 1, "{}", result.public_facts, result.internal_facts
        )
        said = warnings([output], "rows")
        warned = [line for line in said if f"the data has 3 rows where dataset.rows declares {rows}; {use}" in line]
        assert (rows != 3) == bool(warned)


def test_infeasible_rho_is_target_not_met() -> None:
    table = pa.table({"x": pa.array([1, 2, 3], pa.int64())})
    with pytest.raises(TargetNotMet, match="1/m"):
        identifiable_statistic(table, "x", "mean", 1, 99, 0.001, rows=3)


# --- the paper's Adult example ------------------------------------------------------------------

ADULT_NAMES = [
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status",
    "occupation", "relationship", "race", "sex", "capital-gain", "capital-loss",
    "hours-per-week", "native-country", "income",
]  # fmt: skip
# Table 4, f(D) of the mean, as printed (truncated, not rounded)
TABLE4_MEANS = {
    "age": "38.6435",
    "education-num": "10.0780",
    "capital-gain": "1079.067",
    "capital-loss": "87.5023",
    "hours-per-week": "40.4223",
}


@pytest.fixture(scope="module")
def adult(adult_uci_dir) -> pa.Table:
    read = pacsv.ReadOptions(column_names=ADULT_NAMES)
    parse = pacsv.ParseOptions(delimiter=",")
    train = pacsv.read_csv(adult_uci_dir / "adult.data", read_options=read, parse_options=parse)
    read_test = pacsv.ReadOptions(column_names=ADULT_NAMES, skip_rows=1)
    test = pacsv.read_csv(adult_uci_dir / "adult.test", read_options=read_test, parse_options=parse)
    columns = list(TABLE4_MEANS)
    return pa.concat_tables([train.select(columns), test.select(columns)])


def test_adult_true_means_match_table4(adult: pa.Table) -> None:
    assert adult.num_rows == 48_842
    for column, shown in TABLE4_MEANS.items():
        decimals = len(shown.split(".")[1])
        mean = math.fsum(adult[column].to_numpy().tolist()) / adult.num_rows
        assert math.floor(mean * 10**decimals) / 10**decimals == pytest.approx(float(shown))


def test_adult_hours_per_week_release(adult: pa.Table) -> None:
    """Section 5: the rho = 0.1 mean of hours-per-week, lambda ~ 8.4032e-4, around 40.4223."""
    result = identifiable_statistic(adult, "hours-per-week", "mean", 1, 99, 0.1, rows=48_842)
    lam = result.public_facts["lambda"]
    assert f"{lam:.4e}" == "8.4032e-04"
    assert result.internal_facts["values_clamped_below"] == 0
    assert result.internal_facts["values_clamped_above"] == 0
    true_mean = math.fsum(adult["hours-per-week"].to_numpy().tolist()) / 48_842
    assert abs(result.table["value"][0].as_py() - true_mean) < TAIL * lam
    assert result.event.universe_size == 99
