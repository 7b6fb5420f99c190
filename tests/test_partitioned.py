"""Partitioned (k, beta)-SDGS (mechanisms/partitioned.py) against the in-process mechanism:
the same published multiset when both see the same sample (beta = 1: the sample is every row),
suppression by the global count, output files that follow neither the input order nor the
input partitions, and the distribution of a fixed cell's published count against the exact
one (chi-square).

Statistical tests state their failure probability; none assumes a seed."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from scipy.stats import binom, chisquare

from privrelease.errors import UserError
from privrelease.mechanisms import partitioned
from privrelease.mechanisms.results import Pieces
from privrelease.mechanisms.schemes import Bins, Keep, ValueMap
from privrelease.mechanisms.sdgs import count_cells, sdgs

ALPHA = 1e-6
"""Failure probability of each statistical assertion below (when the code is correct)."""

SCHEMES = {
    "job": ValueMap(mapping=(("a", "A"), ("b", "A"), ("c", "C"), ("d", "D")), default="other"),
    "age": Bins(edges=(0, 10, 20, 40)),
    "zone": Keep(),
}


def rows(tables: list[pa.Table]) -> Counter:
    """The multiset of rows (as label tuples) of all ``tables``."""
    found: Counter = Counter()
    for table in tables:
        columns = [table.column(name).cast(pa.string()).to_pylist() for name in table.column_names]
        found.update(zip(*columns))
    return found


def population(size: int) -> pa.Table:
    """``size`` rows; zones 0..11, so partitions of the zone-sorted table see different zones
    (Keep labels differ between partitions)."""
    rng = np.random.default_rng()
    table = pa.table(
        {
            "job": pa.array(rng.choice(list("abcdez"), size)).dictionary_encode(),
            "age": rng.integers(0, 41, size),
            "zone": rng.integers(0, 12, size),
        }
    )
    return table.sort_by("zone")  # input order visible: sorted by a published column


def partitioned_sdgs(parts: list[pa.Table], schemes: dict, **parameters: Any) -> tuple[list[pa.Table], Any]:
    """:func:`.partitioned.streamed_sdgs` with its pieces computed: the files and the result."""
    result = partitioned.streamed_sdgs(parts, schemes, **parameters)
    assert isinstance(result.table, Pieces)
    return list(result.table.tables), result


def slices(table: pa.Table, parts: int) -> list[pa.Table]:
    bounds = np.linspace(0, table.num_rows, parts + 1).astype(int)
    return [table.slice(lo, hi - lo) for lo, hi in zip(bounds[:-1], bounds[1:])]


@pytest.mark.parametrize("parts", [1, 3, 7])
def test_same_release_as_in_process_on_the_same_sample(parts: int) -> None:
    """beta = 1 (k-DGS): both see the whole table as their sample, so the published multisets,
    the facts and the event must be identical; an empty partition changes nothing."""
    table = population(3000)
    pieces = [*slices(table, parts), table.slice(0, 0)]
    files, result = partitioned_sdgs(pieces, SCHEMES, k=15, beta=1.0, epsilon=0.0, rows_per_file=700)
    reference = sdgs(table, SCHEMES, k=15, beta=1.0, epsilon=0.0)
    assert rows(files) == rows([reference.table])
    assert result.public_facts == reference.public_facts
    assert result.internal_facts == reference.internal_facts
    assert result.event == reference.event
    assert len(files) == partitioned.file_count(reference.table.num_rows, 700)
    assert sum(f.num_rows for f in files) == reference.table.num_rows
    for file in files:
        assert file.column_names == list(SCHEMES)
        for name in file.column_names:  # each file's dictionaries hold only its own labels
            column = file.column(name).combine_chunks()
            assert set(column.dictionary.to_pylist()) == set(column.cast(pa.string()).to_pylist())


def test_merged_counts_equal_whole_sample_counts() -> None:
    """The reduction of the partial counts equals count_cells on the concatenated table, cell by
    cell (label tuples), with Keep labels merged in value order (zone 9 before zone 10)."""
    table = population(5000)
    merged = partitioned.merge_counts([count_cells(part, SCHEMES, beta=1.0) for part in slices(table, 5)])
    whole = count_cells(table, SCHEMES, beta=1.0)

    def by_labels(cells) -> dict:
        names = list(cells.labels)
        labels = [cells.labels[name].to_pylist() for name in names]
        keys = zip(*[[labels[i][code] for code in cells.codes[name]] for i, name in enumerate(names)])
        return dict(zip(keys, cells.counts.tolist()))

    assert by_labels(merged) == by_labels(whole)
    assert merged.labels["zone"].to_pylist() == [str(zone) for zone in range(12)]
    assert (merged.rows_in, merged.rows_sampled) == (5000, 5000)


def test_suppression_uses_the_global_count() -> None:
    """Cell A has 3 rows in each of 10 partitions (fewer than k = 20 in each, 30 in all):
    published with all 30 rows. Cell B has 19 rows in all: suppressed everywhere."""
    schemes = {"x": Keep()}
    parts = [pa.table({"x": ["A"] * 3 + (["B"] * 2 if i < 9 else ["B"])}) for i in range(10)]
    files, result = partitioned_sdgs(parts, schemes, k=20, beta=1.0, epsilon=0.0)
    assert rows(files) == Counter({("A",): 30})
    assert result.internal_facts["rows_suppressed"] == 19
    assert result.internal_facts["cells_suppressed"] == 1


def test_files_follow_neither_partitions_nor_input_order() -> None:
    """Partition 0 holds only cell A, partition 1 only cell B (200 rows each), in input order.
    Two output files: each must hold both cells (a file missing one: probability 2 * 2^-200 per
    cell), and the rows of a file are not in input order (runs of equal rows: a sorted file
    has 2 at most; a uniformly random order of ~200 A and ~200 B has about 200, and fewer
    than 40 with probability far below ALPHA)."""
    schemes = {"x": Keep()}
    parts = [pa.table({"x": ["A"] * 200}), pa.table({"x": ["B"] * 200})]
    files, _ = partitioned_sdgs(parts, schemes, k=1, beta=1.0, epsilon=0.0, rows_per_file=200)
    assert len(files) == 2
    for file in files:
        values = file.column("x").cast(pa.string()).to_pylist()
        assert set(values) == {"A", "B"}
        runs = 1 + sum(a != b for a, b in zip(values, values[1:]))
        assert runs > 40


def test_fixed_cell_count_has_the_in_process_distribution() -> None:
    """Cell A has n = 60 rows spread over 4 partitions; beta = 0.5, k = 25. In-process SDGS
    publishes X rows of A when X >= k and none otherwise, X ~ Binomial(60, 0.5). Over 1500
    partitioned runs the published count matches that exact law (chi-square over the
    outcomes "suppressed", 25..35, ">= 36"; failure probability ALPHA), and the sample size
    of all rows matches Binomial(N, 0.5) (z-test on the mean, |z| < 5.3: probability < ALPHA)."""
    n, k, beta, runs = 60, 25, 0.5, 1500
    schemes = {"x": Keep()}
    values = np.array(["A"] * n + ["B"] * 140)
    parts = [pa.table({"x": values[i::4]}) for i in range(4)]
    published, sampled = [], []
    for _ in range(runs):
        files, result = partitioned_sdgs(parts, schemes, k=k, beta=beta, epsilon=0.0)
        published.append(rows(files)[("A",)])
        sampled.append(result.internal_facts["rows_sampled"])
    outcomes = [0, *range(k, 36)]
    observed = [sum(1 for p in published if p == 0)] + [sum(1 for p in published if p == v) for v in range(k, 36)]
    observed.append(sum(1 for p in published if p >= 36))
    expected = [binom.cdf(k - 1, n, beta)] + [binom.pmf(v, n, beta) for v in outcomes[1:]] + [binom.sf(35, n, beta)]
    expected = np.array(expected) * runs
    assert sum(observed) == runs and abs(expected.sum() - runs) < 1e-6
    assert chisquare(observed, expected).pvalue > ALPHA
    total = len(values)
    z = (np.mean(sampled) - total * beta) / np.sqrt(total * beta * (1 - beta) / runs)
    assert abs(z) < 5.3


def test_rows_pick_files_uniformly() -> None:
    """Each published row lands in each of 8 files with probability 1/8: 4000 rows of one cell
    and 1 row of another, drawn 400 times (chi-square, failure probability ALPHA each)."""
    counts = np.array([4000, 1])
    big = np.zeros(8)
    single = np.zeros(8)
    for _ in range(400):
        split = partitioned.assign_files(counts, 8)
        for file, (cells, rows_in_file) in enumerate(split):
            assert np.all(np.diff(cells) > 0) and np.all(rows_in_file > 0)
            big[file] += rows_in_file[cells == 0].sum()
            single[file] += rows_in_file[cells == 1].sum()
    assert big.sum() == 400 * 4000 and single.sum() == 400
    assert chisquare(big).pvalue > ALPHA
    assert chisquare(single).pvalue > ALPHA


@pytest.mark.parametrize("batch", [1, 3, 7, 64, 1 << 22])
@pytest.mark.parametrize("files", [1, 2, 8])
def test_every_row_is_assigned_once_across_batches(monkeypatch, batch: int, files: int) -> None:
    """Rows are given files in batches that cut cells anywhere (empty cells included): per
    cell, the rows over all files add up to its count, each file's cells ascending."""
    monkeypatch.setattr(partitioned, "_ASSIGN_BATCH", batch)
    counts = np.array([0, 5, 1, 0, 0, 12, 3, 0, 9, 1, 0])
    total = np.zeros(len(counts), np.int64)
    for cells, rows_in_file in partitioned.assign_files(counts, files):
        assert np.all(np.diff(cells) > 0) and np.all(rows_in_file > 0)
        np.add.at(total, cells, rows_in_file)
    assert total.tolist() == counts.tolist()


