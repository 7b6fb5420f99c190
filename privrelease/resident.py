"""The runner kept in the work folder: ``privrelease run`` and ``rerun`` without importing
Prefect, the accounting and the mechanisms each time.

Most of a warm run is imports (``adult-sdgs.yaml`` on 2 cores: about 1.8 s of 3.1 s). So, as
the Prefect server is kept (:mod:`privrelease.server`), a run leaves behind a runner: a process
of this account that has imported them (:mod:`privrelease.cli.runner`) and waits on a Unix socket. A later
``run``/``rerun`` (:func:`forward`) hands it the command line, working folder, environment,
umask and standard streams; the runner forks a child that runs the command exactly as the
command's own process would (:func:`privrelease.cli.main`: the same checks, output, files and
exit code; :func:`become`) and reports the child's exit status; a signal the command gets
(Ctrl-C) is passed on to the child.

A runner serves only a command whose own process would have been the same as the runner's
(:func:`identity`): the same Python, flags, module path, account (uid, gid, groups), resource
limits and environment (but for the few variables a shell changes, :data:`VOLATILE`), and only
while every module it imported and every folder of its module path is unchanged on disk (size
and mtime, checked by the command: installing or removing a package, a plugin too, changes its
folder).
Anything else runs in its own process, as without a runner, and leaves a runner of its own
kind (:func:`keep`). A runner exits after ``PRIVRELEASE_SERVER_IDLE_SECONDS`` without a command,
when its state file goes, or at ``privrelease server stop`` (once its commands have ended); with
``--no-server-reuse``, ``PRIVRELEASE_SERVER_REUSE=false`` or ``PRIVRELEASE_RUNNER=false`` none
is used or kept.

Private to the account: folder ``<work_dir>/runner`` is ``0700``, the socket ``0600``, and a
peer of another uid is refused (``SO_PEERCRED``). Fork safety: the runner forks with no thread
but its main one (checked before it serves), no database, file or network connection open, and
no random state: every draw comes from the OS when it is drawn
(:mod:`privrelease.mechanisms.randomness`, OpenDP), and Python's ``random`` reseeds in a child.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import gc
import hashlib
import json
import os
import resource
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TextIO, cast

COMMANDS = ("run", "rerun")
ENTRY = "privrelease.cli.runner"
"""The runner's module (``python -m privrelease.cli.runner``), whose children run the command line."""
FOLDER = "runner"
VOLATILE = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES"})
"""Variables a shell sets by itself, which nothing reads at import: a runner ignores them when
it compares environments (its child still runs with the command's own)."""
LIMITS = (
    resource.RLIMIT_AS,
    resource.RLIMIT_CORE,
    resource.RLIMIT_CPU,
    resource.RLIMIT_DATA,
    resource.RLIMIT_FSIZE,
    resource.RLIMIT_NOFILE,
    resource.RLIMIT_STACK,
)
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
PERIOD = 5.0
"""The most seconds between a runner's looks at its idle time and its state file."""

_started: tuple[Path, str, dict[str, str]] | None = None
"""This command's runner folder, identity and environment as it started (set by :func:`forward`)."""
_in_runner = False
"""True in a runner's child: its command leaves no runner of its own."""


def identity(environ: Mapping[str, str]) -> str:
    """What a process running a command with ``environ`` has that decides what its imports
    do, hashed: this interpreter (path, version, flags, module path after the script's folder),
    account, resource limits and ``environ`` but :data:`VOLATILE`."""
    facts = [
        sys.executable,
        sys.version,
        list(sys.flags),
        sys.path[0 if sys.flags.safe_path else 1 :],
        [os.getuid(), os.getgid(), sorted(os.getgroups())],
        [resource.getrlimit(limit) for limit in LIMITS],
        sorted((name, value) for name, value in environ.items() if name not in VOLATILE),
    ]
    return hashlib.sha256(json.dumps(facts).encode()).hexdigest()[:32]


@dataclass(frozen=True)
class RunnerState:
    """What a runner records in ``<identity>.json``: its pid, socket, and the size and mtime of
    every module file it imported."""

    pid: int
    socket: str
    started: float
    code: dict[str, list[int]]


