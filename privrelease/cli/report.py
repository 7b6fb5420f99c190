"""``privrelease report``: the disclosure reports stored in the audit database.

``report list`` shows the runs with a stored report, and the reissues of those runs (a reissue
hands back its source run's outputs and report unchanged: it has no report of its own);
``report show RUN_ID`` prints the path of the run's report file (a reissue's: the copy it made
with ``--out``, else its source run's), writing it out from the audit database's copy (under
the work dir) when the file is missing or no longer matches the recorded sha256; ``report open RUN_ID`` opens it
in the default browser. Run ids may be abbreviated to a unique prefix. ``report index`` writes
a static HTML index of every run, with each run's report beside it, for compliance review
(:mod:`privrelease.reports.index`). Listing and locating are :mod:`privrelease.reports.stored`
(the Python API's ``reports`` and ``report``).

These commands read the audit database only: they never import Prefect or the renderer (the
index uses Jinja2, but not the report's calculus or charts).
"""

from __future__ import annotations

import webbrowser
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from privrelease.cli.output import console, print_json, say

if TYPE_CHECKING:
    from privrelease.reports.stored import StoredReport

report_app = typer.Typer(help="Disclosure reports of runs.", no_args_is_help=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]
RunArg = Annotated[str, typer.Argument(help="A run id or a unique prefix of one.")]


def register(app: typer.Typer) -> None:
    """Add the ``report`` command group to ``app``."""
    app.add_typer(report_app, name="report")


@report_app.command("list")
def report_list(json_output: JsonFlag = False) -> None:
    """Runs that have a stored report, and reissues of them: run id, policy, version, status,
    created (a reissue: when it was made); the run a reissue handed back or a rerun repeated."""
    from privrelease.reports.stored import stored_reports

    rows = stored_reports()
    if json_output:
        print_json({"reports": [row.as_dict() for row in rows]})
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
    reissues = any(row.reissue_of or row.rerun_of for row in rows)
    if reissues:
        table.add_column("of", overflow="fold")  # a run id prefix: narrow, for the terminal's sake
    for row in rows:
        table.add_row(
            row.run_id[:12],
            row.policy or "",
            row.version or "",
            row.status,
            (row.created_at or "")[:16].replace("T", " "),
            *([_of(row)] if reissues else []),
        )
    console.print(table)
    console.print("privrelease report show RUN prints a report's path", style="dim")


def _of(row: StoredReport) -> str:
    """The run a reissue handed back or a rerun repeated, in words, by a run id prefix."""
    if row.reissue_of:
        return f"reissue of {row.reissue_of[:8]}"
    return f"rerun of {row.rerun_of[:8]}" if row.rerun_of else ""


@report_app.command("show")
def report_show(run: RunArg, json_output: JsonFlag = False) -> None:
    """Print the path of the run's report file (restored from the audit DB if missing or changed)."""
    from privrelease.reports.stored import locate_report

    located = locate_report(run)
    if json_output:
        print_json(located.as_dict())
        return
    if located.note:
        say(f"note: {located.note}", err=True)
    print(located.path)


@report_app.command("open")
def report_open(run: RunArg, json_output: JsonFlag = False) -> None:
    """Open the run's report in the default web browser."""
    from privrelease.reports.stored import locate_report

    located = locate_report(run)
    opened = bool(webbrowser.open(located.path.as_uri()))
    if json_output:
        print_json({**located.as_dict(), "opened": opened})
        return
    if located.note:
        say(f"note: {located.note}", err=True)
    if opened:
        say(f"opened {located.path}")
    else:
        say(f"no web browser could be started; the report is at {located.path}")


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
    from privrelease.reports.stored import RESTORED_DIR
    from privrelease.settings import get_settings

    result = write_index(out if out is not None else get_settings().work_dir / RESTORED_DIR)
    if json_output:
        print_json(result.as_dict())
        return
    for problem in result.problems:
        say(f"warning: {problem}", err=True)
    print(result.path)
