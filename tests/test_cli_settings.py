"""Malformed settings and bracketed text: every command answers with one verbatim line and
exit 2, never a traceback."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from privrelease import settings as settings_module
from privrelease.settings import DEPLOY_VARIABLES, PREFIX, Settings, unknown_variables

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


# --- the audit database URL, a missing folder, a misspelt name (issue 18, item 3) ----------------

EXPECTED_URL = "expected sqlite:///PATH/audit.db"


@pytest.mark.parametrize(
    ("url", "shown", "reason"),
    [
        ("sqlite://x.db", "sqlite://x.db", "'x.db' is read as a host: a SQLite file follows three slashes"),
        ("notaurl", "notaurl", "not a URL"),
        ("sqlite://", "sqlite://", "an in-memory SQLite database keeps no audit history"),
        ("sqlite:///:memory:", "sqlite:///:memory:", "an in-memory SQLite database"),
        ("postgresql://ada:hunter2@db.example:port/audit", "postgresql://ada:***@db.example:port/audit", "its port is not a number"),
        ("postgresql+psycopg://ada:hunter2@db.example:70000/audit", "postgresql+psycopg://ada:***@db.example:70000/audit", "port 70000 is not in 1-65535"),
        ("postgresql+psycopg://", "postgresql+psycopg://", "it names no host"),
        ("postgresql+psycopg://ada@db.example/", "postgresql+psycopg://ada@db.example/", "it names no database"),
        ("mysql://db.example/audit", "mysql://db.example/audit", "'mysql' is not a supported database"),
        ("postgres://ada@db.example/audit", "postgres://ada@db.example/audit", "'postgres' is not a supported database"),
        ("postgresql+psycopg2://ada@db.example/audit", "postgresql+psycopg2://ada@db.example/audit", "'postgresql+psycopg2' is not a supported"),
    ],
    ids=["sqlite two slashes", "not a url", "sqlite in memory", "sqlite :memory:", "port not a number",
         "port out of range", "postgresql no host", "postgresql no database", "mysql", "postgres scheme",
         "psycopg2 driver"],
)  # fmt: skip
def test_malformed_database_url_is_one_line_naming_it(url, shown, reason, tmp_path) -> None:
    """Checked by SQLAlchemy's own parser when read: exit 2, the variable, the value (password
    masked), why, and what is allowed; never a traceback; nothing created."""
    work = tmp_path / "work"
    result = cli("audit", "verify", PRIVRELEASE_DB_URL=url, PRIVRELEASE_WORK_DIR=str(work))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"PRIVRELEASE_DB_URL={shown!r} is not valid ({reason}" in result.stderr
    assert EXPECTED_URL in result.stderr and "hunter2" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not work.exists()


def test_database_url_error_in_json_masks_the_password() -> None:
    url = "postgresql+psycopg://ada:hunter2@db.example:70000/audit"
    result = cli("ledger", "list", "--json", PRIVRELEASE_DB_URL=url)
    assert result.returncode == 2 and result.stderr == "" and "hunter2" not in result.stdout
    document = json.loads(result.stdout)
    assert document["field"] == "PRIVRELEASE_DB_URL" and document["allowed"].startswith("sqlite:///PATH/audit.db")
    assert "'postgresql+psycopg://ada:***@db.example:70000/audit' is not valid (port 70000" in document["error"]


COMMANDS = {
    "plan": ["plan", "policies/examples/demo.yaml"],
    "run": ["run", "policies/examples/demo.yaml"],
    "audit verify": ["audit", "verify"],
    "audit init": ["audit", "init"],
    "audit migrate": ["audit", "migrate"],
    "ledger show": ["ledger", "show", "demo-census"],
    "report list": ["report", "list"],
    "demo": ["demo", "--seed", "1"],
}


@pytest.mark.parametrize("command", COMMANDS.values(), ids=COMMANDS.keys())
def test_every_command_checks_the_database_url_first(command, tmp_path) -> None:
    """The same refusal from every command, before any work (no folder, no data, no server)."""
    work = tmp_path / "work"
    result = cli(*command, PRIVRELEASE_DB_URL="sqlite://x.db", PRIVRELEASE_WORK_DIR=str(work))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "PRIVRELEASE_DB_URL='sqlite://x.db' is not valid ('x.db' is read as a host" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not work.exists()


@pytest.fixture(scope="module")
def demo_policy(tmp_path_factory) -> Path:
    from privrelease import demo

    folder = tmp_path_factory.mktemp("demo")
    policy, _ = demo.write_demo(folder, seed=3)
    return policy


@pytest.mark.parametrize(
    "command",
    [["run", "POLICY"], ["audit", "verify"], ["audit", "init"], ["audit", "migrate"], ["ledger", "show", "demo-census"],
     ["report", "list"], ["demo", "--seed", "1", "--dir", "DEMO"]],
    ids=["run", "audit verify", "audit init", "audit migrate", "ledger show", "report list", "demo"],
)  # fmt: skip
def test_missing_database_folder_is_named_and_never_created(command, demo_policy, tmp_path) -> None:
    """A SQLite URL into a folder that does not exist (a typo): refused naming that folder, by
    the commands that create a database too; nothing is made (only the working folder is)."""
    missing = tmp_path / "typo" / "nested"
    url = f"sqlite:///{missing / 'audit.db'}"
    args = [
        str(demo_policy) if arg == "POLICY" else str(tmp_path / "demo") if arg == "DEMO" else arg for arg in command
    ]
    result = cli(*args, PRIVRELEASE_DB_URL=url, PRIVRELEASE_WORK_DIR=str(tmp_path / "work"), PREFECT_API_URL="")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"PRIVRELEASE_DB_URL={url!r} is not valid: its folder {missing} does not exist" in result.stderr
    errors = [line for line in result.stderr.strip().splitlines() if not line.endswith("…")]  # but run's progress
    assert len(errors) == 1, result.stderr
    assert not (tmp_path / "typo").exists() and not (tmp_path / "demo").exists()
    assert not list((tmp_path / "work").rglob("prefect-server*.log")), "Prefect was started"


def test_the_working_folder_is_still_made_for_a_new_database(tmp_path) -> None:
    """`audit init` with the default URL creates the working folder (the demo's and a first
    run's home), and with a URL into an existing folder creates just the file."""
    work = tmp_path / "new" / "work"
    created = cli("audit", "init", PRIVRELEASE_WORK_DIR=str(work), PRIVRELEASE_DB_URL="")
    assert created.returncode == 0 and (work / "audit.db").is_file(), created.stderr
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    created = cli("audit", "init", PRIVRELEASE_WORK_DIR=str(work), PRIVRELEASE_DB_URL=url)
    assert created.returncode == 0 and (tmp_path / "audit.db").is_file(), created.stderr


def test_misspelt_setting_is_warned_once_with_the_closest_name() -> None:
    """An unknown PRIVRELEASE_* name would be ignored silently: one warning line each, with a
    did-you-mean; the deploy scripts' and the test suite's names are known; the command runs."""
    result = cli(
        "guarantee", "sdgs", "--k", "10", "--beta", "0.1", "--epsilon", "1", "--json",
        PRIVRELEASE_DB_ULR="sqlite:///elsewhere.db", PRIVRELEASE_PRODUCTON="true", PRIVRELEASE_XYZZY="1",
        PRIVRELEASE_PREFECT_PORT="4201", PRIVRELEASE_REPO=str(REPO), PRIVRELEASE_TEST_ANYTHING="1",
    )  # fmt: skip
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip().splitlines() == [
        "warning: PRIVRELEASE_DB_ULR is not a privrelease setting (ignored); did you mean PRIVRELEASE_DB_URL?",
        "warning: PRIVRELEASE_PRODUCTON is not a privrelease setting (ignored); did you mean PRIVRELEASE_PRODUCTION?",
        "warning: PRIVRELEASE_XYZZY is not a privrelease setting (ignored); the settings are "
        + ", ".join(KNOWN_SETTINGS),
    ]
    json.loads(result.stdout)  # stdout stays one JSON document


def test_a_misspelt_setting_does_not_hide_a_refusal() -> None:
    """The warning comes first, then the one-line error of a malformed setting."""
    result = cli("audit", "verify", PRIVRELEASE_DB_ULR="x", PRIVRELEASE_DB_URL="notaurl")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    warning, error = result.stderr.strip().splitlines()
    assert "did you mean PRIVRELEASE_DB_URL?" in warning and error.startswith("error: PRIVRELEASE_DB_URL='notaurl'")


# --- the settings are documented, and every PRIVRELEASE_* name the project uses is known ---------

KNOWN_SETTINGS = [PREFIX + name.upper() for name in Settings.model_fields]
NAME = re.compile(r"PRIVRELEASE_[A-Z][A-Z_]*[A-Z]")


def test_readme_lists_every_setting() -> None:
    """The README's settings table names each setting (generated from the Settings model) and
    nothing else; so does the settings module's own table."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    start = readme.index("Settings come from the environment")
    table = readme[start : readme.index("\n\n", readme.index("| variable |", start))]
    assert sorted(set(NAME.findall(table))) == sorted(KNOWN_SETTINGS)
    assert set(KNOWN_SETTINGS) <= set(NAME.findall(settings_module.__doc__ or ""))


def test_every_name_the_project_uses_is_known() -> None:
    """No PRIVRELEASE_* name in the code, the deploy scripts or the documentation would be
    warned about as unknown (the deploy scripts' own names are listed in DEPLOY_VARIABLES)."""
    files = [path for folder in ("privrelease", "audit", "flows", "policies", "mechanisms", "reports", "deploy", "bench")
             for path in (REPO / folder).rglob("*") if path.suffix in (".py", ".sh", ".md", ".yaml")]  # fmt: skip
    files += list(REPO.glob("*.md"))
    files.remove(REPO / "privrelease" / "settings.py")  # its doctest shows a misspelt name
    used = {name for path in files for name in NAME.findall(path.read_text(encoding="utf-8"))}
    assert set(DEPLOY_VARIABLES) <= used
    assert unknown_variables(dict.fromkeys(used, "")) == []


def test_settings_follow_every_change_of_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """get_settings builds the settings once per environment (a release asks dozens of times),
    and sees a changed variable, working folder or malformed value at the next call."""
    from privrelease.errors import UserError
    from privrelease.settings import get_settings

    monkeypatch.delenv("PRIVRELEASE_DB_URL", raising=False)
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "a"))
    first = get_settings()
    assert first.work_dir == tmp_path / "a" and get_settings() is first
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "b"))
    assert get_settings().db_url == f"sqlite:///{tmp_path / 'b' / 'audit.db'}"
    monkeypatch.delenv("PRIVRELEASE_WORK_DIR")
    monkeypatch.chdir(tmp_path)
    assert get_settings().work_dir == tmp_path.resolve() / "privrelease-work"
    monkeypatch.setenv("privrelease_production", "true")  # read whatever the case
    assert get_settings().production is True
    monkeypatch.setenv("PRIVRELEASE_PRODUCTION", "perhaps")
    monkeypatch.delenv("privrelease_production")
    for _ in range(2):  # a malformed value is never cached as good
        with pytest.raises(UserError, match="PRIVRELEASE_PRODUCTION='perhaps' is not valid"):
            get_settings()
