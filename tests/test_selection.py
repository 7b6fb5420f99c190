"""epsilon-safe scheme selection: the utility, its sensitivity, the exponential mechanism."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import binom

from privrelease.errors import UserError
from privrelease.mechanisms.events import BoundedRangeSelection
from privrelease.mechanisms.schemes import Bins, Keep, Suppress, ValueMap
from privrelease.mechanisms.selection import (
    expected_published_rows,
    exponential_mechanism,
    select_scheme,
    selection_probabilities,
    sensitivity,
)

ALPHA = 1e-6

CANDIDATES = {
    "fine": {"job": Keep(), "age": Bins(edges=(0, 10, 20, 30, 40))},
    "coarse": {
        "job": ValueMap(mapping=(("a", "ab"), ("b", "ab")), default="rest"),
        "age": Bins(edges=(0, 20, 40)),
    },
    "none": {"job": Suppress(), "age": Suppress()},
}


def published_rows_by_definition(n: int, k: int, beta: float) -> float:
    """E[X 1{X >= k}], X ~ Bin(n, beta), summed term by term."""
    j = np.arange(k, n + 1)
    return float(np.sum(j * binom.pmf(j, n, beta)))


@pytest.mark.parametrize(
    ("k", "beta"),
    [(1, 0.5), (1, 1.0), (20, 1.0), (20, 0.1), (5, 0.3), (3, 0.9), (40, 0.05)],
)
def test_sensitivity_bounds_the_largest_step(k: int, beta: float) -> None:
    """Delta(k, beta) >= max_n g(n + 1) - g(n), with g computed by its definition, and is tight."""
    n = np.arange(int(4 * k / beta) + 50)
    j = np.arange(k, n[-1] + 2)[:, None]
    g = np.sum(j * binom.pmf(j, np.append(n, n[-1] + 1), beta), axis=0)  # g(n) by definition
    steps = np.diff(g)
    bound = sensitivity(k, beta)
    assert max(steps) <= bound <= max(max(steps), beta) * (1 + 1e-6)
    if beta == 1.0:
        assert bound == pytest.approx(k)  # the "rows not suppressed" score jumps by k
    if k == 1:
        assert bound == pytest.approx(beta)


def test_expected_published_rows() -> None:
    table = pa.table({"job": ["a"] * 7 + ["b"] * 3 + ["c"] * 12, "age": [5] * 22})
    scheme = {"job": Keep(), "age": Suppress()}
    for k, beta in [(1, 1.0), (4, 1.0), (4, 0.5), (10, 0.3)]:
        expected = sum(published_rows_by_definition(n, k, beta) for n in (7, 3, 12))
        assert expected_published_rows(table, scheme, k=k, beta=beta) == pytest.approx(expected, rel=1e-12)
    assert expected_published_rows(table, scheme, k=4, beta=1.0) == 19


@st.composite
def table_and_row(draw: st.DrawFn) -> tuple[pa.Table, pa.Table]:
    size = draw(st.integers(0, 40))
    jobs = draw(st.lists(st.sampled_from("abc"), min_size=size + 1, max_size=size + 1))
    ages = draw(st.lists(st.integers(0, 39), min_size=size + 1, max_size=size + 1))
    bigger = pa.table({"job": jobs, "age": ages})
    return bigger.slice(0, size), bigger


@settings(max_examples=60, deadline=None)
@given(
    pair=table_and_row(),
    k=st.integers(1, 8),
    beta=st.sampled_from([1.0, 0.5, 0.1]),
    epsilon=st.sampled_from([0.1, 1.0]),
)
def test_neighbouring_tables(pair: tuple[pa.Table, pa.Table], k: int, beta: float, epsilon: float) -> None:
    """Adding one row raises every score by 0 to the sensitivity (never lowers one: a monotone
    score), so every candidate's selection probability changes by a factor of at most e^eps
    (epsilon-DP with exponent eps u / Delta, checked exactly)."""
    smaller, bigger = pair
    bound = sensitivity(k, beta)
    scores = []
    for table in (smaller, bigger):
        scores.append([expected_published_rows(table, scheme, k=k, beta=beta) for scheme in CANDIDATES.values()])
    gains = np.subtract(scores[1], scores[0])
    assert np.all((gains >= -1e-9 * (1 + np.abs(scores[0]))) & (gains <= bound))
    first, second = (selection_probabilities(s, epsilon=epsilon, sensitivity=bound) for s in scores)
    assert np.all(first <= math.exp(epsilon) * second * (1 + 1e-12))
    assert np.all(second <= math.exp(epsilon) * first * (1 + 1e-12))


def test_the_charged_epsilon_is_spent_not_halved() -> None:
    """With a monotone score the worst neighbouring pair is a candidate of negligible
    probability gaining Delta: its probability grows by e^eps, the charged epsilon, to within
    0.1%. With the factor 2 of the general exponential mechanism the largest loss was eps/2
    while eps was charged, so releases with a selection were 2-3.5x loose (issue 15, item 12)."""
    for epsilon, bound in ((1.0, 0.24), (0.1, 20.0), (3.0, 1.0)):
        before = selection_probabilities([0.0, 50 * bound / epsilon], epsilon=epsilon, sensitivity=bound)
        after = selection_probabilities([bound, 50 * bound / epsilon], epsilon=epsilon, sensitivity=bound)
        loss = float(np.max(np.abs(np.log(after / before))))
        assert 0.999 * epsilon <= loss <= epsilon * (1 + 1e-12)


def test_probabilities_in_log_space() -> None:
    assert selection_probabilities([5.0, 5.0], epsilon=1.0, sensitivity=1.0).tolist() == [0.5, 0.5]
    huge = selection_probabilities([1e6, 1e6 - math.log(2), 0.0], epsilon=1.0, sensitivity=1.0)
    assert huge == pytest.approx([2 / 3, 1 / 3, 0.0])
    assert np.isfinite(selection_probabilities([1e300, -1e300], epsilon=1.0, sensitivity=1.0)).all()


def test_exponential_mechanism_frequencies() -> None:
    """Scores giving probabilities 1/2, 1/4, 1/8, 1/8: each candidate's count in 20,000 draws is
    inside its binomial interval (all four together fail with probability <= ALPHA)."""
    epsilon, bound = 0.8, 2.5
    target = np.array([0.5, 0.25, 0.125, 0.125])
    scores = bound / epsilon * np.log(target)
    assert selection_probabilities(scores, epsilon=epsilon, sensitivity=bound) == pytest.approx(target)
    draws = np.bincount(
        [exponential_mechanism(scores, epsilon=epsilon, sensitivity=bound) for _ in range(20_000)],
        minlength=4,
    )
    lo, hi = binom.interval(1 - ALPHA / 4, 20_000, target)
    assert np.all((lo <= draws) & (draws <= hi)), draws


def test_select_scheme() -> None:
    """640 rows, every (job, age) pair twice, in random order. 'fine' has 32 cells of 20 rows (a
    half-sample reaches k = 20 in one with probability 2^-20), 'coarse' 4 cells of 80 or 240 rows,
    'none' one cell of 640 (both publish about half of the rows). Cell sizes are fixed by
    construction, so the scores are exact numbers, not a draw."""
    jobs, ages = np.meshgrid(np.array(list("abcdefgh")), np.arange(40), indexing="ij")
    order = np.random.default_rng().permutation(640)
    table = pa.table({"job": np.tile(jobs.ravel(), 2)[order], "age": np.tile(ages.ravel(), 2)[order]})
    selection = select_scheme(table, CANDIDATES, k=20, beta=0.5, epsilon=1.0)
    bound = sensitivity(20, 0.5)
    assert selection.event == BoundedRangeSelection(epsilon=1.0, candidates=3, sensitivity=bound)
    scores = selection.internal_facts["scores"]
    assert list(scores) == ["fine", "coarse", "none"]
    assert scores["none"] == pytest.approx(published_rows_by_definition(640, 20, 0.5))  # = 320
    assert scores["fine"] == pytest.approx(32 * published_rows_by_definition(20, 20, 0.5))
    coarse = 2 * published_rows_by_definition(80, 20, 0.5) + 2 * published_rows_by_definition(240, 20, 0.5)
    assert scores["coarse"] == pytest.approx(coarse) and 319 < coarse < 320
    probabilities = selection_probabilities(list(scores.values()), epsilon=1.0, sensitivity=bound)
    assert probabilities[0] < 1e-40  # 'fine' loses by ~320 rows: exp(-320 / 1.5)
    assert selection.name in ("coarse", "none") and selection.scheme == CANDIDATES[selection.name]
    weights = {"none": 0.01, "coarse": 1.0, "fine": 1.0}
    weighted = select_scheme(table, CANDIDATES, k=20, beta=0.5, epsilon=1.0, weights=weights)
    assert weighted.internal_facts["scores"]["none"] == pytest.approx(3.2)
    assert weighted.event.sensitivity == bound
    assert weighted.name == "coarse"  # ahead of the others by > 300 rows: probability > 1 - 1e-40


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"candidates": {}}, "at least one generalization scheme"),
        ({"epsilon": 0.0}, "epsilon must be a finite number > 0; got 0.0"),
        ({"k": 0}, "k must be an integer >= 1"),
        ({"beta": 2.0}, r"beta must be in \[0.0001, 1\]"),
        ({"weights": {"other": 0.5}}, "weights name 'other', which is not a candidate"),
        (
            {"weights": {"fine": 0.0}},
            r"weight of candidate 'fine' must be in \(0, 1\]; got 0.0",
        ),
        ({"weights": {"fine": 1.5}}, r"must be in \(0, 1\]; got 1.5"),
    ],
)
def test_selection_errors(kwargs: dict, message: str) -> None:
    arguments = {"candidates": CANDIDATES, "k": 2, "beta": 0.5, "epsilon": 1.0} | kwargs
    with pytest.raises(UserError, match=message):
        select_scheme(pa.table({"job": ["a"], "age": [1]}), **arguments)
