"""Reading a dataset (CSV or Parquet) into exactly the declared, type-checked columns.

This is the only place that reads microdata files. It knows nothing of policies: the flow passes
plain values (path, format, column name -> type, CSV options), so it is easy to test alone.
Everything is checked before any mechanism runs:

- presence: every declared column must be in the file (the error names it and lists the file's
  columns); columns the file has beyond the declared ones are dropped here and never published;
- type: ``integer`` (int64), ``float`` (float64, finite) or ``string``; text that is not a number
  in a numeric column is an error naming the column, the 1-based data row and the value;
- missing values (null, NaN, or a token in ``missing_values`` after trimming spaces, e.g. ``""``
  or ``"?"``): ``missing="reject"`` fails naming column, row and value; ``missing="drop"`` drops
  the rows and reports how many (``rows_dropped``, an internal fact: it can disclose);
- an empty file, or one without data rows, is an error.

String columns come back dictionary-encoded (``dictionary<int32, string>``): far less memory
than plain strings on large files, and what :mod:`privrelease.mechanisms.generalization` works
on. ``column.cast(pa.string())`` decodes one where plain strings are needed.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

from privrelease.csv_dialect import CsvDialect, csv_first_line
from privrelease.datafiles import open_checked
from privrelease.errors import UserError
from privrelease.files import sha256_bytes

COLUMN_TYPES = ("integer", "float", "string")
_ARROW_TYPES = {"integer": pa.int64(), "float": pa.float64()}
_CHUNK = 1 << 20


@dataclass(frozen=True)
class DatasetRead:
    """The declared columns of a dataset, in declared order, after all checks.

    ``rows_read``: data rows in the file; ``rows_dropped``: rows dropped for missing values
    (``missing="drop"``); ``table.num_rows == rows_read - rows_dropped``. Both counts are internal
    facts (they describe the input, which the release protects)."""

    table: pa.Table
    rows_read: int
    rows_dropped: int


def plain_columns(table: pa.Table) -> pa.Table:
    """``table`` with its dictionary columns decoded (a CSV writes plain values)."""
    return pa.table(
        {
            name: column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column
            for name, column in zip(table.column_names, table.columns, strict=True)
        }
    )


def write_parquet(table: pa.Table, path: str | Path) -> None:
    """Write a release (dictionary-encoded label columns, rows in random order) to Parquet.

    Dictionary columns are written as Parquet dictionary pages without re-encoding. Column
    statistics are left out: min/max per row group of randomly ordered rows tell a reader
    nothing the rows do not, and computing them is a third of the write time."""
    try:
        pq.write_table(table, path, write_statistics=False)
    except OSError as exc:
        raise UserError(f"cannot write {str(path)!r}: {exc}") from exc


def read_dataset(
    path: str | Path,
    *,
    format: Literal["csv", "parquet"],
    columns: dict[str, str],
    delimiter: str | None = None,
    quote: str | None = '"',
    header: bool = True,
    encoding: str = "utf-8",
    missing: Literal["reject", "drop"] = "reject",
    missing_values: tuple[str, ...] = ("", "?"),
    domains: dict[str, Sequence[Any]] | None = None,
    expected_sha256: str | None = None,
    handle: BinaryIO | None = None,
) -> DatasetRead:
    """Read ``path`` into a :class:`DatasetRead` of exactly ``columns`` (name -> ``integer`` |
    ``float`` | ``string``), checked as described in the module docstring; a column named in
    ``domains`` (its declared ``values``) may hold those values only.

    The file is read once into memory and parsed from there: from ``handle`` (the file the run
    opened once, :func:`privrelease.datafiles.open_checked`, read from its start) or else the
    real path of ``path`` opened the same way; with ``expected_sha256`` those bytes must hash to
    it (the fingerprint taken before the budget was reserved), so what is parsed is exactly what
    was fingerprinted, whatever happens to the path in between (overwritten, renamed over,
    relinked).

    CSV: ``delimiter`` None sniffs one of ``, ; TAB |`` from the first line (:func:`csv_first_line`,
    as the fingerprint does); ``quote`` None
    disables quoting; CRLF or LF line ends; ``header=False`` means the file has exactly the
    declared columns, in declared order. Parquet: the CSV options are ignored.
    """
    path = Path(path)
    _check_arguments(format, columns, missing)
    data = _file_bytes(path, handle, expected_sha256)
    if format == "csv":
        dialect, names = _csv_names(_first_line(data), path, columns, delimiter, quote, header, encoding)
        raw = _parse_csv(data, path, columns, dialect, names, encoding, skip_rows=1 if header else 0)
    else:
        raw = parse_parquet(pa.BufferReader(data), path, columns)
    return check_dataset(raw, path, columns, missing=missing, missing_values=missing_values, domains=domains)


def read_row_groups(
    path: str | Path,
    *,
    columns: dict[str, str],
    missing: Literal["reject", "drop"] = "reject",
    missing_values: tuple[str, ...] = ("", "?"),
    domains: dict[str, Sequence[Any]] | None = None,
    expected_sha256: str | None = None,
    handle: BinaryIO | None = None,
) -> Iterator[DatasetRead]:
    """The Parquet file ``path`` as :func:`read_dataset` reads it (its bytes read once, from
    ``handle`` or its real path, and hashed against ``expected_sha256`` before anything is
    parsed), one row group at a time: each row group's declared columns, checked as a whole
    file is (errors name the file's data rows). A row group whose every row is dropped
    (``missing="drop"``) gives an empty table; empty row groups give nothing; a file without a
    row left is an error, as in :func:`read_dataset`. The next row group is parsed and checked
    in a background thread while the caller works on this one (Arrow decodes without the
    GIL), so at most two row groups are held at once, never the whole table."""
    path = Path(path)
    _check_arguments("parquet", columns, missing)
    data = _file_bytes(path, handle, expected_sha256)
    file = _open_parquet(pa.BufferReader(data), path, columns, None)
    metadata = file.metadata
    groups = [group for group in range(metadata.num_row_groups) if metadata.row_group(group).num_rows]
    first_rows = np.cumsum([0] + [metadata.row_group(group).num_rows for group in groups]).tolist()

    def read(at: int) -> DatasetRead:
        raw = _parquet_groups(file, path, columns, (groups[at],))
        return check_dataset(
            raw,
            path,
            columns,
            missing=missing,
            missing_values=missing_values,
            domains=domains,
            first_row=first_rows[at],
            whole=False,
        )

    read_rows = left = 0
    with ThreadPoolExecutor(1, thread_name_prefix="privrelease-read") as pool:
        pending = pool.submit(read, 0) if groups else None
        for at in range(len(groups)):
            assert pending is not None, "a row group is being read"
            done = pending.result()
            pending = pool.submit(read, at + 1) if at + 1 < len(groups) else None
            read_rows, left = read_rows + done.rows_read, left + done.table.num_rows
            yield done
    require_rows_left(path, read_rows, left)


def check_dataset(
    raw: pa.Table,
    path: Path,
    columns: dict[str, str],
    *,
    missing: Literal["reject", "drop"] = "reject",
    missing_values: tuple[str, ...] = ("", "?"),
    domains: dict[str, Sequence[Any]] | None = None,
    first_row: int = 0,
    whole: bool = True,
) -> DatasetRead:
    """The parsed ``raw`` columns of ``path`` checked and typed as :func:`read_dataset` does;
    ``raw`` holds the file's data rows ``first_row + 1`` on (the row numbers errors name).
    ``whole=False`` (one row group of several): no rows left after dropping is no error here."""
    if raw.num_rows == 0:
        raise UserError(f"dataset file {str(path)!r} has no data rows")
    return _check_columns(raw, columns, missing, missing_values, path, first_row, whole, domains or {})


def require_rows_left(path: Path | str, read: int, left: int) -> None:
    """A :class:`UserError` when the dataset at ``path`` has no data row (``read``, over all its
    row groups, files or partitions), or none is left (``left``) after dropping those with a
    missing value."""
    if not read:
        raise UserError(f"dataset {str(path)!r} has no data rows")
    if not left:
        raise UserError(f"every data row of {str(path)!r} has a missing value; nothing is left")


def _file_bytes(path: Path, handle: BinaryIO | None, expected_sha256: str | None) -> pa.Buffer:
    """The bytes of ``handle``, or of the file at the real path of ``path`` (:func:`_read_bytes`)."""
    if handle is not None:
        return _read_bytes(handle, path, expected_sha256)
    with open_checked(path.resolve()) as opened:
        return _read_bytes(opened, path, expected_sha256)


def _read_bytes(handle: BinaryIO, path: Path, expected_sha256: str | None) -> pa.Buffer:
    """The open file's bytes from its start, once; checked against ``expected_sha256`` when given."""
    try:
        handle.seek(0)
        data = handle.read()
    except OSError as exc:
        raise UserError(f"cannot read dataset file {str(path)!r}: {exc.strerror or exc}") from None
    if not data:
        raise UserError(f"dataset file {str(path)!r} is empty")
    if expected_sha256 is not None and (found := sha256_bytes(data)) != expected_sha256:
        raise UserError(
            f"dataset file {str(path)!r} changed after it was fingerprinted (sha256 "
            f"{expected_sha256[:12]} then, {found[:12]} now): nothing was read from it; run again"
        )
    return pa.py_buffer(data)


def _check_domain(
    column: pa.ChunkedArray, name: str, values: Sequence[Any], kept: np.ndarray | None, first_row: int = 0
) -> None:
    """UserError naming the first data row whose value is not declared (exact match: a value
    with a stray space is a different value); ``kept`` as for :func:`_convert`."""
    plain = column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column
    allowed = pc.is_in(plain, value_set=pa.array(list(values), type=plain.type))
    if pc.all(allowed).as_py() is not False:  # null: no row to check
        return
    row = int(np.argmin(allowed.to_numpy(zero_copy_only=False)))
    raise UserError(
        f"column {name!r}, data row {_row_number(row, kept, first_row)}: {plain[row].as_py()!r} is not one of the {len(values)} values "
        f"declared in dataset.columns.{name}.values; declare it there or correct the data"
    )


def _check_arguments(format: str, columns: dict[str, str], missing: str) -> None:
    if format not in ("csv", "parquet"):
        raise UserError(f"format must be 'csv' or 'parquet'; got {format!r}")
    if not columns:
        raise UserError("columns must declare at least one column")
    for name, kind in columns.items():
        if kind not in COLUMN_TYPES:
            raise UserError(f"column {name!r}: type must be one of {', '.join(COLUMN_TYPES)}; got {kind!r}")
    if missing not in ("reject", "drop"):
        raise UserError(f"missing must be 'reject' or 'drop'; got {missing!r}")


def _require_present(path: Path, declared: dict[str, str], found: list[str]) -> None:
    absent = [name for name in declared if name not in found]
    if absent:
        raise UserError(
            f"dataset file {str(path)!r} has no column {absent[0]!r}"
            f" (declared); its columns are: {', '.join(map(repr, found))}"
        )


def _require_unique(path: Path, declared: dict[str, str], found: list[str]) -> None:
    """UserError when a declared column's name heads more than one field."""
    for name in declared:
        positions = [i + 1 for i, field in enumerate(found) if field == name]
        if len(positions) > 1:
            raise UserError(
                f"dataset file {str(path)!r} has {len(positions)} columns named {name!r} (fields "
                f"{', '.join(map(str, positions))}); a declared column must be unique in the header"
            )


def _csv_names(
    first_line: bytes,
    path: Path,
    columns: dict[str, str],
    delimiter: str | None,
    quote: str | None,
    header: bool,
    encoding: str,
) -> tuple[CsvDialect, list[str]]:
    """The dialect (:func:`.csv_dialect.csv_first_line`) and every field's name: the header's, checked to
    hold each declared column once, or (no header) the declared columns, as many as the
    first line has fields."""
    dialect, found = csv_first_line(first_line, path, delimiter=delimiter, quote=quote, encoding=encoding)
    if header:
        _require_present(path, columns, found)
        _require_unique(path, columns, found)
        return dialect, found
    if len(found) != len(columns):
        raise UserError(
            f"dataset file {str(path)!r} has {len(found)} fields per row and no header;"
            f" {len(columns)} columns are declared (without a header they must match)"
        )
    return dialect, list(columns)


def _parse_csv(
    data: pa.Buffer | bytes,
    path: Path,
    columns: dict[str, str],
    dialect: CsvDialect,
    names: list[str],
    encoding: str,
    *,
    skip_rows: int,
    first_row: int = 0,
) -> pa.Table:
    """The declared ``columns`` (text) of the CSV ``data`` whose fields are ``names`` (data rows
    ``first_row + 1`` on of the file, for errors)."""
    try:
        read = pcsv.ReadOptions(encoding=encoding, column_names=names, skip_rows=skip_rows)
        convert = pcsv.ConvertOptions(
            column_types={name: pa.string() for name in columns},
            include_columns=list(columns),
            null_values=[],
            strings_can_be_null=False,
            quoted_strings_can_be_null=False,
        )
        return pcsv.read_csv(
            pa.BufferReader(data), read_options=read, parse_options=dialect.parse_options(), convert_options=convert
        )
    except (pa.ArrowInvalid, UnicodeDecodeError, LookupError) as exc:
        if "Empty CSV file" in str(exc):
            raise UserError(f"dataset file {str(path)!r} has no header and no rows") from exc
        if str(exc).startswith("CSV parse error"):  # its text quotes the record: never shown
            where = _record_fields(data, dialect, len(names), encoding, skip_rows, first_row)
            raise UserError(f"dataset file {str(path)!r} is not valid CSV: {where}") from None
        raise UserError(f"dataset file {str(path)!r} is not valid CSV: {exc}") from exc


def _record_fields(
    data: pa.Buffer | bytes, dialect: CsvDialect, fields: int, encoding: str, skip_rows: int, first_row: int
) -> str:
    """Where the first record of ``data`` (after ``skip_rows`` lines; data row ``first_row + 1``
    of the file first) has another number of fields than ``fields``, in words that quote
    nothing of it (only on the error path: Python's csv module reads the text once)."""
    text = bytes(data).decode(encoding, errors="replace")
    quoting = {"quotechar": dialect.quote} if dialect.quote else {"quoting": csv.QUOTE_NONE}
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=dialect.delimiter, **quoting)
    row = first_row
    for record in reader:
        if reader.line_num <= skip_rows or not record:  # the header; blank lines are no rows
            continue
        row += 1
        if len(record) != fields:
            return f"data row {row} has {len(record)} fields where the header (or the first line) has {fields}"
    return "a record does not parse"


