"""Faults of the production path, with the real components on loopback: Prefect's API unreachable,
PostgreSQL going down while the flow is in its mechanism step, and the process running a flow
(started by a Prefect worker) killed mid-run. In each, nothing is published and nothing stays
charged: the run ends up failed and its budget reservation released (at once, or when it expires
and is reaped)."""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import postgres_server
import pytest
import sqlalchemy as sa
import test_deploy_system as system
import test_flow_steps as shared
from sqlmodel import select

from privrelease.audit.database import dispose_engines, open_database, session
from privrelease.audit.models import LedgerEntry, Output
from privrelease.errors import UserError

REPO = system.REPO
prefect_stack = system.prefect_stack  # the one Prefect server of this test process
runs, ledger_entries, verify_intact = shared.runs, shared.ledger_entries, shared.verify_intact
published = shared.published_dirs
KILL_POOL = "privrelease-kill-test"
TTL_SECONDS = 3


# --------------------------------------------------------------------------- helpers


@pytest.fixture(scope="module")
def demo_files(tmp_path_factory) -> tuple[Path, Path]:
    """The demo policy and its SYNTHETIC data (50,000 rows)."""
    from privrelease import demo

    return demo.write_demo(tmp_path_factory.mktemp("demo"))


@pytest.fixture
def audit_env(monkeypatch, tmp_path):
    """This process's privrelease settings for one test: work dir in tmp, short reservation TTL."""
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("PRIVRELEASE_RESERVATION_TTL_SECONDS", str(TTL_SECONDS))
    for name in ("PRIVRELEASE_DB_URL", "PRIVRELEASE_PRODUCTION", "PRIVRELEASE_DEFAULT_LIFETIME_BUDGET"):
        monkeypatch.delenv(name, raising=False)
    yield
    dispose_engines()


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A loopback port bound but not listening: connecting is refused, and no one else takes it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def wait_until_expired(entry: LedgerEntry) -> None:
    from privrelease.audit.models import utcnow

    assert entry.expires_at is not None
    remaining = (entry.expires_at - utcnow()).total_seconds()
    time.sleep(max(0.0, remaining) + 0.2)


# --------------------------------------------------------------------------- (a) Prefect unreachable


class _Unauthorized(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        self.send_response(401)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_check_prefect_api_names_an_unreachable_url():
    from privrelease.server import check_prefect_api

    with closed_port() as port:
        url = f"http://127.0.0.1:{port}/api"
        with pytest.raises(UserError, match=f"cannot reach Prefect's API at {url} .*nothing was released or charged"):
            check_prefect_api(url, timeout=2)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Unauthorized)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:  # an API that answers, even with an error status (a key needed), is reachable
        check_prefect_api(f"http://127.0.0.1:{server.server_address[1]}/api", timeout=2)
    finally:
        server.shutdown()
        server.server_close()
    check_prefect_api("")  # none configured: a temporary server will be started


def test_unreachable_api_error_recognizes_prefects_failure(monkeypatch):
    import httpx

    from privrelease.server import unreachable_api_error

    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    try:
        try:
            raise httpx.ConnectError("[Errno 111] Connection refused")
        except httpx.ConnectError as cause:
            raise RuntimeError("Failed to reach API at http://127.0.0.1:9/api/") from cause
    except RuntimeError as error:
        translated = unreachable_api_error(error)
    assert translated is not None and "127.0.0.1:9" in str(translated)
    assert unreachable_api_error(RuntimeError("something else")) is None
    assert unreachable_api_error(ValueError("bad")) is None


def test_run_with_unreachable_prefect_api_charges_nothing(demo_files, audit_env, tmp_path):
    """``privrelease run`` with PREFECT_API_URL on a closed port: non-zero exit, no output, no run
    and nothing charged; and (with the check in ``privrelease run``) one line naming the URL, exit
    2, no traceback."""
    policy, data = demo_files
    out = tmp_path / "releases"
    with closed_port() as port:
        url = f"http://127.0.0.1:{port}/api"
        env = {
            **system._clean_environment(),
            "PREFECT_API_URL": url,
            "PREFECT_HOME": str(tmp_path / "prefect-home"),
            "PRIVRELEASE_WORK_DIR": os.environ["PRIVRELEASE_WORK_DIR"],
            "PRIVRELEASE_AUTO_INIT": "true",
        }
        began = time.monotonic()
        done = system.privrelease("run", str(policy), "--data", str(data), "--out", str(out), env=env)
        seconds = time.monotonic() - began
        began = time.monotonic()  # the baseline, under the same load: a command that needs no Prefect
        planned = system.privrelease("plan", str(policy), env=env)
        baseline = time.monotonic() - began
    assert done.returncode != 0
    assert not out.exists() or list(out.iterdir()) == []
    assert runs() == [] and ledger_entries() == []  # the same audit database (SQLite in the work dir)
    assert done.returncode == 2, done.stderr
    assert url in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) <= 3, done.stderr
    assert planned.returncode == 0, planned.stderr  # and no retrying an unreachable API for minutes:
    assert seconds < 20 * baseline, f"{seconds:.1f} s; `privrelease plan` {baseline:.1f} s"


