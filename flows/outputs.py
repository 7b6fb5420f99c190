"""Step 7 of a release: run one policy mechanism (its kind's ``run`` in-process, or its
``finish`` from the partials of Dask or of a streamed in-process read:
:mod:`privrelease.mechanisms.kinds`) and write its output (and its companion, the published
cells of SDGS microdata with their count intervals) to the staging folder. On Dask an output
in pieces is computed and written by the workers, each file by one (:func:`write_remote`), the
flow's process checking their sha256."""

from __future__ import annotations

import functools
import json
from contextlib import nullcontext
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pcsv

from privrelease.files import atomic_path, sha256_file
from privrelease.flows.context import (
    OutputFacts,
    RunContext,
    StagedFile,
    _write_error,
    mechanism_step,
    plan_of,
    safe_name,
    withholding,
)
from privrelease.flows.data import mechanism_rows, run_partials, run_table, streams
from privrelease.mechanisms.results import Pieces

CELLS_SUFFIX = "cells"
"""A companion output's file is ``<mechanism>.cells.<format>`` (:attr:`.results.MechanismResult.cells`)."""


def write_table(table: pa.Table | Pieces, path: Path, output_format: str) -> int:
    """Write ``table`` to ``path`` (Parquet or CSV) through a temp file in the same folder and
    ``os.replace`` (:func:`.files.atomic_path`); the temp file is removed on any error.
    :class:`Pieces` are written one at a time (a Parquet row group, a CSV block each), each
    while the next is computed, never more than two held at once. Returns the rows."""
    from privrelease.datasets import write_parquet

    with atomic_path(path) as temp:
        if isinstance(table, pa.Table) and output_format == "parquet":
            write_parquet(table, temp)
            rows = table.num_rows
        else:
            rows = _write_pieces(
                table if isinstance(table, Pieces) else Pieces(table.schema, iter([table])), temp, output_format, path
            )
    return rows


def _write_pieces(pieces: Pieces, temp: Path, output_format: str, path: Path) -> int:
    """Write the pieces in order, each while the next one is computed: one writer thread, at
    most one piece waiting for it (Arrow's writers and numpy's sorts and gathers run without
    the GIL; at most two pieces are held at once)."""
    from concurrent.futures import Future, ThreadPoolExecutor

    import pyarrow.parquet as pq

    from privrelease.datasets import plain_columns

    rows = 0
    try:
        if output_format == "parquet":
            writer: Any = pq.ParquetWriter(temp, pieces.schema, write_statistics=False)
        else:
            writer = pcsv.CSVWriter(
                temp,
                plain_columns(pieces.schema.empty_table()).schema,
                write_options=pcsv.WriteOptions(quoting_style="needed"),
            )
        with writer, ThreadPoolExecutor(1, thread_name_prefix="privrelease-write") as pool:
            pending: Future[None] | None = None
            for piece in pieces.tables:
                table = piece if output_format == "parquet" else plain_columns(piece)
                if pending is not None:
                    pending.result()  # in order; a write error stops the run here
                pending = pool.submit(writer.write_table, table)
                rows += piece.num_rows
            if pending is not None:
                pending.result()
    except OSError as error:
        raise _write_error(path, error) from None
    return rows