def test_file_count_and_empty_release() -> None:
    assert [partitioned.file_count(m, 10) for m in (0, 1, 10, 11, 21, 1000)] == [1, 1, 1, 2, 4, 128]
    with pytest.raises(ValueError):
        partitioned.file_count(5, 0)
    files, result = partitioned_sdgs(
        [pa.table({"x": ["A", "B"]}), pa.table({"x": ["C"]})], {"x": Keep()}, k=5, beta=1.0, epsilon=0.0
    )
    assert len(files) == 1 and files[0].num_rows == 0 and files[0].column_names == ["x"]
    assert "explanation" in result.public_facts
    with pytest.raises(UserError, match="k must be"):
        partitioned_sdgs([pa.table({"x": ["A"]})], {"x": Keep()}, k=0, beta=1.0, epsilon=0.0)


def test_part_count_gives_each_worker_a_file_of_bounded_rows() -> None:
    """About one file per worker, each of 1,000,000 to 2,000,000 rows (a power of two files;
    one file when fewer rows are published)."""
    cases = ((0, 4), (40_000, 2), (2_000_000, 8), (2_100_000, 8), (10_000_000, 16), (100_000_000, 16), (600_000, 3))
    assert [partitioned.part_count(rows, workers) for rows, workers in cases] == [1, 1, 2, 4, 16, 64, 1]
    with pytest.raises(ValueError):
        partitioned.part_count(5, 0)
    readme = " ".join((Path(__file__).parents[1] / "README.md").read_text().split())
    assert f"at least {partitioned.ROWS_PER_PART_MIN:,} and at most {partitioned.ROWS_PER_PART:,} rows each" in readme


