"""The runner kept in the work folder (privrelease/resident.py): ``privrelease run`` and ``rerun``
forwarded to a process that has imported Prefect and the mechanisms, through the command line in
subprocesses, each test in its own work folder; every runner a test starts is stopped at its end."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from privrelease import demo, resident

ON_RUNNER = "on the runner kept in the work folder"


class Commands:
    """``privrelease`` commands in subprocesses with one environment (runners kept: server reuse
    on, runs recorded on the test harness's Prefect API)."""

    def __init__(self, env: dict[str, str], cwd: Path, work: Path) -> None:
        self.env, self.cwd, self.work = env, cwd, work

    def __call__(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "privrelease", *args],
            capture_output=True,
            text=True,
            env=env or self.env,
            cwd=self.cwd,
            timeout=300,
        )

    @property
    def folder(self) -> Path:
        return self.work / resident.FOLDER

    def states(self) -> list[resident.RunnerState]:
        found = [resident._read_state(self.folder, path.stem) for path in sorted(self.folder.glob("*.json"))]
        return [state for state in found if state is not None]

    def wait_for_runners(self, count: int) -> list[resident.RunnerState]:
        """The runners' states once ``count`` of them serve (their imports take a few seconds)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            states = self.states()
            if len(states) >= count and all(Path(state.socket).exists() for state in states):
                return states
            time.sleep(0.2)
        raise AssertionError(f"{count} runner(s) expected in {self.folder}: {list(self.folder.glob('*'))}")


@pytest.fixture
def commands(prefect_harness: str, work: Path, tmp_path: Path) -> Iterator[Commands]:
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_harness,
        "PREFECT_HOME": str(tmp_path / "prefect-home"),
        "PRIVRELEASE_SERVER_REUSE": "true",
        "PRIVRELEASE_WORK_DIR": str(work),
    }
    found = Commands(env, tmp_path, work)
    try:
        yield found
    finally:
        resident.stop_runners(work, grace=10.0)


def test_a_run_leaves_a_runner_that_runs_the_next_runs_as_their_own_process_would(
    commands: Commands, demo_dir: Path
) -> None:
    """The first run runs in its own process and leaves a runner (folder 0700, socket 0600); the
    next runs go to it: released, their outputs drawn afresh (each child draws its own
    randomness), a refusal with the same line and exit code as in the command's own process, a
    relative path read from the command's folder; ``server stop`` stops the runner."""
    policy = demo_dir / demo.POLICY_FILE
    first = commands("run", str(policy), "--json")
    assert first.returncode == 0, first.stderr
    assert ON_RUNNER not in first.stderr
    (state,) = commands.wait_for_runners(1)
    assert commands.folder.stat().st_mode & 0o777 == 0o700
    assert Path(state.socket).stat().st_mode & 0o777 == 0o600

    outputs = []
    for _ in range(2):
        done = commands("run", os.path.relpath(policy, commands.cwd), "--json")
        assert done.returncode == 0, done.stderr
        assert ON_RUNNER in done.stderr
        outputs.append({output["sha256"] for output in json.loads(done.stdout)["outputs"]})
    assert outputs[0].isdisjoint(outputs[1])

    on_runner = commands("run", str(policy), "--format", "xml")
    own = commands("run", str(policy), "--format", "xml", "--no-server-reuse")
    assert on_runner.returncode == own.returncode == 2
    assert on_runner.stderr == own.stderr
    assert "error: --format must be parquet or csv; got 'xml'" in on_runner.stderr
    assert commands.states() == [state]  # no second runner: the one there serves this kind

    stopped = commands("server", "stop", "--json")
    assert json.loads(stopped.stdout)["runners"] == [state.pid]
    assert not resident._alive(state.pid) and commands.states() == []