def _read_state(folder: Path, key: str) -> RunnerState | None:
    try:
        return RunnerState(**json.loads((folder / f"{key}.json").read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """The file at ``path`` as its inode, mtime and size (None: none there): a runner's state
    file replaced or removed by another process no longer has the stamp its runner wrote."""
    try:
        found = os.stat(path)
    except OSError:
        return None
    return found.st_ino, found.st_mtime_ns, found.st_size


def _unchanged(code: Mapping[str, list[int]]) -> bool:
    """Whether every module file a runner imported is as it was then."""
    for path, (size, mtime) in code.items():
        try:
            found = os.stat(path)
        except OSError:
            return False
        if found.st_size != size or found.st_mtime_ns != mtime:
            return False
    return True


def _loaded_code() -> dict[str, list[int]]:
    """Size and mtime of the file of every module this process has imported, and of every
    folder on its module path (installing or removing a package, a plugin too, changes its
    folder's mtime)."""
    paths = [getattr(module, "__file__", None) for module in list(sys.modules.values())]
    code = {}
    for path in [*paths, *sys.path[0 if sys.flags.safe_path else 1 :]]:
        if isinstance(path, str) and path:
            with contextlib.suppress(OSError):
                found = os.stat(path)
                code[path] = [found.st_size, found.st_mtime_ns]
    return code


# --------------------------------------------------------------------------- the command's side


def forward(argv: list[str]) -> int | None:
    """Run the command ``argv`` on this account's runner when one serves its kind: the exit
    code it ended with. None: run it in this process (not ``run``/``rerun``, no server reuse,
    no runner of this kind, or it could not take the command)."""
    global _started
    if _in_runner or len(argv) < 2 or argv[1] not in COMMANDS or "--no-server-reuse" in argv:
        return None
    try:
        from privrelease.settings import get_settings

        settings = get_settings()
    except Exception:
        return None  # the command reports a malformed setting itself
    if not (settings.server_reuse and settings.runner):
        return None
    folder, key = settings.work_dir / FOLDER, identity(os.environ)
    _started = (folder, key, dict(os.environ))
    state = _read_state(folder, key)
    if state is None or not _unchanged(state.code):
        return None
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    with connection:
        request = {
            "argv": argv,
            "cwd": os.getcwd(),
            "path0": None if sys.flags.safe_path else sys.path[0],
            "umask": _umask(),
            "environ": dict(os.environ),
        }
        try:
            _connect(connection, Path(state.socket))
            socket.send_fds(connection, [b"R"], [0, 1, 2])
            connection.sendall(json.dumps(request).encode() + b"\n")
        except OSError:
            return None  # no runner listens, or a standard stream is closed
        return _await(connection, state)


def _connect(connection: socket.socket, path: Path) -> None:
    """Connect to the socket at ``path`` by its name from its folder (a socket's path is
    limited to 107 bytes; a work folder's may be longer)."""
    here = os.open(".", os.O_PATH)
    try:
        os.chdir(path.parent)
        connection.connect(path.name)
    finally:
        os.fchdir(here)
        os.close(here)


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _await(connection: socket.socket, state: RunnerState) -> int | None:
    """The command's exit code as the runner reports it, passing :data:`FORWARDED` signals on
    to its child meanwhile; a child killed by a signal ends this process by the same signal."""
    child: list[int] = []
    pending: list[int] = []

    def relay(signum: int, _frame: Any) -> None:
        if child:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child[0], signum)
        else:
            pending.append(signum)

    previous = {signum: signal.signal(signum, relay) for signum in FORWARDED}
    try:
        for line in connection.makefile("rb"):
            message = json.loads(line)
            if "refused" in message:
                return None
            if "pid" in message:
                child.append(int(message["pid"]))
                for signum in pending:
                    relay(signum, None)
            elif "status" in message:
                code = os.waitstatus_to_exitcode(int(message["status"]))
                if code < 0:  # as a shell sees a process killed by a signal
                    signal.signal(-code, signal.SIG_DFL)
                    os.kill(os.getpid(), -code)
                    return 128 - code
                return code
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    from privrelease.errors import TargetNotMet

    raise TargetNotMet(
        f"the runner kept in the work folder (pid {state.pid}) ended before the command did "
        f"(pid {child[0] if child else 'unknown'}): its outcome is in the audit database (privrelease audit log)"
    )


def keep() -> None:
    """Leave a runner for this command's kind (:func:`identity`) when none serves it, started
    in the background (it imports for a few seconds); not from a runner's child."""
    if _in_runner or _started is None:
        return
    folder, key, environ = _started
    state = _read_state(folder, key)
    if state is not None and _alive(state.pid):
        if _unchanged(state.code):
            return
        with contextlib.suppress(ProcessLookupError):  # its code changed: it stops once its commands end
            os.kill(state.pid, signal.SIGTERM)
    from privrelease.files import private_folder
    from privrelease.server import start_logged
    from privrelease.settings import get_settings

    private_folder(folder)
    with _held(folder, key) as free:
        if not free:
            return  # one is starting
    command = [sys.executable, *_interpreter_flags(), "-m", ENTRY, str(folder), key]
    start_logged([*command, str(get_settings().server_idle_seconds)], environ, folder / f"{key}.log", detached=True)


def _interpreter_flags() -> list[str]:
    """This interpreter's command-line flags (``-O``, ``-X ...``), for a runner of its kind."""
    return list(subprocess._args_from_interpreter_flags())  # type: ignore[attr-defined]


@contextlib.contextmanager
def _held(folder: Path, key: str) -> Any:
    """The runner lock of ``key``, taken if free: yields whether it was (a runner holds it for
    its life)."""
    handle = open(folder / f"{key}.lock", "a")  # noqa: SIM115  (closed below)
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        handle.close()


def _alive(pid: int) -> bool:
    """True when ``pid`` runs a runner of this account (:func:`.server.runs_ours`)."""
    from privrelease.server import runs_ours

    return runs_ours(pid, ENTRY)


def stop_runners(work_dir: Path, grace: float = 15.0) -> list[int]:
    """Stop every runner kept in ``work_dir`` (``privrelease server stop``): SIGTERM (it stops
    taking commands and exits once they have ended), SIGKILL after ``grace`` seconds (its
    commands run on); their pids. A runner still importing (its lock held, no state file yet:
    one a command just left, :func:`keep`) is waited for, up to ``grace`` seconds, and stopped
    too."""
    from privrelease.server import terminate

    folder = work_dir / FOLDER
    if folder.is_dir():
        _await_starting(folder, grace)
    stopped = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        state = _read_state(folder, path.stem)
        if state is not None and _alive(state.pid):
            terminate(state.pid, group=False, grace=grace)
            stopped.append(state.pid)
        path.unlink(missing_ok=True)
    return stopped


def _await_starting(folder: Path, grace: float) -> None:
    """Until every runner whose lock is held has written its state file, or ``grace`` seconds.
    A state file naming a dead process is not the starting runner's (a runner that stopped
    after its state file was replaced, or was killed, leaves its own: the next runner of its
    kind, importing, has not written one yet)."""
    deadline = time.monotonic() + grace
    for lock in sorted(folder.glob("*.lock")):
        while time.monotonic() < deadline:
            state = _read_state(folder, lock.stem)
            if state is not None and _alive(state.pid):
                break  # serving (or starting and written)
            with _held(folder, lock.stem) as free:
                if free:
                    break  # none is starting
            time.sleep(0.1)


def runners(work_dir: Path) -> list[int]:
    """The pids of the runners kept in ``work_dir``."""
    folder = work_dir / FOLDER
    states = [_read_state(folder, path.stem) for path in folder.glob("*.json")] if folder.is_dir() else []
    return sorted(state.pid for state in states if state is not None and _alive(state.pid))


def in_runner() -> bool:
    """Whether this process is a runner's child running a command."""
    return _in_runner


# --------------------------------------------------------------------------- the runner


@dataclass
class Request:
    """A command a runner took: its command line, folder, module path, umask, environment and
    standard streams (descriptors received from the command)."""

    argv: list[str]
    cwd: str
    path0: str | None
    umask: int
    environ: dict[str, str]
    streams: list[int]


def serve(folder: Path, key: str, idle: float, prepare: Callable[[], None]) -> Request | None:
    """``prepare()`` (import what a command runs), then take commands on ``<key>.sock`` until idle for ``idle``
    seconds, SIGTERM (after the running commands end) or the state file is gone. Returns in a
    child, with the command it is to run; None in the runner when it ends."""
    if identity(os.environ) != key:
        print(f"privrelease runner: this process is not of kind {key}; not serving", flush=True)
        return None
    with _held(folder, key) as free:
        if not free:
            return None
        prepare()
        gc.freeze()  # the imported objects stay out of the children's collections: their pages stay shared
        if threading.active_count() != 1:
            print(f"privrelease runner: {threading.active_count()} threads after the imports; not serving", flush=True)
            return None
        return _serve(folder, key, idle)


def _serve(folder: Path, key: str, idle: float) -> Request | None:
    runner = os.getpid()
    path = folder / f"{key}.sock"
    path.unlink(missing_ok=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    os.chdir(folder)
    listener.bind(path.name)  # relative: a socket's path is limited to 107 bytes
    os.chmod(path, 0o600)
    listener.listen(16)
    from privrelease.files import write_atomic

    state = RunnerState(runner, str(path), time.time(), _loaded_code())
    state_file = folder / f"{key}.json"
    write_atomic(state_file, json.dumps(state.__dict__), durable=False, mode=0o600)
    written = _stamp(state_file)  # checked every PERIOD: a stat, not a parse of the module list
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    stopping: list[bool] = []
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    commands: dict[int, socket.socket] = {}  # child pid -> its command's connection
    last = time.monotonic()
    print(f"privrelease runner {runner}: serving {path}", flush=True)
    try:
        while True:
            watched: list[Any] = [wake_read, *commands.values(), *([] if stopping else [listener])]
            ready, _, _ = select.select(watched, [], [], min(PERIOD, max(idle / 4, 0.2)))
            if wake_read in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, 512)
                _reap(commands)
            for pid, connection in list(commands.items()):
                if connection in ready:  # the command's process went: as its terminal hanging up would
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGHUP)
            if listener in ready and not stopping:
                taken = _take(listener, key)
                if taken is not None:
                    connection, request = taken
                    sys.stdout.flush()
                    pid = os.fork()
                    if pid == 0:
                        _leave(request, [listener, *commands.values(), connection], (wake_read, wake_write))
                        return request
                    for descriptor in request.streams:
                        os.close(descriptor)
                    with contextlib.suppress(OSError):
                        connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                    commands[pid] = connection
            if commands:
                last = time.monotonic()
            elif stopping:
                print(f"privrelease runner {runner}: stopped", flush=True)
                return None
            elif time.monotonic() - last > idle:
                print(f"privrelease runner {runner}: idle for {idle:g} s; stopping", flush=True)
                return None
            elif not ready and _stamp(state_file) != written:
                print(f"privrelease runner {runner}: its state file no longer names it; stopping", flush=True)
                stopping.append(True)
    finally:
        if os.getpid() == runner:
            listener.close()
            if _stamp(state_file) == written:
                state_file.unlink(missing_ok=True)
                path.unlink(missing_ok=True)


