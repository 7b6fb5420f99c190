"""``privrelease run``, ``rerun``, ``reissue`` and ``demo``: the commands that release data.

``run`` and ``rerun`` (and ``demo``, which ends in a run) execute the Prefect flow
:func:`privrelease.flows.release.release` in this process. First every check that needs no
Prefect (:func:`privrelease.flows.preflight.preflight`; for a rerun, its run id and stored
policy): a refusal imports no Prefect and starts no server. Then the run records to the
configured ``PREFECT_API_URL``, else to the Prefect server kept in the work folder
(:mod:`privrelease.server`: found, or started in the background while this process imports
Prefect and the mechanisms and migrates the audit database). Prefect's environment defaults
(unless the user set them): :data:`privrelease.server.PREFECT_DEFAULTS`.

The work is done by :mod:`privrelease.running` (the flow in this process on its server) and
:mod:`privrelease.reissuing` (no flow, no Prefect: the stored outputs of an earlier run checked
against their recorded sha256 and handed back, optionally copied, without a new charge); these
commands parse, call and print. Progress goes to stderr (Rich); the result to stdout (``--json``: one JSON document).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from privrelease import resident
from privrelease import server as prefect_server
from privrelease.cli.output import console, error_console, fail, print_json, say, styled
from privrelease.errors import ClusterFailure, TargetNotMet, UserError
from privrelease.running import run_flow
from privrelease.server import LocalServer

JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]
DataOption = Annotated[
    Path | None,
    typer.Option("--data", help="The dataset file (default: the policy's dataset.path)."),
]
OutOption = Annotated[
    Path | None,
    typer.Option(
        "--out",
        help="Folder for releases (default <work_dir>/releases); each run gets a subfolder.",
    ),
]
FormatOption = Annotated[str, typer.Option("--format", help="Output file format: parquet or csv.")]
EngineOption = Annotated[
    str | None,
    typer.Option(
        "--engine",
        help="Where the data work runs: local (in-process) or dask (partition by partition on a Dask cluster). "
        "Default: the policy's engine section, else local.",
    ),
]
DaskAddressOption = Annotated[
    str | None,
    typer.Option(
        "--dask-address",
        help="The Dask scheduler, e.g. tcp://host:8786 (implies --engine dask; default: a local cluster for the run).",
    ),
]
WorkersOption = Annotated[
    int | None,
    typer.Option("--workers", help="Worker processes of the local Dask cluster started for the run (default 2)."),
]
ServerReuseOption = Annotated[
    bool | None,
    typer.Option(
        "--server-reuse/--no-server-reuse",
        help="Record the run on the Prefect server kept in the work folder (started on first use, stops "
        "after PRIVRELEASE_SERVER_IDLE_SECONDS idle), or on a temporary one of this run. Default: "
        "PRIVRELEASE_SERVER_REUSE (true). A PREFECT_API_URL you set wins.",
    ),
]


def register(app: typer.Typer) -> None:
    """Add ``run``, ``rerun``, ``reissue`` and ``demo`` to ``app``."""
    app.command("run")(run_command)
    app.command("rerun")(rerun_command)
    app.command("reissue")(reissue_command)
    app.command("demo")(demo_command)


# --------------------------------------------------------------------------- Prefect


class RichProgress:
    """Progress of the release steps on stderr: what a step does as it starts (a spinner on a
    terminal, a line otherwise: a log or a pipe shows it too), then a line when it is done."""

    def __init__(self) -> None:
        self._status: Any = None

    def start(self, step: str, description: str) -> None:
        self.close()
        if not error_console.is_terminal:
            say(f"{description}…", err=True)
            return
        self._status = error_console.status(f"{description}…")
        self._status.start()

    def done(self, step: str, seconds: float, note: str = "") -> None:
        self.close()
        say(styled("  [green]✓[/] {} [dim]{}[/]", step, f"{seconds:.2f} s{' ' + note if note else ''}"), err=True)

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


def _fail_release(error: BaseException) -> None:
    """Turn an expected failure into one line on stderr and the exit code (run_flow raises
    expected failures of the flow as :func:`privrelease.running.expected_failure` makes them)."""
    if isinstance(error, (UserError, TargetNotMet, ClusterFailure)):
        fail(str(error), error.exit_code)
    raise error


def _print_summary(summary: dict[str, Any], timings: dict[str, float], json_output: bool) -> None:
    if json_output:
        print_json({**summary, "timings": timings})
        return
    folder = Path(summary["release_dir"])
    say(f"released to: {folder}")
    table = Table("output", "rows", "sha256")
    for output in summary["outputs"]:
        table.add_row(Path(output["path"]).name, str(output["rows"]), output["sha256"])
    console.print(table)
    say(f"report:      {summary['report']}")
    say(f"statement:   {summary['statement']}")
    head = summary["chain_head"]
    say(f"audit chain: seq {head['seq']} {head['hash']} (also in chain-head.json)")
    say(f"run id:      {summary['run_id']}")
    for warning in summary.get("warnings", []):
        say(styled("[bold yellow]warning:[/] {}", warning), err=True)


def _release(json_output: bool, checked: tuple[LocalServer | None, tuple[str, ...]], **parameters: Any) -> None:
    """Run the flow on the server ``checked`` gives (:func:`_start_checked`); with ``--json``
    the plan's warnings it printed are also in the document (``plan_warnings``)."""
    server, plan_warnings = checked
    progress = RichProgress()
    try:
        summary, timings = run_flow(server=server, progress=progress, **parameters)
    except Exception as error:
        _fail_release(error)
        raise
    finally:
        with contextlib.suppress(OSError):
            resident.keep()  # the next run/rerun of this kind skips the imports
    _print_summary({**summary, "plan_warnings": list(plan_warnings)} if json_output else summary, timings, json_output)


