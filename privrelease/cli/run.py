"""``privrelease run``, ``rerun``, ``reissue`` and ``demo``: the commands that release data.

``run`` and ``rerun`` (and ``demo``, which ends in a run) execute the Prefect flow
:func:`privrelease.flows.release.release` in this process. First every check that needs no
Prefect (:func:`privrelease.flows.preflight.preflight`; for a rerun, its run id and stored
policy): a refusal imports no Prefect and starts no server. Then the run records to the
configured ``PREFECT_API_URL``, else to the Prefect server kept in the work folder
(:mod:`privrelease.server`: found, or started in the background while this process imports
Prefect and the mechanisms and migrates the audit database). Prefect's environment defaults
(unless the user set them): :data:`privrelease.server.PREFECT_DEFAULTS`.

``reissue`` needs no flow and never imports Prefect: it checks the stored outputs of an earlier
run against their recorded sha256 and hands them back (optionally copied), without a new
charge. Progress goes to stderr (Rich); the result to stdout (``--json``: one JSON document).
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from privrelease import server as prefect_server
from privrelease.cli.output import console, error_console, fail, print_json, styled
from privrelease.errors import ClusterFailure, TargetNotMet, UserError
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


def _quiet_expected_errors() -> None:
    """Keep Prefect's console handler from printing tracebacks of user mistakes, refused
    releases and operations the system refused (they are reported as one line by this command;
    Prefect's API still gets them)."""
    import logging

    from privrelease.flows.steps import DataStepError

    expected = (UserError, TargetNotMet, DataStepError, OSError)

    class _Filter(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            if record.exc_info and isinstance(record.exc_info[1], expected):
                return False
            if record.levelno >= logging.ERROR and record.name.startswith(("prefect.flow_runs", "prefect.task_runs")):
                message = record.getMessage()
                return not any(kind.__name__ in message for kind in expected)
            return True

    seen: set[int] = set()
    for name in ["", *logging.root.manager.loggerDict]:
        logger = logging.getLogger(name)
        for handler in getattr(logger, "handlers", []):
            if id(handler) in seen or type(handler).__name__ != "PrefectConsoleHandler":
                continue
            seen.add(id(handler))
            if not any(type(f).__name__ == "_Filter" for f in handler.filters):
                handler.addFilter(_Filter())


class RichProgress:
    """Progress of the release steps on stderr: a spinner while a step runs, then a line."""

    def __init__(self) -> None:
        self._status: Any = None

    def start(self, step: str, description: str) -> None:
        self.close()
        self._status = error_console.status(f"{description}…")
        self._status.start()

    def done(self, step: str, seconds: float, note: str = "") -> None:
        self.close()
        error_console.print(
            styled("  [green]✓[/] {} [dim]{}[/]", step, f"{seconds:.2f} s{' ' + note if note else ''}"),
            highlight=False,
        )

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


def _warm_up() -> None:
    """Import what the flow needs and migrate the audit database (while the server starts)."""
    prefect_server.prefect_defaults()
    import opendp.prelude  # noqa: F401  (the statistics' Laplace sampler)

    import privrelease.flows.release  # noqa: F401  (imports Prefect)
    import privrelease.mechanisms.histogram  # noqa: F401
    import privrelease.mechanisms.sdgs  # noqa: F401
    import privrelease.mechanisms.selection  # noqa: F401
    import privrelease.mechanisms.statistics  # noqa: F401
    import privrelease.planning  # noqa: F401
    from privrelease.audit.database import open_database
    from privrelease.reports import render

    render.environment().get_template(render.TEMPLATE)
    open_database()


def run_flow(
    *, server: LocalServer | None, progress: RichProgress | None, **parameters: Any
) -> tuple[dict[str, Any], dict[str, float]]:
    """Run the release flow in this process, holding ``server`` in use; returns its summary and
    timings in seconds: ``warm_up`` (imports, database migration), ``prefect_wait`` (waiting for
    the server after the warm-up), ``prefect_start`` (a server started by this run: its start
    to its first answer) and ``flow`` (the flow call, server up)."""
    with server.lease() if server is not None else contextlib.nullcontext():
        return _run_flow(server, progress, parameters)


def _run_flow(
    server: LocalServer | None, progress: RichProgress | None, parameters: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, float]]:
    timings: dict[str, float] = {}
    status = error_console.status("importing Prefect and the mechanisms…")
    status.start()
    try:
        start = time.perf_counter()
        _warm_up()
        timings["warm_up"] = time.perf_counter() - start
        if server is None:
            from privrelease.cli.deploy import check_prefect_api

            check_prefect_api()  # an unreachable PREFECT_API_URL: one line naming it, before any step
        else:
            if server.started_here:
                status.update("waiting for the Prefect server to start (8-30 s; later runs reuse it)…")
            waited = time.perf_counter()
            server.wait(prefect_server.startup_timeout())
            timings["prefect_wait"] = time.perf_counter() - waited
            if server.started_here:
                timings["prefect_start"] = server.ready_after or 0.0
    finally:
        status.stop()
    if server is not None and server.started_here:
        kept = "" if server.temporary else f"kept {server.state.idle_seconds:g} s idle; "
        error_console.print(
            styled(
                "  [green]✓[/] Prefect server ready [dim]{}[/]",
                f"{timings['prefect_start']:.1f} s ({kept}log {server.log_path})",
            ),
            highlight=False,
        )
    from privrelease.flows import steps
    from privrelease.flows.release import release

    _quiet_expected_errors()
    steps.set_progress(progress)
    start = time.perf_counter()
    try:
        with _no_heartbeats() if server is not None else contextlib.nullcontext():
            summary = release(**parameters)
    finally:
        timings["flow"] = time.perf_counter() - start
        steps.set_progress(None)
        if progress is not None:
            progress.close()
    return summary, timings


def _no_heartbeats() -> contextlib.AbstractContextManager[object]:
    """No flow-run heartbeats on privrelease's own server: it runs none of Prefect's services
    that read them (crashed runs are marked by :mod:`privrelease.flows.recovery`), and ending
    the heartbeat thread costs each run up to a second."""
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    return temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None})


