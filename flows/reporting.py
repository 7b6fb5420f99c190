"""Step 8 of a release: the disclosure report and the public disclosure statement."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from privrelease.flows import release_facts
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

    with session(_engine(), readonly=True) as s:
        head = chain.head(s)
        curve = None if reservation is None else ledger.history_curve(s, reservation.dataset, run.run_id)
    internal: dict[str, dict[str, Any]] = {o.mechanism: dict(o.internal_facts) for o in outputs}
    internal["dataset"] = {"rows_read": read.rows_read, "rows_dropped": read.rows_dropped}
    return ReportContext(
        plan=plan_of(run.policy),
        run_id=run.run_id,
        flow_run_id=run.flow_run_id,
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
        ledger_curve=curve,
        warnings=release_facts.warnings(outputs),
        outputs=[
            {
                "mechanism": o.mechanism,
                "path": o.file,
                "sha256": o.sha256,
                "rows": o.rows,
                "bytes": o.bytes,
            }
            for o in outputs
        ],
        timings=dict(timings),
        internal_facts=internal,
        chain_head={"seq": head.seq, "hash": head.hash, "public_key": _signing_public_key()},
    )


def _signing_public_key() -> str | None:
    """The public key of the configured signing key (None: records are not signed)."""
    from privrelease.audit import signing

    key = signing.signing_key()
    return None if key is None else signing.public_text(key)


def stage_reports(run: RunContext, **facts: Any) -> ReportFacts:
    """Render the disclosure report (full, internal) and the public disclosure statement into
    the staging folder; ``facts``: the keyword arguments of :func:`report_context`."""
    from privrelease.reports import write_html
    from privrelease.reports.render import report_pages

    context = report_context(run, **facts)
    described = json.dumps(release_facts.describe(context.plan, facts["outputs"]), indent=2, sort_keys=True) + "\n"
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
        release_file=release_facts.RELEASE_FILE,
        release_sha256=files[release_facts.RELEASE_FILE][0],
    )
