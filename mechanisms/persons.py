"""Contribution bounding: at most ``m`` rows of each person, kept uniformly at random.

A policy's ``dataset.person: {column, max_rows}`` makes the unit of privacy a person (every row
with the same value of ``column``). Before any mechanism runs, each person's rows beyond
``max_rows`` are dropped uniformly at random (never a refusal: a refusal would tell whether
someone has more rows), so adding or removing one person changes at most ``max_rows`` of the
rows the mechanisms read, whatever the number of rows that person had (as Tumult Analytics'
``max_rows_per_id`` truncation and OpenDP's contribution bounding). A kind whose paper assumes
one row per person (SDGS, crowd-blending histograms, SPLU-Gen, identifiable statistics) reads
ONE random row per person (:func:`keep_at_most` with 1, applied to the kept rows: uniform over
all of the person's rows); noisy counts read all ``max_rows`` with sensitivity ``max_rows``.

The rows are put in a uniformly random order (:func:`.randomness.permutation`, OS CSPRNG) and
then sorted by person, stably: within a person the order is uniformly random, and the first
``m`` of each person (rank within the person's run of rows below ``m``) are kept. Vectorized: a
sort and a cumulative maximum, no loop per row or per person.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from privrelease.mechanisms.randomness import permutation

ONE_ROW = "one random row per person"
MAX_ROWS = "at most max_rows rows per person, with sensitivity max_rows"


def person_codes(values: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """One integer per row naming its person (equal values, equal codes), for any column type."""
    array = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    return np.asarray(array.dictionary_encode().indices.to_numpy(zero_copy_only=False), dtype=np.int64)


def kept_rows(codes: np.ndarray, max_rows: int) -> np.ndarray:
    """Indices of the rows kept: for each person (equal ``codes``), ``min(max_rows, n)`` of its
    ``n`` rows, a uniformly random subset; in random order within each person, people in order
    of their codes (never the input order)."""
    shuffled = permutation(codes.size)
    order = shuffled[np.argsort(codes[shuffled], kind="stable")]
    grouped = codes[order]
    positions = np.arange(grouped.size)
    starts = np.ones(grouped.size, dtype=bool)
    starts[1:] = grouped[1:] != grouped[:-1]
    rank = positions - np.maximum.accumulate(np.where(starts, positions, 0))
    return order[rank < max_rows]


def keep_at_most(table: pa.Table, column: str, max_rows: int) -> pa.Table:
    """``table`` with at most ``max_rows`` rows of each person (equal values of ``column``),
    each person's kept rows a uniformly random subset of its rows (:func:`kept_rows`)."""
    if not table.num_rows:
        return table
    return table.take(pa.array(kept_rows(person_codes(table[column]), max_rows)))
