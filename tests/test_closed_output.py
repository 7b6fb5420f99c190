"""A reader that stops reading (``privrelease run ... | head``) neither stops a command nor changes
its exit code (issue 25, item 13): a write meeting the closed pipe sends the rest of the output to
``/dev/null`` (``privrelease.cli.output.survive_closed_output``). Each test gives the command a
real pipe whose reading end is closed before it starts, so every write to it fails (EPIPE)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from privrelease import demo


def cli(*args: str, closed: tuple[str, ...], cwd: Path, env: dict[str, str] | None = None) -> tuple[int, str]:
    """``privrelease ARGS`` with the streams named in ``closed`` ("stdout", "stderr") written to a
    pipe nobody reads any more; returns the exit code and what reached an open stderr."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "privrelease", *args],
            stdout=write if "stdout" in closed else subprocess.DEVNULL,
            stderr=write if "stderr" in closed else subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=env,
            timeout=600,
        )
    finally:
        os.close(write)
    return done.returncode, done.stderr or ""


@pytest.mark.parametrize(
    ("args", "code", "closed"),
    [
        (["policy", "schema"], 0, ("stdout",)),
        (["policy", "schema"], 0, ("stdout", "stderr")),
        (["--help"], 0, ("stdout",)),
        (["plan", "nowhere.yaml"], 2, ("stdout", "stderr")),
    ],
)
def test_a_reader_that_stops_reading_changes_no_exit_code(
    args: list[str], code: int, closed: tuple[str, ...], tmp_path: Path
) -> None:
    """Printed output (`policy schema`: 40 KiB of JSON, the help) and a refusal's error line:
    the exit code is the command's own (it was 1, "target not met", with nothing said), and an
    open stderr gets no traceback."""
    exit_code, error = cli(*args, closed=closed, cwd=tmp_path)
    assert exit_code == code, error
    assert "Traceback" not in error and "BrokenPipe" not in error
    if "stderr" not in closed and code == 0:
        assert error == ""


def test_a_published_run_piped_to_a_reader_that_left_exits_0(
    prefect_harness: str, demo_dir: Path, work: Path, tmp_path: Path
) -> None:
    """`privrelease run POLICY | head`: the release is published and charged once, exit 0."""
    from privrelease import api

    env = {**os.environ, "PREFECT_API_URL": prefect_harness, "PREFECT_HOME": str(tmp_path / "prefect-home")}
    exit_code, _ = cli("run", str(demo_dir / demo.POLICY_FILE), closed=("stdout", "stderr"), cwd=tmp_path, env=env)
    assert exit_code == 0
    entries = api.ledger("demo-census").status.entries
    assert [entry.state for entry in entries] == ["committed"]
    (release,) = (work / "releases").iterdir()
    assert (release / "chain-head.json").is_file()