def test_deploy_scripts_with_unreachable_prefect_api(tmp_path):
    """The worker and deploy scripts and ``privrelease deploy check`` stop at once, naming the URL."""
    with closed_port() as port:
        url = f"http://127.0.0.1:{port}/api"
        env = {**system._clean_environment(), "PREFECT_API_URL": url, "PREFECT_HOME": str(tmp_path / "home")}
        for script in ("worker.sh", "deploy.sh", "work-pool.sh"):
            args = ["run-once"] if script == "worker.sh" else []
            done = subprocess.run(
                ["bash", str(system.DEPLOY / script), *args],
                env=env,
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 1, (script, done.stderr)
            assert f"Prefect's API at {url} does not answer" in done.stderr, (script, done.stderr)
            assert "Traceback" not in done.stderr
        done = system.privrelease("deploy", "check", env=env)
        assert done.returncode == 2 and url in done.stderr and "Traceback" not in done.stderr, done.stderr
    # with no API configured: what the deployments need, and where `run` records its runs (a kept server by default)
    done = system.privrelease("deploy", "check", env={**env, "PREFECT_API_URL": ""})
    said = " ".join(done.stderr.split())
    assert done.returncode == 2 and "the deployments need one (`privrelease deploy up` starts a server)" in said
    assert "records its runs on the server it keeps in the work folder" in said and "temporary server" not in said


# --------------------------------------------------------------------------- (b) PostgreSQL down


DURABLE = "\n# a crash must not lose committed transactions (the session's test server trades that for speed)\nfsync = on\nsynchronous_commit = on\nfull_page_writes = on\n"


@pytest.fixture
def dedicated_postgres() -> Iterator[postgres_server.Server]:
    """A PostgreSQL cluster of this test's own (it is stopped and started again mid-test), durable
    as in production: ``fsync`` and ``synchronous_commit`` on, so an immediate stop loses no
    committed transaction."""
    try:
        bindir = postgres_server.find_bindir()
    except postgres_server.Unavailable as reason:
        pytest.skip(str(reason))
    server = postgres_server.launch(bindir)
    try:
        postgres_server._initdb(server)
        with (server.data / "postgresql.conf").open("a") as conf:
            conf.write(DURABLE)
        postgres_server._start(server)
        yield server
    finally:
        dispose_engines()
        server.stop()


def postgres_stop(server: postgres_server.Server) -> None:
    done = server.run(server.bindir / "pg_ctl", "-D", server.data, "-m", "immediate", "-w", "-t", "60", "stop")
    assert done.returncode == 0, done.stdout + done.stderr


def postgres_start(server: postgres_server.Server) -> None:
    port = server.port
    postgres_server._start(server)
    assert server.port == port, "the test server came back on another port"


@pytest.mark.system
def test_postgresql_down_mid_run(prefect_harness, dedicated_postgres, demo_files, audit_env, tmp_path, monkeypatch):
    """The audit database stops while the flow runs its mechanisms: the run fails, nothing is
    published (the staging folder is removed although the failure cannot be recorded); when the
    database is back the run is still "running" with its reservation live, and once the reservation
    expires it is reaped: released, and the run recorded as failed."""
    from privrelease.audit import ledger
    from privrelease.flows.release import release
    from privrelease.mechanisms.kinds import all_kinds

    server = dedicated_postgres
    monkeypatch.setenv("PRIVRELEASE_DB_URL", server.url)
    policy, data = demo_files
    out = tmp_path / "releases"
    stopped: list[float] = []
    for kind in all_kinds().values():

        def database_goes_down(spec, loaded, table, original=kind.run):
            if spec.name == "hours-by-sex":  # the first mechanism is done and staged
                postgres_stop(server)
                stopped.append(time.monotonic())
            return original(spec, loaded, table)

        monkeypatch.setattr(kind, "run", database_goes_down)
    with pytest.raises(sa.exc.OperationalError):
        release(policy_path=str(policy), data_path=str(data), out_dir=str(out))
    assert stopped, "the flow never reached the mechanism step"
    assert published(out) == [] and list(out.glob(".*")) == []

    postgres_start(server)
    (run,) = runs()
    assert run.status == "running"  # the failure could not be recorded while the database was down
    (entry,) = ledger_entries()
    assert entry.state == "reserved" and entry.run_id == run.id
    assert entry.expires_at is not None  # it expires after the setting's TTL, not the default hour
    assert (entry.expires_at - entry.created_at).total_seconds() == TTL_SECONDS
    with session(open_database(), readonly=True) as s:
        assert list(s.exec(select(Output).where(Output.run_id == run.id))) == []

    wait_until_expired(entry)
    with session(open_database()) as s:
        reaped = ledger.reap_expired(s)
    assert [e.id for e in reaped] == [entry.id]
    (run,) = runs()
    assert run.status == "failed" and "expired" in run.error
    (released,) = ledger_entries()
    assert released.state == "released" and released.updated_at >= entry.expires_at
    verify_intact()

    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run.flow_run_id).state.type.value == "FAILED"


