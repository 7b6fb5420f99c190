"""(k, beta)-SDGS microdata (Li, Qardaji, Su, "Provably Private Data Anonymization", Algorithm 4).

Three steps: (1) keep each input row independently with probability beta (Bernoulli sampling
from the OS CSPRNG); (2) generalize the sampled rows with a data-independent scheme; (3) suppress
every generalized row whose value combination (its *cell*) occurs fewer than k times in the
sample. By Theorem 1 (proof: n_m = ceil(k / gamma - 1)) the output is (epsilon, delta)-DP for
epsilon >= -ln(1 - beta) and

    delta = d(k, beta, epsilon) = max_{n >= n_m} sum_{j > gamma n}^{n} f(j; n, beta),
    gamma = (e^epsilon - 1 + beta) / e^epsilon,

f the binomial pmf. The arithmetic lives in the accountants; this module realizes the event
``SDGS(k, beta, epsilon, output="microdata")``.

Fast design: only the sampled rows are generalized (:func:`.generalization.encode` gathers
per-distinct-value lookups), each sampled row becomes one mixed-radix integer key, cells are
counted with ``np.bincount`` (``np.unique`` when the key space is large), and the output is
written from the counts of the surviving cells: ``count`` copies of each cell, in uniformly
random order (``randomness.permutation``), decoded to dictionary-encoded label columns.
:func:`count_cells` is shared with the crowd-blending histogram (:mod:`.histogram`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa

from privrelease.mechanisms import randomness
from privrelease.mechanisms.events import SDGS
from privrelease.mechanisms.generalization import CodedColumn, dictionary_column, encode, encode_column
from privrelease.mechanisms.results import MechanismResult
from privrelease.mechanisms.schemes import ColumnScheme
from privrelease.mechanisms.sdgs_math import check_parameters

_BINCOUNT_MAX = 1 << 24
"""Largest key space counted with ``np.bincount`` (128 MiB of counts); beyond, ``np.unique``."""
_INT64_SAFE = 1 << 62


@dataclass(frozen=True)
class CellCounts:
    """The generalized cells of a sample: ``counts[c]`` rows (>= 1) have the label combination
    ``labels[name][codes[name][c]]`` for every column ``name``. Cells are in key order (a
    function of the labels, never of the input row order)."""

    labels: dict[str, pa.Array]
    codes: dict[str, np.ndarray]
    counts: np.ndarray
    rows_in: int
    rows_sampled: int

    def label_columns(self, cells: np.ndarray, rows: np.ndarray | None = None) -> dict[str, pa.DictionaryArray]:
        """The labels of the cells ``cells`` (distinct cell indices), one row per cell, or one
        row per entry of ``rows`` (indices into ``cells``, each used at least once)."""
        return {name: dictionary_column(self.codes[name][cells], self.labels[name], rows) for name in self.labels}


def count_cells(table: pa.Table, schemes: Mapping[str, ColumnScheme], *, beta: float) -> CellCounts:
    """Bernoulli(beta)-sample the rows of ``table`` (all rows when beta == 1), generalize the
    sampled rows with ``schemes`` and count the rows per cell (distinct label combination)."""
    counter = CellCounter(table.num_rows, schemes, beta=beta)
    return counter.counted(encode(table, schemes, counter.sample))


class CellCounter:
    """:func:`count_cells` of a table of ``rows`` rows given one column at a time: the
    Bernoulli(beta) sample is drawn first, each column a scheme names is generalized on the
    sampled rows as it comes (:meth:`add`) and can then be dropped, the cells are counted at
    the end (:meth:`result`). A partition read column by column is so counted without its
    columns ever held together (:func:`privrelease.flows.partitions.partials`)."""

    def __init__(self, rows: int, schemes: Mapping[str, ColumnScheme], *, beta: float):
        self.rows_in, self.schemes = rows, schemes
        self.sample = None if beta == 1 else np.flatnonzero(randomness.bernoulli(rows, beta))
        """The sampled rows' positions (None: every row)."""
        self._coded: dict[str, CodedColumn] = {}

    def add(self, name: str, column: pa.ChunkedArray) -> None:
        """Generalize the sampled rows of column ``name`` (of ``rows`` rows; ignored when no
        scheme names it)."""
        if name in self.schemes:
            self._coded[name] = encode_column(column, self.schemes[name], name=name, rows=self.sample)

    def result(self) -> CellCounts:
        """The cells of the columns added (every column a scheme names)."""
        return self.counted(self._coded)

    def counted(self, coded: Mapping[str, CodedColumn]) -> CellCounts:
        """The cells of the sampled rows generalized as ``coded`` (a column per scheme)."""
        names = list(self.schemes)
        assert all(name in coded for name in names), "every column a scheme names is generalized"
        cell_codes, counts = _count(
            [coded[name].codes for name in names],
            [len(coded[name].labels) for name in names],
        )
        return CellCounts(
            labels={name: coded[name].labels for name in names},
            codes=dict(zip(names, cell_codes)),
            counts=counts,
            rows_in=self.rows_in,
            rows_sampled=self.rows_in if self.sample is None else len(self.sample),
        )


