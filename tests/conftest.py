"""Shared fixtures. Real data lives in ``../shared/data`` beside the checkout (CI has it; a
user's clone may not): tests that need it skip with the reason.

``make test`` runs the tests on two pytest-xdist workers (``-n 2 --dist loadgroup``); plain
``python -m pytest`` runs them in one process. Every process of a run is isolated here: its own
``PREFECT_HOME`` (:func:`pytest_configure`), its own ``tmp_path`` (pytest's, per worker), servers on
free ports; the throwaway PostgreSQL server is one for the run, started by the controller and
shared by the workers (``tests/postgres_server.py``); the tests that need a Prefect server
started for the session (:data:`PREFECT_SERVER_FIXTURES`) run on one worker
(:func:`pytest_collection_modifyitems`, scheduled by :func:`pytest_xdist_make_scheduler`), so
that only one worker pays for starting it."""

from __future__ import annotations

import atexit
import gc
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from privrelease import demo

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def adult_dir() -> Path:
    """``../shared/data/adult`` (ARX's Adult extract and hierarchies), or skip."""
    path = SHARED_DATA / "adult"
    if not (path / "adult.csv").is_file():
        pytest.skip(f"real Adult data not found at {path} (../shared is absent in this checkout)")
    return path


@pytest.fixture(scope="session")
def adult_uci_dir() -> Path:
    """``../shared/data/adult-uci`` (the full UCI Adult files), or skip."""
    path = SHARED_DATA / "adult-uci"
    if not (path / "adult.data").is_file():
        pytest.skip(f"UCI Adult data not found at {path} (../shared is absent in this checkout)")
    return path


def pytest_configure(config: pytest.Config) -> None:
    """Declare ``../shared/data`` a data root (``PRIVRELEASE_DATA_ROOTS``), create audit
    databases on first use (``PRIVRELEASE_AUTO_INIT``), keep no Prefect server between runs
    (``PRIVRELEASE_SERVER_REUSE``), set Prefect's quiet
    test defaults before any module imports it, and start a throwaway
    PostgreSQL server on 127.0.0.1 for the session when the binaries exist
    and ``PRIVRELEASE_TEST_POSTGRES_URL`` is unset, and export its URL before the test modules
    are imported (their PostgreSQL marks read it then). See ``tests/postgres_server.py``.

    ``COLUMNS`` and ``LINES`` are unset (see below). ``PREFECT_HOME`` is a new temporary folder
    of this process (each pytest-xdist worker has its own), removed at exit: the tests neither
    read the user's Prefect profiles and settings nor leave files in ``~/.prefect``, and two
    workers never share Prefect's files."""
    import postgres_server

    # The CLI's tables are as wide as their content when the output is not a terminal (a test's
    # captured output) and COLUMNS is unset; the tests read them row by row, and those that test a
    # width set COLUMNS themselves. Unset here: GNU readline, which pytest imports (with pdb), puts
    # COLUMNS=80 and LINES=24 in the C environment when stdin is not a terminal (os.environ does
    # not show them); child processes inherit them, pytest-xdist's workers too, where Rich reads
    # them when the CLI's consoles are created and folds long cells.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)
        os.unsetenv(name)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    os.environ["PREFECT_HOME"] = _own_folder(f"prefect-home-{worker}")
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        os.environ[GROUPS_ENV] = _own_folder("xdist-groups")  # the controller's
    # Declared here too (pytest-xdist declares it), for runs with -p no:xdist: no unknown-mark warning.
    config.addinivalue_line("markers", "xdist_group(name): run on the pytest-xdist worker of this group")

    # No test touches the user's work folder or audit database (a `make demo` there registers
    # demo-census@1, which `plan` of the example would then warn about): this process's own
    # folder is the default, and the `work` fixture gives each test a fresh one.
    os.environ["PRIVRELEASE_WORK_DIR"] = _own_folder("work")
    os.environ.pop("PRIVRELEASE_DB_URL", None)
    # The Adult example policies (policies/examples) read ../shared/data: a declared data root.
    os.environ["PRIVRELEASE_DATA_ROOTS"] = str(SHARED_DATA)
    # Tests start from fresh work folders; the refusal itself is tested with this unset.
    os.environ["PRIVRELEASE_AUTO_INIT"] = "true"
    # A run from the command line leaves no Prefect server behind (the kept server is tested in
    # test_server.py, whose commands run with an environment of their own).
    os.environ.setdefault("PRIVRELEASE_SERVER_REUSE", "false")
    for key, value in {  # before any test module imports Prefect
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_TASKS_DEFAULT_NO_CACHE": "true",
    }.items():
        os.environ.setdefault(key, value)
    postgres_server.configure(config)


def _own_folder(name: str) -> str:
    """A new temporary folder of this process, removed when it exits."""
    folder = tempfile.mkdtemp(prefix=f"privrelease-test-{name}-")
    atexit.register(shutil.rmtree, folder, True)
    return folder


PREFECT_SERVER_FIXTURES = {"prefect_harness", "prefect_stack"}
"""Session fixtures that start a Prefect server (20-40 s each here): :func:`prefect_harness`, and
``prefect_stack`` of ``tests/test_deploy_system.py`` (used by ``tests/test_deploy_faults.py`` too)."""
PREFECT_GROUP = "prefect-servers"


