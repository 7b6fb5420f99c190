"""A throwaway PostgreSQL server for the test session (loaded by ``tests/conftest.py``).

The PostgreSQL variants of the audit tests run against the maintenance database named by
``PRIVRELEASE_TEST_POSTGRES_URL``. When that variable is not set and the server binaries exist
(``initdb``/``pg_ctl``/``postgres`` on ``PATH``, else the newest ``/usr/lib/postgresql/*/bin`` of
the Debian package), :func:`configure` creates a cluster in a temporary directory, starts it on
``127.0.0.1`` and a free port (trust authentication, Unix socket inside the temporary directory,
fsync off), and exports ``PRIVRELEASE_TEST_POSTGRES_URL=postgresql+psycopg://postgres@127.0.0.1:PORT/postgres``
before any test module is imported, so tests and their subprocesses see it. initdb and ``pg_ctl -w
start`` run in a background thread while pytest collects the tests (collecting takes longer than
starting), and the tests wait for the server after collection. As root (CI), initdb and pg_ctl run as
the ``postgres`` OS user through ``runuser``. A cluster the Debian package may have
started on port 5432 is neither used nor touched.

Under pytest-xdist (``make test`` runs ``-n 2``) the controller process starts the one server as
above and its workers share it (each test makes databases with unique names): the workers inherit
the URL and ``PRIVRELEASE_TEST_POSTGRES_STATUS``, the file the controller's start thread writes
``ready <port> <version>`` or ``failed <reason>`` to, and each worker waits for that file after
collecting (the controller collects nothing, so it never reaches that point itself).

Without the binaries nothing starts and the PostgreSQL tests skip; ``PRIVRELEASE_TEST_NO_POSTGRES=1``
does the same on a machine that has them. Either way one line at the end of the test summary says
which server the PostgreSQL tests used, or why they skip.

Stopping (``pg_ctl -m immediate stop``, then the directory removed) is done by a watchdog process
started with the cluster: it acts when the test process tells it to, at exit (``atexit``; registered
before any test runs, so it runs after the tests' own ``atexit`` clean-ups, which still drop their
template databases on this server), and also when the test process dies without running ``atexit``
(SIGKILL, SIGTERM, ``os._exit``): its end of the pipe then reads EOF. Stdlib only: the watchdog runs
this file as a script.
"""

from __future__ import annotations

import atexit
import contextlib
import glob
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

URL_ENV = "PRIVRELEASE_TEST_POSTGRES_URL"
OFF_ENV = "PRIVRELEASE_TEST_NO_POSTGRES"
STATUS_ENV = "PRIVRELEASE_TEST_POSTGRES_STATUS"
"""Set by the process that started the server for its pytest-xdist workers: the status file's path."""
STATUS_FILE = "status"
WORKER_WAIT_SECONDS = 300  # initdb and pg_ctl's own timeouts are 120 s and 60 s (three attempts)
DEBIAN_BINDIRS = "/usr/lib/postgresql/*/bin"
TOOLS = ("initdb", "pg_ctl", "postgres")
OS_USER = "postgres"  # initdb refuses to run as root
# Outside the kernel's ephemeral range (32768-60999 on Linux), so outgoing connections cannot take
# the port between the probe and the server binding it.
PORTS = range(20000, 32000)
SETTINGS = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
}


class Unavailable(Exception):
    """No server can be started here; the message is the reason the PostgreSQL tests skip."""


