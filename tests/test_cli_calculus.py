"""The calculus commands as a user runs them: output, JSON shapes, exit codes, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from privrelease.mechanisms.sdgs_math import delta_exact, delta_theorem1

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "privrelease", *args], capture_output=True, text=True, cwd=REPO, timeout=120
    )


def test_guarantee_sdgs_grid_json() -> None:
    result = cli("guarantee", "sdgs", "--k", "10,20", "--beta", "0.1,0.2", "--epsilon", "0.1,1.0", "--json")
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert len(rows) == 8
    for row in rows:
        assert {"k", "beta", "epsilon", "delta_theorem1", "delta_exact", "argmax_n"} <= row.keys()
        theorem1 = delta_theorem1(row["k"], row["beta"], row["epsilon"])
        assert row["delta_theorem1"] == theorem1.delta and row["argmax_n"] == theorem1.argmax_n
        assert row["delta_exact"] == delta_exact(row["k"], row["beta"], row["epsilon"]).delta
    below = [row for row in rows if row["epsilon"] == 0.1]
    assert all(row["delta_theorem1"] is None and row["delta_exact"] is not None for row in below)


def test_guarantee_sdgs_table() -> None:
    result = cli("guarantee", "sdgs", "--k", "20", "--beta", "0.1", "--epsilon", "1")
    assert result.returncode == 0 and "4.07e-14" in result.stdout


def test_calibrate_sdgs_each_unknown() -> None:
    k = json.loads(cli("calibrate", "sdgs", "--beta", "0.1", "--epsilon", "1", "--delta", "1e-9", "--json").stdout)
    assert set(k) >= {"k", "beta", "epsilon", "delta"} and k["delta"] <= 1e-9
    assert delta_theorem1(k["k"] - 1, 0.1, 1.0).delta > 1e-9
    eps = json.loads(cli("calibrate", "sdgs", "--k", "20", "--beta", "0.1", "--delta", "1e-9", "--json").stdout)
    assert eps["delta"] <= 1e-9 and eps["epsilon"] < 1.0
    auto = json.loads(cli("calibrate", "sdgs", "--k", "20", "--beta", "auto", "--epsilon", "1", "--json").stdout)
    assert auto["beta"] == pytest.approx(1 - 2.718281828459045**-1)
    beta = json.loads(
        cli(
            "calibrate",
            "sdgs",
            "--k",
            "20",
            "--epsilon",
            "1",
            "--delta",
            "1e-9",
            "--json",
            "--accounting",
            "approximate",
        ).stdout
    )
    assert beta["delta"] <= 1e-9 and 0 < beta["beta"] < 1


def test_calibrate_identifiability_and_splu() -> None:
    result = json.loads(
        cli(
            "calibrate",
            "identifiability",
            "--rho",
            "0.1",
            "--lower",
            "1",
            "--upper",
            "99",
            "--query",
            "mean",
            "--rows",
            "48842",
            "--json",
        ).stdout
    )
    assert result["feasible"] and result["lambda"] == pytest.approx(0.000840, rel=1e-3)
    infeasible = cli(
        "calibrate",
        "identifiability",
        "--rho",
        "0.001",
        "--lower",
        "1",
        "--upper",
        "99",
        "--query",
        "mean",
        "--rows",
        "48842",
        "--json",
    )
    assert infeasible.returncode == 1
    body = json.loads(infeasible.stdout)
    assert body["feasible"] is False and body["lambda"] is None
    splu = json.loads(
        cli("calibrate", "splu", "--gamma", "10", "--eps", "0.3", "--alpha", "3", "--t-e", "0.05", "--json").stdout
    )
    assert splu["t_p"] >= 0.6 and "t_f" in splu


def test_plan_example_policies() -> None:
    ok = cli("plan", "policies/examples/demo.yaml", "--json")
    assert ok.returncode == 0, ok.stderr
    body = json.loads(ok.stdout)
    assert body["passed"] and body["policy"]["name"] == "demo-census"
    assert body["event_tree"]["event"]["kind"] == "composed"
    text = cli("plan", "policies/examples/demo.yaml")
    assert "all targets met" in text.stdout


def test_plan_target_not_met(tmp_path: Path) -> None:
    policy = (REPO / "policies/examples/demo.yaml").read_text().replace("max_epsilon: 4.5", "max_epsilon: 0.5")
    (tmp_path / "p.yaml").write_text(policy)
    result = cli("plan", str(tmp_path / "p.yaml"))
    assert result.returncode == 1 and "FAIL" in result.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (("plan", "no-such.yaml"), "no-such.yaml"),
        (("guarantee", "sdgs", "--k", "0", "--beta", "0.1", "--epsilon", "1"), "k must be"),
        (("guarantee", "sdgs", "--k", "5", "--beta", "1.2", "--epsilon", "1"), "beta must be in (0, 1]"),
        (("guarantee", "sdgs", "--k", "5", "--beta", "0.1", "--epsilon", "-1"), "epsilon must be"),
        (("guarantee", "sdgs", "--k", "x", "--beta", "0.1", "--epsilon", "1"), "--k must be"),
        (("calibrate", "sdgs", "--k", "5", "--beta", "0.1"), "give exactly three"),
        (("calibrate", "identifiability", "--rho", "1.5", "--lower", "1", "--upper", "9"), "rho must be in (0, 1)"),
    ],
)
def test_bad_input_exits_2_without_traceback(args, message) -> None:
    result = cli(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_plan_json_checks_are_numbers() -> None:
    """`plan --json` states each target as numbers (relation, required, achieved), never as
    text such as "<= 1e-09"; the text forms are kept apart for display."""
    done = cli("plan", str(REPO / "policies" / "examples" / "demo.yaml"), "--json")
    assert done.returncode == 0, done.stderr
    checks = json.loads(done.stdout)["checks"]
    assert checks and all(check["relation"] in ("<=", ">=") for check in checks)
    for check in checks:
        for side in ("required", "achieved"):
            value = check[side]
            numbers = value.values() if isinstance(value, dict) else [value]
            assert all(isinstance(number, (int, float)) for number in numbers), check
        relation = check["relation"]
        if not isinstance(check["required"], dict):
            holds = (
                check["achieved"] <= check["required"] if relation == "<=" else check["achieved"] >= check["required"]
            )
            assert holds == check["passed"]
    (budget,) = [check for check in checks if check["target"].startswith("fits the lifetime budget")]
    assert set(budget["required"]) == {"epsilon", "delta"} and budget["text"]["required"] == "eps <= 20, delta <= 1e-06"


def test_plan_tables_show_no_raw_python() -> None:
    """The human plan at 80 columns: facts as `name: value` lines, never a Python dict or True."""
    done = subprocess.run(
        [sys.executable, "-m", "privrelease", "plan", str(REPO / "policies" / "examples" / "demo.yaml")],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "80"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "{'" not in done.stdout and "True" not in done.stdout and "False" not in done.stdout
    assert "k anonymity:" in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
