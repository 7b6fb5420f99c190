"""Command-line usage errors (privrelease.cli.usage): one ``error:`` line naming the option or
command, the value and what is allowed, exit 2; no Click box, no usage block, no traceback."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from privrelease.cli import main

DEMO = str(Path(__file__).resolve().parents[1] / "policies" / "examples" / "demo.yaml")


def invoke(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["privrelease", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    out, err = capsys.readouterr()
    return int(exited.value.code or 0), out, err


def one_line_error(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    code, out, err = invoke(monkeypatch, capsys, *args)
    assert code == 2 and out == "", (code, out, err)
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert not any(mark in err for mark in ("╭", "│", "Usage:", "Traceback", "Try '")), err
    return err.removeprefix("error: ").rstrip("\n")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (("plan", "--nope"), "`privrelease plan` has no option --nope; its options: --json, --chart, --help"),
        (
            ("policy", "approve", DEMO, "--not"),
            "`privrelease policy approve` has no option --not; did you mean --note?",
        ),
        (
            ("guarantee", "compose", DEMO, "--times", "abc"),
            "--times must be a valid integer, unable to parse string as an integer; got 'abc'",
        ),
        (
            ("plan",),
            "`privrelease plan` needs the argument POLICY (the release policy (YAML)); see `privrelease plan --help`",
        ),
        (
            ("policy", "approve", DEMO),
            "`privrelease policy approve` needs the option --by (who approves (recorded with the OS user)); "
            "see `privrelease policy approve --help`",
        ),
        (
            ("run", DEMO, "--format"),
            "`privrelease run`: option '--format' requires an argument (output file format: parquet or csv); "
            "see `privrelease run --help`",
        ),
        (("plann", DEMO), "`privrelease` has no command 'plann'; did you mean 'plan'?"),
        (("audit", "verifyy"), "`privrelease audit` has no command 'verifyy'; did you mean 'verify'?"),
        (
            ("ledger", "show", "a", "b"),
            "`privrelease ledger show`: got unexpected extra argument(s) (b); see `privrelease ledger show --help`",
        ),
    ],
)
def test_usage_errors_are_one_line(
    args: tuple[str, ...], expected: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    assert one_line_error(monkeypatch, capsys, *args) == expected


def test_an_unknown_command_without_a_close_match_lists_the_commands(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    message = one_line_error(monkeypatch, capsys, "zzz")
    assert message.startswith("`privrelease` has no command 'zzz'; its commands: plan, estimate, run, rerun, reissue")


def test_a_usage_error_with_json_is_one_json_document(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = invoke(monkeypatch, capsys, "plan", DEMO, "--json", "--nope")
    assert (code, err) == (2, "")
    assert json.loads(out) == {
        "error": "`privrelease plan` has no option --nope; its options: --json, --chart, --help",
        "field": "--nope",
        "allowed": "--json, --chart, --help",
        "exit_code": 2,
    }


def test_help_version_and_success_keep_their_exit_codes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from privrelease.version import VERSION

    assert invoke(monkeypatch, capsys, "--version")[:2] == (0, f"privrelease {VERSION}\n")
    code, out, _err = invoke(monkeypatch, capsys, "plan", "--help")
    assert code == 0 and "Validate a policy" in out
    code, out, _err = invoke(monkeypatch, capsys, "guarantee")  # a group without a command: its help
    assert code == 2 and "compose" in out
    code, out, _err = invoke(monkeypatch, capsys, "plan", DEMO, "--json")
    assert code == 0 and json.loads(out)["passed"] is True
    code, out, err = invoke(monkeypatch, capsys, "guarantee", "compose", DEMO, "--times", "0", "--delta", "1e-6")
    assert (code, err) == (2, "error: --times must be an integer >= 1; got 0\n")  # a UserError, as before


def test_each_command_group_names_its_commands(monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Every group's help (the line `privrelease --help` shows for it) names each of its commands
    (`policy` once lacked init, schema and revoke), nested groups included."""
    import typer.main

    from privrelease.cli import app

    def groups(group, path: tuple[str, ...]):
        for name, command in group.commands.items():
            if hasattr(command, "commands"):  # a group (Typer's own Click)
                yield (*path, name), command
                yield from groups(command, (*path, name))

    found = list(groups(typer.main.get_command(app), ()))
    assert {path for path, _ in found} >= {("policy",), ("audit",), ("audit", "governance"), ("calibrate",)}
    for path, group in found:
        listed = (group.help or "").split("Commands: ")[-1].rstrip(".").split(", ")
        assert sorted(listed) == sorted(group.commands), path
    code, out, _ = invoke(monkeypatch, capsys, "--help")
    top = " ".join(out.replace("│", " ").split())
    assert code == 0 and "Commands: approve, revoke, list, show, schema, init." in top


@pytest.mark.parametrize("args", [("--help",), ("plan", "--help"), ("policy", "approve", "--help")])
def test_flags_show_no_value_type(monkeypatch: pytest.MonkeyPatch, capsys, args: tuple[str, ...]) -> None:
    """An on/off flag (--json, --help, --version) takes no value: its help shows no `<bool>`."""
    code, out, _ = invoke(monkeypatch, capsys, *args)
    assert code == 0 and "--help" in out and "<bool>" not in out
    assert "<path>" in invoke(monkeypatch, capsys, "plan", "--help")[1]  # valued options keep their type
