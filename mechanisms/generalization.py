"""Applying data-independent generalization schemes to columns, vectorized.

A :data:`~privrelease.mechanisms.schemes.ColumnScheme` maps each input value to one output
label, decided by the scheme alone, never by the data (that is what SDGS's privacy rests on:
Li, Qardaji, Su, Algorithm 4, "data-independent generalization"). The work is done once per
*distinct* value (a column's dictionary, or the range of a small-range integer column) and then
gathered per row with numpy, so there is no Python loop per row.

Every scheme's label set is data-independent except for :class:`Keep` and
:class:`TopBottomCoding`, which publish input values as text; their label dictionaries are sorted
(by value), never in order of first appearance, so they carry nothing of the input row order.

A value outside the scheme's domain (not in a :class:`ValueMap` without default, outside the
edges of :class:`Bins`, a missing value) is a :class:`UserError` naming the column, the 1-based
row number and the value. The domain is checked on every row, even where only a sample is
generalized, so whether a run fails never depends on the sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from privrelease.errors import UserError
from privrelease.mechanisms.schemes import (
    SUPPRESSED,
    Bins,
    ColumnScheme,
    Keep,
    Suppress,
    TopBottomCoding,
    ValueMap,
)

_DENSE_INT_RANGE = 1 << 16
"""An integer column whose values span fewer than this many integers is coded as value - min
(no hashing); wider ones are dictionary-encoded."""


@dataclass(frozen=True)
class CodedColumn:
    """One generalized column: ``codes[i]`` (int32) indexes ``labels`` (string) for row i."""

    codes: np.ndarray
    labels: pa.Array


@dataclass(frozen=True)
class _Chunk:
    """Rows of one source chunk as ``values[codes - offset]``."""

    values: pa.Array
    codes: np.ndarray
    offset: int


def generalize(table: pa.Table, schemes: Mapping[str, ColumnScheme]) -> pa.Table:
    """The columns named in ``schemes`` (in that order), each generalized by its scheme, as
    dictionary-encoded string labels in input row order (a transform, not a release: the
    mechanisms that publish shuffle their output). The dictionaries hold only used labels.

    >>> from privrelease.mechanisms.schemes import Bins
    >>> ages = pa.table({"age": [3, 17, 30, 65]})
    >>> generalize(ages, {"age": Bins(edges=(0, 18, 65))}).column("age").to_pylist()
    ['0-18', '0-18', '18-65', '18-65']
    """
    coded = encode(table, schemes)
    return pa.table({name: dictionary_column(column.codes, column.labels) for name, column in coded.items()})


def encode(
    table: pa.Table, schemes: Mapping[str, ColumnScheme], rows: np.ndarray | None = None
) -> dict[str, CodedColumn]:
    """Generalize the rows at positions ``rows`` (all rows when None; sorted, distinct) of every
    column in ``schemes``. Domains are checked on all rows first."""
    if not schemes:
        raise UserError("schemes must name at least one column to generalize")
    for name in schemes:
        if name not in table.column_names:
            raise UserError(
                f"generalization scheme names column {name!r}, which the data does not have;"
                f" its columns are: {', '.join(map(repr, table.column_names))}"
            )
    # chunk-local row positions, computed once per chunk layout (columns usually share one)
    splits: dict[tuple[int, ...], list[np.ndarray | None]] = {}
    return {name: _encode(table.column(name), scheme, name, rows, splits) for name, scheme in schemes.items()}


def encode_column(
    column: pa.ChunkedArray | pa.Array,
    scheme: ColumnScheme,
    *,
    name: str,
    rows: np.ndarray | None = None,
) -> CodedColumn:
    """Generalize one column (see :func:`encode`)."""
    if isinstance(column, pa.Array):
        column = pa.chunked_array([column])
    return _encode(column, scheme, name, rows, {})


def _encode(
    column: pa.ChunkedArray,
    scheme: ColumnScheme,
    name: str,
    rows: np.ndarray | None,
    splits: dict[tuple[int, ...], list[np.ndarray | None]],
) -> CodedColumn:
    _reject_nulls(column, name)
    chunks = _source_chunks(column)
    empty = pa.array([], column.type.value_type if pa.types.is_dictionary(column.type) else column.type)
    distinct = _distinct_value_sets(chunks)
    labels = _label_set(scheme, distinct or [empty], name)  # no rows: the column's type still decides
    lookups = [(values, _lookup(values, scheme, labels, name)) for values in distinct]
    luts = [next(lut for values, lut in lookups if values is chunk.values) for chunk in chunks]
    _check_domain(chunks, luts, scheme, name)
    lengths = tuple(len(chunk.codes) for chunk in chunks)
    if lengths not in splits:
        splits[lengths] = _split_rows(lengths, rows)
    codes = np.empty(sum(lengths) if rows is None else len(rows), np.int32)
    at = 0
    for chunk, lut, local in zip(chunks, luts, splits[lengths]):
        if local is None:
            source = chunk.codes - chunk.offset if chunk.offset else chunk.codes
        else:
            source = chunk.codes[local]
            if chunk.offset:
                source -= chunk.offset  # a gathered copy: no second array
        # mode="clip": the codes index their lookup table, no bounds check needed
        np.take(lut, source, out=codes[at : at + len(source)], mode="clip")
        at += len(source)
    return CodedColumn(codes=codes, labels=labels)


def _split_rows(lengths: tuple[int, ...], rows: np.ndarray | None) -> list[np.ndarray | None]:
    """Per chunk of these lengths, the chunk-local positions of ``rows`` (None: all rows)."""
    if rows is None:
        return [None] * len(lengths)
    starts = np.cumsum((0, *lengths))
    bounds = np.searchsorted(rows, starts)
    return [
        rows[lo:hi] - start if start else rows[lo:hi] for lo, hi, start in zip(bounds[:-1], bounds[1:], starts[:-1])
    ]


def dictionary_column(codes: np.ndarray, labels: pa.Array, take: np.ndarray | None = None) -> pa.DictionaryArray:
    """``labels[codes]`` (``labels[codes][take]`` when ``take`` is given) as a dictionary array
    whose dictionary keeps only the labels occurring in ``codes``, in their order in
    ``labels`` (so the dictionary reveals nothing beyond the rows; with ``take``, every entry
    of ``codes`` must be taken)."""
    used = np.zeros(len(labels), bool)
    used[codes] = True
    remap = (np.cumsum(used, dtype=np.int32) - 1)[codes]
    indices = remap if take is None else remap[take]
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), labels.filter(pa.array(used)))


def _reject_nulls(column: pa.ChunkedArray, name: str) -> None:
    if column.null_count:
        row = int(np.argmax(column.is_null().to_numpy(zero_copy_only=False)))
        raise UserError(f"column {name!r} has a missing value (null) at row {row + 1}")


def _source_chunks(column: pa.ChunkedArray) -> list[_Chunk]:
    """The column as codes into per-chunk distinct values."""
    if pa.types.is_dictionary(column.type):
        return [_Chunk(chunk.dictionary, chunk.indices.to_numpy(), 0) for chunk in column.chunks]
    if pa.types.is_integer(column.type) and len(column):
        bounds = pc.min_max(column)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
        if high - low < _DENSE_INT_RANGE:
            values = pa.array(np.arange(low, high + 1, dtype=np.int64))
            return [_Chunk(values, chunk.to_numpy(), low) for chunk in column.chunks]
    encoded = pc.dictionary_encode(column)
    return [_Chunk(chunk.dictionary, chunk.indices.to_numpy(), 0) for chunk in encoded.chunks]


def _distinct_value_sets(chunks: list[_Chunk]) -> list[pa.Array]:
    """The chunks' value arrays without repeats; a chunk whose values equal an earlier chunk's
    is given that chunk's array (Parquet row groups usually repeat one dictionary)."""
    distinct: list[pa.Array] = []
    for index, chunk in enumerate(chunks):
        same = next(
            (values for values in distinct if values is chunk.values or values.equals(chunk.values)),
            None,
        )
        if same is None:
            distinct.append(chunk.values)
        else:
            chunks[index] = _Chunk(same, chunk.codes, chunk.offset)
    return distinct


