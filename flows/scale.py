"""Scale-out (k, beta)-SDGS microdata with Dask: the flow ``sdgs-scale-out`` runs the steps of
:mod:`privrelease.mechanisms.partitioned` as Prefect tasks on a Dask cluster
(``prefect_dask.DaskTaskRunner``: a ``LocalCluster`` by default and in tests, ``address=`` of
an existing scheduler in production), so no process ever holds the whole dataset.

1. split (in the flow, from Parquet metadata only): the input file's row groups, or the row
   groups of every ``*.parquet`` file of a folder, grouped into partitions of about
   ``rows_per_partition`` rows (whole row groups);
2. map ``scale-count`` over the partitions: read the partition's declared columns with the
   checks of :mod:`privrelease.datasets`, Bernoulli-sample, generalize and count cells
   (:func:`.sdgs.count_cells`); the partial counts go to a scratch file, the task returns its
   path and row counts;
3. ``scale-reduce`` once: merge all partial counts by cell label, suppress cells with fewer than
   k rows in the whole sample, split the published rows over the output files at random
   (:func:`.partitioned.assign_files`: files do not follow the input partitions, which would
   disclose where a row came from) and write that plan to scratch;
4. map ``scale-write`` over the output files: each writes ``part-NNNNN.parquet``, its rows in
   uniformly random order, and returns its checksum;
5. publish (in the flow): move exactly the files the tasks reported into a fresh hidden folder,
   check every checksum, write ``release.json`` (public facts, files, checksums), and rename
   that folder to ``OUT/<release_name>``: all files appear at once or none.

Tasks take and return paths and small summaries only (no rows, no counts: those stay in the
scratch files, mode 0700, removed at the end), with ``cache_policy=NO_CACHE`` and
``persist_result=False``. Later tasks get plain values, never futures of earlier ones, so Dask
never recomputes a finished step behind the flow's back; every attempt of a task writes a file
of its own and the flow uses exactly the files the completed attempts named, so a retried task
(Dask re-runs the tasks of a lost worker) cannot mix two samples.

On any failure (a task error, a worker lost more often than Dask allows, the flow cancelled):
the flow waits for the tasks still running, removes the work and publish folders and re-raises:
never a partial release. Errors raised while a partition is in hand are
:class:`PartitionError` (a :class:`.steps.DataStepError` that pickles): their text names only
the step and the error type.

Workers must reach the flow's Prefect API (``PREFECT_API_URL``; without one every worker would
start a temporary server of its own) and see the data and output paths (a shared file system).
"""

from __future__ import annotations

import functools
import json
import os
import pickle
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
from prefect import flow, task, unmapped
from prefect.cache_policies import NO_CACHE

from privrelease.errors import UserError
from privrelease.flows.steps import DataStepError
from privrelease.mechanisms.schemes import ColumnScheme

TASK_OPTIONS: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}
RELEASE_MANIFEST = "release.json"
WORK_SUFFIX = ".scale-work"
PUBLISH_SUFFIX = ".scale-publish"
DEFAULT_ROWS_PER_PARTITION = 1_000_000
DEFAULT_ROWS_PER_FILE = 1_000_000


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class ScaleSpec:
    """What to release: the dataset's declared columns (name -> ``integer`` | ``float`` |
    ``string``, all read and checked as in-process), the generalization of the published
    columns, SDGS's k, beta and epsilon, and the missing-value handling."""

    columns: dict[str, str]
    schemes: dict[str, ColumnScheme]
    k: int
    beta: float
    epsilon: float = 0.0
    missing: str = "reject"
    missing_values: tuple[str, ...] = ("", "?")

    @classmethod
    def from_policy(cls, policy_path: str | Path, mechanism: str | None = None) -> tuple[ScaleSpec, Path]:
        """The spec of SDGS mechanism ``mechanism`` (None: the policy's only one) of a policy
        file, and the policy's dataset path."""
        from privrelease.policies import load_policy

        loaded = load_policy(policy_path)
        candidates = [m for m in loaded.policy.mechanisms if m.type == "sdgs"]
        if mechanism is not None:
            candidates = [m for m in candidates if m.name == mechanism]
        if len(candidates) != 1:
            names = ", ".join(repr(m.name) for m in loaded.policy.mechanisms if m.type == "sdgs") or "none"
            raise UserError(f"mechanism must name one sdgs mechanism of the policy; got {mechanism!r} (sdgs: {names})")
        chosen = candidates[0]
        if chosen.select_scheme is not None:
            raise UserError(f"mechanism {chosen.name!r}: scale-out does not run select_scheme; fix the scheme")
        dataset = loaded.policy.dataset
        spec = cls(
            columns={name: column.type for name, column in dataset.columns.items()},
            schemes=loaded.schemes(chosen.columns),
            k=chosen.k,
            beta=chosen.beta,
            epsilon=chosen.epsilon or 0.0,
            missing=dataset.missing,
            missing_values=tuple(dataset.missing_values),
        )
        return spec, loaded.dataset_path


