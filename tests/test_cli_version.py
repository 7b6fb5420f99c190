"""``privrelease --version``: the package version on stdout, exit 0, with no command and no
database; ``--version=`` with a value is bad input (exit 2, one line naming the option)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from privrelease import __version__
from privrelease.version import VERSION

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "privrelease", *args], capture_output=True, text=True, cwd=REPO, timeout=60
    )


def test_version_prints_the_package_version() -> None:
    done = cli("--version")
    assert (done.returncode, done.stdout, done.stderr) == (0, f"privrelease {VERSION}\n", "")
    assert __version__ == VERSION


def test_version_takes_no_value() -> None:
    done = cli("--version=yes")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "--version" in done.stderr
