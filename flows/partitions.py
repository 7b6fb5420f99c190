"""A Parquet dataset (one file, or a folder of ``*.parquet`` files) or a CSV file as
partitions: what the Dask engine fingerprints, reads and computes on its workers, one
partition at a time, so that no process holds the data (the in-process engine reads a Parquet
folder through the same functions).

A CSV file is the same in blocks of whole lines (:func:`scan_csv`: the sha256 of the file, of
its first line and of each block's byte range, from one pass; a partition verifies the first
line and its blocks, then parses them in the dialect of the first line exactly as the
in-process reader parses the file, :func:`privrelease.datasets.parse_csv_lines`, which refuses
a quoted field spanning a line end; errors name the file's own data rows). The Parquet steps:

- Fingerprint (:func:`scan_file`, one call per file, on the workers): one streaming pass over
  each file's bytes gives its sha256 and size, and the sha256 of each row group's byte range
  (all its column chunks) and of the footer, which is parsed first for those ranges. A
  folder's fingerprint combines its files' (:func:`combined_sha256`); a single file's is its
  own sha256, as in-process.
- Partitions (:func:`plan_partitions`, in the flow, from the footers): consecutive whole row
  groups of one file, about ``rows_per_partition`` rows each.
- Read (:func:`read_partition`, on a worker): the file's footer and the partition's row-group
  ranges only, each of which must hash as fingerprinted (what is read is what was
  fingerprinted and charged; any other byte is refused, :class:`VerifiedBytes`); the row groups
  are parsed through that footer and checked exactly as a whole file is
  (:func:`privrelease.datasets.check_dataset`).
- Compute (:func:`partials`): the read partition's partial result for every mechanism of the
  release (:mod:`.scaled`): cell counts, or exact per-group statistics. One pass over the
  data serves every mechanism; only these summaries travel back to the flow.

Errors raised with a partition in hand may quote data: they travel as
:class:`.context.DataStepError`, whose text names only the step (:class:`PartitionError`).
"""

from __future__ import annotations

import functools
import hashlib
import io
import os
import pickle
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from privrelease.datafiles import open_checked
from privrelease.errors import UserError
from privrelease.files import sha256_bytes, sha256_text
from privrelease.flows.context import DataFile, DataStepError, csv_arguments, withholding

FOLDER_DOMAIN = "privrelease-parquet-folder"
_CHUNK = 1 << 22
_MMAP_THRESHOLD, _TRIM_THRESHOLD = 16 << 20, 64 << 20
"""glibc malloc's thresholds on a worker (:func:`_adaptive_malloc`): where its adaptive
thresholds settle by themselves once arrays of a few MB are freed (its trim threshold stays
twice its mmap threshold)."""


@dataclass(frozen=True)
class Partition:
    """Whole row groups of one file: data rows ``first_row + 1 .. first_row + rows`` of it."""

    file: DataFile
    row_groups: tuple[int, ...]
    first_row: int
    rows: int


@dataclass(frozen=True)
class ReadSpec:
    """How to read and check the declared columns (the policy's ``dataset``), as plain values."""

    columns: dict[str, str]
    missing: Literal["reject", "drop"]
    missing_values: tuple[str, ...]
    domains: dict[str, tuple[Any, ...]]
    csv: dict[str, Any] | None = None
    """A CSV file's options (:func:`.context.csv_arguments`: delimiter, quote, header, encoding)."""

    @classmethod
    def of(cls, dataset: Any) -> ReadSpec:
        return cls(
            columns={name: spec.type for name, spec in dataset.columns.items()},
            missing=dataset.missing,
            missing_values=tuple(dataset.missing_values),
            domains={name: tuple(spec.values) for name, spec in dataset.columns.items() if spec.values},
            csv=csv_arguments(dataset.csv) if dataset.format == "csv" else None,
        )


@dataclass(frozen=True)
class PartitionResult:
    """What a partition sends back: its row counts and each mechanism's partial result."""

    rows_read: int
    rows_dropped: int
    partials: dict[str, Any]