GROUPS_ENV = "PRIVRELEASE_TEST_XDIST_GROUPS"
"""Set by the pytest-xdist controller: a folder where each worker writes the ``xdist_group`` of
its tests (``<worker>.json``, nodeid to group) for :func:`pytest_xdist_make_scheduler`."""


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under ``--dist loadgroup`` the tests that use a session Prefect server all go to one worker
    (``xdist_group``), which starts each server once; the other worker runs the rest meanwhile.
    Without pytest-xdist the mark is inert. In a worker, the groups are written for the controller."""
    for item in items:
        if PREFECT_SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.xdist_group(PREFECT_GROUP))
    folder = os.environ.get(GROUPS_ENV)
    if folder and hasattr(config, "workerinput"):
        groups = {}
        for item in items:
            names = sorted({str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                            for mark in item.iter_markers("xdist_group")})  # fmt: skip
            if names:
                groups[item.nodeid] = "_".join(names)
        path = Path(folder) / f"{config.workerinput['workerid']}.json"
        path.with_suffix(".partial").write_text(json.dumps(groups), encoding="utf-8")
        path.with_suffix(".partial").replace(path)  # whole or absent


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: no error when it is not loaded
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` that honours ``xdist_group``. pytest-xdist 3.8.0 groups by a suffix it
    appends to ``item._nodeid`` in the worker, which pytest 9.2 no longer reads (``nodeid`` comes
    from ``item._id``): its own loadgroup silently ran every test on its own. This scheduler reads
    the groups the workers wrote (:func:`pytest_collection_modifyitems`) instead; tests without a
    group are scheduled one by one, as by ``--dist load``."""
    if config.getvalue("dist") != "loadgroup" or not os.environ.get(GROUPS_ENV):
        return None
    from xdist.scheduler import LoadGroupScheduling

    folder = Path(os.environ[GROUPS_ENV])

    class MarkedGroupScheduling(LoadGroupScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # read once all workers have collected (they write before)
                self.groups = {}
                for path in sorted(folder.glob("*.json")):
                    self.groups.update(json.loads(path.read_text(encoding="utf-8")))
            group = self.groups.get(nodeid)
            return f"xdist_group:{group}" if group else super()._split_scope(nodeid)

    return MarkedGroupScheduling(config, log)


@pytest.fixture(scope="session")
def prefect_harness():
    """Prefect's test harness (a temporary API server and database), started at most once per
    test session (20-40 s here, so only the few flow tests use it; the rest call the plain
    steps). Yields the API URL, for commands run in-process that must not start a server."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield PREFECT_API_URL.value()


CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


CHROMIUM_PATHS = ("/usr/bin/chromium", "/usr/bin/chromium-browser")
"""Where Debian's and Ubuntu's packages install it: found even when ``PATH`` lacks ``/usr/bin``."""


def find_chromium() -> str:
    """The Chromium executable on ``PATH``, else at :data:`CHROMIUM_PATHS` (Debian's
    ``/usr/bin/chromium``), looked up when a test needs it, not when the tests are collected (a
    browser installed after the session started is found); skips the test without one."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    found = found or next((path for path in CHROMIUM_PATHS if os.access(path, os.X_OK)), None)
    if found is None:
        pytest.skip(f"no Chromium on PATH or at {' or '.join(CHROMIUM_PATHS)} (apt-get install chromium)")
    return found


@pytest.fixture(scope="module")
def browser() -> Any:
    """Headless Chromium driven by Playwright, one per test module (or skip)."""
    executable = find_chromium()
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


CLI_IMPORTS = "from privrelease.cli import app\nimport privrelease.audit.database\n"
"""What every command on the audit database loads: the baseline of :func:`child_cpu_seconds`."""


def child_cpu_seconds(script: str, cwd: Path | None = None) -> tuple[subprocess.CompletedProcess[str], float, float]:
    """Run ``python -c script`` (CPU time, not wall time: a busy machine slows it less); its
    result, the CPU seconds it used and those of a fresh process importing
    :data:`CLI_IMPORTS` (measured now: a slower machine is slower at both)."""

    def measured(code: str) -> tuple[subprocess.CompletedProcess[str], float]:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False, cwd=cwd
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return done, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)

    done, seconds = measured(script)
    imported, baseline = measured(CLI_IMPORTS)
    assert imported.returncode == 0, imported.stderr
    return done, seconds, baseline


def cpu_seconds(call: Callable[[], T]) -> tuple[T, float]:
    """``call()`` and the CPU seconds it took in this process (CPU time, not wall time: a busy
    machine slows it less), the cyclic garbage collector paused meanwhile: a full collection of
    what earlier tests in this pytest-xdist worker left (0.4 s seen in CI) is not the call's cost."""
    gc.collect()
    gc.disable()
    try:
        start = time.process_time()
        result = call()
        return result, time.process_time() - start
    finally:
        gc.enable()


# --------------------------------------------------------------------------- the demo release


@pytest.fixture(scope="module")
def demo_source(tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo-source")
    demo.write_demo(folder, seed=7)
    return folder


@pytest.fixture
def work(tmp_path, monkeypatch):
    """A fresh work dir (audit database, manifests, releases) for each test."""
    folder = tmp_path / "work"
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(folder))
    for name in (
        "PRIVRELEASE_DB_URL",
        "PRIVRELEASE_PRODUCTION",
        "PRIVRELEASE_RESERVATION_TTL_SECONDS",
        "PRIVRELEASE_DEFAULT_LIFETIME_BUDGET",
    ):
        monkeypatch.delenv(name, raising=False)
    return folder


@pytest.fixture
def demo_dir(demo_source, tmp_path, work):
    folder = tmp_path / "demo"
    shutil.copytree(demo_source, folder)
    return folder


@pytest.fixture(autouse=True)
def _no_site_file(tmp_path_factory, monkeypatch):
    """No test reads the host's /etc/privrelease/site.yaml: each sees a site file of its own,
    absent unless it writes one (``privrelease.site.SITE_FILE``)."""
    from privrelease import site

    monkeypatch.setattr(site, "SITE_FILE", tmp_path_factory.mktemp("site") / "site.yaml")