def shuffled_repeat(cells: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """``np.repeat(cells, counts)`` (``cells`` distinct, >= 0) in uniformly random order.

    Each entry gets a uniform random 64-bit key from the OS CSPRNG whose low ``b`` bits
    (``b`` = bits of the largest cell) are replaced by its cell; sorting the keys orders the
    entries by ``64 - b`` random bits, and the low bits give back the cells. Equal cells are
    identical rows, so this is a uniformly random order of the rows except when two random
    parts tie (probability below m^2 / 2^(65 - b) for m entries), where ties go by cell: a
    function of the published multiset, never of the input order. ``np.sort`` of 64-bit keys
    is ~10x faster than the stable ``argsort`` of :func:`randomness.permutation` on millions.
    """
    bits = int(cells.max()).bit_length() if len(cells) else 0
    low = np.uint64((1 << bits) - 1)
    keys = randomness.random_uint64(int(counts.sum())) & ~low
    keys |= np.repeat(cells.astype(np.uint64), counts)
    keys.sort()
    keys &= low  # in place: cells < 2^63, so the bits read as int64 are the cells
    return keys.view(np.int64)


def _count(codes: list[np.ndarray], radices: list[int]) -> tuple[list[np.ndarray], np.ndarray]:
    """Distinct rows of the code matrix (columns ``codes``, column i in ``[0, radices[i])``):
    per column the code of each distinct row, and the number of rows equal to it."""
    size = len(codes[0])
    if size == 0:
        return [np.zeros(0, np.int32) for _ in codes], np.zeros(0, np.int64)
    space = math.prod(radices)
    if space <= _BINCOUNT_MAX:
        small_key = np.zeros(size, np.int32)  # space <= 2^24: no overflow
        for column, radix in zip(codes, radices):
            small_key *= np.int32(radix)
            small_key += column
        counts = np.bincount(small_key, minlength=space)
        present = np.flatnonzero(counts)
        cell_codes = []
        remainder = present
        for radix in reversed(radices):
            cell_codes.append((remainder % radix).astype(np.int32))
            remainder = remainder // radix
        return cell_codes[::-1], counts[present]
    key: np.ndarray[Any, Any] = codes[0].astype(np.int64)
    span = radices[0]
    for column, radix in zip(codes[1:], radices[1:]):
        if span * radix >= _INT64_SAFE:  # re-number the distinct prefixes densely
            distinct, key = np.unique(key, return_inverse=True)
            span = len(distinct)
        key = key * radix + column
        span *= radix
    _, first, counts = np.unique(key, return_index=True, return_counts=True)
    return [column[first] for column in codes], counts


def utility_delivered(
    counts: np.ndarray, published: np.ndarray, *, k: int, beta: float, rows_in: int
) -> dict[str, float | int | None]:
    """What the release delivered, for internal review only (it describes the data): the share
    of sampled rows published, the estimated share of the people whose cell was published
    (``rows published / (beta rows in)``), and two information-loss measures of the
    generalization and suppression as ARX reports them: the discernibility metric
    ``sum over published cells of n_c^2 + (rows suppressed) (rows sampled)`` (Bayardo &
    Agrawal, ICDE 2005) and the normalized average class size
    ``rows published / (cells published k)`` (C_AVG, LeFevre, DeWitt & Ramakrishnan, ICDE 2006;
    1 is the ideal: every class just k rows)."""
    sampled = int(counts.sum())
    kept = int(counts[published].sum())
    cells_kept = int(published.sum())
    return {
        "share_of_sampled_rows_published": kept / sampled if sampled else None,
        "share_of_people_in_published_cells_estimated": min(1.0, kept / (beta * rows_in)) if rows_in else None,
        "discernibility": int(np.sum(counts[published].astype(np.int64) ** 2)) + (sampled - kept) * sampled,
        "average_class_size_normalized": kept / (cells_kept * k) if cells_kept else None,
    }


def release(
    cells: CellCounts,
    table: pa.Table,
    *,
    k: int,
    beta: float,
    epsilon: float,
    output: Literal["microdata", "histogram"],
) -> MechanismResult:
    """The :class:`MechanismResult` of publishing ``table``, built from ``cells`` (the cells
    with count >= k), with the SDGS event and the public / internal facts."""
    published = cells.counts >= k
    public = {
        "k": k,
        "beta": beta,
        "epsilon": epsilon,
        "columns": list(cells.labels),
        "rows_published": int(cells.counts[published].sum()),
        "cells_published": int(published.sum()),
    }
    if not published.any():
        public["explanation"] = f"nothing is published: every generalized cell of the sample has fewer than k={k} rows"
    internal = {
        "rows_in": cells.rows_in,
        "rows_sampled": cells.rows_sampled,
        "rows_suppressed": int(cells.counts[~published].sum()),
        "cells_suppressed": int((~published).sum()),
        **utility_delivered(cells.counts, published, k=k, beta=beta, rows_in=cells.rows_in),
    }
    event = SDGS(k=k, beta=beta, epsilon=epsilon, output=output)
    return MechanismResult(table=table, event=event, public_facts=public, internal_facts=internal)


def published_cells_table(cells: CellCounts, *, k: int, beta: float, confidence: float) -> pa.Table:
    """One row per cell with at least k rows in the sample, in uniformly random order: its
    labels (dictionary-encoded), ``count`` (int64), ``estimate`` = count / beta (float64) and the
    exact interval [``lower``, ``upper``] (int64) for the people behind the count at
    ``confidence``, conditional on publication (:func:`.count_intervals.count_intervals`,
    vectorized over the distinct counts). A function of the published cells and the public
    k, beta, C: post-processing. A crowd-blending histogram publishes it; SDGS microdata
    publishes it beside the rows (the rows grouped by cell)."""
    from privrelease.mechanisms.columns import COUNT, HISTOGRAM
    from privrelease.mechanisms.count_intervals import count_intervals

    published = np.flatnonzero(cells.counts >= k)
    published = published[randomness.permutation(len(published))]
    columns: dict[str, pa.Array] = dict(cells.label_columns(published))
    counts = np.asarray(cells.counts[published], dtype=np.int64)
    intervals = count_intervals(counts, k, beta, confidence)
    columns[COUNT] = pa.array(counts, pa.int64())
    estimate, lower, upper = HISTOGRAM[1:]
    columns[estimate] = pa.array(intervals.estimate, pa.float64())
    columns[lower] = pa.array(intervals.lower, pa.int64())
    columns[upper] = pa.array(intervals.upper, pa.int64())
    return pa.table(columns)


def with_cells(
    result: MechanismResult, cells: CellCounts, *, k: int, beta: float, confidence: float | None
) -> MechanismResult:
    """``result`` with its published cells as a companion output (:func:`published_cells_table`);
    unchanged when ``confidence`` is None."""
    if confidence is None:
        return result
    from dataclasses import replace

    return replace(result, cells=published_cells_table(cells, k=k, beta=beta, confidence=confidence))


def sdgs(
    table: pa.Table,
    schemes: Mapping[str, ColumnScheme],
    *,
    k: int,
    beta: float,
    epsilon: float,
    confidence: float | None = None,
) -> MechanismResult:
    """(k, beta)-SDGS microdata of the columns in ``schemes``: the sampled, generalized rows
    whose cell has at least k sampled rows, in uniformly random order, as dictionary-encoded
    label columns (an empty table with these columns when every row is suppressed, explained
    in ``public_facts["explanation"]``).

    ``public_facts``: k, beta, epsilon, columns, rows_published, cells_published (all derivable
    from the output). ``internal_facts``: rows_in, rows_sampled, rows_suppressed,
    cells_suppressed and :func:`utility_delivered` (they describe the input). With
    ``confidence``, the published cells with their count intervals as a companion output
    (:func:`with_cells`)."""
    check_parameters(k, beta, epsilon)
    cells = count_cells(table, schemes, beta=beta)
    published = np.flatnonzero(cells.counts >= k)
    rows = shuffled_repeat(np.arange(len(published)), cells.counts[published])
    output = pa.table(cells.label_columns(published, rows))
    result = release(cells, output, k=k, beta=beta, epsilon=epsilon, output="microdata")
    return with_cells(result, cells, k=k, beta=beta, confidence=confidence)
