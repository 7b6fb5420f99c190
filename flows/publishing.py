"""Step 9 of a release, and failure: publish crash-consistently (charge and records first,
then the folder into view; see :mod:`.recovery`), or record the failure and release the
reservation."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from privrelease.errors import UserError
from privrelease.files import fsync
from privrelease.flows import engines, recovery, release_facts
from privrelease.flows.context import (
    CHAIN_HEAD_FILE,
    DataStepError,
    OutputFacts,
    PlanSummary,
    Published,
    ReportFacts,
    ReservationFacts,
    RunContext,
    _session,
    _write_error,
    plan_of,
)
from privrelease.flows.data import forget_data

# --------------------------------------------------------------------------- 9. publish

_PUBLISHING: set[str] = set()  # runs of this process whose publishing transaction has begun


def _fsync_files(folder: Path) -> None:
    """Flush every file of ``folder`` to disk (they are renamed into view after the commit)."""
    for path in folder.iterdir():
        if path.is_file():
            fsync(path)


def publish(
    run: RunContext,
    *,
    plan: PlanSummary,
    reservation: ReservationFacts | None,
    outputs: list[OutputFacts],
    report: ReportFacts,
    timings: dict[str, float],
) -> Published:
    """Publish crash-consistently (:mod:`.recovery`): fsync the staged files; in one
    transaction register the policy version (a draft's content is frozen under its name@version
    only here, or by an approval: refused, and nothing published, when another content took it
    meanwhile), commit the charge and record the outputs (checksums as staged), the guarantees
    with the event tree, the report and the run as ``publishing``; only then rename the staging
    folder into view; then record the run's end and write the chain head beside the outputs.
    A crash anywhere leaves: nothing visible and no charge, or a committed charge that the
    next start rolls forward."""
    from privrelease.audit import approvals, chain, ledger, records

    staging, final = run.staging_dir, run.release_dir
    try:
        _fsync_files(staging)
    except OSError as error:
        raise _write_error(staging, error) from None
    recorded = [
        {
            "mechanism": output.mechanism,
            "path": str(final / staged.file),
            "sha256": staged.sha256,
            "rows": staged.rows,
            "bytes": staged.bytes,
        }
        for output in outputs
        for staged in output.staged()
    ]
    _PUBLISHING.add(run.run_id)  # from here a failure keeps the staged files (recovery may need them)
    with _session() as s:
        approvals.register_policy(s, approvals.PolicyFacts.recorded(s, run.sha256))  # a draft is registered here
        if reservation is not None:
            ledger.commit(s, reservation.entry_id)
        for staged in (staged for output in outputs for staged in output.staged()):
            records.record_output(
                s, run.run_id, final / staged.file, sha256=staged.sha256, rows=staged.rows, size=staged.bytes
            )
        for name, digest in (
            (report.statement_file, report.statement_sha256),
            (report.release_file, report.release_sha256),
        ):
            if name:
                size = (staging / name).stat().st_size
                records.record_output(s, run.run_id, final / name, sha256=digest, size=size)
        _record_guarantees(s, run, plan, report.state)
        html = (staging / report.file).read_text(encoding="utf-8")
        records.store_report(s, run.run_id, html, path=final / report.file)
        records.start_publishing(s, run.run_id)
    try:
        recovery.make_visible(staging, final)
    except OSError as error:
        raise UserError(f"cannot publish {str(final)!r}: {error.strerror or error}") from None
    forget_data(run.run_id)
    with _session() as s:
        records.finish_run(s, run.run_id, "succeeded", timings=timings)
        head = chain.head(s)
        files = {staged.file: staged.sha256 for output in outputs for staged in output.staged()}
        files |= {report.file: report.sha256, report.statement_file: report.statement_sha256}
        if report.release_file:
            files[report.release_file] = report.release_sha256
        binding = records.release_binding(s, run.run_id, final)
        chain.write_head(
            final / CHAIN_HEAD_FILE, head, files=files, release=binding
        )  # before the commit: see .recovery
    _PUBLISHING.discard(run.run_id)
    recovery.ACTIVE.discard(run.run_id)
    return Published(
        run_id=run.run_id,
        release_dir=str(final),
        report=str(final / report.file),
        statement=str(final / report.statement_file),
        chain_head={"seq": head.seq, "hash": head.hash},
        outputs=recorded,
        ledger_after=None if reservation is None else reservation.after,
        warnings=release_facts.warnings(outputs, run.loaded().policy.dataset.size_unit) + _draft_rerun(run),
    )


def _draft_rerun(run: RunContext) -> list[str]:
    """A rerun published as a draft says so (audit 10: a rerun whose approval was revoked since,
    in development mode, published a draft without a word on the terminal)."""
    if run.kind != "rerun" or run.approval is not None:
        return []
    return [
        f"this rerun of run {run.source_run_id} is a DRAFT (its report and statement say so): no current approval "
        "of its policy counts for this data (revoked since, or never given)"
    ]


def _record_guarantees(session: Any, run: RunContext, plan: PlanSummary, state: dict[str, Any]) -> None:
    """The composed guarantee under each accountant, with the plan's checks and what the
    release is (``state``: :meth:`~privrelease.reports.context.ReportContext.release_state`),
    which the release index shows beside them."""
    from privrelease.audit import records

    full = plan_of(run.policy)
    for notion, guarantee in full.composed.items():
        records.record_guarantee(
            session,
            run.run_id,
            notion=notion,
            event_json=plan.event_json,
            epsilon=guarantee.epsilon if guarantee.supported else None,
            delta=guarantee.delta if guarantee.supported else None,
            rho=full.facts.get("rho_composed_statistics"),
            details={
                "supported": guarantee.supported,
                "detail": guarantee.detail,
                "policy_notion": notion == full.notion,
                "checks": plan.checks,
                "release": state,
                "charged_event_json": plan.charged_event_json,
            },
        )


# --------------------------------------------------------------------------- failure


def record_failure(
    run: RunContext | None,
    error: BaseException,
    *,
    reservation: ReservationFacts | None = None,
    timings: dict[str, float] | None = None,
) -> str:
    """After a failure: a run already ``publishing`` (its charge committed) is settled by
    :func:`.recovery.settle` (rolled forward when its staged files are whole). Any other run:
    remove the staging folder (nothing is visible), release the reservation and record the run
    as failed. Returns the error text recorded (for a :class:`DataStepError`, its safe text).
    Never raises for cleanup problems."""
    text = f"{type(error).__name__}: {error}" if not isinstance(error, DataStepError) else str(error)
    if run is None:
        return text
    fingerprinted = engines.held(run.run_id).fingerprint
    forget_data(run.run_id)
    if run.run_id not in _PUBLISHING:  # nothing committed: nothing of it may ever become visible
        shutil.rmtree(run.staging_dir, ignore_errors=True)
    try:
        _settle_failed(run, text, reservation, timings, fingerprinted)
    finally:  # an unrecorded failure is settled by the next release in this process (or after it)
        _PUBLISHING.discard(run.run_id)
        recovery.ACTIVE.discard(run.run_id)
    return text


def _settle_failed(
    run: RunContext,
    text: str,
    reservation: ReservationFacts | None,
    timings: dict[str, float] | None,
    fingerprinted: str | None,
) -> None:
    """Record the failure: a ``publishing`` run is settled by recovery; any other unfinished
    run has its staging folder removed, its reservation released and is recorded failed, with
    the fingerprint of the data it read (``fingerprinted``) if it had one."""
    from privrelease.audit import ledger, records
    from privrelease.audit.models import Run

    with _session() as s:
        found = s.get(Run, run.run_id)
        if found is not None and found.status == "succeeded":
            return  # the failure came after the run's end: the release stands
        if found is not None and found.status == "publishing":
            recovery.settle(s, run.run_id)
            return
        shutil.rmtree(run.staging_dir, ignore_errors=True)
        if reservation is not None:
            try:
                ledger.release(s, reservation.entry_id, reason=f"run failed: {text[:500]}")
            except ledger.LedgerStateError:
                pass  # already released or expired
        if found is not None and found.status in ("pending", "running", "failed"):
            records.finish_run(s, run.run_id, "failed", timings=timings, error=text, fingerprinted=fingerprinted)
