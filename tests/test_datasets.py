"""Reading datasets: CSV (declared / sniffed delimiter, quoting, CRLF, header) and Parquet, checked
before any mechanism runs."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from privrelease.csv_dialect import csv_first_line
from privrelease.datasets import check_dataset, read_dataset, write_parquet
from privrelease.errors import UserError

ADULT_COLUMNS = {
    "sex": "string",
    "age": "integer",
    "race": "string",
    "marital-status": "string",
    "education": "string",
    "native-country": "string",
    "workclass": "string",
    "occupation": "string",
}


def write(tmp_path: Path, text: str, name: str = "data.csv", newline: str = "\n") -> Path:
    path = tmp_path / name
    path.write_bytes(text.replace("\n", newline).encode("utf-8"))
    return path


def strings(column: pa.ChunkedArray) -> list:
    return column.cast(pa.string()).to_pylist()


@pytest.mark.parametrize("delimiter", [";", None])
def test_adult_csv_semicolon_crlf(adult_dir: Path, delimiter: str | None) -> None:
    read = read_dataset(
        adult_dir / "adult.csv",
        format="csv",
        columns=ADULT_COLUMNS,
        delimiter=delimiter,
    )
    table = read.table
    assert (read.rows_read, read.rows_dropped, table.num_rows) == (30162, 0, 30162)
    assert table.column_names == list(ADULT_COLUMNS)  # salary-class is in the file: dropped
    assert table.schema.field("age").type == pa.int64()
    assert table.schema.field("sex").type == pa.dictionary(pa.int32(), pa.string())
    assert table.column("age").slice(0, 2).to_pylist() == [39, 50]
    assert strings(table.column("occupation"))[:2] == [
        "Adm-clerical",
        "Exec-managerial",
    ]
    assert not any(value.endswith("\r") for value in strings(table.column("occupation")))
    assert (
        min(table.column("age").to_pylist()),
        max(table.column("age").to_pylist()),
    ) == (17, 90)
    assert len(set(strings(table.column("native-country")))) == 41


@pytest.mark.parametrize("delimiter", [",", "\t", "|", ";"])
def test_sniffed_delimiter(tmp_path: Path, delimiter: str) -> None:
    rows = ["name,age,score", "ann,31,1.5", "bob,42,2.25", "cy,7,-3"]
    path = write(tmp_path, "\n".join(row.replace(",", delimiter) for row in rows) + "\n")
    table = read_dataset(
        path,
        format="csv",
        columns={"age": "integer", "score": "float", "name": "string"},
    ).table
    assert table.column_names == ["age", "score", "name"]
    assert table.column("age").to_pylist() == [31, 42, 7]
    assert table.column("score").to_pylist() == [1.5, 2.25, -3.0]
    assert strings(table.column("name")) == ["ann", "bob", "cy"]


def test_a_delimiter_inside_quotes_does_not_count(tmp_path: Path) -> None:
    """The header alone decides the dialect, quotes honoured: ``"city, state";zip`` splits on
    ``;`` (one of each, but the comma is inside quotes), as the fingerprint splits it."""
    path = write(tmp_path, '"city, state";zip\n"Paris, IDF";75001\n')
    dialect, names = csv_first_line(path.read_bytes().split(b"\n")[0], path)
    assert (dialect.delimiter, names) == (";", ["city, state", "zip"])
    table = read_dataset(path, format="csv", columns={"city, state": "string", "zip": "string"}).table
    assert strings(table.column("city, state")) == ["Paris, IDF"] and strings(table.column("zip")) == ["75001"]


def test_quoting_crlf_and_spaces(tmp_path: Path) -> None:
    text = 'city;n\n"Paris; France";  12 \n"say ""hi""";3\n'
    path = write(tmp_path, text, newline="\r\n")
    table = read_dataset(path, format="csv", columns={"city": "string", "n": "integer"}, delimiter=";").table
    assert strings(table.column("city")) == ["Paris; France", 'say "hi"']
    assert table.column("n").to_pylist() == [12, 3]


def test_single_column_needs_no_delimiter(tmp_path: Path) -> None:
    path = write(tmp_path, "x\n1.5\n2\n")
    assert read_dataset(path, format="csv", columns={"x": "float"}).table.column("x").to_pylist() == [1.5, 2.0]


