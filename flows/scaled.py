"""A release on the Dask engine: every mechanism's job (what a worker computes on one
partition: :meth:`~privrelease.mechanisms.kinds.MechanismKind.job`) run in one pass over all
partitions (:func:`read_partials`), its partial results merged here in partition order; the
flow then finishes each mechanism from its merged result
(:meth:`~privrelease.mechanisms.kinds.MechanismKind.finish`).

Each kind's job and finish keep its in-process output distribution, so every guarantee of
the plan holds as is (each kind's module says how: e.g. SDGS partitions draw their own
Bernoulli(beta) masks from the OS CSPRNG and the flow suppresses with the counts of the whole
sample; statistics add their noise once, to the merged exact totals). A kind without a job
runs in-process only: :func:`check_engine` says so before anything runs.

With a person column, a person's rows may sit in different partitions: they are bounded as
in-process, with the same distribution, between two passes over the partitions
(:func:`person_shares`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from privrelease.errors import UserError
from privrelease.mechanisms.kinds import ColumnJob, Job

if TYPE_CHECKING:
    from privrelease.policies.schema import Person


@dataclass(frozen=True)
class NamedJob:
    """A mechanism's Dask job (:meth:`~privrelease.mechanisms.kinds.MechanismKind.job`) with the
    names the read step keys its results and its errors by."""

    name: str
    step: str
    job: Job
    pick: int | None = None
    """With a person column and ``max_rows`` > 1, for a one-row kind: which of the flow's
    one-row draws it reads (:class:`.partitions.PersonShare`); None: every kept row."""

    def partial(self, table: pa.Table) -> Any:
        return self.job.partial(table)

    @property
    def takes_columns(self) -> bool:
        """Whether its job can take a partition one column at a time
        (:class:`~privrelease.mechanisms.kinds.ColumnJob`: :meth:`column_partial`)."""
        return isinstance(self.job, ColumnJob)

    def column_partial(self, rows: int) -> Any:
        """Its partial result on ``rows`` rows given one column at a time."""
        assert isinstance(self.job, ColumnJob), f"{self.name}: its job reads whole tables"
        return self.job.column_partial(rows)

    def merge(self, parts: list[Any]) -> Any:
        return self.job.merge(parts)


# --------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Partials:
    """What the read step keeps of a Dask run: row counts, the number of partitions and each
    mechanism's merged partial result (cell counts or exact per-group statistics)."""

    rows_read: int
    rows_dropped: int
    partitions: int
    partials: dict[str, Any]
    rows_over_person_bound: int | None = None
    """Rows dropped by ``dataset.person``'s ``max_rows`` (None: no person column)."""


def read_partials(run_id: str, loaded: Any, files: Sequence[Any], engine: Any) -> Partials:
    """Read every partition on the run's cluster and compute each mechanism's partial result
    in the same pass (:func:`.partitions.partials`); merge them here, in partition order. An
    error a worker raised with data in hand arrives as a :class:`.partitions.PartitionError`
    and leaves as a plain :class:`.context.DataStepError` (which never pickles its details)."""
    from privrelease.flows import engines
    from privrelease.flows.context import DataStepError
    from privrelease.flows.partitions import PartitionError, ReadSpec, partials, plan_partitions
    from privrelease.policies.schema import Person

    jobs = named_jobs(loaded)  # check_engine: every job exists
    parts = plan_partitions(files, engine.rows_per_partition)
    spec = ReadSpec.of(loaded.policy.dataset)
    shares = None
    try:
        rows = [part.rows for part in parts]  # one run of partitions per worker, of about equal rows
        if not isinstance(loaded.policy.dataset.person, Person):
            results = engines.map_runs(run_id, partials, parts, weights=rows, spec=spec, jobs=jobs)
        else:
            shares = person_shares(run_id, loaded.policy.dataset.person, parts, spec, jobs)
            results = engines.map_runs(run_id, partials, parts, shares, weights=rows, spec=spec, jobs=jobs)
    except PartitionError as error:
        raise DataStepError(error.step, error.original) from None
    return _merged(jobs, results, shares)


def person_shares(
    run_id: str, person: Person, parts: Sequence[Any], spec: Any, jobs: tuple[NamedJob, ...]
) -> list[Any]:
    """The person bound across partitions on Dask: each partition counts its rows per person on
    a worker (:func:`.partitions.person_counts`), then :func:`shares_of` here."""
    from privrelease.flows import engines
    from privrelease.flows.partitions import person_counts

    rows = [part.rows for part in parts]
    counted = engines.map_runs(run_id, person_counts, parts, weights=rows, spec=spec, column=person.column)
    return shares_of(person, counted, jobs)


def shares_of(person: Person, counted: Sequence[tuple[pa.Array, Any]], jobs: tuple[NamedJob, ...]) -> list[Any]:
    """The person bound across partitions (or row groups), drawn between two passes over the
    data (as on a whole table, :func:`.data.person_rows` and :func:`.data.mechanism_rows`):
    from each partition's persons and rows per person (``counted``, the first pass:
    :func:`.partitions.count_persons`) the persons are numbered across partitions (their values,
    encoded here, then dropped: a few small integers per person and partition are kept, no row),
    and each partition's share of each person's kept rows and one-row kinds' rows is drawn
    (:func:`~privrelease.mechanisms.persons.partition_shares`), one
    :class:`.partitions.PersonShare` per partition for the second pass."""
    import numpy as np

    from privrelease.flows.partitions import PersonShare
    from privrelease.mechanisms.persons import grouped_order, partition_shares, person_codes

    if not counted:
        return []
    sizes = [len(counts) for _, counts in counted]
    codes = person_codes(pa.chunked_array([values for values, _ in counted], type=counted[0][0].type))
    counts = np.concatenate([counts for _, counts in counted])
    order, grouped = grouped_order(codes)
    picks = sum(job.pick is not None for job in jobs)
    quota, picked = np.empty_like(counts), np.empty_like(counts, shape=(picks, counts.size))
    quota[order], picked[:, order] = partition_shares(grouped, counts[order], person.max_rows, picks)
    bounds = np.cumsum([0, *sizes])
    return [
        PersonShare(person.column, counts[a:b], quota[a:b], picked[:, a:b])
        for a, b in zip(bounds[:-1], bounds[1:], strict=True)
    ]