def find_bindir(path: str | None = None, debian_glob: str | None = None) -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``: the one ``initdb`` on ``path``
    (default ``$PATH``) resolves to, else the newest version under ``debian_glob`` (default
    :data:`DEBIAN_BINDIRS`)."""
    debian_glob = debian_glob or DEBIAN_BINDIRS
    if os.environ.get(OFF_ENV, "") not in ("", "0"):
        raise Unavailable(f"{OFF_ENV} is set")
    found = shutil.which("initdb", path=path)
    if found and _complete(Path(found).resolve().parent):
        return Path(found).resolve().parent
    candidates = [Path(d) for d in glob.glob(debian_glob) if _complete(Path(d))]
    if candidates:
        return max(candidates, key=lambda d: _version_key(d.parent.name))
    raise Unavailable(
        f"no PostgreSQL server binaries ({', '.join(TOOLS)}) on PATH or in {debian_glob}; "
        f"install them (Debian: apt-get install postgresql) or set {URL_ENV}"
    )


def _complete(bindir: Path) -> bool:
    return all(os.access(bindir / tool, os.X_OK) for tool in TOOLS)


def _version_key(name: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else -1 for part in name.split("."))


def _as_postgres_user() -> tuple[list[str], tuple[int, int] | None]:
    """Command prefix and (uid, gid) to run the server tools as: the caller, or ``postgres`` as root."""
    if os.geteuid() != 0:
        return [], None
    import pwd

    try:
        user = pwd.getpwnam(OS_USER)
    except KeyError:
        raise Unavailable(f"running as root and there is no {OS_USER!r} OS user to run initdb as") from None
    runuser = shutil.which("runuser") or shutil.which("runuser", path="/usr/sbin:/sbin")
    if runuser is None:
        raise Unavailable("running as root and runuser (util-linux) is missing: cannot run initdb as postgres")
    return [runuser, "-u", OS_USER, "--"], (user.pw_uid, user.pw_gid)


def _free_port() -> int:
    for port in random.sample(PORTS, 50):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free TCP port on 127.0.0.1 in {PORTS.start}-{PORTS.stop - 1}")


@dataclass
class Server:
    """A throwaway cluster being started (in a background thread) or running, and the watchdog
    that removes it."""

    bindir: Path
    root: Path
    prefix: list[str]
    watchdog: subprocess.Popen[bytes]
    port: int = field(default_factory=_free_port)
    version: str = ""
    began: float = field(default_factory=time.monotonic)
    ready_after: float = 0.0
    owner_pid: int = field(default_factory=os.getpid)
    error: BaseException | None = None
    thread: threading.Thread | None = None

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://{OS_USER}@127.0.0.1:{self.port}/postgres"

    def run(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.prefix, *map(str, args)],
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            start_new_session=True,  # a Ctrl-C meant for pytest must not kill initdb half-way
        )

    @property
    def status_file(self) -> Path:
        return self.root / STATUS_FILE

    def start(self) -> None:
        """initdb, then start the server (blocking; :meth:`start_in_background` runs it in a thread);
        then the outcome in :attr:`status_file`, for the pytest-xdist workers."""
        try:
            _initdb(self)
            _start(self)
            self.version = (self.data / "PG_VERSION").read_text().strip()
            self.ready_after = time.monotonic() - self.began
            status = f"ready {self.port} {self.version}"
        except BaseException as error:
            self.error = error
            status = f"failed {type(error).__name__}: {error}"
        with contextlib.suppress(OSError):
            partial = self.root / f"{STATUS_FILE}.partial"
            partial.write_text(status, encoding="utf-8")
            partial.replace(self.status_file)  # whole or absent: a worker never reads half of it

    def start_in_background(self) -> None:
        self.thread = threading.Thread(target=self.start, name="postgres-test-server", daemon=True)
        self.thread.start()

    def wait(self) -> None:
        """Block until the server accepts connections; re-raise what went wrong if it did not."""
        if self.thread is not None:
            self.thread.join()
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """Stop the server and remove its directory (idempotent; only in the process that started it)."""
        if os.getpid() != self.owner_pid or self.watchdog.stdin is None or self.watchdog.stdin.closed:
            return
        if self.thread is not None:
            self.thread.join(180)  # interrupted during the start: let initdb/pg_ctl finish first
        with contextlib.suppress(OSError):
            self.watchdog.stdin.write(b"x")
            self.watchdog.stdin.flush()
        with contextlib.suppress(OSError):
            self.watchdog.stdin.close()
        try:
            self.watchdog.wait(timeout=60)
        except subprocess.TimeoutExpired:
            print(f"warning: the PostgreSQL test server in {self.root} did not stop within 60 s", file=sys.stderr)
        if os.environ.get(URL_ENV) == self.url:
            del os.environ[URL_ENV]
        if os.environ.get(STATUS_ENV) == str(self.status_file):
            del os.environ[STATUS_ENV]


def launch(bindir: Path) -> Server:
    """A new temporary directory with its watchdog, and the port; the cluster is not created yet:
    call :meth:`Server.start` or :meth:`Server.start_in_background`, then :meth:`Server.wait`."""
    prefix, owner = _as_postgres_user()
    # As root the temporary directory must be reachable by the postgres user: /tmp, not $TMPDIR.
    root = Path(tempfile.mkdtemp(prefix="privrelease-pg-", dir="/tmp" if owner else None))
    if owner:
        os.chown(root, *owner)
    watchdog = subprocess.Popen(
        [sys.executable, "-I", __file__, "--watchdog", str(root), str(bindir / "pg_ctl"), *prefix],
        stdin=subprocess.PIPE,
        start_new_session=True,  # no SIGINT from the terminal's Ctrl-C: it must outlive us
    )
    return Server(bindir, root, prefix, watchdog)


def _initdb(server: Server) -> None:
    done = server.run(
        server.bindir / "initdb",
        "-D",
        server.data,
        "--auth=trust",
        f"--username={OS_USER}",
        "--encoding=UTF8",
        "--locale=C",
        "--no-sync",
    )
    if done.returncode != 0:
        raise RuntimeError(f"initdb failed (exit {done.returncode}):\n{done.stdout}{done.stderr}")
    settings = {**SETTINGS, "unix_socket_directories": "'" + str(server.root).replace("'", "''") + "'"}
    with (server.data / "postgresql.conf").open("a") as conf:
        conf.write("\n# privrelease test server\n")
        conf.writelines(f"{name} = {value}\n" for name, value in settings.items())


def _start(server: Server) -> None:
    """``pg_ctl -w start`` on ``server.port``; on another port if that one was taken meanwhile."""
    log = server.root / "server.log"
    for attempt in range(3):
        if attempt:
            server.port = _free_port()
        done = server.run(
            server.bindir / "pg_ctl", "-D", server.data, "-l", log, "-o", f"-p {server.port}", "-w", "-t", "60", "start"
        )
        if done.returncode == 0:
            return
        text = log.read_text(errors="replace") if log.exists() else ""
        if "could not bind" not in text and "already in use" not in text:
            break  # not a port race: do not retry
    tail = "\n".join(text.splitlines()[-20:])
    raise RuntimeError(f"pg_ctl start failed (exit {done.returncode}):\n{done.stdout}{done.stderr}\n{log}:\n{tail}")


# --- pytest wiring (called from tests/conftest.py) ---------------------------------------------


def _usage_error(error: BaseException) -> Exception:
    import pytest

    return pytest.UsageError(
        f"could not start a throwaway PostgreSQL server for the tests: {error}\n"
        f"(set {OFF_ENV}=1 to skip the PostgreSQL tests, or {URL_ENV} to use another server)"
    )


def wait_for_status(path: Path, timeout: float = WORKER_WAIT_SECONDS) -> tuple[int, str]:
    """In a pytest-xdist worker: the port and version the controller's server runs on, once its
    status file says so; :class:`RuntimeError` with the controller's reason if it failed to start,
    or if no status appears within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the server did not start within {timeout:g} s (no {path})")
        time.sleep(0.1)
    status = path.read_text(encoding="utf-8")
    word, _, rest = status.partition(" ")
    if word != "ready":
        raise RuntimeError(rest or status)
    port, _, version = rest.partition(" ")
    return int(port), version


