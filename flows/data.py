"""Steps 3-6 of a release: fingerprint the dataset (no contents), plan every guarantee from
the policy, reserve the budget, then read the data (in this process, or partition by
partition on the Dask engine, or row group by row group in this process, with every
mechanism's partial result in the same pass)."""

from __future__ import annotations

import functools
import hashlib
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa

from privrelease.datafiles import open_checked
from privrelease.errors import TargetNotMet, UserError
from privrelease.flows import engines
from privrelease.flows.context import (
    _CHUNK,
    DataFile,
    DatasetFacts,
    PlanSummary,
    PolicySource,
    ReadFacts,
    ReservationFacts,
    RunContext,
    _session,
    csv_arguments,
    plan_of,
    withholding,
)

# --------------------------------------------------------------------------- 3. fingerprint


def _scan(handle: BinaryIO) -> tuple[str, int, int, bytes]:
    """One pass over an open text file from its start: its sha256, size, number of lines (a
    last line without a newline counts) and its first line. Every fact of the fingerprint comes
    from the bytes hashed, so no swap of the file between two reads can split them."""
    digest = hashlib.sha256()
    size = lines = 0
    last = b"\n"
    kept = bytearray()
    handle.seek(0)
    while chunk := handle.read(_CHUNK):
        digest.update(chunk)
        size += len(chunk)
        lines += chunk.count(b"\n")
        last = chunk[-1:]
        if b"\n" not in kept:
            kept += chunk
    if last != b"\n":
        lines += 1
    return digest.hexdigest(), size, lines, bytes(kept).split(b"\n", 1)[0]


def header_names(path: Path, dataset: Any) -> list[str] | None:
    """The column names in a data file's CSV header or Parquet schema, read from the file at
    its checked real ``path`` (:func:`.datafiles.open_checked`; for a quick check; None: a CSV
    without a header)."""
    with open_checked(path) as handle:
        try:
            if dataset.format == "parquet":
                import pyarrow.parquet as pq

                return list(pq.read_schema(handle).names)
            first_line = handle.readline()
            if not first_line:
                raise UserError(f"dataset file {str(path)!r} has no header and no rows")
        except pa.ArrowInvalid as error:
            raise UserError(f"dataset file {str(path)!r} is not a readable Parquet file: {error}") from None
        except OSError as error:
            raise UserError(f"cannot read dataset file {str(path)!r}: {error.strerror or error}") from None
    return csv_header(first_line, path, dataset.csv)


def csv_header(first_line: bytes, path: Path, options: Any) -> list[str] | None:
    """The column names of a CSV header line read with ``options`` (a policy's ``dataset.csv``;
    None: the defaults, delimiter sniffed) in the reader's own dialect
    (:func:`.csv_dialect.csv_first_line`) (None: a CSV without a header)."""
    from privrelease.csv_dialect import csv_first_line

    arguments = csv_arguments(options)
    if not arguments.pop("header"):
        return None
    return csv_first_line(first_line, path, **arguments)[1]


def fingerprint_dataset(run: RunContext) -> DatasetFacts:
    """sha256, size and row count of the dataset (no contents), checked against the policy's
    columns, pinned sha256 and, for a rerun, the repeated run's fingerprint. Not against the
    declared ``dataset.rows``: a refusal that depends on how many people are in the data is
    itself a disclosure (a table of N rows runs, the same table without one person is
    refused); N is a public constant (a mean's denominator) and a different count is an
    operator warning (:func:`.release_facts.warnings`). A Parquet
    folder, or any data on the Dask engine, is fingerprinted file by file
    (:func:`.partitions.scan_file`; a CSV file on Dask in blocks of lines,
    :func:`.partitions.scan_csv`; on Dask, on the workers: no process reads it all)."""
    loaded = run.loaded()
    dataset = loaded.policy.dataset
    path = Path(run.data_path)
    if run.engine.scaled or path.is_dir():
        facts = _fingerprint_files(run, loaded, path)
    else:
        facts = _fingerprint_file(path, dataset, _data_handle(run))
    engines.held(run.run_id).fingerprint = facts.sha256  # a refusal from here on records it
    if run.production:  # approvals binding the bytes are checked against their fingerprint
        from privrelease.audit import approvals

        with _session() as s:
            approvals.require_approved(
                s, approvals.policy_facts(loaded), loaded.policy.approval, data_path=str(path), data_sha256=facts.sha256
            )
    pinned = dataset.sha256
    if pinned is not None and facts.sha256 != pinned:
        raise UserError(
            f"dataset {str(path)!r} has sha256 {facts.sha256[:12]}, but the policy pins dataset.sha256 "
            f"{pinned[:12]} (the vintage it was approved for): use that file or a policy for this one"
        )
    if run.expected_fingerprint is not None and facts.sha256 != run.expected_fingerprint:
        raise UserError(
            f"dataset {str(path)!r} has sha256 {facts.sha256[:12]}, but run "
            f"{run.source_run_id} released from {run.expected_fingerprint[:12]}: a rerun "
            "repeats a release on the same data"
        )
    return facts