def dataset_files(path: Path) -> list[Path]:
    """The Parquet files of a dataset: the file itself, or a folder's ``*.parquet`` files by
    name (a folder without any is an error)."""
    if path.is_dir():
        files = sorted(
            child for child in path.iterdir() if child.suffix == ".parquet" and not child.name.startswith(".")
        )
        if not files:
            raise UserError(f"dataset folder {str(path)!r} has no .parquet files")
        return files
    if not path.is_file():
        raise UserError(f"dataset {str(path)!r} does not exist (a Parquet file or a folder of them)")
    return [path]


def scan_file(path: str, handle: BinaryIO | None = None) -> DataFile:
    """Fingerprint one file in one streaming pass over its bytes (memory: one chunk), on a
    worker or in the flow: the footer is parsed first for the row groups' byte ranges, then the
    whole file is hashed, each range and the footer too; the footer parsed must be the footer
    hashed (else the file changed while it was read). ``path`` is the checked real path, read
    through ``handle`` (the file the run opened) or opened by :func:`.datafiles.open_checked`."""
    if handle is None:
        with open_checked(path) as opened:
            return scan_file(path, opened)
    try:
        size = os.fstat(handle.fileno()).st_size
        footer, metadata = _footer(handle, size, path)
        groups = [metadata.row_group(i) for i in range(metadata.num_row_groups)]
        # an empty row group has nothing to read (a 0-row file's one group has no valid offsets)
        ranges = tuple(_byte_range(group) if group.num_rows else (4, 4) for group in groups)
        if any(not 4 <= start <= end <= size - len(footer) for start, end in ranges):
            raise UserError(f"dataset file {path!r} is not a readable Parquet file: row groups outside the file")
        whole, digests, tail = hashlib.sha256(), [hashlib.sha256() for _ in ranges], hashlib.sha256()
        spans = [*ranges, (size - len(footer), size)]
        position = 0
        # the whole file's digest in a second thread, the ranges' here (hashlib releases the
        # GIL): every byte is hashed twice, in about the time of once when a core is free
        with ThreadPoolExecutor(1, thread_name_prefix="privrelease-sha256") as pool:
            for chunk in _chunks(handle):
                hashed = pool.submit(whole.update, chunk)
                end = position + len(chunk)
                for digest, (start, stop) in zip([*digests, tail], spans, strict=True):
                    if start < end and stop > position:
                        digest.update(chunk[max(start, position) - position : min(stop, end) - position])
                position = end
                hashed.result()
    except OSError as error:
        raise UserError(f"cannot read dataset file {path!r}: {error.strerror or error}") from None
    if position != size or tail.hexdigest() != sha256_bytes(footer):
        raise UserError(f"dataset file {path!r} changed while it was fingerprinted; run again")
    return DataFile(
        path=path,
        sha256=whole.hexdigest(),
        bytes=size,
        columns=tuple(metadata.schema.to_arrow_schema().names),
        row_groups=tuple(group.num_rows for group in groups),
        ranges=ranges,
        range_sha256=tuple(digest.hexdigest() for digest in digests),
        footer_bytes=len(footer),
        footer_sha256=tail.hexdigest(),
    )


