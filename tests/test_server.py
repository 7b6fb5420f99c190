"""The Prefect server kept between runs (privrelease/server.py, ``privrelease server``), through
the command line in subprocesses, each test in its own work folder. Every server a test starts
is stopped by the fixture (its process group killed if ``server stop`` could not)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from privrelease import demo
from privrelease import server as prefect_server

REPO = Path(__file__).resolve().parents[1]


class Work:
    """A work folder and the environment its commands run with (no PREFECT_API_URL)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "PRIVRELEASE_"))}
        self.env.update(
            PRIVRELEASE_WORK_DIR=str(root / "work"),
            PRIVRELEASE_AUTO_INIT="true",
            PRIVRELEASE_RUNNER="false",  # the runner kept beside the server: tests/test_resident.py
            PREFECT_HOME=str(root / "prefect-home"),
        )

    @property
    def folder(self) -> Path:
        return prefect_server.server_folder(self.root / "work")

    def cli(self, *args: str, expect: int = 0, **env: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "privrelease", *args],
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        assert done.returncode == expect, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        return done.stdout

    def status(self) -> dict:
        return json.loads(self.cli("server", "status", "--json"))

    def kill_all(self) -> None:
        """Stop the kept server; kill its process group if it is still there."""
        state = prefect_server.read_state(self.folder)
        with contextlib.suppress(AssertionError, subprocess.TimeoutExpired):
            self.cli("server", "stop")
        if state is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(state.pid, signal.SIGKILL)


@pytest.fixture
def work(tmp_path) -> Iterator[Work]:
    made = Work(tmp_path)
    try:
        yield made
    finally:
        made.kill_all()