def dataset_sha256(loaded: Any, path: Path) -> str:
    """The fingerprint a run of ``loaded`` on the data at ``path`` records (checked as a run
    checks it), computed in this process: for what a production approval binds."""
    path = loaded.data_file(path)
    if path.is_dir():
        return _fingerprint_files(None, loaded, path).sha256
    with open_checked(path) as handle:
        return _fingerprint_file(path, loaded.policy.dataset, handle).sha256


def _fingerprint_file(path: Path, dataset: Any, handle: BinaryIO) -> DatasetFacts:
    """One file, opened as ``handle``, in one pass over its bytes (CSV: :func:`_scan`; Parquet:
    :func:`.partitions.scan_file`, whose footer gives the columns and rows)."""
    if dataset.format == "parquet":
        from privrelease.flows.partitions import scan_file

        file = scan_file(str(path), handle)
        _require_columns(path, dataset, file.columns)
        return DatasetFacts(str(path), file.sha256, file.bytes, file.rows)
    try:
        sha256, size, lines, first_line = _scan(handle)
    except OSError as error:
        raise UserError(f"cannot read dataset file {str(path)!r}: {error.strerror or error}") from None
    header = csv_header(first_line, path, dataset.csv)
    if header is not None:
        _require_columns(path, dataset, header)
    return DatasetFacts(str(path), sha256, size, lines - (1 if header is not None else 0))


def _require_columns(path: Path, dataset: Any, header: Sequence[str]) -> None:
    absent = [name for name in dataset.columns if name not in header]
    if absent:
        raise UserError(
            f"dataset file {str(path)!r} has no column {absent[0]!r} (declared in the policy) "
            f"among its {len(header)} columns (their names are part of the data: not recorded; "
            "`privrelease run` lists them on the terminal before it starts)"
        )


def _fingerprint_files(run: RunContext | None, loaded: Any, path: Path) -> DatasetFacts:
    """A Parquet file or folder, file by file, or a CSV file in blocks of lines (on Dask, on
    the run's cluster, connected here: an unreachable scheduler is refused before anything is
    reserved; without a ``run``, in this process); the fingerprint combines the files'
    (:func:`.partitions.combined_sha256`: a single file's own sha256, as in-process)."""
    from privrelease.flows import partitions
    from privrelease.policies.loader import confine

    dataset = loaded.policy.dataset
    if dataset.format == "csv":
        if path.is_dir():
            raise UserError(
                f"dataset {str(path)!r}: dataset.format is 'csv', but a folder dataset needs Parquet files",
                field="dataset.format",
            )
        assert run is not None and run.engine.scaled, "a CSV file is fingerprinted whole in-process"
        engines.connect(run.run_id, run.engine)
        arguments = csv_arguments(dataset.csv)
        files = engines.map_gather(
            run.run_id,
            partitions.scan_csv,
            [str(confine(path, loaded.base_dir, what="dataset file"))],
            csv=arguments,
            rows_per_block=run.engine.rows_per_partition,
        )
        if not sum(files[0].row_groups):
            raise UserError(f"dataset file {str(path)!r} has no data rows")
    else:
        paths = [str(confine(file, loaded.base_dir, what="dataset file")) for file in partitions.dataset_files(path)]
        if run is not None and run.engine.scaled:
            engines.connect(run.run_id, run.engine)
            sizes = [Path(file).stat().st_size for file in paths]  # one run of files per worker, of about equal bytes
            files = engines.map_runs(run.run_id, partitions.scan_file, paths, weights=sizes)
        else:
            files = [partitions.scan_file(file) for file in paths]
    for file in files:
        if file.format == "parquet" or dataset.csv is None or dataset.csv.header:
            _require_columns(Path(file.path), dataset, file.columns)
    return DatasetFacts(
        str(path),
        partitions.combined_sha256(files),
        sum(file.bytes for file in files),
        sum(file.rows for file in files),
        files=tuple(files),
    )