def scan_csv(path: str, csv: dict[str, Any], rows_per_block: int, handle: BinaryIO | None = None) -> DataFile:
    """Fingerprint a CSV file in one streaming pass over its bytes (memory: one chunk), on a
    worker: its sha256 and size, its first line (the dialect's and the header's, hashed on its
    own) and blocks of ``rows_per_block`` whole lines after the header (the first line too
    without one), each block's byte range ending just after a newline, and its sha256: what a
    partition reads must hash as fingerprinted (:func:`read_partition`), as a Parquet row group
    does. A block counts its data rows as the reader does (blank lines skipped); a newline
    inside a quoted field is no record boundary, which the read proves or refuses
    (:func:`privrelease.datasets.parse_csv_lines`). ``csv``: :func:`.context.csv_arguments`."""
    import numpy as np

    from privrelease.csv_dialect import csv_first_line

    if handle is None:
        with open_checked(path) as opened:
            return scan_csv(path, csv, rows_per_block, opened)
    header = bool(csv["header"])
    whole, first_line, first_done = hashlib.sha256(), bytearray(), False
    blocks: list[tuple[int, int, str, int]] = []  # start, end, sha256, data rows
    digest, block_start, block_lines, block_rows = hashlib.sha256(), -1 if header else 0, 0, 0
    position = newlines = 0
    previous_newline, previous_byte = -1, 10  # the data starts as if after a newline
    try:
        for chunk in _chunks(handle):
            whole.update(chunk)
            array = np.frombuffer(chunk, np.uint8)
            ends = np.flatnonzero(array == 10)
            if not first_done:
                first_line += chunk if not len(ends) else chunk[: ends[0] + 1]
                first_done = bool(len(ends))
                if first_done and header:
                    block_start = previous_newline = len(first_line) - 1
                    block_start += 1
            newlines += len(ends)
            if block_start >= 0:
                data_ends = ends[ends + position >= block_start]  # the newlines after the header
                gaps = np.diff(data_ends + position, prepend=previous_newline)
                short = data_ends[gaps == 2]  # a blank line may be a lone carriage return
                blank = gaps == 1
                blank[gaps == 2] = np.where(short > 0, array[np.maximum(short - 1, 0)], previous_byte) == 13
                taken = max(block_start - position, 0)
                while len(data_ends):
                    count = min(rows_per_block - block_lines, len(data_ends))
                    cut = int(data_ends[count - 1]) + 1
                    digest.update(chunk[taken:cut])
                    block_lines += count
                    block_rows += count - int(blank[:count].sum())
                    data_ends, blank, taken = data_ends[count:], blank[count:], cut
                    if block_lines == rows_per_block:
                        blocks.append((block_start, position + cut, digest.hexdigest(), block_rows))
                        digest, block_start, block_lines, block_rows = hashlib.sha256(), position + cut, 0, 0
                digest.update(chunk[taken:])
                if len(ends):
                    previous_newline = position + int(ends[-1])
            previous_byte = chunk[-1]
            position += len(chunk)
    except OSError as error:
        raise UserError(f"cannot read dataset file {path!r}: {error.strerror or error}") from None
    if 0 <= block_start < position:
        last = position - previous_newline - 1  # bytes after the last newline
        tail_row = 1 if last > 1 or (last == 1 and previous_byte != 13) else 0
        blocks.append((block_start, position, digest.hexdigest(), block_rows + tail_row))
    lines = newlines + (1 if position and previous_byte != 10 else 0)
    arguments = {key: csv[key] for key in ("delimiter", "quote", "encoding")}
    _, found = csv_first_line(bytes(first_line), Path(path), **arguments)
    return DataFile(
        path=path,
        sha256=whole.hexdigest(),
        bytes=position,
        columns=tuple(found) if csv["header"] else (),
        row_groups=tuple(rows for *_, rows in blocks),
        ranges=tuple((start, end) for start, end, *_ in blocks),
        range_sha256=tuple(sha for _, _, sha, _ in blocks),
        footer_bytes=0,
        footer_sha256=sha256_bytes(b""),
        format="csv",
        head_bytes=len(first_line),
        head_sha256=sha256_bytes(bytes(first_line)),
        line_rows=lines - (1 if csv["header"] else 0),
    )


def _chunks(handle: Any) -> Iterator[memoryview]:
    """The open file's bytes from its start, in chunks of at most :data:`_CHUNK` read into one
    buffer (a chunk is valid until the next is read). A fresh chunk per read was, on a Dask
    worker, a fresh memory mapping faulted in page by page (the nanny's
    ``MALLOC_TRIM_THRESHOLD_`` fixes glibc's mmap threshold at 128 KiB, :func:`_adaptive_malloc`):
    16,000 page faults to fingerprint a 66 MB file."""
    view = memoryview(bytearray(_CHUNK))
    handle.seek(0)
    while read := handle.readinto(view):
        yield view[:read]