@dataclass(frozen=True)
class Partition:
    """Whole row groups of one Parquet file: data rows ``first_row + 1 .. first_row + rows``
    of the dataset; the file's size and modification time when the run was planned."""

    index: int
    path: str
    row_groups: tuple[int, ...]
    first_row: int
    rows: int
    size_bytes: int
    mtime_ns: int


@dataclass(frozen=True)
class PartitionCounts:
    """A partition's partial cell counts (in the scratch file ``path``) and its row counts."""

    index: int
    path: str
    rows_read: int
    rows_dropped: int


@dataclass(frozen=True)
class ReducePlan:
    """The published cells (scratch ``cells_path``) and their rows per output file (scratch
    ``files_path``, one record batch per file); the release's facts and event."""

    cells_path: str
    files_path: str
    files: int
    event_json: str
    public_facts: dict[str, Any] = field(default_factory=dict)
    internal_facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WrittenFile:
    """An output file written by one task attempt (``path``: its unique staging name)."""

    index: int
    path: str
    rows: int
    sha256: str
    bytes: int


class PartitionError(DataStepError):
    """A :class:`.steps.DataStepError` that survives pickling (Dask sends task errors between
    processes): the original exception travels along when it pickles, else a RuntimeError
    with its type and text (kept for the operator's terminal, never in str())."""

    def __reduce__(self) -> tuple[Any, ...]:
        original: BaseException = self.original
        try:
            pickle.loads(pickle.dumps(original))
        except Exception:
            original = RuntimeError(f"{type(original).__name__}: {self.detail}")
        return (type(self), (self.step, original))


# --------------------------------------------------------------------------- 1. split


def _parquet_files(data_path: Path) -> list[Path]:
    if data_path.is_dir():
        files = sorted(path for path in data_path.iterdir() if path.suffix == ".parquet" and path.is_file())
        if not files:
            raise UserError(f"dataset folder {str(data_path)!r} has no .parquet files")
        return files
    if not data_path.is_file():
        raise UserError(f"dataset {str(data_path)!r} does not exist (a Parquet file or a folder of them)")
    return [data_path]


def plan_partitions(
    data_path: str | Path, columns: dict[str, str], rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION
) -> list[Partition]:
    """Partitions of a Parquet file (or of every ``*.parquet`` file of a folder, by name):
    consecutive whole row groups of one file, up to ``rows_per_partition`` rows each (a
    larger row group is a partition of its own). Reads metadata only; every file must have
    the declared columns."""
    if rows_per_partition < 1:
        raise UserError(f"rows_per_partition must be >= 1; got {rows_per_partition}")
    partitions: list[Partition] = []
    first_row = 0
    for path in _parquet_files(Path(data_path)):
        try:
            metadata = pq.ParquetFile(path).metadata
        except (pa.ArrowInvalid, OSError) as error:
            raise UserError(f"dataset file {str(path)!r} is not a readable Parquet file: {error}") from None
        names = metadata.schema.to_arrow_schema().names
        absent = [name for name in columns if name not in names]
        if absent:
            raise UserError(
                f"dataset file {str(path)!r} has no column {absent[0]!r} (declared) among its {len(names)} columns"
            )
        stat = path.stat()
        groups: list[int] = []
        rows = 0
        for group in range(metadata.num_row_groups):
            size = metadata.row_group(group).num_rows
            if groups and rows + size > rows_per_partition:
                partitions.append(
                    Partition(
                        len(partitions), str(path), tuple(groups), first_row, rows, stat.st_size, stat.st_mtime_ns
                    )
                )
                first_row += rows
                groups, rows = [], 0
            groups.append(group)
            rows += size
        if groups and rows:
            partitions.append(
                Partition(len(partitions), str(path), tuple(groups), first_row, rows, stat.st_size, stat.st_mtime_ns)
            )
            first_row += rows
    if first_row == 0:
        raise UserError(f"dataset {str(data_path)!r} has no data rows")
    return partitions


