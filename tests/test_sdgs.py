"""(k, beta)-SDGS microdata and crowd-blending histograms: invariants, sampling, order, facts, and
an empirical privacy test against Theorem 1 of Li, Qardaji, Su (with a broken variant that must
fail it).

Statistical tests state their failure probability; none assumes a seed."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom, chi2, hypergeom

from privrelease.errors import UserError
from privrelease.mechanisms.columns import HISTOGRAM
from privrelease.mechanisms.count_intervals import count_intervals
from privrelease.mechanisms.events import SDGS
from privrelease.mechanisms.generalization import generalize
from privrelease.mechanisms.histogram import crowd_blending_histogram
from privrelease.mechanisms.randomness import bernoulli
from privrelease.mechanisms.schemes import Bins, Keep, Suppress, ValueMap
from privrelease.mechanisms.sdgs import sdgs, shuffled_repeat

ALPHA = 1e-6
"""Failure probability of each statistical assertion below (when the code is correct)."""


def rows_of(table: pa.Table) -> list[tuple]:
    columns = [table.column(name).cast(pa.string()).to_pylist() for name in table.column_names]
    return list(zip(*columns))


def cell_counts(table: pa.Table) -> dict[tuple, int]:
    """Rows per distinct row of a microdata table."""
    counts: dict[tuple, int] = {}
    for row in rows_of(table):
        counts[row] = counts.get(row, 0) + 1
    return counts


def histogram_counts(table: pa.Table) -> dict[tuple, int]:
    """The ``count`` of each cell of a histogram table."""
    return dict(zip(rows_of(table.drop_columns(list(HISTOGRAM))), table.column("count").to_pylist()))


# ---------------------------------------------------------------------------------------------
# invariants (hypothesis)

SCHEMES = {
    "job": ValueMap(mapping=(("a", "A"), ("b", "A"), ("c", "C"), ("d", "D")), default="other"),
    "age": Bins(edges=(0, 10, 20, 40)),
    "zone": Keep(),
}


@st.composite
def small_tables(draw: st.DrawFn) -> pa.Table:
    size = draw(st.integers(0, 60))
    return pa.table(
        {
            "job": draw(st.lists(st.sampled_from("abcdez"), min_size=size, max_size=size)),
            "age": draw(st.lists(st.integers(0, 40), min_size=size, max_size=size)),
            "zone": draw(st.lists(st.integers(0, 3), min_size=size, max_size=size)),
        }
    )


@settings(max_examples=60, deadline=None)
@given(table=small_tables(), k=st.integers(1, 6), beta=st.sampled_from([1.0, 0.7, 0.3]))
def test_every_published_cell_has_at_least_k_rows(table: pa.Table, k: int, beta: float) -> None:
    result = sdgs(table, SCHEMES, k=k, beta=beta, epsilon=1.0)
    published = cell_counts(result.table)
    assert all(count >= k for count in published.values())
    assert result.table.column_names == list(SCHEMES)
    population = cell_counts(generalize(table, SCHEMES)) if table.num_rows else {}
    assert all(count <= population[cell] for cell, count in published.items())  # rows of the input
    facts, internal = result.public_facts, result.internal_facts
    assert facts["rows_published"] == result.table.num_rows
    assert facts["cells_published"] == len(published)
    assert internal["rows_sampled"] == facts["rows_published"] + internal["rows_suppressed"]
    if beta == 1.0:  # k-DGS is deterministic up to order: exactly the cells with >= k rows
        assert published == {cell: n for cell, n in population.items() if n >= k}
        assert internal["cells_suppressed"] == sum(1 for n in population.values() if n < k)

    histogram = crowd_blending_histogram(table, SCHEMES, k=k, beta=beta)
    counts = histogram_counts(histogram.table)
    assert all(count >= k for count in counts.values())
    assert len(counts) == histogram.table.num_rows  # one row per cell
    with_intervals = histogram.table.to_pydict()  # each count's estimate and exact interval
    assert with_intervals["estimate"] == [c / beta for c in with_intervals["count"]]
    expected = count_intervals(with_intervals["count"], k, beta, 0.95)
    assert with_intervals["lower"] == expected.lower.tolist() and with_intervals["upper"] == expected.upper.tolist()
    if beta == 1.0:
        assert counts == published


@pytest.mark.parametrize("columns", [3, 7])
def test_large_key_spaces(columns: int) -> None:
    """Cells are counted exactly when the mixed-radix key space is too large for bincount
    (5000^3) and when it overflows int64 (5000^7, prefixes renumbered): compared with a Counter."""
    rng = np.random.default_rng()
    values = rng.integers(0, 5000, (4000, columns))
    # 40 frequent rows, ~75 copies each
    values[:3000] = values[rng.integers(0, 40, 3000)]
    table = pa.table({f"c{i}": values[:, i] for i in range(columns)})
    schemes = {name: Keep() for name in table.column_names}
    expected: dict[tuple, int] = {}
    for row in map(tuple, values.astype(str).tolist()):
        expected[row] = expected.get(row, 0) + 1
    result = sdgs(table, schemes, k=30, beta=1.0, epsilon=1.0)
    assert cell_counts(result.table) == {cell: n for cell, n in expected.items() if n >= 30}
    histogram = crowd_blending_histogram(table, schemes, k=2)
    assert histogram_counts(histogram.table) == {cell: n for cell, n in expected.items() if n >= 2}


def test_exact_cells_on_adult(adult_dir: Path) -> None:
    """k-DGS (beta = 1) on the real data with ARX level-1 hierarchies equals an independent
    pyarrow group-by of the generalized table, filtered at k."""
    from privrelease.datasets import read_dataset

    columns = {
        "age": "integer",
        "education": "string",
        "marital-status": "string",
        "sex": "string",
    }
    table = read_dataset(adult_dir / "adult.csv", format="csv", columns=columns, delimiter=";").table
    schemes = {}
    for name in columns:
        with open(adult_dir / f"adult_hierarchy_{name}.csv", newline="") as handle:
            schemes[name] = ValueMap(
                mapping=tuple((row[0], row[1]) for row in csv.reader(handle, delimiter=";") if row)
            )
    k = 20
    generalized = generalize(table, schemes)
    plain = pa.table({name: generalized.column(name).cast(pa.string()) for name in columns})
    grouped = plain.group_by(list(columns)).aggregate([([], "count_all")]).to_pylist()
    expected = {tuple(row[name] for name in columns): row["count_all"] for row in grouped if row["count_all"] >= k}
    result = sdgs(table, schemes, k=k, beta=1.0, epsilon=1.0)
    assert cell_counts(result.table) == expected
    assert result.internal_facts["rows_in"] == 30162
    histogram = crowd_blending_histogram(table, schemes, k=k)
    assert histogram_counts(histogram.table) == expected


# ---------------------------------------------------------------------------------------------
# order, sampling, randomness helpers


def acceptance(distribution, alpha: float = ALPHA) -> tuple[float, float]:
    """Central interval of a discrete distribution holding at least 1 - alpha of its mass."""
    return distribution.ppf(alpha / 2) - 1, distribution.isf(alpha / 2) + 1


@pytest.mark.parametrize("order", ["sorted", "reversed", "shuffled"])
def test_output_order_does_not_follow_input_order(order: str) -> None:
    """Input: 1000 rows 'a' then 1000 rows 'b' (or reversed / shuffled). Under a uniformly random
    output order the number of 'a' among the first 1000 output rows is hypergeometric
    (2000, 1000, 1000) whatever the input order; an order-keeping output gives 1000 or 0. The
    acceptance interval fails with probability below ALPHA."""
    values = np.array(["a"] * 1000 + ["b"] * 1000)
    if order == "reversed":
        values = values[::-1]
    elif order == "shuffled":
        values = np.random.default_rng().permutation(values)
    result = sdgs(pa.table({"v": values}), {"v": Keep()}, k=1, beta=1.0, epsilon=1.0)
    output = np.array(result.table.column("v").cast(pa.string()).to_pylist())
    lo, hi = acceptance(hypergeom(2000, 1000, 1000))
    assert lo < np.sum(output[:1000] == "a") < hi


def test_histogram_rows_in_random_order() -> None:
    """40 cells given in sorted order: the chance that the output lists them sorted is 1/40!."""
    table = pa.table({"v": np.repeat(np.arange(40), 3)})
    result = crowd_blending_histogram(table, {"v": Keep()}, k=3)
    cells = [int(v) for v in result.table.column("v").cast(pa.string()).to_pylist()]
    assert sorted(cells) == list(range(40)) and cells != list(range(40))
    assert result.table.column("count").to_pylist() == [3] * 40


@pytest.mark.parametrize("beta", [0.3, 0.05])
def test_sampled_fraction_in_binomial_interval(beta: float) -> None:
    rows = 300_000
    result = sdgs(
        pa.table({"v": np.zeros(rows, np.int64)}),
        {"v": Suppress()},
        k=1,
        beta=beta,
        epsilon=1.0,
    )
    sampled = result.internal_facts["rows_sampled"]
    lo, hi = binom.interval(1 - ALPHA, rows, beta)
    assert lo <= sampled <= hi
    assert result.table.num_rows == sampled  # one cell, k = 1: nothing suppressed


def test_each_row_kept_with_probability_beta_independently() -> None:
    """The sampling law row by row: every row its own cell (k = 1), so each release is exactly
    the set of sampled rows. Over R releases, (1) each row's inclusion count is Binomial(R, beta)
    (chi-square over the rows: no position is favoured, whatever the input order) and (2) the
    sample size of a release is Binomial(n, beta) (chi-square over its values, tails pooled to an
    expected count >= 5): a sampler keeping a fixed number of rows, or rows in runs, fails it.
    Each assertion fails with probability below ALPHA when rows are kept independently."""
    n, beta, releases = 40, 0.3, 3000
    table = pa.table({"row": np.arange(n)})
    kept = np.zeros((releases, n), bool)
    for release in range(releases):
        published = sdgs(table, {"row": Keep()}, k=1, beta=beta, epsilon=1.0).table
        rows = np.array(published.column("row").cast(pa.string()).to_pylist(), dtype=np.int64)
        assert len(set(rows.tolist())) == len(rows)  # each sampled row once
        kept[release, rows] = True
    per_row = kept.sum(axis=0)
    statistic = float(np.sum((per_row - releases * beta) ** 2) / (releases * beta * (1 - beta)))
    assert statistic <= chi2.ppf(1 - ALPHA, n), (statistic, per_row)
    sizes = np.bincount(kept.sum(axis=1), minlength=n + 1)
    expected = releases * binom.pmf(np.arange(n + 1), n, beta)
    low = int(np.argmax(np.cumsum(expected) >= 5))  # pool each tail up to an expected 5
    high = n - int(np.argmax(np.cumsum(expected[::-1]) >= 5))
    observed = np.r_[sizes[: low + 1].sum(), sizes[low + 1 : high], sizes[high:].sum()]
    wanted = np.r_[expected[: low + 1].sum(), expected[low + 1 : high], expected[high:].sum()]
    statistic = float(np.sum((observed - wanted) ** 2 / wanted))
    assert statistic <= chi2.ppf(1 - ALPHA, len(wanted) - 1), (statistic, observed, wanted)


@pytest.mark.parametrize("p", [1 / 256, 255 / 256, 0.5 + 2**-9, 1 / 3, 1e-5])
def test_lazy_bernoulli_matches_its_probability(p: float) -> None:
    """p = 1/2 + 2^-9 is only reached through the second byte (a first-byte-only sampler gives
    1/2, 7.8 standard deviations away); p = 1/256 ends every tie at the second byte."""
    size = 4_000_000
    hits = int(bernoulli(size, p).sum())
    lo, hi = binom.interval(1 - ALPHA, size, p)
    assert lo <= hits <= hi
    assert bernoulli(10, 1.0).all() and bernoulli(0, 0.5).size == 0


def test_shuffled_repeat() -> None:
    cells, counts = np.array([0, 5, 9]), np.array([3, 1, 4])
    out = shuffled_repeat(cells, counts)
    assert sorted(out.tolist()) == [0, 0, 0, 5, 9, 9, 9, 9]
    assert shuffled_repeat(np.zeros(0, np.int64), np.zeros(0, np.int64)).size == 0
    # position of the single cell 1 among 99 copies of cell 0: uniform on 0..99 (chi-square-free
    # check: each position's count is binomial(20000, 1/100); all 100 within their intervals)
    firsts = np.array([np.argmax(shuffled_repeat(np.array([0, 1]), np.array([99, 1])) == 1) for _ in range(20_000)])
    lo, hi = binom.interval(1 - ALPHA / 100, 20_000, 0.01)
    assert np.all((lo <= np.bincount(firsts, minlength=100)) & (np.bincount(firsts, minlength=100) <= hi))


# ---------------------------------------------------------------------------------------------
# results, facts, errors


def test_result_event_and_facts() -> None:
    table = pa.table({"v": ["x"] * 30 + ["y"] * 3, "w": list(range(33))})
    result = sdgs(table, {"v": Keep()}, k=5, beta=1.0, epsilon=0.7)
    assert result.event == SDGS(k=5, beta=1.0, epsilon=0.7, output="microdata")
    assert result.table.column_names == ["v"]  # 'w' has no scheme: not published
    assert result.public_facts == {
        "k": 5,
        "beta": 1.0,
        "epsilon": 0.7,
        "columns": ["v"],
        "rows_published": 30,
        "cells_published": 1,
    }
    assert result.internal_facts == {
        "rows_in": 33,
        "rows_sampled": 33,
        "rows_suppressed": 3,
        "cells_suppressed": 1,
        "share_of_sampled_rows_published": 30 / 33,
        "share_of_people_in_published_cells_estimated": 30 / 33,
        "discernibility": 30**2 + 3 * 33,  # Bayardo-Agrawal: a class of 30, 3 suppressed rows charged 33 each
        "average_class_size_normalized": 30 / (1 * 5),  # C_AVG: one class of 30 rows for k = 5
    }
    assert result.table.column("v").chunk(0).dictionary.to_pylist() == ["x"]  # 'y' does not leak
    histogram = crowd_blending_histogram(table, {"v": Keep()}, k=5, epsilon=0.7)
    assert histogram.event == SDGS(k=5, beta=1.0, epsilon=0.7, output="histogram")
    assert histogram.table.to_pydict() == {"v": ["x"], "count": [30], "estimate": [30.0], "lower": [30], "upper": [30]}
    assert crowd_blending_histogram(table, {"v": Keep()}, k=5).event.epsilon == 0


def test_everything_suppressed_is_an_explained_empty_result() -> None:
    table = pa.table({"v": ["x", "y", "z"], "n": [1, 2, 3]})
    schemes = {"v": Keep(), "n": Bins(edges=(0, 5))}
    result = sdgs(table, schemes, k=2, beta=1.0, epsilon=1.0)
    assert result.table.num_rows == 0 and result.table.column_names == ["v", "n"]
    assert all(field.type == pa.dictionary(pa.int32(), pa.string()) for field in result.table.schema)
    assert "fewer than k=2 rows" in result.public_facts["explanation"]
    assert result.internal_facts["rows_suppressed"] == 3
    histogram = crowd_blending_histogram(table, schemes, k=2)
    assert histogram.table.num_rows == 0 and histogram.table.column_names == [
        "v",
        "n",
        "count",
        "estimate",
        "lower",
        "upper",
    ]
    assert "explanation" in histogram.public_facts
    empty = sdgs(table.slice(0, 0), schemes, k=2, beta=0.5, epsilon=1.0)
    assert empty.table.num_rows == 0 and empty.internal_facts["rows_sampled"] == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": 0}, "k must be an integer >= 1; got 0"),
        ({"k": 2.5}, "k must be an integer >= 1; got 2.5"),
        ({"k": True}, "k must be an integer >= 1"),
        ({"beta": 0}, r"beta must be in \[0.0001, 1\]; got 0"),
        ({"beta": 1.2}, r"beta must be in \[0.0001, 1\]; got 1.2"),
        ({"epsilon": -1.0}, "epsilon must be a finite number >= 0; got -1.0"),
        ({"epsilon": float("inf")}, "epsilon must be a finite number >= 0"),
    ],
)
def test_parameter_errors(kwargs: dict, message: str) -> None:
    arguments = {"k": 2, "beta": 0.5, "epsilon": 1.0} | kwargs
    with pytest.raises(UserError, match=message):
        sdgs(pa.table({"v": [1]}), {"v": Keep()}, **arguments)


def test_domain_error_does_not_depend_on_the_sample() -> None:
    """The bad value is in one row of 10,000; with beta = 0.01 it is almost never sampled, yet
    the run fails every time, naming column, row and value."""
    values = ["a"] * 10_000
    values[6_789] = "b"
    for _ in range(5):
        with pytest.raises(UserError, match=r"column 'v': value 'b' at row 6790"):
            sdgs(
                pa.table({"v": values}),
                {"v": ValueMap(mapping=(("a", "A"),))},
                k=1,
                beta=0.01,
                epsilon=1.0,
            )
    for name in ("count", "estimate", "lower", "upper"):
        with pytest.raises(UserError, match=f"cannot generalize a column named '{name}'"):
            crowd_blending_histogram(pa.table({name: [1]}), {name: Keep()}, k=1)


# ---------------------------------------------------------------------------------------------
# empirical privacy: Theorem 1 of Li, Qardaji, Su, measured

K, BETA, EPSILON = 5, 0.3, 1.0
SIZES = np.arange(1, 11)  # n identical rows in D, n - 1 in D'; n_m = 6 and the argmax 8 inside


def reference_delta(k: int, beta: float, epsilon: float) -> float:
    """d(k, beta, eps) = max_{n >= n_m} sum_{j > gamma n}^n f(j; n, beta), gamma = (e^eps - 1 +
    beta) / e^eps, n_m = ceil(k / gamma - 1) (Theorem 1 as proved; computed here with scipy,
    independent of the project's accountants). The tail shrinks like exp(-n (gamma ln(gamma /
    beta) - gamma + beta)) (Chernoff), so n < 5000 is far beyond where the maximum lies."""
    gamma = (math.exp(epsilon) - 1 + beta) / math.exp(epsilon)
    n = np.arange(math.ceil(k / gamma - 1), 5000)
    return float(binom.sf(np.floor(gamma * n), n, beta).max())


def test_reference_delta_reproduces_the_paper() -> None:
    """Table 2 of "On sampling, anonymization, and differential privacy" (k = 20)."""
    for beta, epsilon, delta in [
        (0.05, 0.25, 6.83e-10),
        (0.1, 0.5, 1.61e-09),
        (0.2, 1.0, 6.03e-09),
        (0.2, 2.0, 1.59e-12),
    ]:
        assert reference_delta(20, beta, epsilon) == pytest.approx(delta, rel=5e-3)
    assert reference_delta(K, BETA, EPSILON) == pytest.approx(0.0112922, rel=1e-4)  # at n = 8


def published_counts(sizes: np.ndarray, replicates: int, *, k: int, beta: float) -> np.ndarray:
    """Runs the real :func:`sdgs` once on a table of ``len(sizes) * replicates`` groups, group
    (i, r) being ``sizes[i]`` identical rows with a value of its own (scheme Keep). Sampling is
    independent per row and suppression per cell, so each group's published count is an
    independent draw of the single-cell output of the proof of Theorem 1: one run here is
    ``replicates`` runs per size. Returns the counts, shape (len(sizes), replicates)."""
    per_group = np.repeat(sizes, replicates)
    group = np.repeat(np.arange(per_group.size), per_group)
    result = sdgs(pa.table({"g": group}), {"g": Keep()}, k=k, beta=beta, epsilon=EPSILON)
    column = result.table.column("g").combine_chunks()
    published = pc.cast(column.dictionary, pa.int64()).to_numpy()[column.indices.to_numpy()]
    return np.bincount(published, minlength=per_group.size).reshape(len(sizes), replicates)


def hockey_stick(x: np.ndarray, y: np.ndarray, epsilon: float, outcomes: int, alpha: float) -> tuple[float, float]:
    """Estimate of sum_o max(0, P(o) - e^eps Q(o)) from independent samples x ~ P, y ~ Q (same
    size N), and its error margin.

    The estimate is G(S) = P(S) - e^eps Q(S) at the empirical maximizer S = {o: P^(o) > e^eps
    Q^(o)}, the mean of Z_i = 1[x_i in S] - e^eps 1[y_i in S] in [-e^eps, 1]. By the empirical
    Bernstein bound (Maurer & Pontil 2009, Theorem 4), for a fixed S, each of mean - G(S) <= m and
    G(S) - mean <= m, m = sqrt(2 V L / N) + 7 (1 + e^eps) L / (3 (N - 1)) (V the sample variance),
    fails with probability at most 2 e^-L; with L = ln(2^(outcomes + 1) / alpha) it holds for all
    2^outcomes sets at once with probability 1 - alpha. Hence, each failing w.p. <= alpha:
    estimate - margin <= true hockey stick (a lower bound), and if the true value is <= delta
    then estimate <= delta + margin."""
    e = math.exp(epsilon)
    values = np.union1d(x, y)
    p = np.array([np.mean(x == v) for v in values])
    q = np.array([np.mean(y == v) for v in values])
    worst = values[p > e * q]
    z = np.isin(x, worst).astype(float) - e * np.isin(y, worst)
    n = len(z)
    log_term = (outcomes + 1) * math.log(2) + math.log(1 / alpha)
    margin = math.sqrt(2 * z.var(ddof=1) * log_term / n) + 7 * (1 + e) * log_term / (3 * (n - 1))
    return float(z.mean()), margin


def exact_output(n: int, k: int, beta: float) -> np.ndarray:
    """P(published count = j), j = 0..n, for a cell of n identical rows."""
    j = np.arange(n + 1)
    pmf = binom.pmf(j, n, beta)
    return np.where(j >= k, pmf, 0.0) + np.where(j == 0, pmf[j < k].sum(), 0.0)


def test_empirical_privacy_within_theorem_1() -> None:
    """Monte Carlo (50,000 runs per n and per dataset) of the worst case in the proof of Theorem 1
    at k = 5, beta = 0.3, eps = 1 (delta = 0.0113, large enough to measure): the empirical
    hockey-stick divergence of the cell's published count on D (n rows) vs D' (n - 1 rows),
    maximized over n = 1..10 and both directions, stays below delta + margin (failure probability
    <= ALPHA). The output distribution also matches the exact one per n (Weissman et al.'s L1
    bound, P(||P^ - P||_1 >= t) <= (2^m - 2) e^(-N t^2 / 2), failure probability <= ALPHA)."""
    delta = reference_delta(K, BETA, EPSILON)
    replicates = 50_000
    on_d = published_counts(SIZES, replicates, k=K, beta=BETA)
    on_d_minus = published_counts(SIZES - 1, replicates, k=K, beta=BETA)
    alpha = ALPHA / (4 * len(SIZES))  # 4 checks per n
    for n, x, y in zip(SIZES, on_d, on_d_minus):
        for first, second in ((x, y), (y, x)):
            estimate, margin = hockey_stick(first, second, EPSILON, outcomes=n + 1, alpha=alpha)
            assert estimate <= delta + margin, (n, estimate, margin, delta)
        for size, draws in ((n, x), (n - 1, y)):
            observed = np.bincount(draws, minlength=size + 1) / replicates
            t = math.sqrt(2 * math.log(2 ** (size + 1) / alpha) / replicates)
            assert np.abs(observed - exact_output(size, K, BETA)).sum() < t, (
                size,
                observed,
            )


@pytest.mark.parametrize(
    ("k", "beta", "variant"),
    [(1, BETA, "k ignored (k = 1)"), (K, 1.0, "no sampling (beta = 1)")],
)
def test_empirical_privacy_test_catches_broken_variants(k: int, beta: float, variant: str) -> None:
    """The same estimator on a broken SDGS (the real function with k = 1, or beta = 1) finds a
    hockey-stick divergence whose lower confidence bound exceeds the delta claimed for (k = 5,
    beta = 0.3, eps = 1) ten times over (k = 1: 0.3 at n = 1; beta = 1: 1 at n = 5). Each lower
    bound is wrong with probability <= ALPHA."""
    delta = reference_delta(K, BETA, EPSILON)
    replicates = 5_000
    on_d = published_counts(SIZES, replicates, k=k, beta=beta)
    on_d_minus = published_counts(SIZES - 1, replicates, k=k, beta=beta)
    alpha = ALPHA / (2 * len(SIZES))
    lower = max(
        estimate - margin
        for n, x, y in zip(SIZES, on_d, on_d_minus)
        for first, second in ((x, y), (y, x))
        for estimate, margin in [hockey_stick(first, second, EPSILON, outcomes=n + 1, alpha=alpha)]
    )
    assert lower > 10 * delta, (variant, lower, delta)
