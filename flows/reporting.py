"""Step 8 of a release: the disclosure report and the public disclosure statement.

Most of a report's time goes to arithmetic that reads no data: the plan's charts (privacy-
accuracy frontiers: an epsilon per parameter value) and the dataset's ledger curve and runway
(privacy loss distributions). :func:`prepare_report` starts both in a background thread once
the budget is reserved, so they are computed while the data is read and the mechanisms run
(on Dask the flow's process only waits for the workers then); the report step takes them when
the ledger still counts the same entries, else computes the curve again: the report is the one
computed at report time either way."""

from __future__ import annotations

import json
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from privrelease.flows import engines, release_facts
from privrelease.flows.context import (
    REPORT_FILE,
    STATEMENT_FILE,
    DatasetFacts,
    OutputFacts,
    ReadFacts,
    ReportFacts,
    ReservationFacts,
    RunContext,
    _engine,
    _write_error,
    plan_of,
)

# --------------------------------------------------------------------------- 8. report


@dataclass(frozen=True)
class Prepared:
    """The report's data-free parts being computed (:func:`prepare_report`): the plan's charts
    and the ledger curve (None: nothing reserved) of a ledger status with ``key``
    (:func:`privrelease.audit.ledger.counting_key`)."""

    charts: Future[list[Any]]
    curve: Future[dict[str, Any] | None] | None
    key: tuple[Any, ...] | None


def prepare_report(run: RunContext, reservation: ReservationFacts | None) -> None:
    """Start computing the report's charts and, after a reservation, its ledger curve (the
    ledger as it stands now) in a background thread; the run holds them in this process
    (:func:`.engines.held`) for :func:`report_context`."""
    from concurrent.futures import ThreadPoolExecutor

    from privrelease.audit import ledger
    from privrelease.audit.database import session
    from privrelease.reports.charts import all_charts

    status = None
    if reservation is not None:
        with session(_engine(), readonly=True) as s:
            status = ledger.ledger_status(s, reservation.dataset)
    pool = ThreadPoolExecutor(1, thread_name_prefix="privrelease-report")
    try:
        charts = pool.submit(all_charts, plan_of(run.policy))
        curve = None if status is None else pool.submit(ledger.curve_of, status, run.run_id)
    finally:
        pool.shutdown(wait=False)  # the thread ends with its last computation
    key = None if status is None else ledger.counting_key(status)
    engines.held(run.run_id).report = Prepared(charts, curve, key)


def report_context(
    run: RunContext,
    *,
    dataset: DatasetFacts,
    reservation: ReservationFacts | None,
    read: ReadFacts,
    outputs: list[OutputFacts],
    timings: dict[str, float],
    status: str = "succeeded",
) -> Any:
    """The :class:`privrelease.reports.context.ReportContext` of a run."""
    from privrelease.audit import chain, ledger
    from privrelease.audit.database import session
    from privrelease.reports.context import ReportContext

    prepared = engines.held(run.run_id).report if engines.holds(run.run_id) else None
    curve = None
    with session(_engine(), readonly=True) as s:
        head = chain.head(s)
        if reservation is not None:
            now = ledger.ledger_status(s, reservation.dataset)
            if prepared is not None and prepared.curve is not None and prepared.key == ledger.counting_key(now):
                curve = prepared.curve.result()
            else:
                curve = ledger.curve_of(now, run.run_id)
    internal: dict[str, dict[str, Any]] = {o.mechanism: dict(o.internal_facts) for o in outputs}
    internal["dataset"] = _dataset_rows(run, read)
    return ReportContext(
        plan=plan_of(run.policy),
        run_id=run.run_id,
        flow_run_id=run.flow_run_id,
        rerun_of=run.source_run_id if run.kind == "rerun" else None,
        code_version=run.code_version,
        status=status,
        generated_at=datetime.now(UTC),
        approval=run.approval,
        data_read_at=read.data_read_at,
        dataset={
            "sha256": dataset.sha256,
            "size_bytes": dataset.size_bytes,
            "rows": dataset.rows,
            "files": max(len(dataset.files), 1),
            "engine": read.engine,
        },
        budget=None if reservation is None else reservation.budget,
        ledger_before=None if reservation is None else reservation.before,
        ledger_after=None if reservation is None else reservation.after,
        ledger_remaining=None if reservation is None else reservation.remaining,
        ledger_at_lifetime_delta=reservation is not None and reservation.at_lifetime_delta,
        ledger_curve=curve,
        warnings=release_facts.declared_rows(outputs, run.loaded().policy.dataset.size_unit),
        nearly_empty=release_facts.nearly_empty(outputs),
        outputs=[
            {
                "mechanism": o.mechanism,
                "path": staged.file,
                "sha256": staged.sha256,
                "rows": staged.rows,
                "bytes": staged.bytes,
                "companion": staged is o.cells,
            }
            for o in outputs
            for staged in o.staged()
        ],
        timings=dict(timings),
        internal_facts=internal,
        public_facts={o.mechanism: dict(o.public_facts) for o in outputs},
        chain_head={"seq": head.seq, "hash": head.hash, "public_key": _signing_public_key()},
        charts=None if prepared is None else prepared.charts.result(),
        production=run.production,
    )


def _dataset_rows(run: RunContext, read: ReadFacts) -> dict[str, Any]:
    """The rows read and dropped, for the internal report: for missing values, and with a person
    column by its ``max_rows`` (counted by every read: one table, row groups or partitions)."""
    rows: dict[str, Any] = {"rows_read": read.rows_read, "rows_dropped_for_missing_values": read.rows_dropped}
    if run.loaded().policy.dataset.person_column:
        rows["rows_dropped_by_person_bound"] = read.rows_over_person_bound
    return rows


def _signing_public_key() -> str | None:
    """The public key of the configured signing key (None: records are not signed)."""
    from privrelease.audit import signing
    from privrelease.settings import signing_key

    key = signing_key()
    return None if key is None else signing.public_text(key)


def stage_reports(run: RunContext, **facts: Any) -> ReportFacts:
    """Render the disclosure report (full, internal) and the public disclosure statement into
    the staging folder; ``facts``: the keyword arguments of :func:`report_context`."""
    from privrelease.reports import write_html
    from privrelease.reports.render import report_pages

    context = report_context(run, **facts)
    state = context.release_state()
    document = release_facts.describe(context.plan, facts["outputs"], state)
    described = json.dumps(document, indent=2, sort_keys=True) + "\n"
    report, statement = report_pages(context)
    files = {}
    for name, text in ((REPORT_FILE, report), (STATEMENT_FILE, statement), (release_facts.RELEASE_FILE, described)):
        path = run.staging_dir / name
        try:
            sha256 = write_html(text, path)  # the atomic text writer (fsync, rename)
        except OSError as error:
            raise _write_error(path, error) from None
        files[name] = (sha256, len(text.encode("utf-8")))
    return ReportFacts(
        file=REPORT_FILE,
        sha256=files[REPORT_FILE][0],
        statement_file=STATEMENT_FILE,
        statement_sha256=files[STATEMENT_FILE][0],
        statement_bytes=files[STATEMENT_FILE][1],
        state=state,
        release_file=release_facts.RELEASE_FILE,
        release_sha256=files[release_facts.RELEASE_FILE][0],
    )