def _as_text(values: pa.Array) -> pa.Array:
    return values if pa.types.is_string(values.type) else values.cast(pa.string())


def _numeric(values: pa.Array, scheme: ColumnScheme, name: str) -> np.ndarray:
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
        raise UserError(f"column {name!r}: {type(scheme).__name__} needs a numeric column; it holds {values.type}")
    return values.to_numpy(zero_copy_only=False).astype(np.float64)


def _bin_labels(scheme: Bins, name: str) -> list[str]:
    edges = scheme.edges
    if len(edges) < 2 or any(not a < b for a, b in pairwise(edges)):
        raise UserError(f"column {name!r}: bin edges must be at least two, strictly increasing; got {edges}")
    if scheme.labels is None:
        return [f"{lo:g}-{hi:g}" for lo, hi in pairwise(edges)]
    if len(scheme.labels) != len(edges) - 1:
        raise UserError(
            f"column {name!r}: {len(edges) - 1} bins need {len(edges) - 1} labels; got {len(scheme.labels)}"
        )
    return list(scheme.labels)


def _top_bottom_text(values: pa.Array, scheme: TopBottomCoding, name: str) -> pa.Array:
    numbers = _numeric(values, scheme, name)
    text = np.array(_as_text(values).to_pylist(), dtype=object)
    if scheme.lower is not None:
        text[numbers <= scheme.lower] = f"<={scheme.lower:g}"
    if scheme.upper is not None:
        text[numbers >= scheme.upper] = f">={scheme.upper:g}"
    return pa.array(text, pa.string())