# --------------------------------------------------------------------------- 4. plan


def plan_summary(policy: PolicySource) -> PlanSummary:
    """The plan of ``policy`` as a small summary (no exception when a target is missed)."""
    from privrelease.mechanisms.events import event_to_json

    plan = plan_of(policy)
    charged = plan.charged_event
    return PlanSummary(
        passed=plan.passed,
        notion=plan.notion,
        event_json=event_to_json(plan.event),
        charged_event_json=event_to_json(charged) if charged else None,
        checks=[
            {key: getattr(check, key) for key in ("target", "required", "achieved", "passed")} for check in plan.checks
        ],
        warnings=plan.warnings,
    )


def plan_release(run: RunContext) -> PlanSummary:
    """Every guarantee of the release from the policy alone; :class:`TargetNotMet` naming the
    missed targets when a check fails."""
    summary = plan_summary(run.policy)
    require_targets(summary, f"{run.name}@{run.version}")
    return summary


def require_targets(summary: PlanSummary, policy: str) -> None:
    """:class:`TargetNotMet` naming every target the plan of ``policy`` (name@version) misses."""
    if not summary.passed:
        missed = [
            f"{check['target']}: required {check['required']}, achieved {check['achieved']}"
            for check in summary.checks
            if not check["passed"]
        ]
        raise TargetNotMet(f"policy {policy} does not meet its targets: " + "; ".join(missed))


def require_budget(session: Any, loaded: Any, summary: PlanSummary) -> None:
    """:class:`TargetNotMet` when the release would not fit what its dataset's ledger holds, and
    :class:`UserError` when it states no lifetime budget, or another budget or accountant than
    its dataset has registered (:func:`~privrelease.audit.ledger.policy_status`): a read-only
    preview, before the run starts; :func:`reserve_budget` decides, under the audit write lock."""
    from privrelease.audit import ledger

    if summary.charged_event_json is None:
        return
    status = ledger.policy_status(session, loaded, summary.notion)
    ledger.check_fits(status, summary.charged_event_json)


# --------------------------------------------------------------------------- 5. budget


def reserve_budget(run: RunContext, dataset: DatasetFacts, plan: PlanSummary) -> ReservationFacts | None:
    """In one transaction, committed before the data is read: register the dataset identity
    ``dataset.id`` (first time: with the policy's lifetime budget, else the
    ``default_lifetime_budget`` setting; a different budget than registered is refused) and the
    file as its vintage, attach the file to the run, and reserve the DP part of the release's
    event tree against the identity's budget. None when nothing is charged (then the dataset is
    registered only when its id and a lifetime budget are known)."""
    from privrelease.audit import ledger, records
    from privrelease.audit.models import DatasetIdentity

    policy = run.loaded().policy
    targets, dataset_id = policy.targets, policy.dataset.id
    with _session() as s:
        try:
            registered = s.get(DatasetIdentity, dataset_id) if dataset_id is not None else None
            budget = ledger.resolve_lifetime_budget(targets.lifetime_budget, registered)
        except UserError:
            if plan.charged_event_json is not None:
                raise
            budget = None
        if budget is not None and dataset_id is not None:
            records.register_dataset(
                s,
                dataset.sha256,
                identity=dataset_id,
                size_bytes=dataset.size_bytes,
                row_count=dataset.rows,
                lifetime_epsilon=budget.epsilon,
                lifetime_delta=budget.delta,
                notion=targets.accounting,
                label=Path(dataset.path).name,
            )
            records.attach_dataset(s, run.run_id, dataset.sha256)
        if plan.charged_event_json is None:
            return None
        assert dataset_id is not None, "verify_policy refuses a charged release without dataset.id"
        reservation = ledger.reserve(s, dataset_id, run.run_id, plan.charged_event_json, plan.notion)
    return ReservationFacts(
        entry_id=reservation.entry_id,
        dataset=reservation.dataset,
        notion=reservation.notion,
        budget=reservation.budget.as_dict(),
        before=reservation.spent_before.as_dict(),
        after=reservation.total_after.as_dict(),
        this_release=reservation.this_release.as_dict(),
        remaining=reservation.remaining_after.as_dict(),
        at_lifetime_delta=reservation.at_lifetime_delta,
    )


