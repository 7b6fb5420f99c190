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


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "privrelease", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env=None if env is None else {**os.environ, **env},
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


def test_guarantee_sdgs_table_shows_an_underflowed_delta_as_its_power_of_ten() -> None:
    """Below the smallest double the float is only a bound (4.94e-324): the table prints the
    exact power of ten the JSON carries, as ``10^...``."""
    args = ("guarantee", "sdgs", "--k", "100000", "--beta", "0.01", "--epsilon", "0.02")
    (row,) = json.loads(cli(*args, "--json").stdout)
    shown = cli(*args).stdout
    assert "e-324" not in shown
    for key in ("log10_delta_theorem1", "log10_delta_exact"):
        assert row[key] < -300 and f"10^{row[key]:.2f}" in shown


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
    assert "all targets met" in text.stdout and "; neighbours add or remove one row" in text.stdout


def test_plan_of_a_release_without_dp_names_no_neighbouring_relation(adult_dir) -> None:
    """SPLU-Gen is not differentially private: plan states the unit of privacy and says no
    neighbouring relation applies, instead of naming one. Its facts carry the report's labels
    (T_p, T_f), never their keys."""
    from privrelease.reports.labels import fact_label

    env = {"PRIVRELEASE_DATA_ROOTS": str(adult_dir.parent), "COLUMNS": "250"}
    splu = cli("plan", "policies/examples/adult-splu.yaml", env=env)
    words = " ".join(splu.stdout.split())
    assert "not differentially private: no neighbouring relation applies" in words, splu.stderr
    (facts,) = [
        m["facts"]
        for m in json.loads(cli("plan", "policies/examples/adult-splu.yaml", "--json", env=env).stdout)["mechanisms"]
    ]
    for key in ("t_p", "t_p_argmin_f", "t_f"):
        assert f"{fact_label(key)}: {facts[key]:g}" in words
    assert fact_label("t_p") == "small-sum privacy T_p" and "t p:" not in words and "not dp:" not in words


def test_plan_target_not_met(tmp_path: Path) -> None:
    policy = (REPO / "policies/examples/demo.yaml").read_text().replace("max_epsilon: 4.5", "max_epsilon: 0.5")
    (tmp_path / "p.yaml").write_text(policy)
    result = cli("plan", str(tmp_path / "p.yaml"))
    assert result.returncode == 1 and "FAIL" in result.stdout


def test_plan_warns_that_run_refuses_a_policy_without_a_lifetime_budget(tmp_path: Path) -> None:
    """Without ``targets.lifetime_budget`` and without the setting, plan's targets may all pass
    but ``run`` refuses the release (:data:`privrelease.settings.NO_LIFETIME_BUDGET`): plan says
    so beside its verdict, in text and JSON; with the setting it does not."""
    from privrelease.settings import NO_LIFETIME_BUDGET

    policy = (
        (REPO / "policies/examples/demo.yaml")
        .read_text()
        .replace("  lifetime_budget: {epsilon: 20, delta: 1.0e-6}\n", "")
    )
    (tmp_path / "p.yaml").write_text(policy)
    env = {key: value for key, value in os.environ.items() if key != "PRIVRELEASE_DEFAULT_LIFETIME_BUDGET"}

    def plan(*options: str, **extra: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "privrelease", "plan", str(tmp_path / "p.yaml"), *options]
        return subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120, env={**env, **extra})

    text = plan()
    assert text.returncode == 0 and f"warning: {NO_LIFETIME_BUDGET}: `run` refuses this policy" in " ".join(
        text.stdout.split()
    )
    assert "all targets met (but see the 1 warning(s) above)" in text.stdout
    body = json.loads(plan("--json").stdout)
    assert body["passed"] and body["warnings"] == [f"{NO_LIFETIME_BUDGET}: `run` refuses this policy"]
    assert "warning" not in plan(PRIVRELEASE_DEFAULT_LIFETIME_BUDGET="[20, 1e-6]").stdout