# --------------------------------------------------------------------------- commands


def run_command(
    policy: Annotated[Path, typer.Argument(help="The release policy (YAML).")],
    data: DataOption = None,
    out: OutOption = None,
    output_format: FormatOption = "parquet",
    production: Annotated[
        bool,
        typer.Option(
            "--production",
            help="Refuse unapproved policies. Production mode is also on when the audit database says so "
            "(privrelease audit mode) or PRIVRELEASE_PRODUCTION=true; nothing on the command line turns it off.",
        ),
    ] = False,
    engine: EngineOption = None,
    dask_address: DaskAddressOption = None,
    workers: WorkersOption = None,
    server_reuse: ServerReuseOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Release what a policy says, as a Prefect flow run.

    Checks the policy (approval in production mode), fingerprints the data, plans and checks the
    guarantees, reserves the budget, reads the data, runs the mechanisms, publishes the outputs
    and the disclosure report atomically and commits the audit records. Exit 0: released;
    1: a target is not met or the budget is exhausted; 2: invalid input."""
    from privrelease.flows.preflight import preflight

    # what the run would refuse (policy, targets, data file, approval, budget) fails now, not after Prefect's start
    def check() -> tuple[str, ...]:
        _check_format(output_format)
        return preflight(
            policy,
            data_path=data,
            output_format=output_format,
            production=production,
            engine=engine,
            dask_address=dask_address,
            workers=workers,
        )

    _release(
        json_output,
        _start_checked(check, server_reuse),
        policy_path=str(policy),
        data_path=None if data is None else str(data),
        out_dir=None if out is None else str(out),
        output_format=output_format,
        production=production,
        engine=engine,
        dask_address=dask_address,
        workers=workers,
    )


def rerun_command(
    run_id: Annotated[str, typer.Argument(help="The run to repeat (id or unique prefix).")],
    data: DataOption = None,
    out: OutOption = None,
    output_format: FormatOption = "parquet",
    engine: EngineOption = None,
    dask_address: DaskAddressOption = None,
    workers: WorkersOption = None,
    server_reuse: ServerReuseOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Repeat a run: same policy version (approved, in production) and data, fresh randomness, new charge.

    The stored canonical policy is used (its hierarchy files are found through the run's
    manifest and checked against the recorded hash); the data must have the same sha256."""
    from privrelease.flows.preflight import preflight_rerun

    def check() -> tuple[str, ...]:
        _check_format(output_format)
        return preflight_rerun(
            run_id,
            data_path=data,
            output_format=output_format,
            engine=engine,
            dask_address=dask_address,
            workers=workers,
        )

    _release(
        json_output,
        _start_checked(check, server_reuse),
        rerun_of=run_id,
        data_path=None if data is None else str(data),
        out_dir=None if out is None else str(out),
        output_format=output_format,
        engine=engine,
        dask_address=dask_address,
        workers=workers,
    )


def _start_checked(
    check: Callable[[], tuple[str, ...]], reuse: bool | None
) -> tuple[LocalServer | None, tuple[str, ...]]:
    """Run the quick ``check`` of the user's input (about a second; no Prefect), saying so on
    stderr first, print the plan's warnings it returns (stderr, before any data is read), then
    find or start the Prefect server: a refused release never starts, waits for or imports
    Prefect. Returns the server and the warnings."""
    progress = RichProgress()
    progress.start("checks", "checking the policy, the data file, the audit chain and the budget")
    try:
        plan_warnings = check()
    finally:
        progress.close()
    for warning in plan_warnings:
        say(styled("[bold yellow]warning:[/] {}", warning), err=True)
    return prefect_server.connect(reuse), plan_warnings


def _check_format(output_format: str) -> None:
    """The pre-flight's check (:func:`.flows.preflight.check_output_format`) in the option's words."""
    from privrelease.flows.steps import OUTPUT_FORMATS

    if output_format not in OUTPUT_FORMATS:
        raise UserError(f"--format must be {' or '.join(OUTPUT_FORMATS)}; got {output_format!r}")


def reissue_command(
    run_id: Annotated[str, typer.Argument(help="The run whose outputs to hand back.")],
    out: Annotated[
        Path | None,
        typer.Option("--out", help="Also copy the outputs and report into this folder."),
    ] = None,
    json_output: JsonFlag = False,
) -> None:
    """Hand back the outputs of an earlier run without recomputing (no new charge).

    Every output and the report are checked against their recorded sha256 first; with --out
    they are copied to a new folder. The reissue is recorded as a run of its own."""
    from privrelease.reissuing import reissue

    result = reissue(run_id, out)
    if json_output:
        print_json(result.as_dict())
        return
    table = Table("file", "rows", "sha256", title=f"Reissued run {result.source_run_id}")
    for output in result.outputs:
        table.add_row(output.path, "" if output.rows is None else str(output.rows), output.sha256[:16] + "…")
    console.print(table)
    if result.report:
        say(f"report: {result.report}")
    say(f"checksums verified; recorded as run {result.run_id} (no budget charged)")
    if result.published_nothing:
        say(
            styled(
                "[bold yellow]warning:[/] {}",
                f"run {result.source_run_id} published no rows: every file handed back is empty (its privacy cost "
                "was charged when it ran)",
            )
        )
    if result.approval_revoked:
        say(styled("[bold yellow]warning:[/] {}", result.approval_revoked))


def demo_command(
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="Where to write the demo (default <work_dir>/demo)."),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option("--seed", help="Fixed seed for the synthetic data (default: OS CSPRNG)."),
    ] = None,
    server_reuse: ServerReuseOption = None,
    json_output: JsonFlag = False,
) -> None:
    """Try it end to end on SYNTHETIC census-like data: generate, approve, release.

    Writes 50,000 synthetic rows and the demo policy (policies/examples/demo.yaml) to --dir,
    approves the policy as "privrelease demo", runs the release flow in production mode and
    prints where the outputs and the report are."""
    from privrelease.audit.database import open_database, session

    started = time.perf_counter()
    progress = RichProgress()
    progress.start("demo", "opening the audit database (created if missing)")
    try:
        open_database(create=True)  # the demo makes its own audit database, before any other work
    finally:
        progress.close()
    server = prefect_server.connect(server_reuse)
    try:
        from privrelease import demo
        from privrelease.audit import approvals
        from privrelease.flows.opening import approval_binding
        from privrelease.policies import load_policy
        from privrelease.settings import get_settings

        folder = directory or get_settings().work_dir / "demo"
        policy_path, data_path = demo.write_demo(folder, seed=seed)
        say(styled("  [green]✓[/] wrote {} rows of SYNTHETIC data: {}", demo.ROWS, data_path), err=True)
        loaded = load_policy(policy_path)
        facts = approvals.policy_facts(loaded)
        with session(open_database()) as s:
            approvals.approve_policy(
                s, facts, "privrelease demo", note="demo policy on synthetic data", binding=approval_binding(loaded)
            )
        say(
            styled(
                "  [green]✓[/] approved {}@{} (sha256 {}) as 'privrelease demo'",
                facts.name,
                facts.version,
                facts.sha256[:12],
            ),
            err=True,
        )
        summary, timings = run_flow(
            server=server,
            progress=progress,
            policy_path=str(policy_path),
            out_dir=str(Path(folder).expanduser().resolve() / "releases"),
            production=True,
        )
    except Exception as error:
        if server is not None and "prefect" not in sys.modules:
            server.stop()
        _fail_release(error)
        raise
    timings["total"] = time.perf_counter() - started
    _print_summary({**summary, "data": str(data_path), "policy": str(policy_path)}, timings, json_output)
    if not json_output:
        command, hint = how_to_call()
        say(
            f"demo finished in {timings['total']:.1f} s; open the report: {command} report open {summary['run_id'][:12]}"
        )
        if hint:
            say(hint)


def how_to_call() -> tuple[str, str]:
    """How to call privrelease from this shell: ``privrelease`` when ``PATH`` finds this one,
    else its path in this environment's ``bin`` folder (``.venv/bin/privrelease`` after ``make
    demo``), with a line saying how to put it on ``PATH``."""
    import os
    import shutil

    folder = Path(sys.executable).parent
    found = shutil.which("privrelease")
    if found is not None and Path(found).parent.resolve() == folder.resolve():
        return "privrelease", ""
    shown = Path(os.path.relpath(folder)) if folder.resolve().is_relative_to(Path.cwd()) else folder
    activate = f"run `. {shown / 'activate'}` or " if (folder / "activate").is_file() else ""
    return str(shown / "privrelease"), f"privrelease is not on your PATH: {activate}use {shown / 'privrelease'}"