class _WorkerPlugin:
    """In a pytest-xdist worker: waits for the controller's server once this worker has collected
    its tests, and exports its URL (the port may have changed since the worker was started)."""

    def __init__(self, status: Path) -> None:
        self.status = status

    def pytest_collection_finish(self, session: Any) -> None:
        try:
            port, _ = wait_for_status(self.status)
        except Exception as error:
            raise _usage_error(error) from error
        os.environ[URL_ENV] = f"postgresql+psycopg://{OS_USER}@127.0.0.1:{port}/postgres"


class _Plugin:
    """Waits for the server once collection is done (it starts while the tests are collected) and
    says at the end of the run which server the PostgreSQL tests used, or why they skip."""

    def __init__(self, server: Server | None, line: str) -> None:
        self.server, self.line, self.waited = server, line, 0.0

    def pytest_collection_finish(self, session: Any) -> None:
        if self.server is None:
            return
        began = time.monotonic()
        try:
            self.server.wait()
        except Exception as error:
            raise _usage_error(error) from error
        self.waited = time.monotonic() - began
        os.environ[URL_ENV] = self.server.url  # the port may have changed
        self.line = (
            f"PostgreSQL tests: throwaway PostgreSQL {self.server.version} on 127.0.0.1:{self.server.port} "
            f"from {self.server.bindir} (ready after {self.server.ready_after:.1f} s, started during collection; "
            f"the tests waited {self.waited:.1f} s for it; removed at exit)"
        )

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.line and self.server is not None:  # pytest-xdist: the workers waited, not this process
            try:
                self.server.wait()
            except Exception as error:
                terminalreporter.write_line(f"PostgreSQL tests: the throwaway server failed to start: {error}")
                return
            self.line = (
                f"PostgreSQL tests: throwaway PostgreSQL {self.server.version} on 127.0.0.1:{self.server.port} "
                f"from {self.server.bindir} (ready after {self.server.ready_after:.1f} s, started while the "
                f"pytest-xdist workers collected; shared by them; removed at exit)"
            )
        terminalreporter.write_line(self.line)


