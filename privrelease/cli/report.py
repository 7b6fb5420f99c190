"""``privrelease report``: the disclosure reports stored in the audit database.

``report list`` shows the runs with a stored report, and the reissues of those runs (a reissue
hands back its source run's outputs and report unchanged: it has no report of its own);
``report show RUN_ID`` prints the path of the run's report file (a reissue's: the copy it made
with ``--out``, else its source run's), writing it out from the audit database's copy (under
the work dir) when the file is missing or no longer matches the recorded sha256; ``report open RUN_ID`` opens it
in the default browser. Run ids may be abbreviated to a unique prefix. ``report index`` writes
a static HTML index of every run, with each run's report beside it, for compliance review
(:mod:`privrelease.reports.index`).

These commands read the audit database only: they never import Prefect or the renderer (the
index uses Jinja2, but not the report's calculus or charts).
"""

from __future__ import annotations

import webbrowser
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from privrelease.cli.output import console, error_console, print_json
from privrelease.errors import UserError
from privrelease.files import sha256_bytes, sha256_file

report_app = typer.Typer(help="Disclosure reports of runs.", no_args_is_help=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]
RunArg = Annotated[str, typer.Argument(help="A run id or a unique prefix of one.")]
RESTORED_DIR = "reports"
"""Folder under the work dir where reports are written out from the audit database."""


def register(app: typer.Typer) -> None:
    """Add the ``report`` command group to ``app``."""
    app.add_typer(report_app, name="report")


def _when(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat(timespec="seconds")


@report_app.command("list")
def report_list(json_output: JsonFlag = False) -> None:
    """Runs that have a stored report, and reissues of them: run id, policy, version, status,
    created (a reissue: when it was made; the run it reissued)."""
    from sqlmodel import col, select

    from privrelease.audit.database import open_database, session
    from privrelease.audit.models import PolicyVersion, Report, Run

    statement = (
        select(  # type: ignore[call-overload]  # sqlmodel types select() for at most 4 columns; 9 work
            Report.id,
            Report.run_id,
            Report.created_at,
            Report.sha256,
            Report.path,
            Run.status,
            Run.kind,
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
    latest: dict[str, dict[str, Any]] = {}
    with session(open_database(), readonly=True) as s:
        for _id, run_id, created, sha256, path, status, kind, name, version in s.exec(statement).all():
            latest[run_id] = {
                "run_id": run_id,
                "policy": name,
                "version": version,
                "status": status,
                "kind": kind,
                "created_at": _when(created),
                "sha256": sha256,
                "path": path,
            }
        for row in latest.values():
            row["reissue_of"] = None
        for reissue in s.exec(
            select(Run).where(Run.kind == "reissue", Run.status == "succeeded").order_by(col(Run.started_at))
        ).all():
            source = latest.get(reissue.source_run_id or "")
            if source is None:
                continue  # its source has no stored report: nothing was handed back with one
            latest[reissue.id] = {
                **source,
                "run_id": reissue.id,
                "status": reissue.status,
                "kind": reissue.kind,
                "created_at": _when(reissue.finished_at or reissue.started_at),
                "path": _reissued_copy(s, reissue.id, source["sha256"]) or source["path"],
                "reissue_of": source["run_id"],
            }
    rows = sorted(latest.values(), key=lambda row: row["created_at"] or "")
    if json_output:
        print_json({"reports": rows})
        return
    if not rows:
        console.print("no stored reports yet (privrelease run POLICY.yaml writes one)")
        return
    table = Table()
    table.add_column("run", no_wrap=True)
    table.add_column("policy", overflow="fold")
    table.add_column("version", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("created (UTC)", no_wrap=True)
    reissues = any(row["reissue_of"] for row in rows)
    if reissues:
        table.add_column("reissue of", overflow="fold")  # a run id prefix: narrow, for the terminal's sake
    for row in rows:
        table.add_row(
            row["run_id"][:12],
            row["policy"] or "",
            row["version"] or "",
            row["status"],
            (row["created_at"] or "")[:16].replace("T", " "),
            *([(row["reissue_of"] or "")[:8]] if reissues else []),
        )
    console.print(table)
    console.print("privrelease report show RUN prints a report's path", style="dim")


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
        from privrelease.reports import write_html

        write_html(report.html, target)
    return Located(run_id, target, report.sha256, "audit-db", recorded, note)


@report_app.command("show")
def report_show(run: RunArg, json_output: JsonFlag = False) -> None:
    """Print the path of the run's report file (restored from the audit DB if missing or changed)."""
    located = locate_report(run)
    if json_output:
        print_json(located.as_dict())
        return
    if located.note:
        error_console.print(f"note: {located.note}", highlight=False, markup=False, soft_wrap=True)
    print(located.path)


@report_app.command("open")
def report_open(run: RunArg, json_output: JsonFlag = False) -> None:
    """Open the run's report in the default web browser."""
    located = locate_report(run)
    opened = bool(webbrowser.open(located.path.as_uri()))
    if json_output:
        print_json({**located.as_dict(), "opened": opened})
        return
    if located.note:
        error_console.print(f"note: {located.note}", highlight=False, markup=False, soft_wrap=True)
    if opened:
        console.print(f"opened {located.path}", highlight=False, markup=False, soft_wrap=True)
    else:
        console.print(
            f"no web browser could be started; the report is at {located.path}",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


@report_app.command("index")
def report_index(
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Folder to write index.html and the reports into (default: <work_dir>/reports)."),
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Write a static HTML index of all runs (with their reports beside it) and print its path."""
    from privrelease.reports.index import write_index
    from privrelease.settings import get_settings

    result = write_index(out if out is not None else get_settings().work_dir / RESTORED_DIR)
    if json_output:
        print_json(result.as_dict())
        return
    for problem in result.problems:
        error_console.print(f"warning: {problem}", highlight=False, markup=False, soft_wrap=True)
    print(result.path)
