"""``privrelease deploy``: scheduled releases on a Prefect server, by the scripts in ``deploy/``
(``server.sh``, ``work-pool.sh``, ``deploy.sh``, ``worker.sh``; see ``deploy/README.md``), and the
check that Prefect's API answers before a release starts.

The commands run the scripts of the source checkout (they are not part of an installed wheel);
each script is idempotent and prints one clear line per step on stderr. Prefect is never imported
here at module level: ``privrelease --help`` stays fast. Whether Prefect's API answers is
:func:`privrelease.server.check_prefect_api`'s to say.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Annotated

import typer

from privrelease.errors import UserError
from privrelease.server import check_prefect_api, configured_api_url

SCRIPTS_DIR = Path(__file__).resolve().parents[2] / "deploy"
"""``deploy/`` of the checkout this package is imported from."""

deploy_app = typer.Typer(
    help="Scheduled releases on a Prefect server: local server, work pool, deployments, worker.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    """Add the ``deploy`` command group to ``app``."""
    app.add_typer(deploy_app, name="deploy")


# --------------------------------------------------------------------------- the scripts


def _script(name: str, *args: str) -> None:
    """Run ``deploy/<name>`` with this process's environment; exit with its code on failure."""
    path = SCRIPTS_DIR / name
    if not path.is_file():
        raise UserError(
            f"the deploy scripts are not in this installation ({path} is missing): they come with "
            "the source checkout of privrelease (deploy/); run this command from an editable install"
        )
    try:
        done = subprocess.run(["bash", str(path), *args], check=False)
    except FileNotFoundError:
        raise UserError("bash is needed to run the deploy scripts and was not found on PATH") from None
    if done.returncode != 0:
        raise typer.Exit(done.returncode)


Action = Annotated[str, typer.Argument(help="start | stop | status | foreground")]


@deploy_app.command("server")
def server_command(action: Action = "start") -> None:
    """A local Prefect server on 127.0.0.1 (deploy/server.sh).

    start: in the background, waiting until it answers (idempotent); stop; status; foreground.
    Port PRIVRELEASE_PREFECT_PORT (default 4200); files under PREFECT_HOME (default
    privrelease-work/prefect)."""
    _script("server.sh", action)


@deploy_app.command("pool")
def pool_command() -> None:
    """Create the process work pool privrelease-process (deploy/work-pool.sh; idempotent)."""
    _script("work-pool.sh")


@deploy_app.command("apply")
def apply_command(
    names: Annotated[
        list[str] | None, typer.Argument(help="Deployment names (default: all in deploy/prefect.yaml).")
    ] = None,
) -> None:
    """Create or update the deployments and their cron schedules (deploy/deploy.sh)."""
    _script("deploy.sh", *(names or []))


@deploy_app.command("worker")
def worker_command(
    action: Annotated[str, typer.Argument(help="start | stop | status | foreground | run-once")] = "start",
) -> None:
    """A process worker on the work pool (deploy/worker.sh).

    It runs the scheduled and triggered flow runs with this environment (PRIVRELEASE_DB_URL,
    PRIVRELEASE_PRODUCTION, ...). start: in the background (idempotent); stop; status;
    foreground; run-once: the runs due now, then exit."""
    _script("worker.sh", action)


@deploy_app.command("up")
def up_command() -> None:
    """Server, work pool, deployments and a background worker, each idempotent.

    The local server is started only when PREFECT_API_URL is not set (else that server is used);
    a server on its port that deploy/server.sh did not start is refused, never reused."""
    if not os.environ.get("PREFECT_API_URL"):
        _script("server.sh", "start")
    _script("work-pool.sh")
    _script("deploy.sh")
    _script("worker.sh", "start")


@deploy_app.command("down")
def down_command() -> None:
    """Stop the background worker and the local server these commands started."""
    _script("worker.sh", "stop")
    _script("server.sh", "stop")


@deploy_app.command("check")
def check_command() -> None:
    """Check that Prefect's API (PREFECT_API_URL, or the Prefect profile's) answers."""
    url = configured_api_url()
    if not url:
        raise UserError(
            "no PREFECT_API_URL is configured (nor in a Prefect profile): the deployments need one (`privrelease "
            "deploy up` starts a server); `privrelease run` records its runs on the server it keeps in the work "
            "folder (`privrelease server status`), or on a temporary one with PRIVRELEASE_SERVER_REUSE=false"
        )
    check_prefect_api(url)
    typer.echo(f"Prefect's API answers at {url}")