_server: Server | None = None


def configure(config: Any) -> None:
    """``pytest_configure``: use ``PRIVRELEASE_TEST_POSTGRES_URL`` if set; else start a server in the
    background and export its URL at once (the test modules read it when they are imported). The
    tests wait for it after collection; ``pytest.UsageError`` if the binaries exist but it fails."""
    global _server
    if config.option.help or config.option.collectonly:
        return
    server = None
    status = os.environ.get(STATUS_ENV)
    if hasattr(config, "workerinput") and status:  # a pytest-xdist worker: the controller started it
        config.pluginmanager.register(_WorkerPlugin(Path(status)), "privrelease-postgres")
        return
    if os.environ.get(URL_ENV):
        line = f"PostgreSQL tests: the server in {URL_ENV} from the environment"
    elif _server is not None:  # pytest.main() run again in this process
        server = _server
        os.environ[URL_ENV] = server.url
        os.environ[STATUS_ENV] = str(server.status_file)
        line = f"PostgreSQL tests: the throwaway server on 127.0.0.1:{server.port}"
    else:
        try:
            server = _server = launch(find_bindir())
        except Unavailable as reason:
            line = f"PostgreSQL tests skip: {reason}"
        except Exception as error:
            raise _usage_error(error) from error
        else:
            atexit.register(server.stop)
            os.environ[URL_ENV] = server.url
            os.environ[STATUS_ENV] = str(server.status_file)
            server.start_in_background()
            line = ""
    config.pluginmanager.register(_Plugin(server, line), "privrelease-postgres")


# --- the watchdog (run as a script by start()) -------------------------------------------------


def _watchdog(root: Path, pg_ctl: str, prefix: list[str]) -> None:
    """Wait until the parent writes a byte or dies (EOF), then stop the cluster and remove ``root``."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    sys.stdin.buffer.read(1)
    data = root / "data"
    if (data / "postmaster.pid").exists():
        subprocess.run(
            [*prefix, pg_ctl, "-D", str(data), "-m", "immediate", "-w", "-t", "60", "stop"],
            cwd=root,
            capture_output=True,
            timeout=90,
            check=False,
        )
    shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__" and sys.argv[1:2] == ["--watchdog"]:
    _watchdog(Path(sys.argv[2]), sys.argv[3], sys.argv[4:])