def _reap(commands: dict[int, socket.socket]) -> None:
    """Collect every ended child and send its wait status to its command."""
    while commands:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = commands.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError):
                connection.sendall(json.dumps({"status": status}).encode() + b"\n")
            connection.close()


def _take(listener: socket.socket, key: str) -> tuple[socket.socket, Request] | None:
    """Accept a command: its connection and request, when its peer is this account and its
    environment of this runner's kind; else it is told (``refused``: it runs in its own process)."""
    connection, _ = listener.accept()
    streams: list[int] = []
    try:
        connection.settimeout(5.0)
        _, uid, _ = struct.unpack("3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
        if uid != os.getuid():
            connection.close()
            return None
        _, streams, _, _ = socket.recv_fds(connection, 1, 3)
        with connection.makefile("rb") as reader:
            message = json.loads(reader.readline(1 << 20))
        request = Request(streams=streams, **message)
        if len(streams) != 3 or identity(request.environ) != key:
            raise ValueError("not of this runner's kind")
        connection.settimeout(None)
        return connection, request
    except (OSError, ValueError, TypeError) as error:
        for descriptor in streams:
            os.close(descriptor)
        with contextlib.suppress(OSError):
            connection.sendall(json.dumps({"refused": str(error)}).encode() + b"\n")
        connection.close()
        return None


def _leave(request: Request, sockets: list[socket.socket], pipe: tuple[int, int]) -> None:
    """In the child: drop the runner's signal handlers, sockets and pipe."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    for each in sockets:
        each.close()
    for descriptor in pipe:
        os.close(descriptor)


def become(request: Request) -> None:
    """Make this child the command's process: its standard streams, folder, umask, environment,
    command line and module path (the caller sets up what it made of them at import: the
    command line's consoles)."""
    global _in_runner
    for target, descriptor in enumerate(request.streams):
        if descriptor != target:
            os.dup2(descriptor, target)
            os.close(descriptor)
    os.chdir(request.cwd)
    os.umask(request.umask)
    os.environ.clear()
    os.environ.update(request.environ)
    sys.argv = list(request.argv)
    if request.path0 is not None:
        sys.path[0] = request.path0
    for descriptor, name in enumerate(("stdin", "stdout", "stderr")):
        stream = _standard_stream(descriptor, getattr(sys, name))
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    _in_runner = True


def _standard_stream(descriptor: int, was: TextIO) -> TextIO:
    """A text stream on ``descriptor`` as Python makes one at start: stderr and a terminal
    line-buffered, the encoding and error handler of the same environment (``was``)."""
    mode = "r" if descriptor == 0 else "w"
    buffering = 1 if descriptor == 2 or (mode == "w" and os.isatty(descriptor)) else -1
    stream = open(descriptor, mode, buffering, encoding=was.encoding, errors=was.errors, closefd=False)  # noqa: SIM115
    return cast(TextIO, stream)


def end(code: int | str | None) -> NoReturn:
    """End a runner's child as Python ends a process, less the teardown of every module the
    runner imported (most of a short command's time, its pages copied from the runner's): the
    non-daemon threads joined, the exit functions run, the streams flushed; ``code`` as
    :class:`SystemExit` takes it."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code or 0)