def parse_csv_lines(
    first_line: bytes,
    data: bytes,
    path: Path,
    columns: dict[str, str],
    *,
    records: int,
    first_row: int,
    delimiter: str | None,
    quote: str | None,
    header: bool,
    encoding: str,
) -> pa.Table:
    """The declared columns (text) of ``data``: whole lines of the CSV file ``path`` holding its
    data rows ``first_row + 1 .. first_row + records`` (``records``: its lines that are not
    blank), parsed in the dialect and with the names of its ``first_line``, exactly as
    :func:`read_dataset` parses the whole file (a header in ``data`` would be read as a row).

    The lines must be whole records: a quoted field spanning a line end (or a bare carriage
    return, a line end to the parser) is refused, naming the first data row it touches. Proof:
    a sentinel line of empty fields is parsed after ``data``; the parser yields one row per
    non-blank line and the sentinel as a row of its own exactly when no record spans a line
    end and ``data`` does not end inside a quoted field (which would swallow the sentinel)."""
    dialect, names = _csv_names(first_line, path, columns, delimiter, quote, header, encoding)
    if data.count(b"\r") != data.count(b"\r\n"):
        raise UserError(
            f"dataset file {str(path)!r} has a carriage return that does not end a line in data rows "
            f"{first_row + 1}-{first_row + records}: the Dask engine splits CSV at line ends; correct the "
            "data or run with --engine local"
        )
    sentinel = (dialect.delimiter * (len(names) - 1) + "\n").encode(encoding)
    ended = data if data.endswith(b"\n") else data + b"\n"
    try:
        table = _parse_csv(ended + sentinel, path, columns, dialect, names, encoding, skip_rows=0, first_row=first_row)
    except UserError as error:
        if dialect.quote is None or dialect.quote.encode(encoding) not in data:
            raise
        raise UserError(  # a block cut inside a quoted field starts with the field's rest
            f"{error} (if a quoted field spans a line end there or in the rows before: the Dask engine splits "
            "CSV at line ends and reads such files only with --engine local)"
        ) from None
    if table.num_rows != records + 1 or any(table.column(name)[-1].as_py() != "" for name in columns):
        row = first_row + _first_spanning_line(ended, records, path, columns, dialect, names, encoding) + 1
        raise UserError(
            f"dataset file {str(path)!r}: a quoted field spans a line end at data row {row}; "
            "the Dask engine splits CSV at line ends and reads such files only with --engine local"
        )
    return table.slice(0, records)


