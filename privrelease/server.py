"""The local Prefect server that records the runs, kept between them.

Prefect records every flow run on a server; starting one costs 8-30 s, a small release about a
second. So the first run started from a work folder starts a server in the background (its own
session, ``PREFECT_HOME`` and log under ``<work_dir>/prefect-server/``) and every later run finds
it through the state file ``server.json`` there (pid, port, API URL, start time, owner token),
checks that it answers as that server (``/api/health`` and a proof of the token at
:data:`IDENTITY_PATH`) and uses it. A state file whose process is gone, or is not this account's,
is removed and a new server started.

Private to the account that runs releases (SECURITY.md): the folder is ``0700``, the state file
and log ``0600``, and the API answers only requests that carry the owner token as Prefect's auth
string (the server gets it as ``PREFECT_SERVER_API_AUTH_STRING``, the runs as
``PREFECT_API_AUTH_STRING``; Prefect's basic authentication). Another local account can reach
the port but reads, creates and deletes nothing (``401``); ``/api/health`` stays open.

Idle shutdown: each run holds a lease (``clients/<pid>``) and touches ``last-used``; the server
checks every few seconds and exits once no lease holder is alive and ``last-used`` is older than
``PRIVRELEASE_SERVER_IDLE_SECONDS`` (default 1800). With ``PRIVRELEASE_SERVER_REUSE=false`` a run
starts a temporary server of its own that ends with it (idle time 0, dies with its parent). A
``PREFECT_API_URL`` the user configured always wins: no server is started.

Whether a configured API answers (:func:`check_prefect_api`) and whether a failure was Prefect's
API out of reach (:func:`unreachable_api_error`) are decided here too, for ``privrelease run``
and ``deploy``: one line naming the URL, never a traceback.

This module imports neither Prefect nor uvicorn except in :func:`serve` (the server process) and
:func:`configured_api_url` (Prefect's settings).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from privrelease.errors import UserError
from privrelease.files import private_folder, write_atomic

PREFECT_DEFAULTS = {
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "PREFECT_TASKS_DEFAULT_NO_CACHE": "true",
}
FOLDER = "prefect-server"
STATE_FILE = "server.json"
LOG_FILE = "server.log"
LAST_USED = "last-used"
CLIENTS = "clients"
IDENTITY_PATH = "/privrelease/server"
"""``?nonce=N`` answers ``{"proof": HMAC-SHA256(token, N), "pid": ...}``: proves which server
listens on a port without giving the token to whatever listens there."""
TOKEN_ENV = "PRIVRELEASE_SERVER_TOKEN"
SERVER_AUTH_ENV = "PREFECT_SERVER_API_AUTH_STRING"
CLIENT_AUTH_ENV = "PREFECT_API_AUTH_STRING"


@dataclass(frozen=True)
class ServerState:
    """What ``server.json`` records about a running server."""

    pid: int
    port: int
    api_url: str
    started: float
    token: str
    idle_seconds: float


def prefect_defaults() -> None:
    """Set Prefect's environment defaults for this process (the user's values win)."""
    for key, value in PREFECT_DEFAULTS.items():
        os.environ.setdefault(key, value)


def startup_timeout() -> float:
    """Seconds to wait for a server to answer (``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``)."""
    try:
        return float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "90"))
    except ValueError:
        return 90.0


def server_folder(work_dir: Path | None = None) -> Path:
    """``<work_dir>/prefect-server``: state file, log, leases and the server's ``PREFECT_HOME``."""
    if work_dir is None:
        from privrelease.settings import get_settings

        work_dir = get_settings().work_dir
    return work_dir / FOLDER