# --------------------------------------------------------------------------- 6. read


def _read(run: RunContext, expected_sha256: str, files: Sequence[DataFile] = ()) -> Any:
    """The declared columns of the data, parsed from bytes that hash to ``expected_sha256``
    (a folder: from its ``files``, each whole, parsed from the bytes fingerprinted)."""
    from privrelease.datasets import DatasetRead, read_dataset, require_rows_left
    from privrelease.flows.partitions import ReadSpec, plan_partitions, read_partition

    dataset = run.loaded().policy.dataset
    spec = ReadSpec.of(dataset)
    if files:
        reads = [read_partition(part, spec) for part in plan_partitions(files, sys.maxsize)]
        require_rows_left(
            run.data_path, sum(read.rows_read for read in reads), sum(read.table.num_rows for read in reads)
        )
        return DatasetRead(
            pa.concat_tables([read.table for read in reads]),
            sum(read.rows_read for read in reads),
            sum(read.rows_dropped for read in reads),
        )
    return read_dataset(
        run.data_path, format=dataset.format, **csv_arguments(dataset.csv), **_read_arguments(run, expected_sha256)
    )


def _read_arguments(run: RunContext, expected_sha256: str) -> dict[str, Any]:
    """How the run's data file is read and checked (the policy's columns, missing values and
    domains), through the run's open file, from bytes that must hash to ``expected_sha256``."""
    from privrelease.flows.partitions import ReadSpec

    spec = ReadSpec.of(run.loaded().policy.dataset)
    return {
        "columns": spec.columns,
        "missing": spec.missing,
        "missing_values": spec.missing_values,
        "domains": dict(spec.domains),
        "expected_sha256": expected_sha256,
        "handle": _data_handle(run),
    }


def _data_handle(run: RunContext) -> BinaryIO:
    """The run's data file as opened in this process (:func:`.engines.held`); opened now, by
    its checked real path, in a process that has not (a task elsewhere: its bytes must still
    hash to the run's fingerprint)."""
    state = engines.held(run.run_id)
    if state.opened is None:
        state.opened = open_checked(run.data_path)
    return state.opened


def read_data(run: RunContext, dataset: DatasetFacts) -> ReadFacts:
    """Record the data-read time (status ``running``; after the approval and the reservation
    are committed), then read and check the declared columns. What is read must be what was
    fingerprinted: its bytes are read once and must hash to the fingerprint. On Dask the
    workers read partition by partition and compute every mechanism's partial result in the
    same pass (:func:`.scaled.read_partials`); in-process, a Parquet file whose mechanisms all
    stream is read and computed the same way, one row group at a time (:func:`streams`)."""
    from privrelease.audit import records
    from privrelease.datasets import require_rows_left

    with _session() as s:
        record = records.record_data_read(s, run.run_id)
        read_at = record.data_read_at
    assert read_at is not None, "record_data_read records the time"
    if run.engine.scaled:
        from privrelease.flows.scaled import read_partials

        with withholding("reading the data"):
            read = read_partials(run.run_id, run.loaded(), dataset.files, run.engine)
            require_rows_left(run.data_path, read.rows_read, read.rows_read - read.rows_dropped)
        engines.held(run.run_id).partials = read.partials
        engine = {
            "description": run.engine.describe(),
            "partitions": read.partitions,
            "workers": engines.workers(run.run_id),
        }
        return ReadFacts(
            read.rows_read,
            read.rows_dropped,
            read_at,
            engine=engine,
            rows_over_person_bound=read.rows_over_person_bound,
        )
    if streams(run):
        from privrelease.flows.scaled import stream_partials

        with withholding("reading the data"):
            reads = functools.partial(_row_groups, run, dataset.sha256)
            streamed = stream_partials(run.loaded(), reads, Path(run.data_path).name)
        engines.held(run.run_id).partials = streamed.partials
        return ReadFacts(
            streamed.rows_read, streamed.rows_dropped, read_at, rows_over_person_bound=streamed.rows_over_person_bound
        )
    with withholding("reading the data"):
        result = _read(run, dataset.sha256, dataset.files)
        bounded = engines.held(run.run_id).table = person_rows(run.loaded(), result.table)
    over = result.table.num_rows - bounded.num_rows if run.loaded().policy.dataset.person_column else None
    return ReadFacts(result.rows_read, result.rows_dropped, read_at, rows_over_person_bound=over)