def _first_spanning_line(
    data: bytes, records: int, path: Path, columns: dict[str, str], dialect: CsvDialect, names: list[str], encoding: str
) -> int:
    """How many non-blank lines of ``data`` precede the first that is not a whole record
    (bisection over line prefixes: only on the error path, O(n log n) parsing in total)."""
    array = np.frombuffer(data, np.uint8)
    ends = np.flatnonzero(array == 10) + 1
    starts = np.concatenate([[0], ends[:-1]])
    blank = (ends - starts == 1) | ((ends - starts == 2) & (array[np.maximum(ends - 2, 0)] == 13))
    before = np.concatenate([[0], np.cumsum(~blank)])  # non-blank lines among the first k
    sentinel = (dialect.delimiter * (len(names) - 1) + "\n").encode(encoding)

    def whole(lines: int) -> bool:
        prefix = data[: int(ends[lines - 1])] if lines else b""
        try:
            table = _parse_csv(prefix + sentinel, path, columns, dialect, names, encoding, skip_rows=0)
        except UserError:
            return False
        return table.num_rows == int(before[lines]) + 1

    lo, hi = 0, len(ends)  # whole(lo); the first bad line is in lines lo+1..hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if whole(mid):
            lo = mid
        else:
            hi = mid
    return min(int(before[lo]), max(records - 1, 0))


