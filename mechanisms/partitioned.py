"""(k, beta)-SDGS microdata computed over partitions of the input (row groups, files) that are
never held together: the same mechanism as :func:`.sdgs.sdgs`, with the same output
distribution (Li, Qardaji, Su, "Provably Private Data Anonymization", Algorithm 4).

SDGS keeps each row independently with probability beta, generalizes it, counts the sampled
rows per cell (label combination) over the WHOLE sample and publishes every sampled row whose
cell has at least k of them. Split over partitions P_1..P_m of the rows:

1. per partition (:func:`.sdgs.count_cells`): an independent Bernoulli(beta) mask from the OS
   CSPRNG for its rows (the masks of all partitions together are i.i.d. Bernoulli(beta) over
   all rows, as in-process), the sampled rows generalized and counted per cell;
2. one global reduction (:func:`merge_counts`): the partial counts added up per cell, cells
   matched by their *labels* (each partition numbers its own labels; a label-based key makes
   them agree), so ``n_c = sum_p n_{p,c}`` is the count of cell c in the whole sample;
3. suppression with the global counts (:func:`published_cells`): cell c is published iff
   ``n_c >= k``, and then with all its ``n_c`` rows;
4. the published rows split over output files (:func:`assign_files`: each row in a uniformly
   random file), each file in uniformly random order (:func:`file_table`).

Why step 4 does not write one file per input partition (the rows of P_p that survived): the
file a row lands in would tell which input partition it came from, i.e. publish the finer cell
(cell, partition) while suppressing only on the cell. If a person's row is the only one of its
cell in its partition (row groups follow the input order: dates, regions, ids), the file of
that partition contains the cell iff the person was sampled, with probability
``beta * P[n_c >= k]`` against 0 without them: no (epsilon, delta) guarantee with small delta,
and not the in-process output distribution. Instead every published row independently picks a
uniformly random file (``randomness.uniform_below``): given the published multiset the files
are a random split of it, a post-processing of SDGS's output, so Theorem 1's guarantee
(epsilon >= -ln(1 - beta), delta = d(k, beta, epsilon)) holds unchanged, and the files read
one after the other are a uniformly random order of the multiset, as in-process. The number of
files depends only on the number of published rows (on Dask also on the workers': :func:`split`
gives each worker a file of its own to write; each row then draws its file and its piece in
that file at once).

The merged label dictionary of a column is the partitions' common one when they agree (always
for value maps, bins and suppression, whose labels the scheme fixes); otherwise (``Keep``,
top/bottom coding, where each partition sees different values) the union in value order
(numbers numerically, as in-process; other text in text order): a function of the label set,
never of the input order. A partition keeps its labels only when it has cells; partitions
without cells do not take part in the label merge.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from privrelease.mechanisms import randomness
from privrelease.mechanisms.results import MechanismResult, Pieces
from privrelease.mechanisms.schemes import ColumnScheme
from privrelease.mechanisms.sdgs import CellCounts, check_parameters, count_cells, release, shuffled_repeat, with_cells

_INT64_SAFE = 1 << 62
ROWS_PER_FILE = 250_000
"""Published rows per output piece (a Parquet row group, a CSV block), at most (on Dask, at
most in expectation: :func:`split` draws a file's pieces with the files): pieces of
this size let one be written while the next is computed (1 M rows in one piece wrote 0.03 s
slower at 1 M published rows, bench/sdgs.py)."""
ROWS_PER_PART = 2_000_000
"""Published rows per file of an output written on Dask, at most (:func:`part_count`)."""
ROWS_PER_PART_MIN = 1_000_000
"""Published rows per file of an output written on Dask, at least (:func:`part_count`; fewer
when fewer are published): a file costs its worker two tasks and a writer of its own beside
its rows' work (about 0.1 CPU s a million rows). 2 M rows published by 8 workers on 2 cores
(``bench/scale.py --worker-steps``): the workers' CPU of the output 0.32 s in 8 files of
250,000 rows, 0.25 s in 2 of 1 M."""
_ASSIGN_BATCH = 1 << 22
"""Published rows given a file per batch in :func:`assign_files` (bounds its memory)."""
_DENSE_KEYS = 1 << 24
"""Largest (file, cell) key space counted with ``np.bincount`` in :func:`assign_files`."""


def merge_counts(parts: Sequence[CellCounts]) -> CellCounts:
    """The cell counts of the union of the partitions' samples: ``counts[c] = sum_p n_{p,c}``
    over cells matched by their labels, cells in key order (mixed-radix key of the merged
    label codes, a function of the labels), ``rows_in`` / ``rows_sampled`` summed."""
    assert parts, "at least one partition"
    names = list(parts[0].labels)
    assert all(list(part.labels) == names for part in parts), "partitions generalize the same columns"
    labels: dict[str, pa.Array] = {}
    codes: list[np.ndarray] = []
    counted = [part for part in parts if len(part.counts)] or list(parts[:1])
    for name in names:
        arrays = [part.labels[name] for part in counted]
        if all(array.equals(arrays[0]) for array in arrays[1:]):
            labels[name] = arrays[0]
            codes.append(np.concatenate([part.codes[name] for part in counted]))
            continue
        merged = _label_order(pc.unique(pa.chunked_array(arrays, pa.string())))
        labels[name] = merged
        remaps = [
            pc.index_in(array, value_set=merged).to_numpy(zero_copy_only=False).astype(np.int32) for array in arrays
        ]
        codes.append(np.concatenate([remap[part.codes[name]] for remap, part in zip(remaps, counted)]))
    counts = np.concatenate([part.counts for part in counted]).astype(np.int64, copy=False)
    cell_codes, sums = _sum_by_cell(codes, [len(labels[name]) for name in names], counts)
    return CellCounts(
        labels=labels,
        codes=dict(zip(names, cell_codes)),
        counts=sums,
        rows_in=sum(part.rows_in for part in parts),
        rows_sampled=sum(part.rows_sampled for part in parts),
    )


def _label_order(labels: pa.Array) -> pa.Array:
    """Distinct ``labels`` in value order: numerically when every label is a number, possibly
    with a ``<=`` / ``>=`` prefix (``Keep`` of a numeric column, top/bottom coding: the
    in-process order), else in text order. A function of the label set alone."""
    text = labels.to_pylist()  # distinct labels: a short list
    try:
        values = [float(label.removeprefix("<=").removeprefix(">=")) for label in text]
    except ValueError:
        return labels.take(pc.sort_indices(labels))
    order = sorted(range(len(text)), key=lambda i: (values[i], text[i]))
    return labels.take(pa.array(order, pa.int64()))


def _sum_by_cell(
    codes: list[np.ndarray], radices: list[int], weights: np.ndarray
) -> tuple[list[np.ndarray], np.ndarray]:
    """Distinct rows of the code matrix (columns ``codes``) in key order, and per distinct row
    the sum of ``weights`` over its occurrences."""
    if len(weights) == 0:
        return [np.zeros(0, np.int32) for _ in codes], np.zeros(0, np.int64)
    if math.prod(radices) < _INT64_SAFE:
        key = np.ravel_multi_index(codes, radices)
    else:  # a huge label space: number the distinct code rows instead
        _, key = np.unique(np.stack(codes, axis=1), axis=0, return_inverse=True)
        key = key.reshape(-1)
    _, sums, first = _sum_by_key(key, weights)
    return [column[first].astype(np.int32, copy=False) for column in codes], sums


def _sum_by_key(key: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The distinct values of ``key`` (ascending), the sum of ``weights`` per value, and the
    position of one occurrence of each."""
    order = np.argsort(key, kind="stable")
    sorted_key = key[order]
    starts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])
    return sorted_key[starts], np.add.reduceat(weights[order], starts), order[starts]