def test_split_over_workers_is_the_published_multiset_in_uniform_files(monkeypatch) -> None:
    """:func:`.partitioned.split` with at most 500 rows a file: the files are drawn in one map
    of ``assign_files`` over 3 contiguous slices of the cells covering them all; the files
    together are the published multiset (that of the in-process pieces of the same cells), and
    over 50 splits each row lands in each of the files with probability 1/J (chi-square on the
    files' rows, failure probability ALPHA)."""
    monkeypatch.setattr(partitioned, "ROWS_PER_FILE", 500)
    monkeypatch.setattr(partitioned, "ROWS_PER_PART", 500)
    monkeypatch.setattr(partitioned, "ROWS_PER_PART_MIN", 500)
    result = partitioned.streamed_sdgs(slices(population(40_000), 4), SCHEMES, k=5, beta=0.2, epsilon=1.0)
    assert isinstance(result.table, Pieces) and result.table.remote is not None
    published = rows(list(result.table.tables))
    total = sum(published.values())
    files = partitioned.part_count(total, 3)
    assert files > 4
    calls: list[list[np.ndarray]] = []

    def gather(function, items, **constants):
        calls.append(items)
        return [function(item, **constants) for item in items]

    sizes = np.zeros(files)
    for _ in range(50):
        made = result.table.remote(3, gather)
        tables = [pa.concat_tables(list(file())) for file in made]
        assert len(tables) == files and rows(tables) == published
        sizes += [table.num_rows for table in tables]
    assert len(calls) == 50 and all(len(items) == 3 for items in calls)
    assert sorted(np.concatenate(calls[0]).tolist()) == sorted(published.values())  # the slices: every cell once
    assert chisquare(sizes).pvalue > ALPHA