def _first_line(data: pa.Buffer) -> bytes:
    """The bytes of ``data`` up to and including its first newline (all of it without one),
    found 1 MiB at a time (the file is not copied)."""
    view = memoryview(data)
    for start in range(0, len(view), _CHUNK):
        end = view[start : start + _CHUNK].tobytes().find(b"\n")
        if end >= 0:
            return view[: start + end + 1].tobytes()
    return view.tobytes()


def parse_parquet(
    source: Any,
    path: Path,
    columns: dict[str, str],
    *,
    metadata: pq.FileMetaData | None = None,
    row_groups: Sequence[int] | None = None,
) -> pa.Table:
    """The declared ``columns`` of the Parquet file at ``source`` (a pyarrow-readable file;
    ``path`` names it in errors), text as dictionary columns; with ``metadata`` (its parsed
    footer) and ``row_groups``, only those row groups, read through that footer."""
    return _parquet_groups(_open_parquet(source, path, columns, metadata), path, columns, row_groups)


def parse_parquet_columns(
    source: Any, path: Path, columns: dict[str, str], *, metadata: pq.FileMetaData, row_groups: Sequence[int]
) -> Iterator[tuple[str, pa.Table]]:
    """:func:`parse_parquet` one declared column at a time: each column's name and its
    ``row_groups`` as a one-column table, decoded only when the next is asked for (a reader that
    drops each column once used never holds them together)."""
    file = _open_parquet(source, path, columns, metadata)
    for name, kind in columns.items():
        yield name, _parquet_groups(file, path, {name: kind}, row_groups)