def test_no_header(tmp_path: Path) -> None:
    path = write(tmp_path, "a,1\nb,2\n")
    table = read_dataset(path, format="csv", columns={"k": "string", "v": "integer"}, header=False).table
    assert strings(table.column("k")) == ["a", "b"] and table.column("v").to_pylist() == [1, 2]
    with pytest.raises(UserError, match="2 fields per row and no header; 3 columns"):
        read_dataset(
            path,
            format="csv",
            columns={"k": "string", "v": "integer", "w": "float"},
            header=False,
        )


def test_missing_column_names_it_and_lists_file_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "a,b\n1,2\n")
    with pytest.raises(UserError, match=r"no column 'zip' \(declared\); its columns are: 'a', 'b'"):
        read_dataset(path, format="csv", columns={"a": "integer", "zip": "string"})
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.table({"a": [1], "b": [2]}), parquet)
    with pytest.raises(UserError, match=r"no column 'zip' \(declared\); its columns are: 'a', 'b'"):
        read_dataset(parquet, format="parquet", columns={"zip": "string"})


def test_non_numeric_text_names_column_row_and_value(tmp_path: Path) -> None:
    path = write(tmp_path, "id,age\n1,30\n2,31\n3,thirty\n4,33\n")
    with pytest.raises(
        UserError,
        match=r"column 'age' is declared integer but data row 3 holds 'thirty'",
    ):
        read_dataset(path, format="csv", columns={"id": "integer", "age": "integer"})
    path = write(tmp_path, "x\n1.5\n2,5\n", name="f.csv")
    with pytest.raises(UserError, match=r"column 'x' is declared float but data row 2 holds '2,5'"):
        read_dataset(path, format="csv", columns={"x": "float"}, delimiter=";")
    path = write(tmp_path, "x\n1.5\ninf\n", name="g.csv")
    with pytest.raises(UserError, match=r"data row 2 holds 'inf', which is not a finite number"):
        read_dataset(path, format="csv", columns={"x": "float"})


def test_bad_value_located_in_a_large_file(tmp_path: Path) -> None:
    values = [str(i) for i in range(50_000)]
    values[37_211] = "12a"
    path = write(tmp_path, "n\n" + "\n".join(values) + "\n")
    with pytest.raises(UserError, match=r"data row 37212 holds '12a'"):
        read_dataset(path, format="csv", columns={"n": "integer"})


