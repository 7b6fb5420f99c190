"""The mechanisms of a release on the Dask engine: one registry entry per mechanism type,
each a *job* (what a worker computes on one partition: :meth:`partial`) and a *finish* (what
the flow computes from the merged partials, once: suppression, selection, noise, output).

The output distribution is the in-process one, so every guarantee of the plan holds as is:

- ``sdgs`` and ``histogram``: each partition draws its own Bernoulli(beta) mask from the OS
  CSPRNG (together: i.i.d. Bernoulli(beta) over all rows, as in-process), generalizes and
  counts its sampled rows per cell (:func:`.sdgs.count_cells`); the flow adds the counts per
  cell over all partitions (:func:`.partitioned.merge_counts`) and suppresses with the counts
  of the *whole* sample. SDGS microdata is then written by one worker, row group by row group,
  each published row in a uniformly random position (:func:`write_microdata`): a uniformly
  random order of the published multiset, as in-process; never one piece per input partition
  (which would disclose the partition of a row: see :mod:`.partitioned`).
- ``identifiable_statistic``: each partition computes its exact per-group count or clamped sum
  (:func:`.statistics.statistic_partial`); the flow merges them exactly and adds the Laplace
  noise once, to the total (:func:`.statistics.noisy_release`); never noise per partition.
- ``splu_gen`` runs in-process only (decoy groups of gamma rows must not follow partitions),
  and so does ``select_scheme``: :func:`refusal` says so before anything runs.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from privrelease.errors import UserError
from privrelease.mechanisms.schemes import ColumnScheme

ROWS_PER_ROW_GROUP = 1_000_000
COUNT_COLUMN = "__privrelease_rows__"


@dataclass(frozen=True)
class CellJob:
    """SDGS or a crowd-blending histogram: sample with ``beta``, generalize, count cells."""

    name: str
    step: str
    schemes: dict[str, ColumnScheme]
    beta: float

    def partial(self, table: pa.Table) -> Any:
        from privrelease.mechanisms.sdgs import count_cells

        return count_cells(table, self.schemes, beta=self.beta)


@dataclass(frozen=True)
class StatisticJob:
    """A rho-identifiable count, sum or mean, per group of the generalized ``by`` columns."""

    name: str
    step: str
    column: str | None
    by: dict[str, ColumnScheme]
    calibration: Any
    domain: dict[str, tuple[Any, ...]] | None

    def partial(self, table: pa.Table) -> Any:
        from privrelease.mechanisms.statistics import statistic_partial

        prepared, column = statistic_table(table, self.column, self.by)
        return statistic_partial(prepared, column, self.calibration, self.domain)


def statistic_table(table: pa.Table, column: str | None, by: dict[str, ColumnScheme]) -> tuple[pa.Table, str]:
    """The columns a statistic reads: the value column (a constant one stands in for a count)
    and the ``by`` columns generalized with their schemes; and the value column's name."""
    from privrelease.mechanisms.generalization import generalize

    if column is None:
        column = COUNT_COLUMN
        columns: dict[str, Any] = {column: pa.array(np.zeros(table.num_rows, dtype=np.int64))}
    else:
        columns = {column: table.column(column)}
    if by:
        generalized = generalize(table, by)
        columns.update({name: generalized.column(name) for name in by})
    return pa.table(columns), column


def statistic_job(loaded: Any, spec: Any) -> StatisticJob:
    """The job of a policy's ``identifiable_statistic`` mechanism (its calibration and group
    domain come from the policy alone)."""
    from privrelease.mechanisms.schemes import Keep
    from privrelease.planning import _statistic_calibration, group_domain

    by = {name: loaded.scheme(name) if loaded.policy.scheme_for(name) is not None else Keep() for name in spec.by}
    domain = group_domain(loaded, tuple(spec.by)) if spec.by else None
    return StatisticJob(
        spec.name,
        f"mechanism {spec.name!r} ({spec.type})",
        spec.column,
        by,
        _statistic_calibration(loaded, spec),
        None if domain is None else {name: tuple(labels) for name, labels in domain.items()},
    )


def job(loaded: Any, spec: Any) -> CellJob | StatisticJob:
    """The partition job of a policy mechanism (:func:`refusal` is None for it)."""
    if spec.type in ("sdgs", "histogram"):
        return CellJob(spec.name, f"mechanism {spec.name!r} ({spec.type})", loaded.schemes(spec.columns), spec.beta)
    assert spec.type == "identifiable_statistic", spec.type
    return statistic_job(loaded, spec)


def refusal(spec: Any) -> str | None:
    """Why a policy mechanism cannot run on the Dask engine (None: it can)."""
    if spec.type == "splu_gen":
        return (
            f"mechanism {spec.name!r} (splu_gen) runs in-process only: its decoy groups of gamma rows "
            "must be drawn over the whole table, not per partition; run this policy with --engine local"
        )
    if spec.type == "sdgs" and spec.select_scheme is not None:
        return (
            f"mechanism {spec.name!r} (sdgs with select_scheme) runs in-process only; fix the scheme "
            "(generalization) to run it on Dask, or run with --engine local"
        )
    return None