@pytest.mark.parametrize(
    "args, message",
    [
        (("plan", "no-such.yaml"), "no-such.yaml"),
        (("guarantee", "sdgs", "--k", "0", "--beta", "0.1", "--epsilon", "1"), "k must be"),
        (
            ("guarantee", "sdgs", "--k", "5", "--beta", "1.2", "--epsilon", "1"),
            "--beta must be in [0.0001, 1]; got 1.2",
        ),
        (("guarantee", "sdgs", "--k", "5", "--beta", "0.1", "--epsilon", "-1"), "epsilon must be"),
        (("guarantee", "sdgs", "--k", "x", "--beta", "0.1", "--epsilon", "1"), "--k must be"),
        (("calibrate", "sdgs", "--k", "5", "--beta", "0.1"), "give exactly three"),
        (
            ("calibrate", "sdgs", "--k", "20", "--beta", "0.1,0.2", "--epsilon", "1"),
            "--beta takes one number in [0.0001, 1] or 'auto'; got '0.1,0.2'",
        ),
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
    assert "k-anonymity:" in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 80


# --- noisy counts --------------------------------------------------------------------------------


def test_calibrate_noisy_counts_gaussian_and_laplace_json() -> None:
    """The values are the kind's own functions', the policy's noise section rounded up (it still
    meets the target), the half-width what the accuracy command states for that noise."""
    from privrelease.mechanisms.kinds.noisy_counts import (
        approximate_delta,
        calibrate_scale,
        calibrate_sigma,
        half_width,
    )

    done = cli("calibrate", "noisy-counts", "--epsilon", "1", "--delta", "1e-6", "--json")
    assert done.returncode == 0, done.stderr
    gaussian = json.loads(done.stdout)
    assert set(gaussian) == {
        "distribution",
        "sigma",
        "sensitivity",
        "epsilon",
        "delta",
        "delta_achieved",
        "confidence",
        "half_width",
        "noise",
    }
    sigma = calibrate_sigma(1.0, 1e-6)
    assert gaussian["distribution"] == "gaussian" and gaussian["sigma"] == sigma
    assert gaussian["delta_achieved"] == approximate_delta("gaussian", sigma, 1.0) <= 1e-6
    assert gaussian["half_width"] == half_width("gaussian", sigma, 0.95) == 8
    noise = gaussian["noise"]
    assert noise["distribution"] == "gaussian" and sigma <= noise["sigma"] <= sigma * (1 + 1e-9)
    accuracy = cli(
        "guarantee", "accuracy", "noisy-counts", "--distribution", "gaussian", "--sigma", str(sigma), "--json"
    )
    assert json.loads(accuracy.stdout) == {
        "distribution": "gaussian",
        "sigma": sigma,
        "confidence": 0.95,
        "half_width": 8,
    }

    laplace = json.loads(cli("calibrate", "noisy-counts", "--epsilon", "0.2", "--confidence", "0.99", "--json").stdout)
    assert laplace["distribution"] == "laplace" and laplace["scale"] == calibrate_scale(0.2) == 5.0
    assert laplace["delta"] is None and laplace["delta_achieved"] == 0.0 and "sigma" not in laplace
    assert laplace["half_width"] == half_width("laplace", 5.0, 0.99)
    assert laplace["noise"] == {"distribution": "laplace", "scale": 5.0}


@pytest.mark.parametrize("delta", [1e-6, None])
def test_calibrate_noisy_counts_for_people_with_several_rows(tmp_path: Path, delta: float | None) -> None:
    """--max-rows m calibrates for a table of sensitivity m: the discrete Laplace scale m/epsilon,
    the Gaussian sigma by the zCDP bound a person of m rows gets (scale-free: m times the sigma
    of rho at m = 1, checked against m = 2), and the noise it prints, put in a policy whose
    person has at most m rows, plans to at most epsilon 1 (at the target delta); a relative 3e-6
    less noise plans above it."""
    from privrelease.mechanisms import zcdp
    from privrelease.mechanisms.kinds.noisy_counts import calibrate_sigma
    from privrelease.planning import plan_policy
    from privrelease.policies import load_policy_text

    args = ["calibrate", "noisy-counts", "--epsilon", "1", "--max-rows", "3", "--json"]
    body = json.loads(cli(*args, *(["--delta", str(delta)] if delta else [])).stdout)
    assert body["sensitivity"] == 3
    name = "sigma" if delta else "scale"
    if delta is None:
        assert body["scale"] == 3.0 and body["delta_achieved"] == 0.0
    else:
        sigma = body["sigma"]
        assert sigma == calibrate_sigma(1.0, delta, 3)
        assert sigma / 3 == pytest.approx(calibrate_sigma(1.0, delta, 2) / 2, rel=3e-6)
        assert body["delta_achieved"] == zcdp.approximate_delta(9 / (2 * sigma**2), 1.0) <= delta
        assert zcdp.approximate_delta(9 / (2 * (sigma * (1 - 3e-6)) ** 2), 1.0) > delta
    for parameter, meets in ((body["noise"][name], True), (body["noise"][name] * (1 - 3e-6), False)):
        text = f"""
name: people
version: "1"
dataset:
  id: people
  path: people.csv
  person: {{column: id, max_rows: 3}}
  columns: {{id: {{type: string}}, sex: {{type: string, values: [F, M]}}}}
generalization: {{sex: keep}}
mechanisms:
  - {{name: counts, type: noisy_counts, columns: [sex], noise: {{distribution: {body["distribution"]}, {name}: {parameter!r}}}}}
targets: {{accounting: approximate, {"delta: " + str(delta) if delta else "max_epsilon: 1"}}}
"""
        plan = plan_policy(load_policy_text(text, tmp_path))
        guarantee = plan.composed["approximate"]
        assert (guarantee.epsilon <= 1.0) is meets, (parameter, guarantee)  # at the target delta, if any
    refused = cli("calibrate", "noisy-counts", "--epsilon", "1", "--max-rows", "0")
    assert refused.returncode == 2 and "--max-rows must be an integer in [1, 1000]; got 0" in refused.stderr


def test_calibrate_noisy_counts_table() -> None:
    done = cli("calibrate", "noisy-counts", "--epsilon", "1", "--delta", "1e-6")
    assert done.returncode == 0, done.stderr
    assert "4.230781075" in done.stdout and "+-8" in done.stdout
    assert "noise: {distribution: gaussian, sigma: 4.230781075}" in done.stdout


@pytest.mark.parametrize(
    ("distribution", "option", "value", "confidence"),
    [("gaussian", "--sigma", 20.0, 0.95), ("gaussian", "--sigma", 0.5, 0.5), ("laplace", "--scale", 5.0, 0.999)],
)
def test_guarantee_accuracy_noisy_counts(distribution: str, option: str, value: float, confidence: float) -> None:
    from privrelease.mechanisms.kinds.noisy_counts import half_width

    args = ("guarantee", "accuracy", "noisy-counts", "--distribution", distribution, option, str(value))
    done = cli(*args, "--confidence", str(confidence), "--json")
    assert done.returncode == 0, done.stderr
    body = json.loads(done.stdout)
    assert body == {
        "distribution": distribution,
        option[2:]: value,
        "confidence": confidence,
        "half_width": half_width(distribution, value, confidence),
    }
    text = cli(*args, "--confidence", str(confidence))
    assert (
        f"each cell within +-{body['half_width']} of its true count with probability >= {confidence:g}" in text.stdout
    )
    assert "all cells at once need more (--cells N)" in text.stdout


def test_guarantee_accuracy_noisy_counts_all_cells() -> None:
    """--cells N adds the half-width of all N cells at once beside each cell's (adult-noisy:
    sigma 4.231, 20 cells: +-8 each, +-13 all at once), in JSON and in words; calibrate too."""
    from privrelease.mechanisms.kinds.noisy_counts import all_cells_half_width

    args = ("guarantee", "accuracy", "noisy-counts", "--distribution", "gaussian", "--sigma", "4.231", "--cells", "20")
    body = json.loads(cli(*args, "--json").stdout)
    assert body == {
        "distribution": "gaussian",
        "sigma": 4.231,
        "confidence": 0.95,
        "half_width": 8,
        "all_cells_half_width": 13,
    }
    assert body["all_cells_half_width"] == all_cells_half_width("gaussian", 4.231, 0.95, 20)
    assert "each cell within +-8 " in cli(*args).stdout and "all 20 cells at once within +-13" in cli(*args).stdout
    calibrated = json.loads(
        cli("calibrate", "noisy-counts", "--epsilon", "1", "--delta", "1e-6", "--cells", "100", "--json").stdout
    )
    assert calibrated["half_width"] == 8 and calibrated["all_cells_half_width"] == 15
    table = cli("calibrate", "noisy-counts", "--epsilon", "1", "--delta", "1e-6", "--cells", "1000").stdout
    assert "all 1,000 cells at once" in table and "+-17" in table


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("calibrate", "noisy-counts", "--epsilon", "0", "--delta", "1e-6"), "--epsilon must be in (0, 100]; got 0"),
        (("calibrate", "noisy-counts", "--epsilon", "-1"), "--epsilon must be in (0, 100]; got -1"),
        (("calibrate", "noisy-counts", "--epsilon", "inf"), "--epsilon must be in (0, 100]; got inf"),
        (("calibrate", "noisy-counts", "--epsilon", "1", "--delta", "1"), "--delta must be in (0, 1); got 1"),
        (("calibrate", "noisy-counts", "--epsilon", "1", "--confidence", "1.5"), "--confidence must be a number in"),
        (
            ("calibrate", "noisy-counts", "--epsilon", "1", "--cells", "0"),
            "--cells must be an integer in [1, 1,000,000]",
        ),
        (
            (
                "guarantee",
                "accuracy",
                "noisy-counts",
                "--distribution",
                "laplace",
                "--scale",
                "2",
                "--cells",
                "2000000",
            ),
            "--cells must be an integer in [1, 1,000,000]; got 2e+06",
        ),
        (("guarantee", "accuracy", "noisy-counts", "--distribution", "poisson", "--scale", "2"), "--distribution must"),
        (
            ("guarantee", "accuracy", "noisy-counts", "--distribution", "gaussian"),
            "--sigma is required for gaussian noise",
        ),
        (
            ("guarantee", "accuracy", "noisy-counts", "--distribution", "laplace", "--sigma", "2"),
            "--sigma is not a parameter of laplace noise: give --scale",
        ),
        (
            ("guarantee", "accuracy", "noisy-counts", "--distribution", "gaussian", "--sigma", "-3"),
            "--sigma must be a number in [0.01, 1e+06]; got -3",
        ),
        (
            ("guarantee", "accuracy", "noisy-counts", "--distribution", "laplace", "--scale", "nan"),
            "--scale must be a number in [0.01, 1e+06]; got nan",
        ),
    ],
)
def test_noisy_counts_bad_input_exits_2_naming_the_option(args, message) -> None:
    """One line on stderr naming the option, exit 2; with --json the same as a JSON document."""
    result = cli(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.stderr + result.stdout
    body = json.loads(cli(*args, "--json").stdout)
    assert body["exit_code"] == 2 and message in body["error"] and body["field"] == message.split()[0]


def test_calibrate_noisy_counts_beyond_the_largest_sigma_is_not_met() -> None:
    """A target no sigma up to the policies' largest reaches: exit 1, one line, no search."""
    result = cli("calibrate", "noisy-counts", "--epsilon", "1e-7", "--delta", "1e-8")
    assert result.returncode == 1 and "no discrete Gaussian sigma up to 1e+06" in result.stderr


def test_a_fact_reads_the_same_in_plan_and_report() -> None:
    """plan and the report word every fact alike: yes/no, numbers, lists, column groups, and
    mappings, nested ones included (one formatter, reports.labels.fact_text)."""
    from privrelease.cli.calculus import _facts_text
    from privrelease.reports.render import _facts

    facts = {
        "fsmooth": {"epsilon0": 0.5, "delta0": 0.25, "f(2)": 0.125},
        "levels": {"state": {"of": "county", "level": 1}, "region": {"of": "state", "level": 2}},
        "tables": [["county", "sex"], []],
        "feasible": True,
        "candidate_schemes": ["a", "b"],
        "naive_sigma": 2.5,
    }
    plan_lines = _facts_text(facts).splitlines()
    report_lines = [f"{label}: {text}" for label, text in _facts(facts)]
    assert plan_lines == report_lines
    assert "levels: state (of = county, level = 1), region (of = state, level = 2)" in plan_lines
    assert "f-smooth (Theorem 6): ε0 = 0.5, δ0 = 0.25, f(2) = 0.125" in plan_lines


@pytest.mark.parametrize("policy", ["discharges.yaml", "adult-identifiable.yaml"])
def test_plan_accuracy_lines_wrap_at_a_narrow_terminal(policy: str) -> None:
    """Every "accuracy of" line (rows counted per person, a table's or a group's half-widths, a
    kind's own rows, an ungrouped statistic's) wraps at the terminal's width, none runs past it."""
    width = 50
    result = cli("plan", f"policies/examples/{policy}", env={"COLUMNS": str(width)})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("  accuracy of "))
    end = next(i for i in range(first, len(lines)) if lines[i].startswith(("Accuracy of ", "Targets")))
    block = lines[first:end]
    assert max(len(line) for line in block) <= width, "\n".join(block)
    assert sum(line.startswith("  accuracy of ") for line in block) >= 6