def _open_parquet(source: Any, path: Path, columns: dict[str, str], metadata: pq.FileMetaData | None) -> pq.ParquetFile:
    """The Parquet file at ``source`` (through ``metadata`` when given), opened to read the
    declared ``columns`` (each must be present), text as dictionary columns. Not pre-buffered:
    every source here is already in memory (the file's read bytes, or a Dask partition's
    verified pieces), where pre-buffering only hands each read to Arrow's I/O threads (20
    partitions of 1 M rows on 8 fresh Dask workers on 2 cores: the workers' CPU 0.909 ->
    0.878 s, mean of three runs of the read step alone)."""
    try:
        schema = metadata.schema.to_arrow_schema() if metadata is not None else pq.read_schema(source)
        _require_present(path, columns, schema.names)
        as_dictionary = [
            name
            for name in columns
            if columns[name] == "string"
            and (pa.types.is_string(schema.field(name).type) or pa.types.is_large_string(schema.field(name).type))
        ]
        return pq.ParquetFile(source, metadata=metadata, read_dictionary=as_dictionary, pre_buffer=False)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"dataset file {str(path)!r} is not a readable Parquet file: {exc}") from exc


def _parquet_groups(
    file: pq.ParquetFile, path: Path, columns: dict[str, str], row_groups: Sequence[int] | None
) -> pa.Table:
    """The declared ``columns`` of an opened file's ``row_groups`` (None: all, decoded on
    Arrow's threads). Given row groups are decoded in the calling thread: they are read one
    partition or row group at a time beside other work (a Dask worker's one task thread per
    core, the streamed read's prefetch thread), where Arrow's own threads only add hand-offs
    and a memory arena each: 20 M rows, 8 workers on 2 cores (``bench/scale.py``), the release's
    CPU 1.63 -> 1.50 s in-process and 2.19 -> 2.07 s on Dask, its time 1.07 -> 1.04 s and
    1.26 -> 1.20 s."""
    try:
        if row_groups is None:
            return file.read(columns=list(columns))
        return file.read_row_groups(list(row_groups), columns=list(columns), use_threads=False)
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"dataset file {str(path)!r} is not a readable Parquet file: {exc}") from exc