def test_split_draws_as_many_slices_as_files_when_workers_outnumber_them(monkeypatch) -> None:
    """Two files on 8 workers: the files are drawn on 2 slices of the cells (a task and its
    costs per file, not per worker), covering every published row once."""
    result = partitioned.streamed_sdgs(slices(population(40_000), 4), SCHEMES, k=5, beta=0.2, epsilon=1.0)
    assert isinstance(result.table, Pieces) and result.table.remote is not None
    published = rows(list(result.table.tables))
    total = sum(published.values())
    for name in ("ROWS_PER_FILE", "ROWS_PER_PART", "ROWS_PER_PART_MIN"):
        monkeypatch.setattr(partitioned, name, -(-total // 2))
    assert partitioned.part_count(total, 8) == 2
    calls: list[list[np.ndarray]] = []

    def gather(function, items, **constants):
        calls.append(items)
        return [function(item, **constants) for item in items]

    tables = [pa.concat_tables(list(file())) for file in result.table.remote(8, gather)]
    assert len(tables) == 2 and rows(tables) == published
    assert len(calls) == 1 and len(calls[0]) == 2
    assert sorted(np.concatenate(calls[0]).tolist()) == sorted(published.values())


def test_split_draws_each_row_s_file_and_piece_at_once(monkeypatch) -> None:
    """Four files of about 4 pieces each: one map of ``assign_files`` over 16 (file, piece)
    pairs; writing the files draws nothing more (the pieces come drawn), every piece holds
    about a quarter of its file's rows, and over 40 splits each row lands in each of the 16
    pieces with probability 1/16 (chi-square, failure probability ALPHA)."""
    cells = partitioned.published_cells(
        partitioned.merge_counts([count_cells(part, SCHEMES, beta=0.2) for part in slices(population(40_000), 4)]), 5
    )
    published = rows(list(partitioned.pieces(cells, 1)))
    total = sum(published.values())
    monkeypatch.setattr(partitioned, "ROWS_PER_PART", -(-total // 4))
    monkeypatch.setattr(partitioned, "ROWS_PER_PART_MIN", -(-total // 4))
    remote = functools.partial(partitioned.split, cells, -(-total // 16))
    assert partitioned.part_count(total, 4) == 4
    drawn: list[int] = []

    def gather(function, items, **constants):
        drawn.append(constants["files"])
        return [function(item, **constants) for item in items]

    sizes = np.zeros(16)
    for _ in range(40):
        made = remote(4, gather)
        with monkeypatch.context() as patched:
            patched.setattr(partitioned, "assign_files", lambda *_, **__: pytest.fail("a file drew again"))
            files = [list(file()) for file in made]
        assert len(files) == 4 and all(len(pieces) == 4 for pieces in files)
        assert rows([table for pieces in files for table in pieces]) == published
        sizes += [table.num_rows for pieces in files for table in pieces]
    assert drawn == [16] * 40
    assert chisquare(sizes).pvalue > ALPHA


def test_equal_runs_are_consecutive_of_about_equal_weight_and_never_empty() -> None:
    """Each item in the run its weight's midpoint falls in: 20 equal items in 8 runs of 2 or 3,
    fewer items than runs one run each, and weights 0 allowed."""
    assert partitioned.equal_runs([1] * 20, 8).tolist() == [0, 2, 5, 7, 10, 12, 15, 17, 20]
    assert partitioned.equal_runs([7, 1, 1, 1, 1, 1, 1, 1], 2).tolist() == [0, 1, 8]
    assert partitioned.equal_runs([3, 3], 8).tolist() == [0, 1, 2]
    assert partitioned.equal_runs([5, 0, 0, 5], 2).tolist() == [0, 1, 4]
    assert partitioned.equal_runs([], 3).tolist() == [0]