@pytest.mark.parametrize("text", ["", "a,b\n", "a,b\r\n"])
def test_empty_file(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(UserError, match="is empty|has no data rows"):
        read_dataset(path, format="csv", columns={"a": "integer"})


def test_missing_values_rejected_or_dropped(tmp_path: Path) -> None:
    path = write(tmp_path, "job,age\nclerk,30\n?,31\nnurse,\nsmith, ?\ncook,x\n")
    columns = {"job": "string", "age": "integer"}
    with pytest.raises(UserError, match=r"column 'job' has a missing value '\?' at data row 2"):
        read_dataset(path, format="csv", columns=columns)
    # dropped rows 2, 3, 4; the type error keeps the file's row numbering (row 5)
    with pytest.raises(UserError, match=r"data row 5 holds 'x'"):
        read_dataset(path, format="csv", columns=columns, missing="drop")
    path = write(tmp_path, "job,age\nclerk,30\n?,31\nnurse,\nsmith, ?\ncook,40\n", name="ok.csv")
    read = read_dataset(path, format="csv", columns=columns, missing="drop")
    assert (read.rows_read, read.rows_dropped) == (5, 3)
    assert strings(read.table.column("job")) == ["clerk", "cook"]
    assert read.table.column("age").to_pylist() == [30, 40]
    custom = read_dataset(
        path,
        format="csv",
        columns={"job": "string"},
        missing_values=("smith",),
        missing="drop",
    )
    assert strings(custom.table.column("job")) == ["clerk", "?", "nurse", "cook"]
    with pytest.raises(UserError, match="every data row"):
        read_dataset(
            write(tmp_path, "a\n?\n\n?\n", name="all.csv"),
            format="csv",
            columns={"a": "string"},
            missing="drop",
        )


def test_parquet(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    source = pa.table(
        {
            "extra": ["secret", "also secret", "x"],
            "city": pa.array(["a", "b", "a"]).dictionary_encode(),
            "n": pa.array([1, 2, 3], pa.int32()),
            "text_n": ["10", " 20", "30"],
            "w": [0.5, 1.0, 2.0],
        }
    )
    pq.write_table(source, path, row_group_size=2)
    columns = {"w": "float", "city": "string", "n": "integer", "text_n": "integer"}
    read = read_dataset(path, format="parquet", columns=columns)
    assert read.table.column_names == [
        "w",
        "city",
        "n",
        "text_n",
    ]  # 'extra' is not read
    assert read.table.schema.field("n").type == pa.int64()
    assert read.table.column("text_n").to_pylist() == [10, 20, 30]
    assert strings(read.table.column("city")) == ["a", "b", "a"]
    as_float = read_dataset(path, format="parquet", columns={"n": "float", "extra": "string"}).table
    assert as_float.column("n").to_pylist() == [1.0, 2.0, 3.0]
    with pytest.raises(UserError, match="column 'w' holds double values; declared integer"):
        read_dataset(path, format="parquet", columns={"w": "integer"})
    with pytest.raises(
        UserError,
        match="column 'extra' is declared integer but data row 1 holds 'secret'",
    ):
        read_dataset(path, format="parquet", columns={"extra": "integer"})


def test_parquet_nulls_and_nan(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    pq.write_table(
        pa.table(
            {
                "a": [1, None, 3, 4],
                "b": [0.5, 1.5, float("nan"), 2.0],
                "c": ["x", "y", "z", "?"],
            }
        ),
        path,
    )
    with pytest.raises(UserError, match=r"column 'a' has a missing value null at data row 2"):
        read_dataset(path, format="parquet", columns={"a": "integer"})
    with pytest.raises(UserError, match=r"column 'b' has a missing value nan at data row 3"):
        read_dataset(path, format="parquet", columns={"b": "float"})
    read = read_dataset(
        path,
        format="parquet",
        columns={"a": "integer", "b": "float", "c": "string"},
        missing="drop",
    )
    assert (read.rows_dropped, read.table.column("a").to_pylist()) == (3, [1])


def test_bad_arguments_and_files(tmp_path: Path) -> None:
    path = write(tmp_path, "a\n1\n")
    with pytest.raises(UserError, match="format must be 'csv' or 'parquet'; got 'xlsx'"):
        read_dataset(path, format="xlsx", columns={"a": "integer"})  # type: ignore[arg-type]
    with pytest.raises(
        UserError,
        match="column 'a': type must be one of integer, float, string; got 'date'",
    ):
        read_dataset(path, format="csv", columns={"a": "date"})
    with pytest.raises(UserError, match="missing must be 'reject' or 'drop'"):
        read_dataset(path, format="csv", columns={"a": "integer"}, missing="ignore")  # type: ignore[arg-type]
    with pytest.raises(UserError, match="does not exist"):
        read_dataset(tmp_path / "nope.csv", format="csv", columns={"a": "integer"})
    with pytest.raises(UserError, match="not a readable Parquet file"):
        read_dataset(path, format="parquet", columns={"a": "integer"})
    with pytest.raises(UserError, match="not valid CSV: data row 2 has 1 fields where the header") as ragged:
        read_dataset(
            write(tmp_path, "a,b\n1,2\n\n3456789\n", name="ragged.csv"),
            format="csv",
            columns={"a": "integer"},
            delimiter=",",
        )
    assert "3456789" not in str(ragged.value)  # the record is never quoted (a person's identifier, say)
    with pytest.raises(UserError, match="not valid CSV"):
        bad = tmp_path / "latin.csv"
        bad.write_bytes(b"a\ncaf\xe9\n")
        read_dataset(bad, format="csv", columns={"a": "string"})
    # the header alone decides the dialect (as the fingerprint decides it): ",", so "1;2" is one field
    with pytest.raises(UserError, match="not valid CSV: data row 1 has 1 fields where the header"):
        read_dataset(
            write(tmp_path, "a,b\n1;2\n", name="odd.csv"),
            format="csv",
            columns={"a": "string"},
        )


def test_write_parquet_round_trip(tmp_path: Path) -> None:
    table = pa.table({"g": pa.array(["x", "y", "x"]).dictionary_encode()})
    write_parquet(table, tmp_path / "out.parquet")
    assert pq.read_table(tmp_path / "out.parquet").equals(table)
    with pytest.raises(UserError, match="cannot write"):
        write_parquet(table, tmp_path / "no-such-dir" / "out.parquet")


def test_declared_values_are_enforced(tmp_path: Path) -> None:
    """A value outside a column's declared values (even one with a stray space) is refused,
    naming the column, the data row and the rule."""
    path = tmp_path / "people.csv"
    path.write_text("sex,age\nMale,30\nFemale,41\n Male,52\n")
    columns = {"sex": "string", "age": "integer"}
    with pytest.raises(UserError, match=r"column 'sex', data row 3: ' Male' is not one of the 2 values declared"):
        read_dataset(path, format="csv", columns=columns, domains={"sex": ["Male", "Female"]})
    path.write_text("sex,age\nMale,30\nUndeclared-Sex,41\n")
    with pytest.raises(UserError, match=r"data row 2: 'Undeclared-Sex'"):
        read_dataset(path, format="csv", columns=columns, domains={"sex": ["Male", "Female"]})
    with pytest.raises(UserError, match=r"column 'age', data row 2: 41 is not one of the 1 values"):
        read_dataset(path, format="csv", columns=columns, domains={"age": [30]})
    path.write_text("sex,age\nMale,30\nFemale,41\n")
    assert read_dataset(path, format="csv", columns=columns, domains={"sex": ["Male", "Female"]}).table.num_rows == 2


def test_byte_order_mark_and_duplicate_header(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes("\ufeffsex,age\nMale,30\n".encode())
    assert read_dataset(path, format="csv", columns={"sex": "string", "age": "integer"}).table.num_rows == 1
    path.write_text("age,sex,age\n30,Male,31\n")
    with pytest.raises(UserError, match=r"2 columns named 'age' \(fields 1, 3\)"):
        read_dataset(path, format="csv", columns={"sex": "string", "age": "integer"})


def test_an_undeclared_value_after_dropped_rows_names_its_own_data_row(tmp_path: Path) -> None:
    """Rows dropped for a missing value do not shift the row an undeclared value is named at;
    a part of a file (a row group, a partition) whose every row is dropped passes the domain
    check (nothing to check) and is no error there."""
    path = tmp_path / "people.csv"
    path.write_text("sex,age\n?,30\nMale,41\nX,52\n")
    columns = {"sex": "string", "age": "integer"}
    with pytest.raises(UserError, match=r"column 'sex', data row 3: 'X' is not one of the 2 values declared"):
        read_dataset(path, format="csv", columns=columns, missing="drop", domains={"sex": ["Male", "Female"]})
    raw = pa.table({"sex": pa.array([None, None], pa.string()), "age": pa.array([1, 2])})
    part = check_dataset(raw, path, columns, missing="drop", domains={"sex": ["Male"]}, whole=False)
    assert part.table.num_rows == 0 and part.rows_dropped == 2
    with pytest.raises(UserError, match="has a missing value; nothing is left"):
        check_dataset(raw, path, columns, missing="drop", domains={"sex": ["Male"]})


def test_a_ragged_record_in_a_block_is_named_by_its_row_in_the_file(tmp_path: Path) -> None:
    """A block of a CSV file (the Dask engine's, :func:`parse_csv_lines`, data rows 101-103)
    with a short record names its data row in the file, never its text."""
    from privrelease.datasets import parse_csv_lines

    with pytest.raises(UserError, match="data row 102 has 1 fields where the header") as error:
        parse_csv_lines(
            b"a,b\n",
            b"1,2\n98765\n3,4\n",
            tmp_path / "f.csv",
            {"a": "integer"},
            records=3,
            first_row=100,
            delimiter=None,
            quote=None,
            header=True,
            encoding="utf-8",
        )
    assert "98765" not in str(error.value)


def test_a_parquet_file_without_rows_has_no_data_rows(tmp_path: Path) -> None:
    """A 0-row Parquet file (pyarrow writes one empty row group, whose offsets are not in the
    file) is fingerprinted, planned as no partition and read as a file with no data rows, in
    row groups as on Dask: never 'row groups outside the file' nor 'a missing value'."""
    from privrelease.datasets import read_row_groups, require_rows_left
    from privrelease.flows.partitions import plan_partitions, scan_file

    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"a": pa.array([], pa.int64())}), path)
    file = scan_file(str(path))
    assert file.row_groups == (0,) and plan_partitions([file], 10) == []
    with pytest.raises(UserError, match="has no data rows"):
        list(read_row_groups(path, columns={"a": "integer"}))
    with pytest.raises(UserError, match="has no data rows"):
        require_rows_left(path, 0, 0)  # what the Dask read of no partition ends with
    with pytest.raises(UserError, match="has a missing value; nothing is left"):
        require_rows_left(path, 3, 0)
