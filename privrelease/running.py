"""Running the release flow (:func:`privrelease.flows.release.release`) in this process, on the
Prefect server :func:`privrelease.server.connect` chose: what ``privrelease run``, ``rerun`` and
``demo`` and the Python API's :func:`privrelease.api.run` share.

Imports Prefect only inside :func:`run_flow` (and :func:`warm_up`). Progress goes to an
optional :class:`.flows.context.ProgressSink` (the command line's draws on stderr; the API passes none: quiet).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
from typing import TYPE_CHECKING, Any

from privrelease import server as prefect_server
from privrelease.errors import ClusterFailure, TargetNotMet, UserError
from privrelease.server import LocalServer

if TYPE_CHECKING:
    from privrelease.flows.context import ProgressSink

__all__ = ["quiet_expected_errors", "run_flow", "warm_up"]


def quiet_expected_errors() -> None:
    """Keep Prefect's console handler from printing tracebacks of user mistakes, refused
    releases and operations the system refused (the caller reports them as one line; Prefect's
    API still gets them)."""
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


FLOW_MODULES = (
    "opendp.prelude",  # the statistics' Laplace sampler
    "privrelease.flows.release",  # imports Prefect
    "privrelease.mechanisms.histogram",
    "privrelease.mechanisms.sdgs",
    "privrelease.mechanisms.selection",
    "privrelease.mechanisms.statistics",
    "privrelease.planning",
)


def import_flow_modules() -> None:
    """Import what the flow needs (:data:`FLOW_MODULES`) and compile the report's template;
    nothing opened (:mod:`privrelease.resident` forks after it)."""
    from privrelease.reports import render

    for name in FLOW_MODULES:
        importlib.import_module(name)
    render.environment().get_template(render.TEMPLATE)


def warm_up() -> None:
    """Import what the flow needs and migrate the audit database (while the server starts);
    Prefect's settings read again from this process's environment (the API :func:`.server.connect`
    chose, after a runner imported Prefect: :mod:`privrelease.resident`)."""
    prefect_server.prefect_defaults()
    import_flow_modules()
    from prefect.context import refresh_global_settings_context

    from privrelease.audit.database import open_database

    refresh_global_settings_context()
    open_database()


def run_flow(
    *, server: LocalServer | None, progress: ProgressSink | None, **parameters: Any
) -> tuple[dict[str, Any], dict[str, float]]:
    """Run the release flow in this process, holding ``server`` in use (None: the API the user
    configured, checked to answer first); returns its summary and timings in seconds:
    ``warm_up`` (imports, database migration), ``prefect_wait`` (waiting for the server after
    the warm-up), ``prefect_start`` (a server started by this run: its start to its first
    answer) and ``flow`` (the flow call, server up).

    An expected failure is raised as what :func:`expected_failure` makes of it; a data step's
    unexpected error as the original exception (a bug: its traceback is the one to read)."""
    try:
        with server.lease() if server is not None else contextlib.nullcontext():
            return _run_flow(server, progress, parameters)
    except Exception as error:
        from privrelease.flows.context import DataStepError

        failure = expected_failure(error)
        if failure is error:
            raise
        if failure is not None:
            raise failure from error
        if isinstance(error, DataStepError) and isinstance(error.original, Exception):
            raise error.original from error
        raise


def expected_failure(error: BaseException) -> UserError | TargetNotMet | ClusterFailure | None:
    """What a user is told of an expected failure of the release flow: a :class:`UserError`
    (exit 2) or :class:`TargetNotMet` (exit 1) naming the step for a data step's refusal (its
    original message, which only the operator's terminal and the caller see), the error itself
    when it is one of :mod:`privrelease.errors`' kinds, a :class:`TargetNotMet` for a ledger entry
    in the wrong state, a :class:`UserError` naming the URL for an unreachable Prefect API.
    None for anything else: a bug."""
    from privrelease.audit.ledger import LedgerStateError
    from privrelease.flows.context import DataStepError

    if isinstance(error, DataStepError):
        if error.exit_code is None:
            return None
        kinds = (UserError, TargetNotMet, ClusterFailure)
        failure = type(error.original) if isinstance(error.original, kinds) else None
        failure = failure or (UserError if error.exit_code == UserError.exit_code else TargetNotMet)
        return failure(f"{error.step}: {error.detail}")
    if isinstance(error, (UserError, TargetNotMet, ClusterFailure)):
        return error
    if isinstance(error, LedgerStateError):
        return TargetNotMet(f"the release was not published: {error}")
    return prefect_server.unreachable_api_error(error)


def _warm_up_words() -> str:
    from privrelease import resident

    if resident.in_runner():
        return "on the runner kept in the work folder (Prefect and the mechanisms imported)"
    return "importing Prefect and the mechanisms"


def _run_flow(
    server: LocalServer | None, progress: ProgressSink | None, parameters: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, float]]:
    timings: dict[str, float] = {}
    if progress is not None:
        progress.start("warm-up", _warm_up_words())
    try:
        start = time.perf_counter()
        warm_up()
        timings["warm_up"] = time.perf_counter() - start
        if server is None:
            prefect_server.check_prefect_api()  # an unreachable PREFECT_API_URL: one line naming it, before any step
        else:
            if server.started_here and progress is not None:
                progress.start("prefect", "waiting for the Prefect server to start (8-30 s; later runs reuse it)")
            waited = time.perf_counter()
            server.wait(prefect_server.startup_timeout())
            timings["prefect_wait"] = time.perf_counter() - waited
            if server.started_here:
                timings["prefect_start"] = server.ready_after or 0.0
    finally:
        if progress is not None:
            progress.close()
    if server is not None and server.started_here and progress is not None:
        kept = "" if server.temporary else f"kept {server.state.idle_seconds:g} s idle; "
        progress.done("Prefect server ready", timings["prefect_start"], f"({kept}log {server.log_path})")
    from privrelease.flows import steps
    from privrelease.flows.release import release

    quiet_expected_errors()
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