def run_mechanism(run: RunContext, name: str) -> OutputFacts:
    """Run the policy mechanism ``name`` on the run's data (on Dask or after a streamed read,
    :func:`.data.streams`: finish it from the merged partial results) and write its output to
    the staging folder. The realized event must be the planned one (what was reserved)."""
    from privrelease.mechanisms.events import event_to_json
    from privrelease.planning import released_event

    loaded = run.loaded()
    spec = loaded.policy.mechanism(name)
    step = mechanism_step(spec)
    file = f"{safe_name(name)}.{run.output_format}"
    path = run.staging_dir / file
    with withholding(step):
        if run.engine.scaled or streams(run):
            result = spec.finish(loaded, run_partials(run)[name])
        else:
            result = spec.run(loaded, mechanism_rows(loaded, spec, run_table(run)))
    event = released_event(loaded, result.event)
    planned = {m.name: m.event for m in plan_of(run.policy).mechanisms}
    assert event == planned[name], (
        f"mechanism {name!r} realized {event!r}, but the plan (and the reservation) has {planned[name]!r}"
    )
    parts = [
        StagedFile(*_write_part(run, f"{safe_name(name)}-{safe_name(part)}.{run.output_format}", table))
        for part, table in result.tables.items()
    ]
    if run.engine.scaled and isinstance(result.table, Pieces) and result.table.remote is not None:
        parts = write_remote(run, step, result.table, safe_name(name))
    if parts:  # several files (tables, or the files the workers wrote): the first stands for the output
        file, rows, sha256 = parts[0].file, parts[0].rows, parts[0].sha256
        path = run.staging_dir / file
    else:
        with withholding(step) if isinstance(result.table, Pieces) else nullcontext():  # pieces compute as written
            rows = write_table(result.table, path, run.output_format)
        sha256 = sha256_file(path)
    cells = None
    if result.cells is not None:
        cells_file = f"{safe_name(name)}.{CELLS_SUFFIX}.{run.output_format}"
        cells_path = run.staging_dir / cells_file
        cells_rows = write_table(result.cells, cells_path, run.output_format)
        cells = StagedFile(cells_file, sha256_file(cells_path), cells_rows, cells_path.stat().st_size)
    return OutputFacts(
        mechanism=name,
        type=spec.type,
        file=file,
        sha256=sha256,
        rows=rows,
        bytes=path.stat().st_size,
        event_json=event_to_json(event),
        public_facts=_jsonable(result.public_facts),
        internal_facts=_jsonable(result.internal_facts),
        cells=cells,
        more=tuple(parts[1:]),
    )


def _write_part(run: RunContext, file: str, table: pa.Table) -> tuple[str, str, int, int]:
    """Write one table of a release of several tables to the staging folder: its file, sha256,
    rows and size."""
    path = run.staging_dir / file
    rows = write_table(table, path, run.output_format)
    return file, sha256_file(path), rows, path.stat().st_size


def write_remote(run: RunContext, step: str, pieces: Pieces, stem: str) -> list[StagedFile]:
    """Split ``pieces`` over the run's Dask workers (:attr:`.results.Pieces.remote`, the rows
    given their files on the workers: ``<stem>-partJJJJ``, or ``<stem>`` alone when the rows
    make one file, :func:`privrelease.mechanisms.partitioned.part_count`) and have each
    file computed and written by a worker into the staging folder (:func:`write_pieces_here`):
    no published row exists in the flow's process, only what the files are computed from
    travels (SDGS: each file's cells and counts). Every file must hash here as its worker wrote
    it (what is published is what was written). The staged files, in order."""
    from privrelease.errors import UserError
    from privrelease.flows import engines
    from privrelease.flows.context import DataStepError
    from privrelease.flows.partitions import PartitionError

    assert pieces.remote is not None, "pieces computed elsewhere have a remote function"
    files = pieces.remote(engines.workers(run.run_id), functools.partial(engines.map_gather, run.run_id))
    names = (
        [f"{stem}.{run.output_format}"]
        if len(files) == 1
        else [f"{stem}-part{j:04d}.{run.output_format}" for j in range(len(files))]
    )
    items = [(remote, pieces.schema, str(run.staging_dir / file)) for remote, file in zip(files, names)]
    try:
        written = engines.map_gather(run.run_id, write_pieces_here, items, output_format=run.output_format, step=step)
    except PartitionError as error:  # leaves as a plain DataStepError, as the read's (.scaled.read_partials)
        raise DataStepError(error.step, error.original) from None
    staged = []
    for file, (sha256, rows) in zip(names, written):
        path = run.staging_dir / file
        if sha256_file(path) != sha256:
            raise UserError(f"output {str(path)!r} changed after the Dask worker wrote it; nothing was published")
        staged.append(StagedFile(file, sha256, rows, path.stat().st_size))
    return staged


def write_pieces_here(item: tuple[Any, pa.Schema, str], output_format: str, step: str) -> tuple[str, int]:
    """On a Dask worker: compute the pieces of one file (``item``: the function giving them,
    their schema and the path to write) and write them (:func:`write_table`); the file's sha256
    and rows. An error is withheld as the mechanism step's (:class:`.partitions.PartitionError`)."""
    from privrelease.flows.partitions import PartitionError

    remote, schema, path = item
    with withholding(step, PartitionError):
        rows = write_table(Pieces(schema, remote()), Path(path), output_format)
    return sha256_file(Path(path)), rows


def _jsonable(value: Any) -> Any:
    """Facts as plain JSON values (numpy scalars to Python, tuples to lists)."""
    return json.loads(json.dumps(value, default=_plain))


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)
