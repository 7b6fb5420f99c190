"""The scheduled path end to end, on loopback, with the real components: a Prefect server started by
``deploy/server.sh`` (its own ``PREFECT_HOME`` in a temporary folder), the process work pool by
``deploy/work-pool.sh``, every deployment of ``deploy/prefect.yaml`` by ``deploy/deploy.sh``, a run
triggered through the demo deployment, executed by ``deploy/worker.sh run-once`` against a fresh
PostgreSQL audit database; then the audit database shows the run, its outputs (on disk, sha256 as
recorded) and its report, and ``privrelease audit verify`` passes against PostgreSQL.

The server is started once per test process (:func:`prefect_stack`; ``tests/test_deploy_faults.py``
uses it too) and stopped at the end of the session, or at exit, even when a test fails: the scripts
start it in a session of its own and ``deploy/server.sh stop`` ends that process group. Select these
tests with ``-m system``; they skip when the PostgreSQL server binaries (hence
``PRIVRELEASE_TEST_POSTGRES_URL``) or ``bash``/``setsid`` are absent.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import postgres_server
import pytest
import sqlalchemy as sa
import yaml
from sqlmodel import Session, select

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
PREFECT_FILE = DEPLOY / "prefect.yaml"
EXAMPLES = REPO / "policies" / "examples"
POOL = "privrelease-process"
POSTGRES_ENV = postgres_server.URL_ENV
DEMO_OUTPUTS = {
    "microdata.parquet",
    "microdata.cells.parquet",
    "hours-by-sex.parquet",
    "mean-hours.parquet",
    "disclosure-statement.html",
    "release.json",
}


# --------------------------------------------------------------------------- the stack


def _clean_environment() -> dict[str, str]:
    """This process's environment without Prefect's and privrelease's settings (each test says
    which it wants) but ``PRIVRELEASE_RUNNER=false``: no runner is left behind (tests/test_resident.py)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "PRIVRELEASE_"))}
    return {**clean, "PRIVRELEASE_RUNNER": "false"}


