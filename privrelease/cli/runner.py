"""``python -m privrelease.cli.runner FOLDER KIND IDLE``: the runner kept in the work folder
(:mod:`privrelease.resident`), started by a ``run``; each of its children runs one forwarded
command through :func:`privrelease.cli.main`, with the consoles set up for the command's streams."""

from __future__ import annotations

import argparse
import importlib
from pathlib import Path

from privrelease import resident

MODULES = ("privrelease.cli", "privrelease.flows.preflight", "dp_accounting.pld.privacy_loss_distribution")
"""What the runner imports besides the flow's modules (:data:`privrelease.running.FLOW_MODULES`)."""


def prepare() -> None:
    """Import what ``run`` and ``rerun`` run, as the command would (Prefect's defaults set first)."""
    from privrelease import running
    from privrelease import server as prefect_server

    prefect_server.prefect_defaults()
    running.import_flow_modules()
    for name in MODULES:
        importlib.import_module(name)


def main() -> None:
    """Serve until idle; in a child, run the command it took and end with its exit code."""
    parser = argparse.ArgumentParser(prog=f"python -m {resident.ENTRY}", description=resident.serve.__doc__)
    parser.add_argument("folder", type=Path)
    parser.add_argument("kind", help="the identity of the commands it serves (privrelease.resident.identity)")
    parser.add_argument("idle", type=float, help="seconds without a command before it exits")
    arguments = parser.parse_args()
    request = resident.serve(arguments.folder, arguments.kind, arguments.idle, prepare)
    if request is None:
        return
    resident.become(request)
    from privrelease.cli import main as command
    from privrelease.cli.output import reset_consoles

    reset_consoles()
    code: int | str | None = 0
    try:
        command()
    except SystemExit as done:
        code = done.code
    resident.end(code)


if __name__ == "__main__":
    main()