def _label_set(scheme: ColumnScheme, distinct: list[pa.Array], name: str) -> pa.Array:
    """All labels the scheme can produce on these values, in a data-independent order."""
    if isinstance(scheme, Suppress):
        labels = [SUPPRESSED]
    elif isinstance(scheme, ValueMap):
        labels = [label for _, label in scheme.mapping]
        if scheme.default is not None:
            labels.append(scheme.default)
    elif isinstance(scheme, Bins):
        labels = _bin_labels(scheme, name)
    elif isinstance(scheme, (Keep, TopBottomCoding)):
        values = pc.unique(pa.chunked_array(distinct, distinct[0].type if distinct else pa.string()))
        values = values.take(pc.sort_indices(values))
        text = _as_text(values) if isinstance(scheme, Keep) else _top_bottom_text(values, scheme, name)
        labels = text.to_pylist()
    else:
        raise UserError(f"column {name!r}: unknown generalization scheme {scheme!r}")
    return pa.array(list(dict.fromkeys(labels)), pa.string())


def _lookup(values: pa.Array, scheme: ColumnScheme, labels: pa.Array, name: str) -> np.ndarray:
    """For each distinct value, the index of its label in ``labels``; -1 outside the domain."""
    if isinstance(scheme, Suppress):
        return np.zeros(len(values), np.int32)
    if isinstance(scheme, Bins):
        numbers = _numeric(values, scheme, name)
        edges = np.asarray(scheme.edges, dtype=np.float64)
        index = np.searchsorted(edges, numbers, side="right") - 1
        index[numbers == edges[-1]] = len(edges) - 2  # the last bin is closed
        index[(numbers < edges[0]) | (numbers > edges[-1])] = -1
        # labels may repeat (two bins, one label): map bin -> position of its label
        bin_label = pc.index_in(pa.array(_bin_labels(scheme, name)), value_set=labels).to_numpy()
        return np.where(index >= 0, bin_label[index], -1).astype(np.int32)
    if isinstance(scheme, ValueMap):
        keys = pa.array([key for key, _ in scheme.mapping], pa.string())
        targets = pc.index_in(
            pa.array([label for _, label in scheme.mapping], pa.string()),
            value_set=labels,
        ).to_numpy(zero_copy_only=False)
        position = pc.index_in(_as_text(values), value_set=keys).fill_null(-1).to_numpy()
        default = -1 if scheme.default is None else labels.index(scheme.default).as_py()
        return np.where(position >= 0, targets[position], default).astype(np.int32)
    text = _as_text(values) if isinstance(scheme, Keep) else _top_bottom_text(values, scheme, name)
    return pc.index_in(text, value_set=labels).fill_null(-1).to_numpy().astype(np.int32)


def _describe(scheme: ColumnScheme) -> str:
    if isinstance(scheme, Bins):
        return f"bins cover [{scheme.edges[0]:g}, {scheme.edges[-1]:g}]"
    if isinstance(scheme, ValueMap):
        return f"the value map has {len(scheme.mapping)} values and no default"
    return "outside the scheme's domain"


def _check_domain(chunks: list[_Chunk], luts: list[np.ndarray], scheme: ColumnScheme, name: str) -> None:
    start = 0
    for chunk, lut in zip(chunks, luts):
        if (lut < 0).any():
            bad = np.flatnonzero(lut[chunk.codes - chunk.offset] < 0)
            if bad.size:
                row = int(bad[0])
                value = chunk.values[int(chunk.codes[row]) - chunk.offset].as_py()
                raise UserError(
                    f"column {name!r}: value {value!r} at row {start + row + 1} is outside the"
                    f" generalization scheme's domain ({_describe(scheme)})"
                )
        start += len(chunk.codes)