def _footer(handle: Any, size: int, path: str) -> tuple[bytes, pq.FileMetaData]:
    """The file's footer (metadata, its length, ``PAR1``) and the metadata parsed from it."""
    if size < 12:
        raise UserError(f"dataset file {path!r} is not a readable Parquet file: {size} bytes")
    handle.seek(size - 8)
    tail = handle.read(8)
    length = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or length > size - 12:
        raise UserError(f"dataset file {path!r} is not a readable Parquet file: no Parquet footer")
    handle.seek(size - 8 - length)
    footer = handle.read(length + 8)
    try:
        return footer, pq.read_metadata(pa.BufferReader(b"PAR1" + footer))
    except (pa.ArrowInvalid, OSError) as error:
        raise UserError(f"dataset file {path!r} is not a readable Parquet file: {error}") from None


def _byte_range(group: pq.RowGroupMetaData) -> tuple[int, int]:
    """Where a row group's column chunks lie in its file: [first byte, end)."""
    starts, ends = [], []
    for i in range(group.num_columns):
        chunk = group.column(i)
        start = chunk.data_page_offset
        if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
            start = min(start, chunk.dictionary_page_offset)
        starts.append(start)
        ends.append(start + chunk.total_compressed_size)
    return (min(starts), max(ends)) if starts else (0, 0)


def combined_sha256(files: Sequence[DataFile]) -> str:
    """The dataset's fingerprint: the sha256 of its one file (as in-process), or of
    ``privrelease-parquet-folder`` and one line ``name<TAB>bytes<TAB>sha256`` per file, by
    name (renaming, adding, removing or changing any file changes it)."""
    if len(files) == 1:
        return files[0].sha256
    lines = [FOLDER_DOMAIN, *(f"{Path(f.path).name}\t{f.bytes}\t{f.sha256}" for f in files)]
    return sha256_text("\n".join(lines) + "\n")


def plan_partitions(files: Sequence[DataFile], rows_per_partition: int) -> list[Partition]:
    """Consecutive whole row groups of each file, up to ``rows_per_partition`` rows per
    partition (a larger row group is a partition of its own); files without rows give none."""
    partitions: list[Partition] = []
    for file in files:
        groups: list[int] = []
        first = rows = 0
        for group, size in enumerate(file.row_groups):
            if not size:  # nothing to read (and no byte range to check)
                continue
            if groups and rows + size > rows_per_partition:
                partitions.append(Partition(file, tuple(groups), first, rows))
                first += rows
                groups, rows = [], 0
            groups.append(group)
            rows += size
        if rows:
            partitions.append(Partition(file, tuple(groups), first, rows))
    return partitions