def stream_partials(loaded: Any, reads: Callable[[str | None], Iterable[Any]], name: str) -> Partials:
    """Each mechanism's merged partial result over the checked row groups of the file ``name``
    (``reads(None)``: a fresh pass over them, :func:`privrelease.datasets.read_row_groups`;
    ``reads(column)``: of that column alone), computed in this process one read at a time as on
    Dask (:func:`.partitions.job_partials`; an error names the row group's data rows): the
    in-process release of a Parquet file whose mechanisms all have a job (:func:`.data.streams`).
    With a person column, two passes as on Dask: the first counts each row group's rows per
    person (:func:`.partitions.count_persons`; of the person column alone when a missing value
    is refused, ``missing: reject``, so no row is dropped: the second pass checks every column),
    the person bound is drawn (:func:`shares_of`), the second computes on the rows it keeps."""
    from privrelease.flows.partitions import count_persons, job_partials, rows_note
    from privrelease.policies.schema import Person

    jobs, person = named_jobs(loaded), loaded.policy.dataset.person
    shares = None
    if isinstance(person, Person):  # the same verified bytes twice: the same row groups, the same people
        counted = reads(person.column if loaded.policy.dataset.missing == "reject" else None)
        shares = shares_of(person, [count_persons(read.table, person.column) for read in counted], jobs)
    results, first = [], 0
    for read, share in zip(reads(None), itertools.repeat(None) if shares is None else shares):
        results.append(job_partials(read, jobs, rows_note(first, read.rows_read, name), share=share))
        first += read.rows_read
    return _merged(jobs, results, shares)


def named_jobs(loaded: Any) -> tuple[NamedJob, ...]:
    """Every mechanism's job, named (each must have one); each that reads fewer rows of a person
    than are kept (:meth:`~privrelease.policies.schema.Dataset.rows_read`: a one-row kind, with
    ``max_rows`` > 1) numbered for its own one-row draw."""
    from privrelease.flows.context import mechanism_step

    dataset = loaded.policy.dataset
    one_row = [spec for spec in loaded.policy.mechanisms if dataset.rows_read(spec) < dataset.rows_per_person]
    picks = {spec.name: i for i, spec in enumerate(one_row)}
    return tuple(
        NamedJob(spec.name, mechanism_step(spec), spec.job(loaded), picks.get(spec.name))
        for spec in loaded.policy.mechanisms
    )


def _merged(jobs: tuple[NamedJob, ...], results: list[Any], shares: list[Any] | None = None) -> Partials:
    """The partitions' results (:class:`.partitions.PartitionResult`, in partition order) merged
    per job; with the person bound's ``shares`` (:func:`shares_of`), the rows it dropped: each
    person's rows beyond its quota."""
    return Partials(
        rows_read=sum(result.rows_read for result in results),
        rows_dropped=sum(result.rows_dropped for result in results),
        partitions=len(results),
        partials={item.name: item.merge([result.partials[item.name] for result in results]) for item in jobs},
        rows_over_person_bound=None
        if shares is None
        else sum(int(share.counts.sum() - share.quota.sum()) for share in shares),
    )


def check_engine(loaded: Any, engine: Any) -> None:
    """UserError when the policy cannot run on ``engine``: a mechanism that runs in-process
    only, or a CSV file the engine cannot split at line ends (an encoding in which a newline,
    the delimiter or the quote is not one byte of its own: :func:`splits_at_newlines`)."""
    if not engine.scaled:
        return
    dataset = loaded.policy.dataset
    if dataset.format == "csv":
        options = dataset.csv
        encoding = "utf-8" if options is None else options.encoding
        if not splits_at_newlines(encoding):
            raise UserError(
                f"dataset.csv.encoding is {encoding!r}: the Dask engine splits a CSV file at newline bytes, which "
                "needs UTF-8 or a single-byte encoding (latin-1, cp1252, ...); run with --engine local",
                field="dataset.csv.encoding",
            )
    for spec in loaded.policy.mechanisms:
        if spec.job(loaded) is None:
            raise UserError(
                f"mechanism {spec.name!r} ({spec.type}) runs in-process only: {spec.in_process_only}; "
                "run this policy with --engine local",
                field="engine",
            )


def splits_at_newlines(encoding: str) -> bool:
    """Whether every newline byte of text in ``encoding`` is a newline (and ASCII bytes are
    ASCII characters): UTF-8 (no byte of a multi-byte character is ASCII) or a single-byte
    encoding (each of the 256 bytes one character), never UTF-16 or Shift JIS."""
    import codecs

    name = codecs.lookup(encoding).name
    if name in ("utf-8", "utf-8-sig", "ascii"):
        return True
    ascii_bytes = bytes(range(128))
    try:
        if ascii_bytes.decode(name) != ascii_bytes.decode("ascii"):
            return False
        return (
            all(len(bytes([byte]).decode(name, errors="replace")) == 1 for byte in range(128, 256))
            and len(bytes(range(128, 256)).decode(name, errors="replace")) == 128
        )
    except (UnicodeDecodeError, LookupError):
        return False
