"""Generalization: every scheme kind, domain errors naming column / row / value, data independence."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from privrelease.errors import UserError
from privrelease.mechanisms.generalization import encode, encode_column, generalize
from privrelease.mechanisms.schemes import (
    Bins,
    Keep,
    Suppress,
    TopBottomCoding,
    ValueMap,
)


def labels(table: pa.Table, name: str) -> list:
    return table.column(name).cast(pa.string()).to_pylist()


def test_every_scheme_kind() -> None:
    table = pa.table(
        {
            "age": [0, 9, 10, 25, 30],
            "job": ["nurse", "cook", "nurse", "pilot", "cook"],
            "city": ["a", "b", "c", "d", "e"],
            "income": [5.0, 100.0, 250.5, 1000.0, 40.0],
        }
    )
    schemes = {
        "age": Bins(edges=(0, 10, 30)),
        "job": ValueMap(mapping=(("nurse", "care"), ("cook", "food")), default="other"),
        "city": Suppress(),
        "income": TopBottomCoding(lower=10, upper=1000),
        "extra": Keep(),
    }
    table = table.append_column("extra", pa.array([3, 1, 2, 3, 1]))
    out = generalize(table, schemes)
    assert out.column_names == list(schemes)
    assert all(pa.types.is_dictionary(field.type) and field.type.value_type == pa.string() for field in out.schema)
    assert labels(out, "age") == [
        "0-10",
        "0-10",
        "10-30",
        "10-30",
        "10-30",
    ]  # last bin closed
    assert labels(out, "job") == ["care", "food", "care", "other", "food"]
    assert labels(out, "city") == ["*"] * 5
    assert labels(out, "income") == ["<=10", "100", "250.5", ">=1000", "40"]
    assert labels(out, "extra") == ["3", "1", "2", "3", "1"]


def test_bin_labels_and_float_edges() -> None:
    table = pa.table({"x": [0.0, 0.25, 0.5, 1.0]})
    out = generalize(table, {"x": Bins(edges=(0, 0.5, 1))})
    assert labels(out, "x") == ["0-0.5", "0-0.5", "0.5-1", "0.5-1"]
    named = generalize(table, {"x": Bins(edges=(0, 0.5, 1), labels=("low", "high"))})
    assert labels(named, "x") == ["low", "low", "high", "high"]
    merged = generalize(table, {"x": Bins(edges=(0, 0.5, 0.75, 1), labels=("a", "b", "a"))})
    assert labels(merged, "x") == ["a", "a", "b", "a"]
    assert merged.column("x").chunk(0).dictionary.to_pylist() == ["a", "b"]


def test_dictionary_holds_only_used_labels_in_data_independent_order() -> None:
    mapping = ValueMap(mapping=(("x", "L1"), ("y", "L2"), ("z", "L3")))
    out = generalize(pa.table({"v": ["z", "x", "z"]}), {"v": mapping})
    assert out.column("v").chunk(0).dictionary.to_pylist() == ["L1", "L3"]
    kept = generalize(pa.table({"v": [30, 4, 200, 4]}), {"v": Keep()})  # sorted by value, not first seen
    assert kept.column("v").chunk(0).dictionary.to_pylist() == ["4", "30", "200"]
    text = generalize(pa.table({"v": ["b", "c", "a"]}), {"v": Keep()})
    assert text.column("v").chunk(0).dictionary.to_pylist() == ["a", "b", "c"]


def test_domain_errors_name_column_row_and_value() -> None:
    table = pa.table({"job": ["nurse", "cook", "spy"], "age": [10, 120, 20]})
    with pytest.raises(UserError, match=r"column 'job': value 'spy' at row 3 is outside .*no default"):
        generalize(table, {"job": ValueMap(mapping=(("nurse", "a"), ("cook", "b")))})
    with pytest.raises(UserError, match=r"column 'age': value 120 at row 2 is outside .*\[0, 100\]"):
        generalize(table, {"age": Bins(edges=(0, 50, 100))})
    with pytest.raises(UserError, match=r"column 'age': value 10 at row 1"):
        generalize(table, {"age": Bins(edges=(15, 50, 200))})
    chunked = pa.table({"v": pa.chunked_array([pa.array(["a", "b"]), pa.array(["a", "q", "b"])])})
    with pytest.raises(UserError, match=r"value 'q' at row 4"):
        generalize(chunked, {"v": ValueMap(mapping=(("a", "x"), ("b", "y")))})
    wide = pa.table({"v": pa.array([5, 10**12, 7, -(10**12)])})  # dictionary path, not a dense range
    with pytest.raises(UserError, match=r"value -1000000000000 at row 4"):
        generalize(wide, {"v": Bins(edges=(-(10**11), 10**13))})


def test_domain_checked_on_every_row_even_when_only_some_are_generalized() -> None:
    table = pa.table({"v": ["a", "b", "bad", "a"]})
    scheme = {"v": ValueMap(mapping=(("a", "x"), ("b", "y")))}
    with pytest.raises(UserError, match=r"value 'bad' at row 3"):
        encode(table, scheme, rows=np.array([0, 1, 3]))


def test_scheme_and_column_errors() -> None:
    table = pa.table({"s": ["a"], "n": [1], "m": pa.array([None], pa.int64())})
    with pytest.raises(UserError, match="Bins needs a numeric column; it holds string"):
        generalize(table, {"s": Bins(edges=(0, 1))})
    with pytest.raises(UserError, match="TopBottomCoding needs a numeric column"):
        generalize(table, {"s": TopBottomCoding(upper=3)})
    with pytest.raises(UserError, match="strictly increasing"):
        generalize(table, {"n": Bins(edges=(0, 2, 2))})
    with pytest.raises(UserError, match="2 bins need 2 labels; got 1"):
        generalize(table, {"n": Bins(edges=(0, 1, 2), labels=("x",))})
    with pytest.raises(UserError, match=r"column 'm' has a missing value \(null\) at row 1"):
        generalize(table, {"m": Keep()})
    with pytest.raises(
        UserError,
        match="names column 'zip', which the data does not have; its columns are: 's', 'n', 'm'",
    ):
        generalize(table, {"zip": Keep()})
    with pytest.raises(UserError, match="at least one column"):
        generalize(table, {})


def test_mapping_depends_on_the_scheme_only() -> None:
    """The label of a value does not depend on which other values are present, on the chunking,
    or on the encoding (dense integer range, hashed integers, dictionary)."""
    rng = np.random.default_rng()
    values = rng.integers(0, 100, 5_000)
    scheme = Bins(edges=(0, 18, 40, 65, 100))
    whole = labels(generalize(pa.table({"v": values}), {"v": scheme}), "v")
    half = labels(generalize(pa.table({"v": values[:2500]}), {"v": scheme}), "v")
    assert half == whole[:2500]
    wide = np.append(values, 10**9)  # forces the hashed path
    wide_labels = labels(
        generalize(pa.table({"v": wide}), {"v": Bins(edges=(0, 18, 40, 65, 100, 10**10))}),
        "v",
    )
    assert wide_labels[:-1] == whole
    chunks = pa.chunked_array(
        [
            pa.array(values[:1000]).dictionary_encode(),
            pa.array(values[1000:]).dictionary_encode(),
        ]
    )
    assert labels(generalize(pa.table({"v": chunks}), {"v": scheme}), "v") == whole


def test_encode_rows_equals_generalize_then_take() -> None:
    rng = np.random.default_rng()
    table = pa.table(
        {
            "a": pa.chunked_array([pa.array(rng.choice(["x", "y", "z"], 300)) for _ in range(3)]),
            "b": pa.chunked_array([pa.array(rng.integers(0, 9, 450)), pa.array(rng.integers(0, 9, 450))]),
        }
    )
    schemes = {"a": Keep(), "b": Bins(edges=(0, 4, 8))}
    rows = np.sort(rng.choice(900, 200, replace=False))
    coded = encode(table, schemes, rows)
    full = generalize(table, schemes)
    for name in schemes:
        got = np.asarray(coded[name].labels.to_pylist(), dtype=object)[coded[name].codes]
        assert got.tolist() == [labels(full, name)[i] for i in rows]
    single = encode_column(table.column("a").combine_chunks(), Keep(), name="a", rows=rows)
    assert np.array_equal(single.codes, coded["a"].codes)


def test_adult_level1_hierarchies(adult_dir: Path) -> None:
    """ARX level-1 hierarchies as value maps on the real data: every value is a leaf (SOURCE.md)
    and the labels agree with a plain-Python lookup of the hierarchy file."""
    from privrelease.datasets import read_dataset

    columns = {"age": "integer", "education": "string", "native-country": "string"}
    table = read_dataset(adult_dir / "adult.csv", format="csv", columns=columns, delimiter=";").table
    schemes, lookups = {}, {}
    for name in columns:
        with open(adult_dir / f"adult_hierarchy_{name}.csv", newline="") as handle:
            rows = [row for row in csv.reader(handle, delimiter=";") if row]
        lookups[name] = {row[0]: row[1] for row in rows}
        schemes[name] = ValueMap(mapping=tuple((row[0], row[1]) for row in rows))
    out = generalize(table, schemes)
    for name in columns:
        raw = [str(v) for v in table.column(name).cast(pa.string()).to_pylist()]
        assert labels(out, name) == [lookups[name][value] for value in raw]
    assert labels(out, "age")[:2] == [
        "35-39",
        "45-49",
    ]  # ages 39, 50 (ARX's off-by-one labels)