# --------------------------------------------------------------------------- 2. count


def read_partition(partition: Partition, spec: ScaleSpec) -> Any:
    """The partition's declared columns, checked as :func:`privrelease.datasets.read_dataset`
    checks a whole file (a :class:`~privrelease.datasets.DatasetRead`; row numbers in its
    errors count from the partition's first row)."""
    from privrelease.datasets import _check_columns

    path = Path(partition.path)
    stat = path.stat()
    if (stat.st_size, stat.st_mtime_ns) != (partition.size_bytes, partition.mtime_ns):
        raise UserError(f"dataset file {partition.path!r} changed while the release ran; run again")
    schema = pq.read_schema(path)
    as_dictionary = [
        name
        for name, kind in spec.columns.items()
        if kind == "string"
        and (pa.types.is_string(schema.field(name).type) or pa.types.is_large_string(schema.field(name).type))
    ]
    raw = pq.ParquetFile(path, read_dictionary=as_dictionary).read_row_groups(
        list(partition.row_groups), columns=list(spec.columns)
    )
    return _check_columns(raw, spec.columns, spec.missing, spec.missing_values, path)


def count_partition(partition: Partition, spec: ScaleSpec, scratch: str) -> PartitionCounts:
    """Sample, generalize and count one partition; the partial counts go to a new file in
    ``scratch`` (one per attempt). A user error names the partition's data rows."""
    from privrelease.mechanisms.partitioned import cells_to_arrow
    from privrelease.mechanisms.sdgs import count_cells

    try:
        try:
            read = read_partition(partition, spec)
            cells = count_cells(read.table, spec.schemes, beta=spec.beta)
        except UserError as error:
            raise UserError(
                f"data rows {partition.first_row + 1}-{partition.first_row + partition.rows} of the dataset"
                f" (partition {partition.index}; row numbers below count from its first row): {error}"
            ) from None
    except Exception as error:
        raise PartitionError(f"counting partition {partition.index}", error) from None
    path = Path(scratch) / f"count-{partition.index:05d}-{uuid.uuid4().hex}.arrow"
    _write_arrow(cells_to_arrow(cells), path)
    return PartitionCounts(partition.index, str(path), read.rows_read, read.rows_dropped)


def _write_arrow(table: pa.Table, path: Path, batches: list[pa.RecordBatch] | None = None) -> None:
    with pa.OSFile(str(path), "wb") as sink, ipc.new_file(sink, table.schema) as writer:
        if batches is None:
            writer.write_table(table)
        for batch in batches or ():
            writer.write_batch(batch)


def _read_arrow(path: str) -> ipc.RecordBatchFileReader:
    return ipc.open_file(pa.memory_map(path))


# --------------------------------------------------------------------------- 3. reduce


_FILES_SCHEMA = pa.schema([("cell", pa.int64()), ("rows", pa.int64())])


def reduce_counts(parts: list[PartitionCounts], spec: ScaleSpec, scratch: str, rows_per_file: int) -> ReducePlan:
    """Merge the partial counts, keep the cells with at least k rows in the whole sample and
    split their rows over the output files at random; both go to new scratch files."""
    from privrelease.mechanisms import partitioned
    from privrelease.mechanisms.events import event_to_json

    try:
        merged = partitioned.merge_counts(
            [
                partitioned.cells_from_arrow(_read_arrow(part.path).read_all())
                for part in sorted(parts, key=lambda p: p.index)
            ]
        )
        published = partitioned.published_cells(merged, spec.k)
        files = partitioned.file_count(int(published.counts.sum()), rows_per_file)
        assignment = partitioned.assign_files(published.counts, files)
        outcome = partitioned.result(merged, k=spec.k, beta=spec.beta, epsilon=spec.epsilon)
    except Exception as error:
        raise PartitionError("merging the partial counts", error) from None
    tag = uuid.uuid4().hex
    cells_path = Path(scratch) / f"published-{tag}.arrow"
    files_path = Path(scratch) / f"files-{tag}.arrow"
    _write_arrow(partitioned.cells_to_arrow(published), cells_path)
    batches = [
        pa.record_batch([pa.array(cells, pa.int64()), pa.array(rows, pa.int64())], schema=_FILES_SCHEMA)
        for cells, rows in assignment
    ]
    _write_arrow(pa.table({"cell": [], "rows": []}, schema=_FILES_SCHEMA), files_path, batches)
    internal = {
        **outcome.internal_facts,
        "rows_read": sum(part.rows_read for part in parts),
        "rows_dropped": sum(part.rows_dropped for part in parts),
        "partitions": len(parts),
    }
    return ReducePlan(
        str(cells_path), str(files_path), files, event_to_json(outcome.event), outcome.public_facts, internal
    )