def _is_text(type_: pa.DataType) -> bool:
    if pa.types.is_dictionary(type_):
        type_ = type_.value_type
    return pa.types.is_string(type_) or pa.types.is_large_string(type_)


def _missing_mask(column: pa.ChunkedArray, missing_values: tuple[str, ...]) -> np.ndarray | None:
    """True where the value is missing: null, NaN, or (text) a missing token after trimming
    spaces. None when nothing is missing (the common case, found without a per-row array)."""
    tokens = pa.array(missing_values, pa.string())

    def token(values: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
        return pc.is_in(pc.utf8_trim_whitespace(values), value_set=tokens)

    if pa.types.is_dictionary(column.type):
        parts, dictionary, per_value = [], None, np.zeros(0, bool)
        for chunk in column.chunks:  # chunks often repeat one dictionary: test it once
            if dictionary is None or not chunk.dictionary.equals(dictionary):
                dictionary = chunk.dictionary
                per_value = token(dictionary).to_numpy(zero_copy_only=False)
            parts.append(per_value[chunk.indices.fill_null(0).to_numpy()] if per_value.any() else None)
        if all(part is None for part in parts) and not column.null_count:
            return None
        mask = np.concatenate([np.zeros(len(c), bool) if p is None else p for c, p in zip(column.chunks, parts)])
    elif _is_text(column.type):
        mask = token(column).to_numpy()
    elif pa.types.is_floating(column.type):
        mask = pc.is_nan(column).fill_null(False).to_numpy()
    else:
        mask = np.zeros(len(column), bool)
    if column.null_count:
        mask = mask | column.is_null().to_numpy()
    return mask if mask.any() else None


def _check_columns(
    raw: pa.Table,
    columns: dict[str, str],
    missing: str,
    missing_values: tuple[str, ...],
    path: Path,
    first_row: int = 0,
    whole: bool = True,
    domains: dict[str, Sequence[Any]] | None = None,
) -> DatasetRead:
    rows_read = raw.num_rows
    drop = None
    for name in columns:
        mask = _missing_mask(raw.column(name), missing_values)
        if mask is None:
            continue
        if missing == "reject":
            row = int(np.argmax(mask))
            raise UserError(
                f"column {name!r} has a missing value {_display(raw.column(name)[row])} at data row"
                f" {first_row + row + 1}; missing values are rejected (missing='reject'; 'drop' drops such rows)"
            )
        drop = mask if drop is None else drop | mask
    kept = None  # data row numbers (1-based) of the kept rows, when rows were dropped
    if drop is not None:
        kept = np.flatnonzero(~drop) + 1 + first_row
        if whole:
            require_rows_left(path, raw.num_rows, kept.size)
        raw = raw.filter(pa.array(~drop))
    checked = {name: _convert(raw.column(name), name, kind, kept, first_row) for name, kind in columns.items()}
    for name, values in (domains or {}).items():
        _check_domain(checked[name], name, values, kept, first_row)
    return DatasetRead(pa.table(checked), rows_read=rows_read, rows_dropped=rows_read - raw.num_rows)


def _display(value: pa.Scalar) -> str:
    return "null" if not value.is_valid else repr(value.as_py())


def _convert(
    column: pa.ChunkedArray, name: str, kind: str, kept: np.ndarray | None, first_row: int = 0
) -> pa.ChunkedArray:
    """``column`` (no missing values left) as the declared type; ``kept``: the data row number
    of each row (None: row i is data row first_row + i + 1), for error messages."""
    if kind == "string":
        if not _is_text(column.type):
            column = column.cast(pa.string())
        if not pa.types.is_dictionary(column.type):
            column = pc.dictionary_encode(column)
        return column
    target = _ARROW_TYPES[kind]
    numeric = pa.types.is_integer(column.type) or (kind == "float" and pa.types.is_floating(column.type))
    if numeric:
        return column.cast(target)
    if not _is_text(column.type):
        raise UserError(f"column {name!r} holds {column.type} values; declared {kind}")
    text = pc.utf8_trim_whitespace(column.cast(pa.string()))
    try:
        converted = text.cast(target)
    except pa.ArrowInvalid:
        row = _first_unparsable(text, target)
        raise UserError(
            f"column {name!r} is declared {kind} but data row {_row_number(row, kept, first_row)} holds"
            f" {text[row].as_py()!r}, which is not {'an integer' if kind == 'integer' else 'a number'}"
        ) from None
    if kind == "float":
        finite = pc.is_finite(converted).to_numpy(zero_copy_only=False)
        if not finite.all():
            row = int(np.argmin(finite))
            raise UserError(
                f"column {name!r} is declared float but data row {_row_number(row, kept, first_row)} holds"
                f" {text[row].as_py()!r}, which is not a finite number"
            )
    return converted


def _row_number(index: int, kept: np.ndarray | None, first_row: int = 0) -> int:
    return first_row + index + 1 if kept is None else int(kept[index])


def _first_unparsable(text: pa.ChunkedArray, target: pa.DataType) -> int:
    """Index of the first value of ``text`` that does not cast to ``target`` (bisection: only
    on the error path, O(n) casting in total)."""
    lo, hi = 0, len(text)  # invariant: text[lo:hi] holds the first failure
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            text.slice(lo, mid - lo).cast(target)
            lo = mid
        except pa.ArrowInvalid:
            hi = mid
    return lo