def merge(job: CellJob | StatisticJob, parts: list[Any]) -> Any:
    """The whole release's partial result from the partitions' (in partition order)."""
    if isinstance(job, CellJob):
        from privrelease.mechanisms.partitioned import merge_counts

        return merge_counts(parts)
    from privrelease.mechanisms.statistics import merge_partials

    return merge_partials(parts)


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Partials:
    """What the read step keeps of a Dask run: row counts, the number of partitions and each
    mechanism's merged partial result (cell counts or exact per-group statistics)."""

    rows_read: int
    rows_dropped: int
    partitions: int
    partials: dict[str, Any]


def read_partials(run_id: str, loaded: Any, files: Sequence[Any], engine: Any) -> Partials:
    """Read every partition on the run's cluster and compute each mechanism's partial result
    in the same pass (:func:`.partitions.partials`); merge them here, in partition order. An
    error a worker raised with data in hand arrives as a :class:`.partitions.PartitionError`
    and leaves as a plain :class:`.steps.DataStepError` (which never pickles its details)."""
    from privrelease.flows import engines
    from privrelease.flows.partitions import PartitionError, ReadSpec, partials, plan_partitions
    from privrelease.flows.steps import DataStepError

    jobs = tuple(job(loaded, spec) for spec in loaded.policy.mechanisms)
    parts = plan_partitions(files, engine.rows_per_partition)
    try:
        results = engines.map_gather(run_id, partials, parts, spec=ReadSpec.of(loaded.policy.dataset), jobs=jobs)
    except PartitionError as error:
        raise DataStepError(error.step, error.original) from None
    return Partials(
        rows_read=sum(result.rows_read for result in results),
        rows_dropped=sum(result.rows_dropped for result in results),
        partitions=len(parts),
        partials={item.name: merge(item, [result.partials[item.name] for result in results]) for item in jobs},
    )


# --------------------------------------------------------------------------- finishing


@dataclass(frozen=True)
class Finished:
    """A mechanism's result: its output table for the flow to write (None: written already)
    and its rows, the realized event and the facts."""

    table: pa.Table | None
    rows: int
    event: Any
    public_facts: dict[str, Any]
    internal_facts: dict[str, Any]

    @classmethod
    def of(cls, result: Any) -> Finished:
        """A :class:`~privrelease.mechanisms.results.MechanismResult`, to be written."""
        return cls(result.table, result.table.num_rows, result.event, result.public_facts, result.internal_facts)


def finish(loaded: Any, spec: Any, merged: Any, path: Path, output_format: str) -> Finished:
    """Suppress or add noise once over the merged partial result, and produce the output
    (SDGS microdata is written to ``path`` here, row group by row group)."""
    if spec.type == "sdgs":
        from privrelease.mechanisms import partitioned

        published = partitioned.published_cells(merged, spec.k)
        pieces = partitioned.file_count(int(published.counts.sum()), ROWS_PER_ROW_GROUP)
        rows = write_microdata(published, partitioned.assign_files(published.counts, pieces), path, output_format)
        outcome = partitioned.result(merged, k=spec.k, beta=spec.beta, epsilon=spec.epsilon or 0.0)
        return Finished(None, rows, outcome.event, outcome.public_facts, outcome.internal_facts)
    if spec.type == "histogram":
        from privrelease.mechanisms.histogram import check_histogram, histogram_of_cells

        check_histogram(loaded.schemes(spec.columns), spec.k, spec.beta, spec.epsilon)
        return Finished.of(histogram_of_cells(merged, k=spec.k, beta=spec.beta, epsilon=spec.epsilon))
    from privrelease.mechanisms.statistics import noisy_release

    statistic = statistic_job(loaded, spec)
    column = statistic.column if statistic.column is not None else COUNT_COLUMN
    return Finished.of(noisy_release(merged, column, statistic.calibration, statistic.domain))


def write_microdata(cells: Any, assignment: list[tuple[np.ndarray, np.ndarray]], path: Path, output_format: str) -> int:
    """Write SDGS microdata: one row group (CSV: one block) per entry of ``assignment``
    (:func:`.partitioned.assign_files`: every published row in a uniformly random piece), each
    piece's rows in uniformly random order, so the file is a uniformly random order of the
    published rows as in-process; only one piece is held at a time. Returns the rows written.
    Through a temp file and ``os.replace``, as :func:`.steps.write_table`."""
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    from privrelease.flows.steps import plain_columns
    from privrelease.mechanisms.partitioned import empty_output, file_table

    temp = path.with_name(f".{path.name}.tmp")
    schema = empty_output(cells).schema
    rows = 0
    try:
        if output_format == "parquet":
            writer: Any = pq.ParquetWriter(temp, schema, write_statistics=False)
        else:
            writer = pcsv.CSVWriter(temp, plain_columns(empty_output(cells)).schema)
        with writer:
            for which, counts in assignment:
                piece = file_table(cells, which, counts)
                writer.write_table(piece if output_format == "parquet" else plain_columns(piece))
                rows += piece.num_rows
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return rows


def check_engine(loaded: Any, engine: Any) -> None:
    """UserError when the policy cannot run on ``engine``: a mechanism that runs in-process
    only, or a dataset that is not Parquet (the engine reads Parquet row groups)."""
    if not engine.scaled:
        return
    if loaded.policy.dataset.format != "parquet":
        raise UserError(
            f"dataset.format is {loaded.policy.dataset.format!r}: the Dask engine reads Parquet (a file or a folder "
            "of .parquet files); convert the data or run with --engine local",
            field="dataset.format",
        )
    for spec in loaded.policy.mechanisms:
        reason = refusal(spec)
        if reason is not None:
            raise UserError(reason, field="engine")