def read_state(folder: Path) -> ServerState | None:
    """The state file's record; None when there is none (or it is unreadable)."""
    try:
        return ServerState(**json.loads((folder / STATE_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None


def _write_state(folder: Path, state: ServerState) -> None:
    write_atomic(folder / STATE_FILE, json.dumps(asdict(state), indent=2), durable=False, mode=0o600)


def _forget(folder: Path, token: str) -> None:
    """Remove the state file if it still names the server with ``token``."""
    state = read_state(folder)
    if state is not None and state.token == token:
        (folder / STATE_FILE).unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    """True when ``pid`` runs a privrelease server of this account (:func:`runs_ours`)."""
    return runs_ours(pid, "privrelease.server")


def runs_ours(pid: int, module: str) -> bool:
    """True when ``pid`` runs ``python -m MODULE`` in this account (Linux: checked by its
    command line and the owner of its ``/proc`` entry)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):  # PermissionError: another account's process
        return False
    process = Path(f"/proc/{pid}")
    try:
        ours = process.stat().st_uid == os.getuid()
        return ours and module.encode() in (process / "cmdline").read_bytes()  # a zombie's is empty
    except OSError:
        return not process.parent.is_dir()  # no /proc: trust the pid


def _proof(token: str, nonce: str) -> str:
    """HMAC-SHA256 of ``nonce`` under ``token``: what only the server holding ``token`` can answer."""
    return hmac.new(token.encode(), nonce.encode(), hashlib.sha256).hexdigest()


def identify(state: ServerState, timeout: float = 2.0) -> bool:
    """True when the server at ``state.api_url`` is healthy and is the one ``state`` names (it
    proves it holds the token for a fresh nonce; the token itself is never sent)."""
    base = state.api_url.removesuffix("/api")
    nonce = secrets.token_hex(16)
    try:
        with urllib.request.urlopen(f"{base}{IDENTITY_PATH}?nonce={nonce}", timeout=timeout) as answer:
            if not hmac.compare_digest(str(json.loads(answer.read()).get("proof")), _proof(state.token, nonce)):
                return False
        with urllib.request.urlopen(state.api_url + "/health", timeout=timeout) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def last_used(folder: Path) -> float:
    """When a run last used the server (epoch seconds); now while a lease holder is alive."""
    if _lease_holders(folder):
        return time.time()
    try:
        return (folder / LAST_USED).stat().st_mtime
    except OSError:
        return 0.0


def _touch(folder: Path) -> None:
    (folder / LAST_USED).touch()


def _lease_holders(folder: Path) -> list[int]:
    """Pids of the live processes holding a lease; leases of dead ones are removed."""
    holders = []
    for lease in (folder / CLIENTS).glob("*"):
        try:
            pid = int(lease.name)
            os.kill(pid, 0)
        except (ValueError, ProcessLookupError):
            lease.unlink(missing_ok=True)
            continue
        except PermissionError:
            pass
        holders.append(pid)
    return holders


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    private_folder(folder)
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _free_port() -> int:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:  # pragma: no cover - runs in the child
    """Linux: the temporary server gets SIGTERM when its parent dies (even by SIGKILL)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class LocalServer:
    """A server of the work folder (kept: found or started in the background) or of this
    process (temporary). :meth:`wait` blocks until it answers; :meth:`lease` marks it in use."""

    def __init__(
        self, folder: Path, state: ServerState, process: subprocess.Popen[bytes] | None, *, temporary: bool = False
    ) -> None:
        self.folder, self.state, self.process, self.temporary = folder, state, process, temporary
        self.started_here = process is not None
        self.ready_after: float | None = None

    @property
    def api_url(self) -> str:
        return self.state.api_url

    @property
    def log_path(self) -> Path:
        return self.folder / LOG_FILE

    def _exited(self) -> bool:
        if self.process is not None:
            return self.process.poll() is not None
        return not _alive(self.state.pid)

    def wait(self, timeout: float) -> float:
        """Block until the server answers as itself; the seconds since it was started."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._exited():
                raise UserError(f"the Prefect server (pid {self.state.pid}) exited; see {self.log_path}")
            if identify(self.state):
                self.ready_after = time.time() - self.state.started
                return self.ready_after
            time.sleep(0.1)
        raise UserError(
            f"the Prefect server at {self.api_url} did not answer within {timeout:g} s (raise "
            f"PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, or stop it: privrelease server stop); "
            f"see {self.log_path}"
        )

    @contextlib.contextmanager
    def lease(self) -> Iterator[None]:
        """Hold the server in use (no idle shutdown) while the block runs."""
        lease = self.folder / CLIENTS / str(os.getpid())
        held = lease.exists()
        lease.parent.mkdir(parents=True, exist_ok=True)
        lease.touch()
        _touch(self.folder)
        try:
            yield
        finally:
            if not held:
                lease.unlink(missing_ok=True)
            _touch(self.folder)

    def stop(self) -> None:
        """Stop a temporary server and remove its folder (a kept server stays)."""
        if self.process is None or not self.temporary:
            return
        terminate(self.state.pid, group=False)
        self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _spawn(folder: Path, idle_seconds: float, *, detached: bool, env: dict[str, str]) -> LocalServer:
    """Start ``python -m privrelease.server`` on a free port and record it in ``folder`` (private:
    ``0700``, its files ``0600``)."""
    private_folder(folder)
    token = secrets.token_hex(16)
    port = _free_port()
    prefect_defaults()
    environment = {
        **os.environ,
        **env,
        TOKEN_ENV: token,
        "PREFECT_UI_ENABLED": "0",
        "PREFECT_API_BLOCKS_REGISTER_ON_START": os.environ.get("PREFECT_API_BLOCKS_REGISTER_ON_START", "false"),
    }
    environment.pop("PREFECT_API_URL", None)
    command = [sys.executable, "-m", "privrelease.server", str(folder), str(port), str(idle_seconds)]
    _touch(folder)
    process = start_logged(command, environment, folder / LOG_FILE, detached=detached)
    state = ServerState(process.pid, port, f"http://127.0.0.1:{port}/api", time.time(), token, idle_seconds)
    _write_state(folder, state)
    return LocalServer(folder, state, process, temporary=not detached)


def start_logged(
    command: list[str], environment: dict[str, str], log: Path, *, detached: bool
) -> subprocess.Popen[bytes]:
    """Start ``command`` in ``log``'s folder with ``environment``, no input, its output appended
    to ``log`` (``0600``): in a session of its own when ``detached``, else dying with this
    process (Linux)."""
    with open(os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab") as output:
        return subprocess.Popen(
            command,
            env=environment,
            cwd=log.parent,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            start_new_session=detached,
            preexec_fn=None if detached or sys.platform != "linux" else _die_with_parent,
        )


def find_server(folder: Path) -> ServerState | None:
    """The kept server recorded in ``folder`` if its process is alive (it may still be starting);
    a state file left by a dead server is removed."""
    state = read_state(folder)
    if state is None:
        return None
    if _alive(state.pid):
        return state
    _forget(folder, state.token)
    return None


def kept_server() -> LocalServer:
    """The work folder's kept server: the one recorded there, or a new one started now in the
    background (not waited for: call :meth:`LocalServer.wait`)."""
    from privrelease.settings import get_settings

    settings = get_settings()
    folder = server_folder(settings.work_dir)
    with _locked(folder):
        state = find_server(folder)
        if state is not None and _readable_by_others(folder / STATE_FILE):
            terminate(state.pid, group=True)  # started by an older privrelease: an API open to every account
            _forget(folder, state.token)
            state = None
        if state is not None:
            _touch(folder)
            return LocalServer(folder, state, None)
        home = {"PREFECT_HOME": str(folder / "home")}
        return _spawn(folder, settings.server_idle_seconds, detached=True, env=home)


def _readable_by_others(path: Path) -> bool:
    """True when ``path`` has group or other permission bits (False when it is gone)."""
    try:
        return bool(path.stat().st_mode & 0o077)
    except OSError:
        return False


def temporary_server() -> LocalServer:
    """A server for this process only (the user's ``PREFECT_HOME``), stopped when it exits."""
    import atexit

    folder = private_folder(server_folder()) / f"temporary-{os.getpid()}-{secrets.token_hex(4)}"
    (folder / CLIENTS).mkdir(parents=True)
    (folder / CLIENTS / str(os.getpid())).touch()  # this process's lease, for its whole life
    server = _spawn(folder, 0.0, detached=False, env={})
    atexit.register(server.stop)
    return server


def _prefect_configured_elsewhere() -> bool:
    """True when an API URL may come from somewhere else than the environment: the active
    profile, or a ``prefect.toml`` / ``.env`` / ``pyproject.toml [tool.prefect]`` here."""
    cwd = Path.cwd()
    if (cwd / "prefect.toml").is_file() or (cwd / ".env").is_file():
        return True
    pyproject = cwd / "pyproject.toml"
    try:
        if pyproject.is_file() and "prefect" in tomllib.loads(pyproject.read_text(encoding="utf-8")).get("tool", {}):
            return True
    except (OSError, tomllib.TOMLDecodeError):
        return True
    home = Path(os.environ.get("PREFECT_HOME", "~/.prefect")).expanduser()
    profiles = Path(os.environ.get("PREFECT_PROFILES_PATH", home / "profiles.toml"))
    if not profiles.is_file():
        return False
    try:
        document = tomllib.loads(profiles.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return True
    active = os.environ.get("PREFECT_PROFILE") or document.get("active", "ephemeral")
    profile = document.get("profiles", {}).get(active, {})
    return bool(profile.get("PREFECT_API_URL"))


def user_configured() -> bool:
    """True when the user named a Prefect API (``PREFECT_API_URL``, a profile or config file) or
    turned local servers off (``PREFECT_SERVER_EPHEMERAL_ENABLED=false``)."""
    if os.environ.get("PREFECT_SERVER_EPHEMERAL_ENABLED", "").lower() in ("false", "0"):
        return True
    return bool(os.environ.get("PREFECT_API_URL")) or _prefect_configured_elsewhere()


def connect(reuse: bool | None = None) -> LocalServer | None:
    """The server this process's runs record to, started (not waited for) if needed, and
    ``PREFECT_API_URL`` set to it: None when the user configured an API (that one is used), else
    the work folder's kept server, or with ``reuse`` False (default: the setting
    ``PRIVRELEASE_SERVER_REUSE``) a temporary server of this process, with ``PREFECT_API_AUTH_STRING``
    set to its token."""
    prefect_defaults()
    if user_configured():
        return None
    if reuse is None:
        from privrelease.settings import get_settings

        reuse = get_settings().server_reuse
    server = kept_server() if reuse else temporary_server()
    os.environ["PREFECT_API_URL"] = server.api_url
    os.environ[CLIENT_AUTH_ENV] = server.state.token
    return server


# --------------------------------------------------------------------------- API reachability

UNREACHABLE_PREFIX = "Failed to reach API at"
"""How Prefect's client words a failed version check (a ``RuntimeError`` from an ``httpx`` error)."""


def configured_api_url() -> str | None:
    """Prefect's API URL as Prefect resolves it (environment, profile, ``prefect.toml``); None when
    none is configured (Prefect then uses a temporary server). Imports Prefect's settings."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def check_prefect_api(url: str | None = None, *, timeout: float = 5.0) -> None:
    """Raise :class:`UserError` naming ``url`` (default :func:`configured_api_url`) when nothing
    answers HTTP at ``<url>/health`` within ``timeout`` seconds. Any HTTP answer, even an error
    status (an API that wants a key), counts as reachable; no URL configured: nothing to check."""
    url = configured_api_url() if url is None else url
    if not url:
        return
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout):
            return
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, OSError, ValueError) as error:
        reason = getattr(error, "reason", None) or error
        raise UserError(_unreachable_message(url, str(reason), "nothing was released or charged")) from None


def _unreachable_message(url: str, reason: str, outcome: str) -> str:
    return (
        f"cannot reach Prefect's API at {url} ({reason}); {outcome}. Start that server "
        "(deploy/server.sh start), or unset PREFECT_API_URL to let privrelease start a temporary one"
    )


def unreachable_api_error(error: BaseException) -> UserError | None:
    """A :class:`UserError` naming the API URL when ``error`` (or an exception it was raised from)
    is a failure to reach Prefect's API: an ``httpx`` transport error, or Prefect's
    ``RuntimeError("Failed to reach API at ...")``; or its refusal for want of credentials (an
    HTTP 401: a server with an auth string). None for any other error."""
    seen: set[int] = set()
    current: BaseException | None = error
    reason = None
    unauthorized = False
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        module = type(current).__module__
        if module.startswith(("httpx", "httpcore")) and _is_transport_error(current):
            reason = reason or f"{type(current).__name__}: {current}"
        elif isinstance(current, RuntimeError) and str(current).startswith(UNREACHABLE_PREFIX):
            reason = reason or str(current)
        elif getattr(getattr(current, "response", None), "status_code", None) == 401:
            unauthorized = True
        current = current.__cause__ or current.__context__
    if reason is None and not unauthorized:
        return None
    url = None
    if "prefect" in sys.modules:
        url = configured_api_url()
    url = url or os.environ.get("PREFECT_API_URL") or "the configured PREFECT_API_URL"
    if reason is None:
        return UserError(
            f"Prefect's API at {url} refused the run (401 Unauthorized): set {CLIENT_AUTH_ENV} to its auth string "
            "(a server deploy/server.sh started: the content of $PREFECT_HOME/api-auth) or PREFECT_API_KEY; "
            "nothing was released"
        )
    return UserError(_unreachable_message(url, reason, "nothing was released"))


def _is_transport_error(error: BaseException) -> bool:
    import httpx

    return isinstance(error, httpx.TransportError | httpx.TimeoutException)


def terminate(pid: int, *, group: bool, grace: float = 15.0) -> None:
    """SIGTERM ``pid`` (its process group with ``group``), SIGKILL after ``grace`` seconds."""
    kill = os.killpg if group else os.kill
    with contextlib.suppress(ProcessLookupError):
        kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(OSError, IndexError):
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return  # exited; its parent has not reaped it yet
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        kill(pid, signal.SIGKILL)


def stop_server(work_dir: Path | None = None) -> ServerState | None:
    """Stop the work folder's kept server (its process group) and remove its state file; the
    state it had, or None when none was running."""
    folder = server_folder(work_dir)
    if not folder.is_dir():
        return None
    with _locked(folder):
        state = find_server(folder)
        if state is None:
            return None
        terminate(state.pid, group=True)
        _forget(folder, state.token)
        return state


# --------------------------------------------------------------------------- the server process


def _watch_idle(server: Any, folder: Path, idle: float, token: str) -> None:
    """Once uvicorn has started, ask it to exit when no run holds a lease and ``last-used`` is
    ``idle`` seconds old, or when the state file no longer names this server."""
    period = min(5.0, max(idle / 4, 0.2))
    while not server.started:
        time.sleep(0.1)
    _touch(folder)  # idle from the moment it answers
    while not server.should_exit:
        time.sleep(period)
        state = read_state(folder)
        if state is None or state.token != token:
            print("privrelease: state file no longer names this server; stopping", flush=True)
        elif _lease_holders(folder) or time.time() - last_used(folder) < idle:
            continue
        else:
            print(f"privrelease: idle for {idle:g} s; stopping", flush=True)
        server.should_exit = True


def serve(folder: Path, port: int, idle: float) -> None:
    """Run Prefect's API (temporary-server mode: no UI, no scheduler) on 127.0.0.1:``port``,
    open only to requests carrying its owner token (Prefect's ``PREFECT_SERVER_API_AUTH_STRING``)
    and proving the token at :data:`IDENTITY_PATH`, until idle or SIGTERM."""
    import threading
    from urllib.parse import parse_qs

    token = os.environ.pop(TOKEN_ENV)
    os.environ[SERVER_AUTH_ENV] = token  # read by create_app: every /api route but /health asks for it
    import uvicorn
    from prefect.server.api.server import create_app

    api = create_app(ephemeral=True, final=True)

    async def app(scope, receive, send):
        if scope["type"] == "http" and scope["path"] == IDENTITY_PATH:
            nonce = parse_qs(scope.get("query_string", b"").decode()).get("nonce", [""])[0]
            identity = json.dumps({"proof": _proof(token, nonce), "pid": os.getpid()}).encode()
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": identity})
            return
        await api(scope, receive, send)

    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", lifespan="on"))
    threading.Thread(target=_watch_idle, args=(server, folder, idle, token), daemon=True).start()
    try:
        server.run()
    finally:
        _forget(folder, token)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m privrelease.server", description=serve.__doc__)
    parser.add_argument("folder", type=Path)
    parser.add_argument("port", type=int)
    parser.add_argument("idle", type=float)
    arguments = parser.parse_args()
    serve(arguments.folder, arguments.port, arguments.idle)