def test_a_command_of_another_kind_or_after_a_code_change_runs_in_its_own_process(
    commands: Commands, demo_dir: Path
) -> None:
    """Another environment is another kind of process: it runs in its own process and leaves a
    runner of its kind; a module file the runner imported that changed since (here: its
    recorded mtime made stale) sends the command to its own process too; the runner itself
    refuses a request whose environment is not of its kind."""
    policy = str(demo_dir / demo.POLICY_FILE)
    assert commands("run", policy).returncode == 0
    (state,) = commands.wait_for_runners(1)

    other = {**commands.env, "PRIVRELEASE_TEST_KIND": "other"}
    done = commands("run", policy, env=other)
    assert done.returncode == 0, done.stderr
    assert ON_RUNNER not in done.stderr
    assert len(commands.wait_for_runners(2)) == 2

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as connection:
        resident._connect(connection, Path(state.socket))
        socket.send_fds(connection, [b"R"], [0, 1, 2])
        request = {"argv": ["privrelease", "run", policy], "cwd": str(commands.cwd), "path0": None, "umask": 0o22}
        request["environ"] = {**commands.env, "PRIVRELEASE_TEST_KIND": "third"}
        connection.sendall(json.dumps(request).encode() + b"\n")
        assert "refused" in json.loads(connection.makefile("rb").readline())

    (path,) = [path for path in commands.folder.glob("*.json") if json.loads(path.read_text())["pid"] == state.pid]
    recorded = json.loads(path.read_text())
    module = next(name for name in recorded["code"] if name.endswith("resident.py"))
    recorded["code"][module][1] += 1
    path.write_text(json.dumps(recorded))
    done = commands("run", policy)
    assert done.returncode == 0, done.stderr
    assert ON_RUNNER not in done.stderr
    assert not resident._alive(state.pid)  # a runner whose code changed is stopped by the next command


def test_the_command_passes_its_signals_to_the_child_and_exits_with_its_code() -> None:
    """Ctrl-C (here SIGTERM) sent to the command reaches the child running it; the command exits
    with the child's code (the runner's side played by a thread)."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import signal, sys, time\nsignal.signal(15, lambda *a: sys.exit(7))\ntime.sleep(60)"]
    )
    ours, runner = socket.socketpair()

    def play_runner() -> None:
        time.sleep(0.5)  # the child's handler is set
        runner.sendall(json.dumps({"pid": child.pid}).encode() + b"\n")
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGTERM)  # what the command gets
        child.wait(timeout=30)
        runner.sendall(json.dumps({"status": child.returncode << 8}).encode() + b"\n")
        runner.close()

    player = threading.Thread(target=play_runner)
    player.start()
    try:
        state = resident.RunnerState(pid=0, socket="", started=0.0, code={})
        assert resident._await(ours, state) == 7
    finally:
        player.join()
        ours.close()
        if child.poll() is None:
            child.kill()


def start_runner(folder: Path, kind: str, idle: float) -> tuple[subprocess.Popen[bytes], str]:
    """A runner of its own kind (an environment no command has) serving ``folder``, idle for at
    most ``idle`` seconds; its process and identity."""
    folder.mkdir(mode=0o700)
    env = {**os.environ, "PRIVRELEASE_TEST_KIND": kind}
    key = subprocess.run(
        [sys.executable, "-c", "import os; from privrelease import resident; print(resident.identity(os.environ))"],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    ).stdout.strip()
    return subprocess.Popen(
        [sys.executable, "-m", resident.ENTRY, str(folder), key, f"{idle:g}"], env=env, cwd=folder
    ), key


def test_an_idle_runner_exits_by_itself(tmp_path: Path) -> None:
    """A runner with nothing to do for its idle time exits and removes its socket and state."""
    folder = tmp_path / "runner"
    process, _ = start_runner(folder, "idle", 1)
    try:
        assert process.wait(timeout=120) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert list(folder.glob("*.json")) == [] and list(folder.glob("*.sock")) == []


@pytest.mark.parametrize("change", ["removed", "replaced"])
def test_a_runner_whose_state_file_is_removed_or_replaced_stops(tmp_path: Path, change: str) -> None:
    """A runner stops within its look period when its state file goes, or is replaced by
    another process's (even with the same text); it leaves a replacement where it is."""
    folder = tmp_path / "runner"
    process, key = start_runner(folder, f"state-{change}", 600)
    try:
        state_file = folder / f"{key}.json"
        deadline = time.monotonic() + 120
        while not (state_file.exists() and (folder / f"{key}.sock").exists()) and time.monotonic() < deadline:
            time.sleep(0.1)
        text = state_file.read_text()
        if change == "removed":
            state_file.unlink()
        else:
            (folder / "other.json").write_text(text)
            os.replace(folder / "other.json", state_file)
        assert process.wait(timeout=resident.PERIOD + 10) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert [path.read_text() for path in folder.glob("*.json")] == ([] if change == "removed" else [text])