def person_rows(loaded: Any, table: pa.Table) -> pa.Table:
    """The rows every mechanism reads: with ``dataset.person`` naming a column, at most
    ``max_rows`` of each person, a uniformly random subset (:mod:`privrelease.mechanisms.persons`),
    before any mechanism runs; else ``table``."""
    from privrelease.mechanisms.persons import keep_at_most
    from privrelease.policies.schema import Person

    person = loaded.policy.dataset.person
    return keep_at_most(table, person.column, person.max_rows) if isinstance(person, Person) else table


def mechanism_rows(loaded: Any, spec: Any, table: pa.Table) -> pa.Table:
    """What mechanism ``spec`` reads of the run's :func:`person_rows`: all of them when it reads
    every kept row of a person (:meth:`~privrelease.policies.schema.Dataset.rows_read`), else ONE
    random row of each person (its paper's one row per person)."""
    from privrelease.mechanisms.persons import keep_at_most

    dataset = loaded.policy.dataset
    if dataset.rows_read(spec) == dataset.rows_per_person:
        return table
    return keep_at_most(table, dataset.person.column, 1)


def streams(run: RunContext) -> bool:
    """Whether the run's in-process read computes every mechanism's partial result as Dask
    does, one row group at a time (:func:`.scaled.stream_partials`), and never holds the whole
    table: a Parquet file (not a folder) whose mechanisms all have a job
    (:meth:`~privrelease.mechanisms.kinds.MechanismKind.job`: per row group, merged, then
    ``finish``, the output distribution of ``run``, as on Dask). With a person column, a
    person's rows may sit in different row groups: they are bounded as on Dask, between two
    passes over the row groups, with the distribution of :func:`person_rows` on the whole table."""
    loaded = run.loaded()
    return (
        not run.engine.scaled
        and loaded.policy.dataset.format == "parquet"
        and not Path(run.data_path).is_dir()
        and all(spec.job(loaded) is not None for spec in loaded.policy.mechanisms)
    )


def _row_groups(run: RunContext, expected_sha256: str, column: str | None = None) -> Iterator[Any]:
    """The checked row groups of the run's Parquet file (:func:`privrelease.datasets.read_row_groups`),
    parsed from bytes read through the run's open file that hash to ``expected_sha256``: every
    declared column, or ``column`` alone."""
    from privrelease.datasets import read_row_groups

    arguments = _read_arguments(run, expected_sha256)
    if column is not None:
        arguments["columns"] = {column: arguments["columns"][column]}
        arguments["domains"] = {key: value for key, value in arguments["domains"].items() if key == column}
    return read_row_groups(run.data_path, **arguments)


def _recorded_fingerprint(run: RunContext) -> str:
    """The dataset fingerprint the run recorded (its reservation names it)."""
    from privrelease.audit.models import Run

    with _session() as s:
        return s.get(Run, run.run_id).dataset_fingerprint


def run_table(run: RunContext) -> pa.Table:
    """The run's table: read by :func:`read_data` in this process, or read again here (a task
    in another process), from bytes that hash to the run's recorded fingerprint."""
    state = engines.held(run.run_id)
    if state.table is None:
        fingerprint = _recorded_fingerprint(run)
        files: Sequence[DataFile] = ()
        if Path(run.data_path).is_dir():
            facts = _fingerprint_files(run, run.loaded(), Path(run.data_path))
            if facts.sha256 != fingerprint:
                raise UserError(f"dataset {run.data_path!r} changed after it was fingerprinted: nothing was read")
            files = facts.files
        state.table = person_rows(run.loaded(), _read(run, fingerprint, files).table)
    return state.table


def run_partials(run: RunContext) -> dict[str, Any]:
    """Every mechanism's merged partial result: computed by :func:`read_data` in this process
    (Dask, or a streamed read: :func:`streams`), or for a streamed read computed again here (a
    task in another process) from bytes that hash to the run's recorded fingerprint."""
    state = engines.held(run.run_id)
    if state.partials is None:
        assert not run.engine.scaled, f"run {run.run_id}: the read step computes the partial results in this process"
        from privrelease.flows.scaled import stream_partials

        reads = functools.partial(_row_groups, run, _recorded_fingerprint(run))
        state.partials = stream_partials(run.loaded(), reads, Path(run.data_path).name).partials
    return state.partials


def forget_data(run_id: str) -> None:
    """Drop everything the run holds in this process (:func:`.engines.release`)."""
    engines.release(run_id)