# --------------------------------------------------------------------------- 4. write


def write_file(plan: ReducePlan, index: int, pieces: str) -> WrittenFile:
    """Write output file ``index`` of the plan (its rows in uniformly random order) under a
    new name in ``pieces``; its checksum, size and row count."""
    from privrelease.datasets import fingerprint, write_parquet
    from privrelease.mechanisms import partitioned

    cells = partitioned.cells_from_arrow(_read_arrow(plan.cells_path).read_all())
    batch = _read_arrow(plan.files_path).get_batch(index)
    table = partitioned.file_table(cells, batch.column(0).to_numpy(), batch.column(1).to_numpy())
    path = Path(pieces) / f"part-{index:05d}-{uuid.uuid4().hex}.parquet"
    write_parquet(table, path)
    sha256, size = fingerprint(path)
    return WrittenFile(index, str(path), table.num_rows, sha256, size)


# --------------------------------------------------------------------------- tasks


def _returning_memory(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function``, then Arrow's memory pool hands its cached free memory back to the OS (a
    worker's memory limit counts it: about 60 MB per partition otherwise)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        finally:
            pa.default_memory_pool().release_unused()

    return wrapper


@task(name="scale-count", task_run_name="scale-count-{partition.index}", **TASK_OPTIONS)
@_returning_memory
def count_task(partition: Partition, spec: ScaleSpec, scratch: str) -> PartitionCounts:
    return count_partition(partition, spec, scratch)


@task(name="scale-reduce", **TASK_OPTIONS)
@_returning_memory
def reduce_task(parts: list[PartitionCounts], spec: ScaleSpec, scratch: str, rows_per_file: int) -> ReducePlan:
    return reduce_counts(parts, spec, scratch, rows_per_file)


@task(name="scale-write", task_run_name="scale-write-{index}", **TASK_OPTIONS)
@_returning_memory
def write_task(plan: ReducePlan, index: int, pieces: str) -> WrittenFile:
    return write_file(plan, index, pieces)


# --------------------------------------------------------------------------- 5. publish


@dataclass(frozen=True)
class Folders:
    """Where a run writes: ``work`` (scratch and written files, mode 0700), ``publish`` (the
    release being assembled) and ``final`` (the release), all in the output folder."""

    work: Path
    publish: Path
    final: Path

    @property
    def scratch(self) -> Path:
        return self.work / "scratch"

    @property
    def pieces(self) -> Path:
        return self.work / "pieces"

    @classmethod
    def create(cls, out_dir: str | Path, release_name: str) -> Folders:
        root = Path(out_dir)
        if not release_name or "/" in release_name or release_name.startswith("."):
            raise UserError(
                f"release_name must be a plain folder name (no '/', not starting with '.'); got {release_name!r}"
            )
        folders = cls(
            root / f".{release_name}{WORK_SUFFIX}", root / f".{release_name}{PUBLISH_SUFFIX}", root / release_name
        )
        for path in (folders.final, folders.work, folders.publish):
            if path.exists():
                raise UserError(f"{str(path)!r} already exists; choose another release_name or remove it")
        try:
            root.mkdir(parents=True, exist_ok=True)
            folders.work.mkdir(mode=0o700)
            folders.scratch.mkdir(mode=0o700)
            folders.pieces.mkdir(mode=0o700)
        except OSError as error:
            raise UserError(f"cannot create the work folder in {str(root)!r}: {error.strerror or error}") from None
        return folders

    def remove(self) -> None:
        """Remove the work and publish folders (never the release folder)."""
        for path in (self.work, self.publish):
            for _ in range(3):  # a task ending meanwhile may add a file: try again
                shutil.rmtree(path, ignore_errors=True)
                if not path.exists():
                    break
                time.sleep(0.2)


def publish(folders: Folders, plan: ReducePlan, written: list[WrittenFile]) -> dict[str, Any]:
    """Move exactly the reported files into the publish folder as ``part-NNNNN.parquet``, check
    their checksums, write the manifest and rename the folder to the release folder."""
    from privrelease.datasets import fingerprint

    assert sorted(w.index for w in written) == list(range(plan.files)), "one written file per planned file"
    folders.publish.mkdir()
    files = []
    for piece in sorted(written, key=lambda w: w.index):
        target = folders.publish / f"part-{piece.index:05d}.parquet"
        os.rename(piece.path, target)
        sha256, size = fingerprint(target)
        if (sha256, size) != (piece.sha256, piece.bytes):
            raise RuntimeError(f"output file {piece.index} changed after it was written (checksum mismatch)")
        files.append({"file": target.name, "rows": piece.rows, "sha256": sha256, "bytes": size})
    manifest = {
        "mechanism": "sdgs",
        "event": json.loads(plan.event_json),
        "public_facts": plan.public_facts,
        "files": files,
    }
    (folders.publish / RELEASE_MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    os.rename(folders.publish, folders.final)
    return {
        "release_dir": str(folders.final),
        "files": [{**entry, "path": str(folders.final / entry["file"])} for entry in files],
        "event_json": plan.event_json,
        "public_facts": plan.public_facts,
        "internal_facts": plan.internal_facts,
    }


# --------------------------------------------------------------------------- the flow


def _settle(futures: list[Any]) -> None:
    """Wait until every submitted task has ended (failed ones included)."""
    for future in futures:
        try:
            future.wait()
        except BaseException:  # noqa: BLE001 - only waiting
            pass


@flow(name="sdgs-scale-out", persist_result=False, validate_parameters=False, log_prints=False)
def scale_release(
    data_path: str,
    out_dir: str,
    spec: ScaleSpec,
    release_name: str | None = None,
    rows_per_partition: int = DEFAULT_ROWS_PER_PARTITION,
    rows_per_file: int = DEFAULT_ROWS_PER_FILE,
) -> dict[str, Any]:
    """(k, beta)-SDGS microdata of the Parquet dataset at ``data_path`` as the files of
    ``OUT/<release_name>`` (default ``sdgs-<random hex>``): paths, checksums, facts and the
    seconds of each stage."""
    from privrelease.mechanisms.sdgs import check_parameters

    check_parameters(spec.k, spec.beta, spec.epsilon)
    if rows_per_file < 1:
        raise UserError(f"rows_per_file must be >= 1; got {rows_per_file}")
    partitions = plan_partitions(data_path, spec.columns, rows_per_partition)
    folders = Folders.create(out_dir, release_name or f"sdgs-{uuid.uuid4().hex[:12]}")
    submitted: list[Any] = []
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        timings[stage] = round(time.perf_counter() - clock, 3)
        clock = time.perf_counter()

    try:
        counting = count_task.map(partitions, unmapped(spec), unmapped(str(folders.scratch)))
        submitted.extend(counting)
        parts = [future.result() for future in counting]
        lap("count")
        reducing = reduce_task.submit(parts, spec, str(folders.scratch), rows_per_file)
        submitted.append(reducing)
        plan = reducing.result()
        lap("reduce")
        writing = write_task.map(unmapped(plan), list(range(plan.files)), unmapped(str(folders.pieces)))
        submitted.extend(writing)
        written = [future.result() for future in writing]
        lap("write")
        published = publish(folders, plan, written)
        lap("publish")
    except BaseException:
        _settle(submitted)
        folders.remove()
        raise
    folders.remove()
    return {**published, "timings": timings}


def run_scale_release(
    data_path: str | Path,
    out_dir: str | Path,
    spec: ScaleSpec,
    *,
    address: str | None = None,
    n_workers: int = 2,
    threads_per_worker: int = 1,
    memory_limit: str | int = "auto",
    **options: Any,
) -> dict[str, Any]:
    """Run :func:`scale_release` on the Dask scheduler at ``address`` (production: an existing
    cluster whose workers see the data and output paths and reach the same Prefect API), or
    on a new ``LocalCluster`` of ``n_workers`` processes. Needs a Prefect API URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect_dask import DaskTaskRunner

    if not PREFECT_API_URL.value():
        raise UserError(
            "scale-out needs a Prefect server: set PREFECT_API_URL (e.g. http://127.0.0.1:4200/api);"
            " without one every Dask worker would start a temporary server of its own"
        )
    if address:
        runner = DaskTaskRunner(address=address)
    else:
        runner = DaskTaskRunner(
            cluster_kwargs={
                "n_workers": n_workers,
                "threads_per_worker": threads_per_worker,
                "memory_limit": memory_limit,
                "processes": True,
            }
        )
    return scale_release.with_options(task_runner=runner)(
        data_path=str(data_path), out_dir=str(out_dir), spec=spec, **options
    )
