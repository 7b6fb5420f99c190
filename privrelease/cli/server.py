"""``privrelease server start|stop|status``: the Prefect server kept in the work folder between
runs (:mod:`privrelease.server`). Never imports Prefect."""

from __future__ import annotations

import os
import time
from typing import Annotated

import typer

from privrelease import resident
from privrelease import server as prefect_server
from privrelease.cli.output import print_json, say
from privrelease.errors import UserError

server_app = typer.Typer(
    help="The local Prefect server that records runs, kept between them (stops after "
    "PRIVRELEASE_SERVER_IDLE_SECONDS without a run).",
    no_args_is_help=True,
)
JsonFlag = Annotated[bool, typer.Option("--json", help="Print one JSON document.")]


def register(app: typer.Typer) -> None:
    """Add the ``server`` command group to ``app``."""
    app.add_typer(server_app, name="server")


def _status() -> dict[str, object]:
    folder = prefect_server.server_folder()
    state = prefect_server.find_server(folder)
    runners = resident.runners(folder.parent)
    if state is None:
        return {"running": False, "folder": str(folder), "runners": runners}
    now = time.time()
    return {
        "running": True,
        "answering": prefect_server.identify(state),
        "pid": state.pid,
        "api_url": state.api_url,
        "uptime_seconds": round(now - state.started, 1),
        "idle_seconds": round(now - prefect_server.last_used(folder), 1),
        "idle_timeout_seconds": state.idle_seconds,
        "log": str(folder / prefect_server.LOG_FILE),
        "folder": str(folder),
        "runners": runners,
    }


def _print_status(status: dict[str, object]) -> None:
    runners = status["runners"]
    if runners:
        say(f"runner kept in the work folder: pid {', '.join(map(str, runners))}")  # type: ignore[call-overload]
    if not status["running"]:
        say(f"no Prefect server is kept in {status['folder']}")
        return
    answering = "" if status["answering"] else " (not answering yet)"
    say(
        f"Prefect server pid {status['pid']} at {status['api_url']}{answering}\n"
        f"up {status['uptime_seconds']:.0f} s, idle {status['idle_seconds']:.0f} s "
        f"(stops after {status['idle_timeout_seconds']:g} s idle)\nlog {status['log']}"
    )


@server_app.command("start")
def start_command(json_output: JsonFlag = False) -> None:
    """Start the server in the background (or find the running one) and wait until it answers."""
    if os.environ.get("PREFECT_API_URL"):
        raise UserError(
            f"PREFECT_API_URL is set ({os.environ['PREFECT_API_URL']}): runs use that server; "
            "unset it to keep a local one"
        )
    prefect_server.prefect_defaults()
    server = prefect_server.kept_server()
    with server.lease():
        server.wait(prefect_server.startup_timeout())
    status = _status()
    if json_output:
        print_json(status)
    else:
        _print_status(status)


@server_app.command("stop")
def stop_command(json_output: JsonFlag = False) -> None:
    """Stop the kept server (its process group) and remove its state file, and the runners kept
    in the work folder (once the commands they run have ended)."""
    from privrelease.settings import get_settings

    state = prefect_server.stop_server()
    runners = resident.stop_runners(get_settings().work_dir)
    if json_output:
        print_json({"stopped": state is not None, "pid": None if state is None else state.pid, "runners": runners})
        return
    say("no Prefect server was running" if state is None else f"stopped the Prefect server (pid {state.pid})")
    if runners:
        say(
            f"stopped the runner{'s' * (len(runners) > 1)} kept in the work folder (pid {', '.join(map(str, runners))})"
        )


@server_app.command("status")
def status_command(json_output: JsonFlag = False) -> None:
    """The kept server's pid, URL, uptime and idle time (a stale state file is removed)."""
    status = _status()
    if json_output:
        print_json(status)
    else:
        _print_status(status)
