"""Malformed settings and bracketed text: every command answers with one verbatim line and
exit 2, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "privrelease", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        env={**os.environ, **env},
    )


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [
        ("PRIVRELEASE_DEFAULT_LIFETIME_BUDGET", "10,1e-6", "a JSON pair '[epsilon, delta]'"),
        ("PRIVRELEASE_RESERVATION_TTL_SECONDS", "abc", "a number of seconds > 0"),
        ("PRIVRELEASE_PRODUCTION", "maybe", "true or false"),
    ],
)
@pytest.mark.parametrize("command", [["plan", "policies/examples/demo.yaml"], ["audit", "verify"], ["ledger", "list"]])
def test_malformed_settings_fail_every_command_cleanly(variable, value, expected, command) -> None:
    result = cli(*command, **{variable: value})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{variable}={value!r} is not valid: expected {expected}" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_error_text_is_printed_verbatim(tmp_path: Path) -> None:
    """Square brackets in a message (a path, a value, the expected form) are not Rich markup."""
    missing = tmp_path / "[bold]policy[/bold].yaml"
    result = cli("plan", str(missing))
    assert result.returncode == 2 and "[bold]policy[/bold].yaml" in result.stderr


def test_json_errors_are_one_object_on_stdout() -> None:
    import json

    result = cli("guarantee", "compose", "policies/examples/demo.yaml", "--times", "0", "--delta", "1e-6", "--json")
    assert result.returncode == 2 and result.stderr == ""
    assert json.loads(result.stdout) == {
        "error": "--times must be an integer >= 1; got 0",
        "field": "--times",
        "allowed": "an integer >= 1",
        "exit_code": 2,
    }
    result = cli("audit", "verify", "--json", PRIVRELEASE_PRODUCTION="maybe")
    document = json.loads(result.stdout)
    assert document["field"] == "PRIVRELEASE_PRODUCTION" and document["allowed"] == "true or false"
    assert document["exit_code"] == result.returncode == 2