# --------------------------------------------------------------------------- (c) flow process killed


BLOCKING_FLOW = '''
"""The release flow, with its second mechanism blocking (the process is killed there)."""
import os
import time
from pathlib import Path

from privrelease.flows.release import release  # noqa: F401  (the deployment's flow)
from privrelease.mechanisms.kinds import all_kinds

MARKER = Path(__file__).with_name("in-mechanism.pid")


def _blocking(original):
    def run(spec, loaded, table):
        if spec.name == "hours-by-sex":  # the first mechanism is done and staged
            MARKER.write_text(str(os.getpid()))
            time.sleep(600)
        return original(spec, loaded, table)

    return run


for kind in all_kinds().values():
    kind.run = _blocking(kind.run)
'''


@pytest.mark.system
def test_flow_process_killed_mid_run(prefect_stack, demo_files, audit_env, tmp_path, monkeypatch):
    """A worker runs a deployment; the process running the flow is killed with SIGKILL in the
    mechanism step: Prefect marks the flow run CRASHED, nothing is published, and the next run
    on this host settles the killed one at once (its process is gone): reservation released,
    run failed ("recovered"), staging folder removed."""
    from privrelease.flows.steps import release_plain

    stack = prefect_stack
    policy, data = demo_files
    code = tmp_path / "code"
    code.mkdir()
    (code / "blocking_flow.py").write_text(BLOCKING_FLOW)
    marker = code / "in-mechanism.pid"
    out = tmp_path / "releases"
    with system.postgres_database() as db_url:
        monkeypatch.setenv("PRIVRELEASE_DB_URL", db_url)
        env = {
            **stack.env,
            "PRIVRELEASE_WORK_POOL": KILL_POOL,
            "PRIVRELEASE_DB_URL": db_url,
            "PRIVRELEASE_WORK_DIR": str(tmp_path / "work"),
            "PRIVRELEASE_RESERVATION_TTL_SECONDS": str(TTL_SECONDS),
        }
        from prefect.client.schemas.actions import WorkPoolCreate
        from prefect.workers.process import ProcessWorker

        with stack.client() as client:
            template = ProcessWorker.get_default_base_job_template()
            client.create_work_pool(
                WorkPoolCreate(name=KILL_POOL, type="process", base_job_template=template), overwrite=True
            )
            deployment = client.create_deployment(
                flow_id=client.create_flow_from_name("release"),
                name="killed-mid-run",
                work_pool_name=KILL_POOL,
                work_queue_name="default",
                entrypoint="blocking_flow.py:release",
                path=str(code),
                pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(code)}}],
                enforce_parameter_schema=False,
            )
            flow_run = client.create_flow_run_from_deployment(
                deployment, parameters={"policy_path": str(policy), "data_path": str(data), "out_dir": str(out)}
            )
        log = tmp_path / "worker.log"
        killed = None
        try:
            with system.worker(stack, env, log, "run-once") as process:
                deadline = time.monotonic() + 120
                while not marker.exists():
                    assert process.poll() is None, f"the worker ended early:\n{system.tail(log)}"
                    assert time.monotonic() < deadline, f"the flow never reached the mechanism:\n{system.tail(log)}"
                    time.sleep(0.1)
                time.sleep(0.05)  # the marker's pid is written
                killed = int(marker.read_text())
                os.kill(killed, signal.SIGKILL)
                process.wait(timeout=90)  # run-once: the worker reports the crash, then exits
            finished = system.wait_for_final_state(stack, flow_run.id)
        finally:
            if killed is None and marker.exists():  # the test failed before the kill
                with contextlib.suppress(ProcessLookupError, ValueError):
                    os.kill(int(marker.read_text()), signal.SIGKILL)
        assert finished.state.type.value == "CRASHED", f"{finished.state}\n{system.tail(log)}"

        assert published(out) == []  # only the killed run's hidden staging folder is left
        (staging,) = out.glob(".*.partial")
        assert (staging / "microdata.parquet").exists()
        (run,) = runs()
        assert run.status == "running" and run.flow_run_id == str(flow_run.id)
        (entry,) = ledger_entries()
        assert entry.state == "reserved"

        second = release_plain(policy_path=str(policy), data_path=str(data), out_dir=str(out))
        assert published(out) == [Path(second.release_dir)]
        assert list(out.glob(".*")) == []  # the killed run's staging folder was removed
        crashed, ok = runs()
        assert crashed.id == run.id and crashed.status == "failed" and "recovered" in crashed.error
        assert ok.status == "succeeded"
        assert [(e.run_id, e.state) for e in ledger_entries()] == [(crashed.id, "released"), (ok.id, "committed")]
        with session(open_database(), readonly=True) as s:
            assert list(s.exec(select(Output).where(Output.run_id == crashed.id))) == []
        verify_intact()