def test_a_peer_of_another_account_is_refused() -> None:
    """A runner takes nothing from another account's process, even where the folder and socket
    modes would let it connect (``SO_PEERCRED``): it closes the connection unread."""
    from test_server import other_account

    uid = other_account()
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 for the other account to run")
    folder = Path(tempfile.mkdtemp(prefix="privrelease-peer-"))
    try:
        os.chmod(folder, 0o755)
        path = folder / "runner.sock"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(path))
            os.chmod(path, 0o777)
            listener.listen(1)
            code = (
                f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({str(path)!r})\n"
                "try:\n    s.sendall(b'R')\n    print(repr(s.recv(100)))\n"
                "except (BrokenPipeError, ConnectionResetError):\n    print(repr(b''))"
            )
            peer = subprocess.Popen(
                ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", python, "-c", code],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert resident._take(listener, "any kind") is None
            out, err = peer.communicate(timeout=60)
        assert peer.returncode == 0, err
        assert out.strip() == "b''"  # closed (or reset) without an answer
    finally:
        shutil.rmtree(folder, ignore_errors=True)


STARTING_RUNNER = """
import fcntl, json, os, sys, time
folder, key = sys.argv[1], sys.argv[2]
lock = open(os.path.join(folder, key + ".lock"), "a")
fcntl.flock(lock, fcntl.LOCK_EX)
time.sleep(1.5)  # a runner's imports, before it writes its state file
state = {"pid": os.getpid(), "socket": os.path.join(folder, key + ".sock"), "started": time.time(), "code": {}}
with open(os.path.join(folder, key + ".json"), "w") as handle:
    json.dump(state, handle)
time.sleep(60)
"""


@pytest.mark.parametrize("left", [False, True], ids=["no-state-file", "a-dead-runner-s-state-file"])
def test_server_stop_waits_for_a_runner_still_importing_and_stops_it(tmp_path: Path, left: bool) -> None:
    """A runner a command has just left (``keep``) holds its lock while it imports and writes
    its state file only then: ``stop_runners`` (``server stop``) waits for it and stops it,
    instead of missing it and leaving it to serve until idle (audit 9: a ``run`` then one
    ``server stop`` left one such runner in 13 of 13 work folders). So too where the state file
    there names a dead runner (one that stopped after its state file was replaced, leaving it:
    the clean-clone suite left a runner so)."""
    folder = tmp_path / resident.FOLDER
    folder.mkdir()
    key = "k" * 32
    if left:
        dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
        state = {"pid": int(dead.stdout), "socket": str(folder / f"{key}.sock"), "started": 0.0, "code": {}}
        (folder / f"{key}.json").write_text(json.dumps(state))
    # its command line names the runner's module, as resident._alive requires
    starting = subprocess.Popen([sys.executable, "-c", STARTING_RUNNER, str(folder), key, resident.ENTRY])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # until it holds the lock
            with resident._held(folder, key) as free:
                if not free:
                    break
            time.sleep(0.05)
        assert (folder / f"{key}.json").exists() == left
        assert resident.stop_runners(tmp_path, grace=10.0) == [starting.pid]
        assert starting.wait(timeout=15) != 0  # terminated by the signal, not by its own end
    finally:
        starting.kill()
