"""The mechanisms of a release on the Dask engine: the *jobs* (what a worker computes on one
partition: :meth:`CellJob.partial`, :meth:`StatisticJob.partial`) and *finishes* (what the
flow computes once from the merged partials: suppression, noise, output) that the entries of
:mod:`.registry` name, and the read of all partitions in one pass (:func:`read_partials`).

The output distribution is the in-process one, so every guarantee of the plan holds as is:

- ``sdgs`` and ``histogram``: each partition draws its own Bernoulli(beta) mask from the OS
  CSPRNG (together: i.i.d. Bernoulli(beta) over all rows, as in-process), generalizes and
  counts its sampled rows per cell (:func:`.sdgs.count_cells`); the flow adds the counts per
  cell over all partitions (:func:`.partitioned.merge_counts`) and suppresses with the counts
  of the *whole* sample. SDGS microdata is then written by the flow, row group by row group,
  each published row in a uniformly random position (:func:`write_microdata`): a uniformly
  random order of the published multiset, as in-process; never one piece per input partition
  (which would disclose the partition of a row: see :mod:`.partitioned`).
- ``identifiable_statistic``: each partition computes its exact per-group count or clamped sum
  (:func:`.statistics.statistic_partial`); the flow merges them exactly and adds the Laplace
  noise once, to the total (:func:`.statistics.noisy_release`); never noise per partition.
- ``sdgs`` with ``select_scheme``: each partition counts, per candidate, all its rows and a
  Bernoulli(beta) sample; the exponential mechanism chooses from the merged counts of all rows
  (the in-process scores) and the release is the chosen candidate's sample, drawn
  independently of the choice, as in-process.
- ``splu_gen`` runs in-process only (decoy groups of gamma rows must not follow partitions):
  :func:`.registry.refusal` says so before anything runs.
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

    @staticmethod
    def merge(parts: list[Any]) -> Any:
        """The cell counts of the whole sample (:func:`.partitioned.merge_counts`)."""
        from privrelease.mechanisms.partitioned import merge_counts

        return merge_counts(parts)


@dataclass(frozen=True)
class SelectionJob:
    """SDGS with ``select_scheme``: per candidate, the cell counts of all rows (the selection's
    scores) and of a Bernoulli(beta) sample (the release, once a candidate is chosen)."""

    name: str
    step: str
    candidates: dict[str, dict[str, ColumnScheme]]
    beta: float

    def partial(self, table: pa.Table) -> Any:
        from privrelease.mechanisms.sdgs import count_cells

        return {
            name: (count_cells(table, schemes, beta=1.0), count_cells(table, schemes, beta=self.beta))
            for name, schemes in self.candidates.items()
        }

    @staticmethod
    def merge(parts: list[Any]) -> Any:
        """Per candidate, both counts of the whole table (:func:`.partitioned.merge_counts`)."""
        from privrelease.mechanisms.partitioned import merge_counts

        return {
            name: (merge_counts([part[name][0] for part in parts]), merge_counts([part[name][1] for part in parts]))
            for name in parts[0]
        }


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

    @staticmethod
    def merge(parts: list[Any]) -> Any:
        """The exact per-group totals of all rows (:func:`.statistics.merge_partials`)."""
        from privrelease.mechanisms.statistics import merge_partials

        return merge_partials(parts)


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
    from privrelease.flows.context import mechanism_step
    from privrelease.mechanisms.schemes import Keep
    from privrelease.planning import _statistic_calibration, group_domain

    by = {name: loaded.scheme(name) if loaded.policy.scheme_for(name) is not None else Keep() for name in spec.by}
    domain = group_domain(loaded, tuple(spec.by)) if spec.by else None
    return StatisticJob(
        spec.name,
        mechanism_step(spec),
        spec.column,
        by,
        _statistic_calibration(loaded, spec),
        None if domain is None else {name: tuple(labels) for name, labels in domain.items()},
    )


def cell_job(loaded: Any, spec: Any) -> CellJob | SelectionJob:
    """The job of a policy's ``sdgs`` or ``histogram`` mechanism (with ``select_scheme``: of
    every candidate)."""
    from privrelease.flows.context import mechanism_step

    step = mechanism_step(spec)
    if getattr(spec, "select_scheme", None) is not None:
        names = spec.select_scheme.candidates
        return SelectionJob(
            spec.name, step, {name: loaded.schemes(spec.columns, candidate=name) for name in names}, spec.beta
        )
    return CellJob(spec.name, step, loaded.schemes(spec.columns), spec.beta)


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
    and leaves as a plain :class:`.context.DataStepError` (which never pickles its details)."""
    from privrelease.flows import engines
    from privrelease.flows.context import DataStepError
    from privrelease.flows.partitions import PartitionError, ReadSpec, partials, plan_partitions
    from privrelease.flows.registry import MECHANISMS

    made = []
    for spec in loaded.policy.mechanisms:
        make = MECHANISMS[spec.type].job
        assert make is not None, f"{spec.type} runs in-process only (refused on Dask before anything runs)"
        made.append(make(loaded, spec))
    jobs = tuple(made)
    parts = plan_partitions(files, engine.rows_per_partition)
    try:
        results = engines.map_gather(run_id, partials, parts, spec=ReadSpec.of(loaded.policy.dataset), jobs=jobs)
    except PartitionError as error:
        raise DataStepError(error.step, error.original) from None
    return Partials(
        rows_read=sum(result.rows_read for result in results),
        rows_dropped=sum(result.rows_dropped for result in results),
        partitions=len(parts),
        partials={item.name: item.merge([result.partials[item.name] for result in results]) for item in jobs},
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


def finish_sdgs(loaded: Any, spec: Any, merged: Any, path: Path, output_format: str) -> Finished:
    """Suppress with the merged counts and write the microdata to ``path`` here, row group by
    row group (:func:`write_microdata`). With ``select_scheme`` the exponential mechanism
    first chooses a candidate from the merged counts of all rows (as in-process), and the
    release is that candidate's sample, drawn independently of the choice: the in-process
    distribution, and the same composed event."""
    from privrelease.mechanisms import partitioned

    selection = None
    if spec.select_scheme is not None:
        from privrelease.mechanisms.selection import expected_published_of_counts, select_by_scores

        candidates = {name: loaded.schemes(spec.columns, candidate=name) for name in spec.select_scheme.candidates}
        scores = {
            name: expected_published_of_counts(merged[name][0].counts, k=spec.k, beta=spec.beta) for name in candidates
        }
        selection = select_by_scores(candidates, scores, k=spec.k, beta=spec.beta, epsilon=spec.select_scheme.epsilon)
        merged = merged[selection.name][1]
    published = partitioned.published_cells(merged, spec.k)
    pieces = partitioned.file_count(int(published.counts.sum()), ROWS_PER_ROW_GROUP)
    rows = write_microdata(published, partitioned.assign_files(published.counts, pieces), path, output_format)
    outcome = partitioned.result(merged, k=spec.k, beta=spec.beta, epsilon=spec.epsilon or 0.0)
    if selection is None:
        return Finished(None, rows, outcome.event, outcome.public_facts, outcome.internal_facts)
    from privrelease.mechanisms.events import Composed

    return Finished(
        None,
        rows,
        Composed(events=(selection.event, outcome.event)),
        {**outcome.public_facts, "chosen_scheme": selection.name},
        {**outcome.internal_facts, "selection": selection.internal_facts},
    )


def finish_histogram(loaded: Any, spec: Any, merged: Any, path: Path, output_format: str) -> Finished:
    """Suppress the merged cells below k."""
    from privrelease.mechanisms.histogram import check_histogram, histogram_of_cells

    check_histogram(loaded.schemes(spec.columns), spec.k, spec.beta, spec.epsilon)
    return Finished.of(histogram_of_cells(merged, k=spec.k, beta=spec.beta, epsilon=spec.epsilon))


def finish_statistic(loaded: Any, spec: Any, merged: Any, path: Path, output_format: str) -> Finished:
    """Laplace noise added once, to the merged exact totals."""
    from privrelease.mechanisms.statistics import noisy_release

    statistic = statistic_job(loaded, spec)
    column = statistic.column if statistic.column is not None else COUNT_COLUMN
    return Finished.of(noisy_release(merged, column, statistic.calibration, statistic.domain))


def write_microdata(cells: Any, assignment: list[tuple[np.ndarray, np.ndarray]], path: Path, output_format: str) -> int:
    """Write SDGS microdata: one row group (CSV: one block) per entry of ``assignment``
    (:func:`.partitioned.assign_files`: every published row in a uniformly random piece), each
    piece's rows in uniformly random order, so the file is a uniformly random order of the
    published rows as in-process; only one piece is held at a time. Returns the rows written.
    Through a temp file and ``os.replace``, as :func:`.outputs.write_table`."""
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    from privrelease.flows.outputs import plain_columns
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
    from privrelease.flows.registry import refusal

    for spec in loaded.policy.mechanisms:
        reason = refusal(spec)
        if reason is not None:
            raise UserError(reason, field="engine")