class VerifiedBytes(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only ``pieces`` (offset -> bytes, each
    checked against the fingerprint) can be read; reading anything else is an error. Parquet
    reads a row group through its footer from its column chunks only, so a partition parses
    exactly bytes that were fingerprinted without reading the rest of the file."""

    def __init__(self, size: int, pieces: dict[int, bytes]):
        self._size, self._pieces, self._position = size, pieces, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: self._size}[whence]
        self._position = base + offset
        return self._position

    def readinto(self, buffer: Any) -> int:
        wanted = min(len(buffer), self._size - self._position)
        filled = 0
        while filled < wanted:  # a read may span adjacent pieces (consecutive row groups)
            position = self._position + filled
            piece = next(((s, b) for s, b in self._pieces.items() if s <= position < s + len(b)), None)
            if piece is None:
                raise OSError(f"read of bytes {position}-{self._position + wanted} outside the fingerprinted ranges")
            start, data = piece
            count = min(wanted - filled, start + len(data) - position)
            buffer[filled : filled + count] = data[position - start : position - start + count]
            filled += count
        self._position += filled
        return filled


def _verified(handle: Any, file: DataFile, start: int, end: int, expected: str) -> bytes:
    """Bytes ``[start, end)`` of the open file, which must hash to ``expected``."""
    handle.seek(start)
    piece = handle.read(end - start)
    if sha256_bytes(piece) != expected:
        raise UserError(
            f"dataset file {file.path!r} changed after it was fingerprinted (bytes {start}-{end} no longer "
            f"hash as they did): nothing was read from it; run again"
        )
    return piece


def read_partition(partition: Partition, spec: ReadSpec) -> Any:
    """The partition's declared columns, checked (a :class:`~privrelease.datasets.DatasetRead`),
    parsed from its file's footer and its row groups' bytes only, each of which must hash as
    fingerprinted (what is read is what was charged). A user error names the file and rows."""
    from privrelease.datasets import parse_parquet

    if partition.file.format == "csv":
        return _read_csv_partition(partition, spec)
    path = Path(partition.file.path)
    source, metadata = _verified_parquet(partition)
    try:
        raw = parse_parquet(source, path, spec.columns, metadata=metadata, row_groups=partition.row_groups)
        return _checked(raw, path, spec)
    except UserError as error:
        raise UserError(f"{error}{rows_note(partition.first_row, partition.rows, path.name)}") from None


def _verified_parquet(partition: Partition) -> tuple[pa.PythonFile, pq.FileMetaData]:
    """The partition's Parquet file as only its footer and its row groups' bytes, each checked
    against the fingerprint (:class:`VerifiedBytes`), and the footer parsed."""
    file = partition.file
    with open_checked(Path(file.path)) as handle:
        try:
            tail = file.bytes - file.footer_bytes
            pieces = {tail: _verified(handle, file, tail, file.bytes, file.footer_sha256)}
            for group in partition.row_groups:
                start, end = file.ranges[group]
                pieces[start] = _verified(handle, file, start, end, file.range_sha256[group])
        except OSError as error:
            raise UserError(f"cannot read dataset file {file.path!r}: {error.strerror or error}") from None
    metadata = pq.read_metadata(pa.BufferReader(b"PAR1" + pieces[tail]))  # the verified footer
    return pa.PythonFile(VerifiedBytes(file.bytes, pieces), mode="r"), metadata


def rows_note(first_row: int, rows: int, name: str) -> str:
    """What an error found in part of a file adds: which of its data rows the part holds (the
    error's own row numbers count from the first of them)."""
    return f" (in data rows {first_row + 1}-{first_row + rows} of {name!r}: row numbers count from the first of them)"


def _checked(raw: pa.Table, path: Path, spec: ReadSpec, first_row: int = 0) -> Any:
    """The parsed ``raw`` rows checked as declared in ``spec`` (rows from ``first_row + 1``);
    a partition may lose every row to ``missing: drop`` (the whole read may not:
    :func:`privrelease.datasets.require_rows_left`, once its partitions are merged)."""
    from privrelease.datasets import check_dataset

    return check_dataset(
        raw,
        path,
        spec.columns,
        missing=spec.missing,
        missing_values=spec.missing_values,
        domains=dict(spec.domains),
        first_row=first_row,
        whole=False,
    )


def _read_csv_partition(partition: Partition, spec: ReadSpec) -> Any:
    """A CSV partition: the file's first line (the dialect's and the header's) and the
    partition's blocks of whole lines, each hashing as fingerprinted, parsed and checked as the
    in-process reader does the whole file; errors name the file's own data row numbers."""
    from privrelease.datasets import parse_csv_lines

    file, csv = partition.file, spec.csv
    assert csv is not None, "a CSV file is read with the policy's CSV options"
    path = Path(file.path)
    with open_checked(path) as handle:
        try:
            first_line = _verified(handle, file, 0, file.head_bytes, file.head_sha256)
            start, end = file.ranges[partition.row_groups[0]][0], file.ranges[partition.row_groups[-1]][1]
            data = b"".join(
                _verified(handle, file, *file.ranges[block], file.range_sha256[block]) for block in partition.row_groups
            )
        except OSError as error:
            raise UserError(f"cannot read dataset file {file.path!r}: {error.strerror or error}") from None
    assert len(data) == end - start, "a partition's blocks are consecutive"
    try:
        raw = parse_csv_lines(
            first_line, data, path, spec.columns, records=partition.rows, first_row=partition.first_row, **csv
        )
        return _checked(raw, path, spec, partition.first_row)
    except UserError as error:
        raise UserError(
            f"{error} (in data rows {partition.first_row + 1}-{partition.first_row + partition.rows} of "
            f"{path.name!r}, bytes {start}-{end})"
        ) from None


class PartitionError(DataStepError):
    """A :class:`.context.DataStepError` raised on a worker: it keeps the original error when
    pickled (Dask sends it to the flow process, which turns it back into a plain
    DataStepError, :func:`.scaled.gather`), else a RuntimeError with its type and text."""

    def __reduce__(self) -> tuple[Any, ...]:
        original = self.original
        try:
            pickle.loads(pickle.dumps(original))
        except Exception:
            original = RuntimeError(f"{type(original).__name__}: {self.detail}")
        return (type(self), (self.step, original))


@functools.cache
def _adaptive_malloc() -> None:
    """Once per process, when ``MALLOC_TRIM_THRESHOLD_`` is below :data:`_TRIM_THRESHOLD` (Dask's
    nanny starts every worker with 65536, ``distributed.nanny.pre-spawn-environ``): glibc's
    mmap and trim thresholds as its adaptive defaults reach them. A fixed trim threshold also
    fixes the mmap threshold at 128 KiB, so every array of a partition was a fresh mapping
    faulted in page by page and unmapped when freed: 45 ms of CPU per partition of 1 M rows
    against 31 ms (reading 8 columns and counting SDGS cells). Up to 64 MiB of freed memory
    then stays in the worker for the next partition (as Arrow's pool keeps its own, below).
    Nothing happens without glibc."""
    import ctypes

    if int(os.environ.get("MALLOC_TRIM_THRESHOLD_", _TRIM_THRESHOLD)) >= _TRIM_THRESHOLD:
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    libc.mallopt(-3, _MMAP_THRESHOLD)  # M_MMAP_THRESHOLD (malloc.h)
    libc.mallopt(-1, _TRIM_THRESHOLD)  # M_TRIM_THRESHOLD


@dataclass(frozen=True)
class PersonShare:
    """A partition's part of the person bound on Dask (:func:`.scaled.read_partials`), per
    person in the partition's order of first appearance (:func:`~privrelease.mechanisms.persons.persons_of`):
    its rows as the first pass counted them, how many it keeps, and each one-row kind's kept row
    (:func:`~privrelease.mechanisms.persons.partition_shares`)."""

    column: str
    counts: Any
    quota: Any
    picked: Any

    def tables(self, table: pa.Table, jobs: tuple[Any, ...]) -> list[pa.Table]:
        """What each job reads of the partition's ``table``: its kept rows, or a one-row kind's
        (``job.pick``) one row of some of its people (:func:`~privrelease.mechanisms.persons.partition_rows`)."""
        import numpy as np

        from privrelease.mechanisms.persons import partition_rows, person_codes

        codes = person_codes(table[self.column])
        if not np.array_equal(np.bincount(codes, minlength=len(self.counts)), self.counts):
            raise RuntimeError("the partition's people differ between the two reads of its verified bytes")
        kept, picked = partition_rows(codes, self.quota, self.picked)
        kept_table = table.take(pa.array(kept))
        return [kept_table if job.pick is None else table.take(pa.array(picked[job.pick])) for job in jobs]


def person_counts(partition: Partition, spec: ReadSpec, column: str) -> tuple[pa.Array, Any]:
    """The first pass of the person bound on Dask (on a worker): :func:`count_persons` of the
    partition."""
    _adaptive_malloc()
    with withholding("reading the data", PartitionError):
        return count_persons(read_partition(partition, spec).table, column)


def count_persons(table: pa.Table, column: str) -> tuple[pa.Array, Any]:
    """A partition's (or row group's) distinct persons (values of ``column``, in order of first
    appearance, :func:`~privrelease.mechanisms.persons.persons_of`) and each one's rows."""
    import numpy as np

    from privrelease.mechanisms.persons import persons_of

    persons, codes = persons_of(table[column])
    return persons, np.bincount(codes, minlength=len(persons)).astype(np.int32)  # a partition's rows: below 2^31


def partials(
    partition: Partition, share: PersonShare | None = None, *, spec: ReadSpec, jobs: tuple[Any, ...]
) -> PartitionResult:
    """Read one partition and compute every job's partial result on it (on a worker), on the
    rows ``share`` keeps when the policy names a person column. A Parquet partition of which
    no row can be dropped (no person column, ``missing: reject``) whose every job takes one
    column at a time (:class:`~privrelease.mechanisms.kinds.ColumnJob`: every kind of
    privrelease's own) is read so (:func:`_column_partials`)."""
    _adaptive_malloc()
    by_column = spec.missing == "reject" and partition.file.format == "parquet"
    if share is None and by_column and all(job.takes_columns for job in jobs):
        try:
            return _column_partials(partition, spec, jobs)
        except PartitionError:
            pass  # read again as a whole below: its error is the one a whole read names first
    with withholding("reading the data", PartitionError):
        read = read_partition(partition, spec)
    where = rows_note(partition.first_row, partition.rows, Path(partition.file.path).name)
    return job_partials(read, jobs, where, PartitionError, share)


def _column_partials(partition: Partition, spec: ReadSpec, jobs: tuple[Any, ...]) -> PartitionResult:
    """Every job's partial result on a partition read one column at a time: each declared
    column parsed alone from the verified bytes, checked as :func:`read_partition` checks it
    (``missing: reject``: every row kept, so the columns stay aligned), given to every job's
    column partial and dropped. A worker's partition then holds one column, not all: in a fresh
    process, a first partition of 1 M rows of ``bench/scale.py``'s 8 columns (SDGS, beta 0.1)
    touches 7,400 fresh pages instead of 19,900 and costs 0.042-0.043 CPU s instead of
    0.062-0.064, later ones 0.027-0.029 instead of 0.030-0.034. Any error is raised as a
    :class:`PartitionError`, for :func:`partials` to read the partition as a whole."""
    from privrelease.datasets import parse_parquet_columns

    path = Path(partition.file.path)
    started = [job.column_partial(partition.rows) for job in jobs]
    with withholding("reading the data", PartitionError):
        source, metadata = _verified_parquet(partition)
        columns = parse_parquet_columns(source, path, spec.columns, metadata=metadata, row_groups=partition.row_groups)
        for name, raw in columns:
            single = ReadSpec({name: spec.columns[name]}, spec.missing, spec.missing_values, _domain(spec, name))
            column = _checked(raw, path, single).table.column(0)
            assert len(column) == partition.rows, "a partition's columns have its rows"
            for job, partial in zip(jobs, started, strict=True):
                with withholding(job.step, PartitionError):
                    partial.add(name, column)
            del raw, column  # before the next column is decoded
    results = {}
    for job, partial in zip(jobs, started, strict=True):
        with withholding(job.step, PartitionError):
            results[job.name] = partial.result()
    return PartitionResult(partition.rows, 0, results)


def _domain(spec: ReadSpec, name: str) -> dict[str, tuple[Any, ...]]:
    """The declared domain of column ``name`` alone (none: no entry)."""
    return {name: spec.domains[name]} if name in spec.domains else {}


def job_partials(
    read: Any,
    jobs: tuple[Any, ...],
    where: str,
    error_type: type[DataStepError] = DataStepError,
    share: PersonShare | None = None,
) -> PartitionResult:
    """Every job's partial result on one read partition (a :class:`~privrelease.datasets.DatasetRead`;
    of the rows ``share`` keeps for it, if given); an error is raised as ``error_type`` naming
    the job's step, a user error with ``where`` (:func:`rows_note`) added."""
    with withholding("reading the data", error_type):
        tables = [read.table] * len(jobs) if share is None else share.tables(read.table, jobs)
    results = {}
    for job, table in zip(jobs, tables, strict=True):
        with withholding(job.step, error_type):
            try:
                results[job.name] = job.partial(table)
            except UserError as error:
                raise UserError(f"{error}{where}") from None
    # No release_unused() of Arrow's pool here: its allocator reuses the freed partition for the
    # next one; handing it back to the OS after every partition made the next one fault it in
    # again (20 partitions of 1 M rows: 1.4x the time, for a resident set 22 MB smaller between
    # partitions and the same peak).
    return PartitionResult(read.rows_read, read.rows_dropped, results)