def gone(pid: int, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def flow_run(api_url: str, flow_run_id: str, token: str) -> Any:
    """The flow run as the Prefect server at ``api_url`` (auth string ``token``) recorded it."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL, temporary_settings

    updates = {PREFECT_API_URL: api_url, PREFECT_API_AUTH_STRING: token}
    with temporary_settings(updates=updates), get_client(sync_client=True) as client:
        return client.read_flow_run(uuid.UUID(flow_run_id))


def audit_flow_run(work: Work, run_id: str) -> str:
    from privrelease.audit.database import dispose_engines, open_database, session
    from privrelease.audit.models import Run

    os.environ["PRIVRELEASE_WORK_DIR"] = work.env["PRIVRELEASE_WORK_DIR"]
    try:
        with session(open_database(), readonly=True) as s:
            flow_run_id = s.get(Run, run_id).flow_run_id
    finally:
        dispose_engines()
    assert flow_run_id
    return flow_run_id


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["missing.yaml"], "policy file not found"),
        (["demo/demo.yaml", "--production"], "is not approved"),
        (["demo/demo.yaml", "--data", "demo/missing.csv"], "does not exist"),
    ],
)
def test_refused_run_touches_no_prefect(tmp_path, arguments, message):
    """A run refused by the pre-flight imports no Prefect and starts or records no server; nor
    what only a run needs (the writers' Parquet, the usage errors' Click, and unless it migrated
    a new database, PostgreSQL's dialect on SQLite)."""
    work = Work(tmp_path)
    demo.write_demo(tmp_path / "demo", seed=1, rows=100)
    argv = ["privrelease", "run", *(str(tmp_path / a) if "." in a and not a.startswith("-") else a for a in arguments)]
    code = (
        "import sys\nfrom privrelease.cli import main\n"
        f"sys.argv = {argv!r}\n"
        "try:\n    main()\nexcept SystemExit as exit:\n    assert exit.code == 2, exit.code\n"
        "assert 'prefect' not in sys.modules and 'uvicorn' not in sys.modules\n"
        "unneeded = {'pyarrow.parquet', 'click'}\n"
        "if 'alembic' not in sys.modules:  # no new database was migrated\n"
        "    unneeded.add('sqlalchemy.dialects.postgresql')\n"
        "assert not unneeded & set(sys.modules), unneeded & set(sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], env=work.env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert message in done.stderr
    assert not work.folder.exists()


@pytest.mark.system
def test_server_is_started_once_and_reused(work, tmp_path):
    """``server start`` starts one; two runs use it (same pid, each flow run recorded there);
    a PREFECT_API_URL the user set wins (no server of its own); ``server stop`` ends it."""
    assert work.status() == {"running": False, "folder": str(work.folder), "runners": []}
    started = json.loads(work.cli("server", "start", "--json"))
    assert started["running"] and started["answering"]
    pid, api_url = started["pid"], started["api_url"]
    token = prefect_server.read_state(work.folder).token
    policy, _ = demo.write_demo(tmp_path / "demo", seed=2)
    for _ in range(2):
        summary = json.loads(work.cli("run", str(policy), "--json"))
        assert "prefect_start" not in summary["timings"]  # no server started by the run
        recorded = flow_run(api_url, audit_flow_run(work, summary["run_id"]), token)
        assert recorded.state.type.value == "COMPLETED"
        assert recorded.parameters["policy_path"] == str(policy) and recorded.parameters["production"] is False
    status = work.status()
    assert status["pid"] == pid and status["idle_seconds"] < 60 and status["uptime_seconds"] > 0

    other = Work(tmp_path / "other")  # the user's PREFECT_API_URL: that server, none started
    refused = other.cli("run", str(policy), "--json", expect=2, PREFECT_API_URL=api_url)  # without its auth string
    assert "refused the run (401 Unauthorized): set PREFECT_API_AUTH_STRING" in json.loads(refused)["error"]
    summary = json.loads(
        other.cli("run", str(policy), "--json", PREFECT_API_URL=api_url, PREFECT_API_AUTH_STRING=token)
    )
    assert flow_run(api_url, audit_flow_run(other, summary["run_id"]), token).state.type.value == "COMPLETED"
    assert not other.folder.exists()
    other.cli("server", "start", expect=2, PREFECT_API_URL=api_url)

    deploy = subprocess.run(  # deploy/server.sh does not adopt a server it did not start
        ["bash", str(REPO / "deploy" / "server.sh"), "start"],
        env={**other.env, "PRIVRELEASE_PREFECT_PORT": api_url.split(":")[-1].split("/")[0]},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert deploy.returncode == 1 and "did not start answers at" in deploy.stderr, deploy.stderr

    assert "stopped the Prefect server" in work.cli("server", "stop")
    assert gone(pid, 5) and not work.status()["running"]


@pytest.mark.system
def test_stale_state_is_replaced_and_idle_server_stops(work):
    """A state file naming a dead process is removed and a new server started; a server idle
    for PRIVRELEASE_SERVER_IDLE_SECONDS stops by itself and removes its state file."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    work.folder.mkdir(parents=True)
    stale = prefect_server.ServerState(dead.pid, 9, "http://127.0.0.1:9/api", time.time(), "x", 1800)
    prefect_server._write_state(work.folder, stale)
    started = json.loads(work.cli("server", "start", "--json", PRIVRELEASE_SERVER_IDLE_SECONDS="2"))
    assert started["pid"] != dead.pid and started["answering"]
    assert prefect_server.read_state(work.folder).idle_seconds == 2
    assert gone(started["pid"], 30), "the idle server did not stop"
    assert not (work.folder / prefect_server.STATE_FILE).exists()
    assert "idle for 2 s; stopping" in (work.folder / prefect_server.LOG_FILE).read_text()


def server_processes(folder: Path) -> list[int]:
    """Pids of the privrelease servers whose command line names a folder under ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            words = (entry / "cmdline").read_bytes().split(b"\0")
            if b"privrelease.server" in words and any(str(folder).encode() in word for word in words):
                found.append(int(entry.name))
    return found


@pytest.mark.system
def test_no_server_reuse_leaves_no_process(work, tmp_path):
    """``--no-server-reuse``: a temporary server for the run, gone with it, nothing kept."""
    policy, _ = demo.write_demo(tmp_path / "demo", seed=3)
    summary = json.loads(work.cli("run", str(policy), "--json", "--no-server-reuse"))
    assert summary["timings"]["prefect_start"] > 0
    assert server_processes(work.folder) == []
    assert prefect_server.read_state(work.folder) is None and not list(work.folder.glob("temporary-*"))


def as_account(uid: int, code: str) -> subprocess.CompletedProcess[str]:
    """Python ``code`` run under the account ``uid`` (its group, no others) by ``setpriv``."""
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", sys.executable, "-c", code],
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def other_account() -> int:
    """The uid of another local account (``nobody``) this test can switch to; skip without one."""
    import pwd
    import shutil

    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("switching to another local account needs root and setpriv")
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no 'nobody' account to read as")


def started(pid: int, uid: int) -> None:
    """Wait until process ``pid`` runs as ``uid`` with ``privrelease.server`` in its command line
    (right after ``Popen`` returns, /proc may show an empty one)."""
    deadline = time.monotonic() + 10
    process = Path(f"/proc/{pid}")
    while process.stat().st_uid != uid or b"privrelease.server" not in (process / "cmdline").read_bytes():
        assert time.monotonic() < deadline, f"process {pid} did not start as {uid}"
        time.sleep(0.05)


def test_a_server_of_another_account_is_not_ours(tmp_path):
    """A state file naming another account's process (whose command line names the server) is
    not this account's server: it is neither trusted nor adopted (issue 25, item 21)."""
    uid = other_account()
    sleeper = subprocess.Popen(
        [
            "setpriv",
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            sys.executable,
            "-c",
            "import time; time.sleep(60)",
            "privrelease.server",
        ]  # fmt: skip
    )
    try:
        started(sleeper.pid, uid)
        assert not prefect_server._alive(sleeper.pid)
        folder = tmp_path / "server"
        folder.mkdir()
        state = prefect_server.ServerState(sleeper.pid, 9, "http://127.0.0.1:9/api", time.time(), "x", 1800)
        prefect_server._write_state(folder, state)
        assert prefect_server.find_server(folder) is None and not (folder / prefect_server.STATE_FILE).exists()
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("mode", [0o600, 0o644])
def test_a_server_started_by_an_older_privrelease_is_replaced(tmp_path, monkeypatch, mode):
    """A kept server whose state file other accounts can read was started by a privrelease without
    API authentication: the next run stops it and starts a new one; a private one is used."""
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setattr(prefect_server, "_spawn", lambda *args, **kwargs: "a new server")
    folder = prefect_server.server_folder()
    folder.mkdir(parents=True)
    older = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)", "privrelease.server"], start_new_session=True
    )
    try:
        started(older.pid, os.getuid())
        state = prefect_server.ServerState(older.pid, 9, "http://127.0.0.1:9/api", time.time(), "x", 1800)
        prefect_server._write_state(folder, state)
        (folder / prefect_server.STATE_FILE).chmod(mode)
        found = prefect_server.kept_server()
        if mode == 0o600:
            assert found.state == state and older.poll() is None
        else:
            assert found == "a new server" and older.wait(timeout=20) == -signal.SIGTERM
            assert not (folder / prefect_server.STATE_FILE).exists()
    finally:
        older.kill()
        older.wait()


@pytest.mark.system
def test_kept_server_is_private_to_its_account(tmp_path):
    """Another local account (``nobody``, under ``setpriv``) can reach the work folder and the
    server's port, but reads none of the server's state (its token), the audit database or the
    run records, and the API refuses it: listing flow runs, creating a deployment (401); only
    ``/api/health`` answers. The runner's auth string is accepted (issue 25, item 21)."""
    import base64
    import tempfile
    import urllib.error
    import urllib.request

    uid = other_account()
    root = Path(tempfile.mkdtemp(prefix="privrelease-private-"))  # pytest's tmp_path is 0700: nobody gets in
    work = Work(root)
    try:
        root.chmod(0o755)
        (root / "work").mkdir(mode=0o755)
        (root / "work" / "public.txt").write_text("readable\n")
        (root / "work" / "public.txt").chmod(0o644)
        policy, _ = demo.write_demo(tmp_path / "demo", seed=3, rows=2000)
        summary = json.loads(work.cli("run", str(policy), "--json"))
        folder, state = work.folder, prefect_server.read_state(work.folder)
        database, runs = root / "work" / "audit.db", root / "work" / "runs"
        assert state is not None and database.is_file() and (runs / f"{summary['run_id']}.json").is_file()
        modes = {path.name: path.stat().st_mode & 0o777 for path in (folder, runs, database)}
        modes.update({path.name: path.stat().st_mode & 0o777 for path in (*runs.iterdir(), *folder.iterdir())})
        assert modes[folder.name] == modes[runs.name] == 0o700 and modes[database.name] == 0o600, modes
        for name in (prefect_server.STATE_FILE, prefect_server.LOG_FILE, f"{summary['run_id']}.json"):
            assert modes[name] == 0o600, (name, modes)

        probe = f"""
import json, urllib.error, urllib.request
def attempt(action):
    try:
        return action()
    except PermissionError:
        return "denied"
    except urllib.error.HTTPError as error:
        return error.code
def call(path, body=None):
    request = urllib.request.Request({state.api_url!r} + path, data=body, headers={{"Content-Type": "application/json"}})
    with urllib.request.urlopen(request, timeout=10) as answer:
        return answer.status
print(json.dumps({{
    "public": attempt(lambda: open({str(root / "work" / "public.txt")!r}).read()),
    "state": attempt(lambda: open({str(folder / prefect_server.STATE_FILE)!r}).read()),
    "database": attempt(lambda: open({str(database)!r}, "rb").read(16).decode("latin-1")),
    "runs": attempt(lambda: __import__("os").listdir({str(runs)!r})),
    "health": attempt(lambda: call("/health")),
    "flow_runs": attempt(lambda: call("/flow_runs/filter", b"{{}}")),
    "deployments": attempt(lambda: call("/deployments/", b'{{"name": "x", "flow_id": "00000000-0000-0000-0000-000000000000"}}')),
}}))
"""
        done = as_account(uid, probe)
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert seen["public"] == "readable\n" and seen["health"] == 200, seen  # it reaches the folder and the port
        assert seen["state"] == seen["database"] == seen["runs"] == "denied", seen
        assert seen["flow_runs"] == seen["deployments"] == 401, seen

        identity = state.api_url.removesuffix("/api") + prefect_server.IDENTITY_PATH + "?nonce=n"
        with urllib.request.urlopen(identity, timeout=10) as answer:
            assert state.token not in answer.read().decode()  # the identity check does not hand out the token
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(urllib.request.Request(state.api_url + "/flow_runs/filter", data=b"{}"), timeout=10)
        assert refused.value.code == 401
        authorization = "Basic " + base64.b64encode(state.token.encode()).decode()
        request = urllib.request.Request(
            state.api_url + "/flow_runs/filter",
            data=b"{}",
            headers={"Content-Type": "application/json", "Authorization": authorization},
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            listed = json.loads(answer.read())
        assert audit_flow_run(work, summary["run_id"]) in {run["id"] for run in listed}
    finally:
        work.kill_all()
        import shutil

        shutil.rmtree(root, ignore_errors=True)