@dataclass
class Stack:
    """A Prefect server started by ``deploy/server.sh`` and the process work pool, for this test
    process. ``env``: the environment the scripts and workers run with."""

    root: Path
    port: int
    timings: dict[str, float] = field(default_factory=dict)
    stopped: bool = False

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    @property
    def home(self) -> Path:
        return self.root / "prefect-home"

    @property
    def env(self) -> dict[str, str]:
        return {
            **_clean_environment(),
            "PREFECT_HOME": str(self.home),
            "PRIVRELEASE_PREFECT_PORT": str(self.port),
            "PREFECT_API_URL": self.api_url,
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "PREFECT_UI_ENABLED": "false",
            "PRIVRELEASE_REPO": str(REPO),
        }

    def script(self, name: str, *args: str, env: dict[str, str] | None = None, timeout: float = 180) -> str:
        """Run ``deploy/<name> args``; its output; an assertion naming the output when it fails."""
        done = subprocess.run(
            ["bash", str(DEPLOY / name), *args],
            env=env or self.env,
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        assert done.returncode == 0, (
            f"deploy/{name} {' '.join(args)} exited {done.returncode}:\n{done.stdout}{done.stderr}"
        )
        return done.stdout + done.stderr

    @contextmanager
    def client(self) -> Iterator[Any]:
        """A synchronous Prefect client on this server (whatever API the test process has set),
        with the auth string deploy/common.sh made in ``PREFECT_HOME``."""
        from prefect.client.orchestration import get_client
        from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

        updates = {PREFECT_API_URL: self.api_url, PREFECT_API_AUTH_STRING: (self.home / "api-auth").read_text()}
        with temporary_settings(updates=updates), get_client(sync_client=True) as client:
            yield client

    def stop(self) -> None:
        """Stop the server (its process group) and remove its files; idempotent."""
        if self.stopped:
            return
        self.stopped = True
        with contextlib.suppress(Exception):
            subprocess.run(
                ["bash", str(DEPLOY / "server.sh"), "stop"], env=self.env, capture_output=True, timeout=60, check=False
            )
        pidfile = self.home / "server.pid"
        if pidfile.exists():  # the script could not stop it
            with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
                os.killpg(int(pidfile.read_text()), signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)


@functools.cache
def _stack() -> Stack:
    stack = Stack(Path(tempfile.mkdtemp(prefix="privrelease-deploy-")), postgres_server._free_port())
    atexit.register(stack.stop)  # also when the session is interrupted
    began = time.monotonic()
    stack.script("server.sh", "start")
    stack.timings["server start"] = time.monotonic() - began
    began = time.monotonic()
    stack.script("work-pool.sh")
    stack.timings["work pool"] = time.monotonic() - began
    return stack


@pytest.fixture(scope="session")
def prefect_stack() -> Iterator[Stack]:
    """The Prefect server and work pool of this test process (started at first use)."""
    missing = [tool for tool in ("bash", "setsid") if shutil.which(tool) is None]
    if missing:
        pytest.skip(f"{' and '.join(missing)} not found: the deploy scripts need them")
    stack = _stack()
    yield stack
    stack.stop()


@contextmanager
def postgres_database() -> Iterator[str]:
    """A new, empty database on the test session's PostgreSQL server (dropped afterwards): its URL."""
    if POSTGRES_ENV not in os.environ:
        pytest.skip(
            f"no PostgreSQL server for the tests ({POSTGRES_ENV} is unset): the PostgreSQL server "
            "binaries are absent (Debian: apt-get install postgresql)"
        )
    name = f"privrelease_deploy_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(os.environ[POSTGRES_ENV], isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
        yield sa.make_url(os.environ[POSTGRES_ENV]).set(database=name).render_as_string(hide_password=False)
    finally:
        from privrelease.audit.database import dispose_engines

        dispose_engines()
        with admin.connect() as connection:
            connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def privrelease(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The ``privrelease`` console script in a subprocess."""
    return subprocess.run(
        [str(Path(sys.executable).with_name("privrelease")), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@contextmanager
def worker(stack: Stack, env: dict[str, str], log: Path, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``deploy/worker.sh args`` in a session of its own, output to ``log``; its process group is
    killed on the way out."""
    with open(log, "wb") as handle:
        process = subprocess.Popen(
            ["bash", str(DEPLOY / "worker.sh"), *args],
            env=env,
            cwd=stack.root,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def tail(path: Path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else "(no log)"


def wait_for_final_state(stack: Stack, flow_run_id: Any, timeout: float = 60) -> Any:
    """The flow run once it is in a final state (COMPLETED, FAILED, CRASHED, ...)."""
    deadline = time.monotonic() + timeout
    with stack.client() as client:
        while True:
            flow_run = client.read_flow_run(flow_run_id)
            if flow_run.state is not None and flow_run.state.is_final():
                return flow_run
            assert time.monotonic() < deadline, f"flow run {flow_run_id} still {flow_run.state} after {timeout} s"
            time.sleep(0.5)


def declared_deployments() -> dict[str, dict[str, Any]]:
    """The deployments of deploy/prefect.yaml by name."""
    document = yaml.safe_load(PREFECT_FILE.read_text(encoding="utf-8"))
    return {d["name"]: d for d in document["deployments"]}


# --------------------------------------------------------------------------- the YAML (fast)


def test_prefect_yaml_declares_a_scheduled_deployment_per_example_policy():
    """One deployment per example policy (the demo's policy is the copy `make demo` writes beside
    its synthetic data), each with the three path parameters, a UTC cron schedule in a
    ``schedules:`` list and the process work pool; the flow runs start in PRIVRELEASE_REPO."""
    from prefect.client.schemas.schedules import CronSchedule

    document = yaml.safe_load(PREFECT_FILE.read_text(encoding="utf-8"))
    assert document["pull"] == [
        {"prefect.deployments.steps.set_working_directory": {"directory": "{{ $PRIVRELEASE_REPO }}"}}
    ]
    deployments = declared_deployments()
    examples = {p.stem for p in EXAMPLES.glob("*.yaml")}
    assert set(deployments) == examples
    for name, deployment in deployments.items():
        assert "schedule" not in deployment, name  # the outdated single-schedule field
        assert deployment["entrypoint"] == "flows/release.py:release"
        assert set(deployment["parameters"]) == {"policy_path", "data_path", "out_dir"}, name
        expected_policy = "privrelease-work/demo/demo.yaml" if name == "demo" else f"policies/examples/{name}.yaml"
        assert deployment["parameters"]["policy_path"] == expected_policy
        (schedule,) = deployment["schedules"]
        assert schedule["timezone"] == "UTC"
        CronSchedule(cron=schedule["cron"], timezone="UTC")  # a valid cron expression
        assert deployment["work_pool"]["name"] == POOL
        if name != "demo":
            assert (REPO / deployment["parameters"]["policy_path"]).is_file()
            policy_path = deployment["parameters"]["policy_path"]
            declared = yaml.safe_load((REPO / policy_path).read_text(encoding="utf-8"))["dataset"]["path"]
            # the file the policy itself names, as a path from the checkout
            assert deployment["parameters"]["data_path"] == os.path.normpath(Path(policy_path).parent / declared)


def test_deploy_cli_without_prefect_import():
    """``privrelease deploy`` is registered and its help does not import Prefect."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from privrelease.cli import app; print('prefect' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == "False"
    done = privrelease("deploy", "--help", env=_clean_environment())
    assert done.returncode == 0 and "worker" in done.stdout


@pytest.mark.system
def test_deploy_server_answers_only_with_its_auth_string(prefect_stack):
    """The server ``deploy/server.sh`` started keeps its files private (``PREFECT_HOME`` 0700, the
    auth string 0600) and its API refuses a request without the auth string (401: no flow run
    listed, no deployment created), answers one with it; ``/api/health`` stays open (issue 25,
    item 21)."""
    import base64
    import urllib.error
    import urllib.request

    stack = prefect_stack
    auth = stack.home / "api-auth"
    assert stack.home.stat().st_mode & 0o777 == 0o700 and auth.stat().st_mode & 0o777 == 0o600

    def call(path: str, body: bytes | None, **headers: str) -> int:
        request = urllib.request.Request(
            stack.api_url + path, data=body, headers={"Content-Type": "application/json", **headers}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as answer:
                return int(answer.status)
        except urllib.error.HTTPError as error:
            return int(error.code)

    deployment = b'{"name": "x", "flow_id": "00000000-0000-0000-0000-000000000000"}'
    assert call("/health", None) == 200
    assert call("/flow_runs/filter", b"{}") == call("/deployments/", deployment) == 401
    key = base64.b64encode(auth.read_bytes()).decode()
    assert call("/flow_runs/filter", b"{}", Authorization=f"Basic {key}") == 200


# --------------------------------------------------------------------------- the scheduled path


@pytest.mark.system
def test_scheduled_release_on_prefect_server_and_postgresql(prefect_stack, tmp_path):
    from privrelease import demo
    from privrelease.audit.database import create_engine
    from privrelease.audit.models import LedgerEntry, Output, Report, Run
    from privrelease.files import sha256_file

    stack = prefect_stack
    timings: dict[str, float] = dict(stack.timings)
    began = time.monotonic()
    with postgres_database() as db_url:
        env = {**stack.env, "PRIVRELEASE_DB_URL": db_url, "PRIVRELEASE_WORK_DIR": str(tmp_path / "work")}
        done = privrelease("audit", "migrate", env=env)
        assert done.returncode == 0, done.stderr
        timings["migrate"] = time.monotonic() - began

        mark = time.monotonic()
        output = stack.script("deploy.sh", env=env)
        assert "deployed all deployments" in output
        timings["deploy"] = time.monotonic() - mark

        declared = declared_deployments()
        with stack.client() as client:
            deployments = {d.name: d for d in client.read_deployments() if d.name in declared}
            assert set(deployments) == set(declared)
            for name, deployment in deployments.items():
                (schedule,) = deployment.schedules
                assert schedule.active
                assert schedule.schedule.cron == declared[name]["schedules"][0]["cron"]
                assert schedule.schedule.timezone == "UTC"
                assert deployment.work_pool_name == POOL
                assert deployment.entrypoint == "flows/release.py:release"
                assert deployment.parameters == declared[name]["parameters"]
                # deploy.sh exports PRIVRELEASE_REPO: the flow runs start in this checkout
                assert deployment.pull_steps == [
                    {"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}
                ]
            policy, data = demo.write_demo(tmp_path / "demo")
            out_dir = tmp_path / "releases"
            flow_run = client.create_flow_run_from_deployment(
                deployments["demo"].id,
                parameters={"policy_path": str(policy), "data_path": str(data), "out_dir": str(out_dir)},
            )

        mark = time.monotonic()
        log = tmp_path / "worker.log"
        with worker(stack, env, log, "run-once") as process:
            try:
                process.wait(timeout=150)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the worker did not finish within 150 s:\n{tail(log)}")
        assert process.returncode == 0, tail(log)
        finished = wait_for_final_state(stack, flow_run.id)
        timings["worker run"] = time.monotonic() - mark
        assert finished.state.type.value == "COMPLETED", f"{finished.state}\n{tail(log)}"

        engine = create_engine(db_url)
        try:
            with Session(engine) as s:
                run = s.exec(select(Run).where(Run.flow_run_id == str(flow_run.id))).one()
                outputs = s.exec(select(Output).where(Output.run_id == run.id)).all()
                report = s.exec(select(Report).where(Report.run_id == run.id)).one()
                (entry,) = s.exec(select(LedgerEntry).where(LedgerEntry.run_id == run.id)).all()
        finally:
            engine.dispose()
        assert (run.status, run.kind, run.error) == ("succeeded", "release", None)
        assert entry.state == "committed"
        assert {Path(o.path).name for o in outputs} == DEMO_OUTPUTS
        (release_dir,) = {Path(o.path).parent for o in outputs}
        assert release_dir.parent == out_dir
        for o in outputs:
            assert sha256_file(Path(o.path)) == o.sha256, o.path
        assert Path(report.path) == release_dir / "report.html"
        assert sha256_file(Path(report.path)) == report.sha256
        assert run.id in report.html and "demo-census" in report.html
        assert [p.name for p in out_dir.iterdir()] == [release_dir.name]  # no staging folder left

        done = privrelease("audit", "verify", "--head", str(release_dir / "chain-head.json"), env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "intact" in done.stdout
    timings["test"] = time.monotonic() - began
    print("deploy system test timings (s): " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