def _fail_release(error: BaseException) -> None:
    """Turn an expected failure of the flow into one line on stderr and the exit code."""
    from privrelease.audit.ledger import LedgerStateError
    from privrelease.flows.steps import DataStepError

    if isinstance(error, DataStepError):
        if error.exit_code is None:
            raise error.original if error.original is not None else error
        fail(f"{error.step}: {error.detail}", error.exit_code)
    if isinstance(error, (UserError, TargetNotMet, ClusterFailure)):
        fail(str(error), error.exit_code)
    if isinstance(error, LedgerStateError):
        fail(f"the release was not published: {error}", TargetNotMet.exit_code)
    from privrelease.cli.deploy import unreachable_api_error

    unreachable = unreachable_api_error(error)
    if unreachable is not None:
        fail(str(unreachable), unreachable.exit_code)
    raise error


def _print_summary(summary: dict[str, Any], timings: dict[str, float], json_output: bool) -> None:
    if json_output:
        print_json({**summary, "timings": timings})
        return
    folder = Path(summary["release_dir"])
    console.print(f"released to: {folder}", highlight=False, soft_wrap=True)
    table = Table("output", "rows", "sha256")
    for output in summary["outputs"]:
        table.add_row(Path(output["path"]).name, str(output["rows"]), output["sha256"])
    console.print(table)
    console.print(f"report:      {summary['report']}", highlight=False, soft_wrap=True)
    console.print(f"statement:   {summary['statement']}", highlight=False, soft_wrap=True)
    head = summary["chain_head"]
    console.print(
        f"audit chain: seq {head['seq']} {head['hash']} (also in chain-head.json)",
        highlight=False,
        soft_wrap=True,
    )
    console.print(f"run id:      {summary['run_id']}", highlight=False)
    for warning in summary.get("warnings", []):
        error_console.print(styled("[bold yellow]warning:[/] {}", warning), highlight=False, soft_wrap=True)