def published_cells(cells: CellCounts, k: int) -> CellCounts:
    """The cells of the whole sample with at least k rows (labels unchanged)."""
    keep = np.flatnonzero(cells.counts >= k)
    return CellCounts(
        labels=cells.labels,
        codes={name: codes[keep] for name, codes in cells.codes.items()},
        counts=cells.counts[keep],
        rows_in=cells.rows_in,
        rows_sampled=cells.rows_sampled,
    )


def file_count(rows_published: int, rows_per_file: int) -> int:
    """How many output files: the smallest power of two ``J`` with ``rows_published / J <=
    rows_per_file`` (a function of the published row count only; a power of two lets
    :func:`assign_files` draw each file from ``log2 J`` uniform bits, exactly)."""
    if rows_per_file < 1:
        raise ValueError(f"rows_per_file must be >= 1; got {rows_per_file}")
    files = 1
    while files * rows_per_file < rows_published:
        files *= 2
    return files


def part_count(rows_published: int, workers: int) -> int:
    """How many files an output written on Dask is split into, each written by a worker
    (:func:`split`): :func:`file_count` with about ``rows_published / workers`` rows per file,
    at least :data:`ROWS_PER_PART_MIN` (a file's own costs stay small beside its rows') and at
    most :data:`ROWS_PER_PART` (a file a worker writes in about a second). A function of the
    published row count and the cluster's size, both public."""
    if workers < 1:
        raise ValueError(f"workers must be >= 1; got {workers}")
    share = -(-rows_published // workers)
    return file_count(rows_published, max(ROWS_PER_PART_MIN, min(ROWS_PER_PART, share)))


def assign_files(counts: np.ndarray, files: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Put each of the ``counts[c]`` rows of every cell c into one of ``files`` files (a power
    of two), each row independently and exactly uniformly at random (the low ``log2 files``
    bits of CSPRNG bytes). Per file: (cells with at least one row in it, ascending; their row
    counts there). Memory is bounded by batches of published rows."""
    assert files >= 1 and files & (files - 1) == 0, f"files must be a power of two; got {files}"
    if files == 1:  # every row in the one file: no draw needed
        present = np.flatnonzero(counts)
        return [(present, counts[present].astype(np.int64))]
    width = next(dtype for dtype in (np.uint8, np.uint16, np.uint32, np.uint64) if files - 1 <= np.iinfo(dtype).max)
    mask = width(files - 1)
    cells = len(counts)
    cumulative = np.cumsum(counts, dtype=np.int64)
    total = int(cumulative[-1]) if cells else 0
    dense = np.zeros(files * cells, np.int64) if files * cells <= _DENSE_KEYS else None
    pieces: list[tuple[np.ndarray, np.ndarray]] = []
    for start in range(0, total, _ASSIGN_BATCH):
        stop = min(total, start + _ASSIGN_BATCH)
        # rows [start, stop) in cell order: cell c holds rows [cumulative[c] - counts[c], cumulative[c])
        lo, hi = np.searchsorted(cumulative, [start, stop - 1], side="right")
        within = np.minimum(cumulative[lo : hi + 1], stop) - np.maximum(
            cumulative[lo : hi + 1] - counts[lo : hi + 1], start
        )
        cell = np.repeat(np.arange(lo, hi + 1), within)
        size = stop - start
        draws = randomness.random_uint64(-(-size * np.dtype(width).itemsize // 8)).view(width)[:size]
        key = np.bitwise_and(draws, mask).astype(np.int64) * cells + cell
        if dense is not None:
            dense += np.bincount(key, minlength=len(dense))
        else:
            pieces.append(np.unique(key, return_counts=True))
    if dense is not None:
        keys = np.flatnonzero(dense)
        sums = dense[keys]
    elif pieces:
        keys, sums, _ = _sum_by_key(np.concatenate([key for key, _ in pieces]), np.concatenate([n for _, n in pieces]))
    else:
        keys = sums = np.zeros(0, np.int64)
    file_of, cell_of = np.divmod(keys, max(cells, 1))
    bounds = np.searchsorted(file_of, np.arange(files + 1))
    return [(cell_of[lo:hi], sums[lo:hi].astype(np.int64)) for lo, hi in zip(bounds[:-1], bounds[1:])]


def file_table(cells: CellCounts, which: np.ndarray, counts: np.ndarray) -> pa.Table:
    """One output file: ``counts[i]`` copies of cell ``which[i]`` of ``cells`` (``which``
    distinct), in uniformly random order (:func:`.sdgs.shuffled_repeat`), as dictionary-encoded
    label columns whose dictionaries hold only the labels in this file."""
    present = counts > 0
    which, counts = which[present], counts[present]
    rows = shuffled_repeat(np.arange(len(which)), counts)
    return pa.table(cells.label_columns(which, rows))


def empty_output(cells: CellCounts) -> pa.Table:
    """A table with no rows and the output's columns."""
    return file_table(cells, np.zeros(0, np.int64), np.zeros(0, np.int64))


def result(cells: CellCounts, *, k: int, beta: float, epsilon: float) -> MechanismResult:
    """The facts and the SDGS event of a release whose merged counts are ``cells`` (the table
    is an empty one with the output's columns: the rows are in the files)."""
    return release(cells, empty_output(cells), k=k, beta=beta, epsilon=epsilon, output="microdata")


def microdata(
    merged: CellCounts,
    *,
    k: int,
    beta: float,
    epsilon: float,
    rows_per_file: int = ROWS_PER_FILE,
    confidence: float | None = None,
) -> MechanismResult:
    """SDGS's output from the cell counts of the whole sample: every cell with ``n_c >= k``
    with its ``n_c`` rows, the rows split over :func:`file_count` pieces (each row in a
    uniformly random one, :func:`assign_files`), each piece in uniformly random order
    (:func:`file_table`) and computed only as it is written (:func:`pieces`, in this process
    or on a Dask worker: :class:`.results.Pieces`); the facts and event of :func:`result`;
    with ``confidence``, the published cells with their count intervals as a companion output
    (:func:`.sdgs.with_cells`)."""
    published = published_cells(merged, k)
    outcome = result(merged, k=k, beta=beta, epsilon=epsilon)
    make = functools.partial(pieces, published, file_count(int(published.counts.sum()), rows_per_file))
    rows = MechanismResult(
        Pieces(outcome.table.schema, make(), remote=functools.partial(split, published, rows_per_file)),
        outcome.event,
        outcome.public_facts,
        outcome.internal_facts,
    )
    return with_cells(rows, merged, k=k, beta=beta, confidence=confidence)


def pieces(published: CellCounts, files: int) -> Iterator[pa.Table]:
    """The published rows of ``published`` (each cell with its count) as ``files`` pieces, each
    row in a uniformly random one (:func:`assign_files`, drawn at the first piece), each piece
    in uniformly random order (:func:`file_table`), computed one at a time: no piece exists
    before it is asked for, wherever this runs (the flow's process, or a Dask worker)."""
    yield from drawn_pieces(published, assign_files(published.counts, files))


def drawn_pieces(cells: CellCounts, drawn: Iterable[tuple[np.ndarray, np.ndarray]]) -> Iterator[pa.Table]:
    """The pieces whose rows are ``drawn`` (per piece: which cells of ``cells``, how many rows
    of each), each in uniformly random order (:func:`file_table`), computed one at a time."""
    for which, counts in drawn:
        yield file_table(cells, which, counts)


def split(
    published: CellCounts, rows_per_file: int, workers: int, gather: Callable[..., list[Any]]
) -> list[functools.partial[Iterator[pa.Table]]]:
    """The published rows of ``published`` split over :func:`part_count` files of ``J``
    pieces each (``J``: :func:`file_count` of a file's expected rows), each row in a uniformly
    random piece of a uniformly random file, each file as a picklable function giving its
    pieces (:func:`drawn_pieces`, each in uniformly random order: the file is a uniformly
    random order of its rows), to be computed and written where it runs. Files and pieces are
    drawn together, one :func:`assign_files` over every (file, piece) pair, on slices of the
    cells of about equal rows (as many as files, at most ``workers``), mapped by
    ``gather(assign_files, slices, files=F * J)`` (on Dask over the cluster,
    :func:`.flows.engines.map_gather`): every row independently, as one draw over all rows;
    only counts per (piece, cell) come back, no row is built here. One file draws its own
    pieces where it is written (:func:`pieces`)."""
    counts = published.counts
    total = int(counts.sum())
    files = part_count(total, workers)
    per_file = file_count(-(-total // files), rows_per_file)
    if files == 1:
        return [functools.partial(pieces, published, per_file)]
    bounds = equal_runs(counts, min(files, workers))
    drawn = gather(assign_files, [counts[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])], files=files * per_file)
    slots = [
        (
            np.concatenate([part[slot][0] + lo for part, lo in zip(drawn, bounds[:-1])]),
            np.concatenate([part[slot][1] for part in drawn]),
        )
        for slot in range(files * per_file)
    ]
    return [_file(published, slots[j * per_file : (j + 1) * per_file]) for j in range(files)]


def equal_runs(weights: Sequence[int] | np.ndarray, runs: int) -> np.ndarray:
    """Bounds ``b`` (``b[0] = 0``, ``b[-1] = len(weights)``) of at most ``runs`` runs of
    consecutive items of about equal total weight, none empty: each item goes to the run its
    weight's midpoint falls in."""
    weights = np.asarray(weights, dtype=np.float64)
    if len(weights) == 0:
        return np.zeros(1, np.int64)
    cumulative = np.cumsum(weights)
    cuts = np.searchsorted(cumulative - weights / 2, cumulative[-1] * np.arange(1, runs) / runs)
    return np.unique(np.r_[0, cuts, len(weights)]).astype(np.int64)


def _file(published: CellCounts, drawn: list[tuple[np.ndarray, np.ndarray]]) -> functools.partial[Iterator[pa.Table]]:
    """One file's :func:`drawn_pieces`, over the cells it holds alone (what travels to its
    worker)."""
    held = np.unique(np.concatenate([which for which, _ in drawn]))
    local = [(np.searchsorted(held, which), counts) for which, counts in drawn]
    rows = np.zeros(len(held), np.int64)
    for which, counts in local:
        rows[which] += counts  # a piece holds each of its cells once
    return functools.partial(drawn_pieces, _subset(published, held, rows), local)


def _subset(cells: CellCounts, which: np.ndarray, counts: np.ndarray) -> CellCounts:
    """The cells ``which`` of ``cells`` with ``counts`` rows each (labels unchanged)."""
    return CellCounts(
        labels=cells.labels,
        codes={name: codes[which] for name, codes in cells.codes.items()},
        counts=counts,
        rows_in=cells.rows_in,
        rows_sampled=cells.rows_sampled,
    )


def streamed_sdgs(
    partitions: Iterable[pa.Table],
    schemes: Mapping[str, ColumnScheme],
    *,
    k: int,
    beta: float,
    epsilon: float,
    rows_per_file: int = ROWS_PER_FILE,
) -> MechanismResult:
    """(k, beta)-SDGS microdata of the rows of all ``partitions`` together, one partition in
    memory at a time (plus the counts): per partition its own Bernoulli(beta) sample counted
    per cell (:func:`.sdgs.count_cells`, the Dask job's partial), the counts added up
    (:func:`merge_counts`), the output as :func:`microdata` pieces. The steps the Dask engine
    and an in-process release of a Parquet file run (:mod:`privrelease.flows.scaled`), here
    from tables; the same output distribution as :func:`.sdgs.sdgs` of their concatenation."""
    check_parameters(k, beta, epsilon)
    merged = merge_counts([count_cells(table, schemes, beta=beta) for table in partitions])
    return microdata(merged, k=k, beta=beta, epsilon=epsilon, rows_per_file=rows_per_file)
