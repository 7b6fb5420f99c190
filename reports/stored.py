"""The disclosure reports stored in the audit database: which runs have one
(:func:`stored_reports`, as ``privrelease report list``) and where a run's report can be read
(:func:`locate_report`, as ``report show``/``open``).

A reissue hands back its source run's outputs and report unchanged: it has no report of its
own, so it is listed with its source's report (its ``--out`` copy when it made one). A report
whose recorded file is missing or changed is written out from the audit database's copy under
the work dir. Reads the audit database only: no Prefect, no renderer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from privrelease.errors import UserError
from privrelease.files import sha256_bytes, sha256_file

__all__ = ["RESTORED_DIR", "Located", "StoredReport", "locate_report", "stored_reports"]

RESTORED_DIR = "reports"
"""Folder under the work dir where reports are written out from the audit database."""


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="seconds")


@dataclass(frozen=True)
class StoredReport:
    """A run with a stored report (or a reissue of one): its policy, status and kind
    (``release``, ``rerun``, ``reissue``), when it was created (ISO, UTC), the report's sha256 and
    recorded path, for a reissue the run it reissued (``reissue_of``), for a rerun the run it
    repeated (``rerun_of``)."""

    run_id: str
    policy: str | None
    version: str | None
    status: str
    kind: str
    created_at: str | None
    sha256: str
    path: str | None
    reissue_of: str | None = None
    rerun_of: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def stored_reports() -> list[StoredReport]:
    """Runs that have a stored report (the newest per run), and the succeeded reissues of them,
    oldest first."""
    from sqlmodel import col, select

    from privrelease.audit.database import open_database, session
    from privrelease.audit.models import PolicyVersion, Report, Run

    statement = (
        select(  # type: ignore[call-overload]  # sqlmodel types select() for at most 4 columns; 10 work
            Report.id,
            Report.run_id,
            Report.created_at,
            Report.sha256,
            Report.path,
            Run.status,
            Run.kind,
            Run.source_run_id,
            PolicyVersion.name,
            PolicyVersion.version,
        )
        .join(Run, col(Run.id) == col(Report.run_id))
        .join(
            PolicyVersion,
            col(PolicyVersion.sha256) == col(Run.policy_sha256),
            isouter=True,
        )
        .order_by(col(Report.created_at), col(Report.id))
    )
    latest: dict[str, StoredReport] = {}
    with session(open_database(), readonly=True) as s:
        for _id, run_id, created, sha256, path, status, kind, source, name, version in s.exec(statement).all():
            rerun_of = source if kind == "rerun" else None
            latest[run_id] = StoredReport(
                run_id, name, version, status, kind, _when(created), sha256, path, rerun_of=rerun_of
            )
        for reissue in s.exec(
            select(Run).where(Run.kind == "reissue", Run.status == "succeeded").order_by(col(Run.started_at))
        ).all():
            source = latest.get(reissue.source_run_id or "")
            if source is None:
                continue  # its source has no stored report: nothing was handed back with one
            latest[reissue.id] = StoredReport(
                run_id=reissue.id,
                policy=source.policy,
                version=source.version,
                status=reissue.status,
                kind=reissue.kind,
                created_at=_when(reissue.finished_at or reissue.started_at),
                sha256=source.sha256,
                path=_reissued_copy(s, reissue.id, source.sha256) or source.path,
                reissue_of=source.run_id,
            )
    return sorted(latest.values(), key=lambda row: row.created_at or "")


@dataclass(frozen=True)
class Located:
    """Where a run's report can be read, and how it got there."""

    run_id: str
    path: Path
    sha256: str
    source: str
    """``file``: the recorded file, intact; ``audit-db``: written out from the database copy."""
    recorded_path: str | None
    note: str | None = None
    reissue_of: str | None = None
    """For a reissue: the run whose report (and outputs) it handed back unchanged."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "path": str(self.path),
            "sha256": self.sha256,
            "source": self.source,
            "recorded_path": self.recorded_path,
            "note": self.note,
            "reissue_of": self.reissue_of,
        }


def _reissued_copy(s: Any, reissue_id: str, sha256: str) -> str | None:
    """The path of the report copy a reissue with ``--out`` recorded among its outputs (the
    output with the report's sha256), or None (a reissue without ``--out`` copies nothing)."""
    from sqlmodel import col, select

    from privrelease.audit.models import Output

    return s.exec(
        select(Output.path).where(Output.run_id == reissue_id, Output.sha256 == sha256).order_by(col(Output.id))
    ).first()


def _candidates(recorded: str, work_dir: Path) -> list[Path]:
    path = Path(recorded).expanduser()
    if path.is_absolute():
        return [path]
    return [Path.cwd() / path, work_dir / path]


def locate_report(ref: str) -> Located:
    """The run's newest stored report as a file whose bytes match the recorded sha256: the
    recorded file when it is intact, otherwise the audit database's copy written (atomically)
    to ``<work_dir>/reports/<run id>.html``. A reissue has no report of its own: it hands back
    its source run's outputs and report unchanged, so its report is the source's (the copy it
    made with ``--out`` when that is intact)."""
    from sqlmodel import col, select

    from privrelease.audit.database import open_database, session
    from privrelease.audit.models import Report
    from privrelease.audit.records import find_run

    def newest(s: Any, run_id: str) -> Report | None:
        return s.exec(
            select(Report).where(Report.run_id == run_id).order_by(col(Report.created_at).desc(), col(Report.id).desc())
        ).first()

    with session(open_database(), readonly=True) as s:
        run = find_run(s, ref)
        report = newest(s, run.id)
        copy = None
        if report is None and run.kind == "reissue" and run.source_run_id:
            report = newest(s, run.source_run_id)
            if report is not None:
                copy = _reissued_copy(s, run.id, report.sha256)
    if report is None:
        if run.kind == "reissue":
            raise UserError(
                f"run {run.id} is a reissue of run {run.source_run_id} ({run.status}), which has no stored report"
            )
        raise UserError(
            f"run {run.id} has no stored report (status {run.status}): it ended before its report was rendered"
        )
    if report.run_id == run.id:
        return _located(report, report.path)
    said = (
        f"run {run.id} is a reissue of run {report.run_id}: it published that run's outputs and report "
        "unchanged (no new charge)"
    )
    if copy is not None and (path := _intact(copy, report.sha256)) is not None:
        return Located(run.id, path, report.sha256, "file", copy, f"{said}; this is its copy", report.run_id)
    found = _located(report, report.path)
    missing = f"its copy {copy} is missing or changed; " if copy is not None else ""
    note = f"{said}; {missing}this is run {report.run_id}'s report" + (f" ({found.note})" if found.note else "")
    return Located(run.id, found.path, found.sha256, found.source, found.recorded_path, note, report.run_id)


def _intact(recorded: str, sha256: str) -> Path | None:
    """The file at ``recorded`` (absolute, or relative to the current or work dir) when its
    bytes have ``sha256``."""
    from privrelease.settings import get_settings

    for candidate in _candidates(recorded, get_settings().work_dir):
        if candidate.is_file() and sha256_file(candidate) == sha256:
            return candidate.resolve()
    return None


def _located(report: Any, recorded: str | None) -> Located:
    """``report`` (a stored Report) at ``recorded`` when that file is intact, otherwise its
    audit database copy written out under the work dir."""
    from privrelease.settings import get_settings

    run_id = report.run_id
    data = report.html.encode("utf-8")
    if sha256_bytes(data) != report.sha256:
        raise UserError(
            f"the audit database's copy of run {run_id}'s report does not match its recorded sha256 "
            f"{report.sha256[:12]}: run `privrelease audit verify`"
        )
    work_dir = get_settings().work_dir
    note = None
    if recorded:
        for candidate in _candidates(recorded, work_dir):
            if candidate.is_file():
                if sha256_file(candidate) == report.sha256:
                    return Located(run_id, candidate.resolve(), report.sha256, "file", recorded)
                note = (
                    f"the report file {candidate} was changed since it was recorded; showing the audit database's copy"
                )
                break
        else:
            note = f"the report file {recorded} is missing; written out from the audit database"
    else:
        note = "no report file was recorded; written out from the audit database"
    target = work_dir / RESTORED_DIR / f"{run_id}.html"
    if not (target.is_file() and sha256_file(target) == report.sha256):
        from privrelease.reports.html import write_html

        write_html(report.html, target)
    return Located(run_id, target, report.sha256, "audit-db", recorded, note)