def _release(json_output: bool, server: LocalServer | None, **parameters: Any) -> None:
    progress = RichProgress()
    try:
        summary, timings = run_flow(server=server, progress=progress, **parameters)
    except Exception as error:
        _fail_release(error)
        raise
    _print_summary(summary, timings, json_output)


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
    def check() -> None:
        _check_format(output_format)
        preflight(
            policy,
            data_path=data,
            output_format=output_format,
            production=production,
            engine=engine,
            dask_address=dask_address,
            workers=workers,
        )

    server = _start_checked(check, server_reuse)
    _release(
        json_output,
        server,
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
    """Repeat a run: same approved policy version and data, fresh randomness, new charge.

    The stored canonical policy is used (its hierarchy files are found through the run's
    manifest and checked against the recorded hash); the data must have the same sha256."""
    from privrelease.flows.opening import rerun_source

    def check() -> None:
        _check_format(output_format)
        rerun_source(run_id)

    server = _start_checked(check, server_reuse)
    _release(
        json_output,
        server,
        rerun_of=run_id,
        data_path=None if data is None else str(data),
        out_dir=None if out is None else str(out),
        output_format=output_format,
        engine=engine,
        dask_address=dask_address,
        workers=workers,
    )


def _start_checked(check: Callable[[], object], reuse: bool | None) -> LocalServer | None:
    """Run the quick ``check`` of the user's input (about a second; no Prefect), then find or
    start the Prefect server: a refused release never starts, waits for or imports Prefect."""
    check()
    return prefect_server.connect(reuse)


def _check_format(output_format: str) -> None:
    if output_format not in ("parquet", "csv"):
        raise UserError(f"--format must be parquet or csv; got {output_format!r}")


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
    result = reissue(run_id, out)
    if json_output:
        print_json(result)
        return
    table = Table("file", "rows", "sha256", title=f"Reissued run {result['source_run_id']}")
    for output in result["outputs"]:
        table.add_row(
            output["path"], "" if output["rows"] is None else str(output["rows"]), output["sha256"][:16] + "…"
        )
    console.print(table)
    if result["report"]:
        console.print(f"report: {result['report']}", highlight=False, soft_wrap=True)
    console.print(
        f"checksums verified; recorded as run {result['run_id']} (no budget charged)",
        highlight=False,
    )


def reissue(run_ref: str, out: Path | None = None) -> dict[str, Any]:
    """Verify and hand back the outputs of run ``run_ref``; with ``out``, copy them (and the
    report) into a new folder under ``out``. Recorded as a ``reissue`` run; nothing charged."""
    from sqlmodel import col, select

    from privrelease.audit import chain, records
    from privrelease.audit.database import open_database, session
    from privrelease.audit.models import Output, Report
    from privrelease.files import sha256_file, write_atomic
    from privrelease.flows.steps import CHAIN_HEAD_FILE, code_version, safe_name

    with session(open_database(), readonly=True) as s:
        source = records.find_run(s, run_ref)
        outputs = list(s.exec(select(Output).where(Output.run_id == source.id).order_by(col(Output.id))))
        report = s.exec(select(Report).where(Report.run_id == source.id)).first()
    if source.status != "succeeded" or source.kind == "reissue":
        raise UserError(
            f"run {source.id} is a {source.kind} that {source.status}; only a succeeded release "
            "or rerun can be reissued"
        )
    files = [(Path(o.path), o.sha256, o.rows) for o in outputs]
    if report is not None and report.path:
        files.append((Path(report.path), report.sha256, None))
    for path, expected, _rows in files:
        try:
            actual = sha256_file(path)
        except OSError:
            raise UserError(
                f"output {path} of run {source.id} is missing; it cannot be reissued "
                "(`privrelease audit verify` lists what changed)"
            ) from None
        if actual != expected:
            raise UserError(
                f"output {path} of run {source.id} was edited (sha256 {actual[:16]} on disk, "
                f"{expected[:16]} recorded); it cannot be reissued"
            )
    handed: list[dict[str, Any]] = []
    target = None
    if out is not None:
        name = Path(files[0][0]).parent.name if files else safe_name(source.id)
        target = out.expanduser().resolve() / f"{name}-reissue-{time.strftime('%Y%m%dT%H%M%S')}"
        try:
            target.mkdir(parents=True)
        except OSError as error:
            raise UserError(f"cannot create {str(target)!r}: {error.strerror or error}") from None
    with session(open_database()) as s:
        run = records.start_run(
            s,
            policy_sha256=source.policy_sha256,
            code_version=code_version(),
            dataset_fingerprint=source.dataset_fingerprint,
            kind="reissue",
            source_run_id=source.id,
        )
        report_path = None
        for path, expected, rows in files:
            final = path
            if target is not None:
                final = target / path.name
                write_atomic(final, lambda temp, source=path: shutil.copyfile(source, temp), durable=False)
                if sha256_file(final) != expected:
                    raise UserError(f"copy {final} does not match its source's sha256")
            if report is not None and str(path) == report.path:
                report_path = str(final)
                if target is not None:
                    records.record_output(s, run, final, sha256=expected)
                continue
            if target is not None:
                records.record_output(s, run, final, sha256=expected, rows=rows)
            handed.append({"path": str(final), "sha256": expected, "rows": rows})
        records.finish_run(s, run, "succeeded")
        head = chain.head(s)
        if target is not None:
            chain.write_head(target / CHAIN_HEAD_FILE, head)
    return {
        "run_id": run.id,
        "source_run_id": source.id,
        "outputs": handed,
        "report": report_path,
        "folder": None if target is None else str(target),
        "chain_head": {"seq": head.seq, "hash": head.hash},
    }


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
    open_database(create=True)  # the demo makes its own audit database, before any other work
    server = prefect_server.connect(server_reuse)
    try:
        from privrelease import demo
        from privrelease.audit import approvals
        from privrelease.flows.opening import approval_binding
        from privrelease.policies import load_policy
        from privrelease.settings import get_settings

        folder = directory or get_settings().work_dir / "demo"
        policy_path, data_path = demo.write_demo(folder, seed=seed)
        error_console.print(
            styled("  [green]✓[/] wrote {} rows of SYNTHETIC data: {}", demo.ROWS, data_path),
            highlight=False,
            soft_wrap=True,
        )
        loaded = load_policy(policy_path)
        facts = approvals.policy_facts(loaded)
        with session(open_database()) as s:
            approvals.approve_policy(
                s, facts, "privrelease demo", note="demo policy on synthetic data", binding=approval_binding(loaded)
            )
        error_console.print(
            styled(
                "  [green]✓[/] approved {}@{} (sha256 {}) as 'privrelease demo'",
                facts.name,
                facts.version,
                facts.sha256[:12],
            ),
            highlight=False,
        )
        progress = RichProgress()
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
        console.print(
            f"demo finished in {timings['total']:.1f} s; open the report: "
            f"privrelease report open {summary['run_id'][:12]}",
            highlight=False,
        )
