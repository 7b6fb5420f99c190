"""Accuracy targets in the policy (targets.accuracy): validated against the mechanisms they
name, checked by `plan` like the privacy targets (exit 1 when unmet), from data-free
statements only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from privrelease.errors import UserError
from privrelease.mechanisms.accuracy import count_accuracy, laplace_half_width
from privrelease.planning import plan_policy
from privrelease.policies import load_policy_text

REPO = Path(__file__).resolve().parents[1]

POLICY = """name: accurate
version: "1"
dataset:
  id: accurate-census
  path: data.csv
  rows: 1000
  columns: {sex: {type: string, values: [a, b]}, age: {type: integer}}
generalization: {sex: keep}
mechanisms:
  - {name: rows, type: sdgs, columns: [sex], beta: 0.1, k: 20, epsilon: 1.0}
  - {name: mean-age, type: identifiable_statistic, query: mean, column: age, lower: 0, upper: 100, rho: 0.05}
targets:
  accounting: approximate
  delta: 1.0e-6
  accuracy:
{targets}
"""


def plan_of(targets: str, tmp_path: Path):
    return plan_policy(load_policy_text(POLICY.replace("{targets}", targets), tmp_path))


def accuracy_checks(plan) -> list:
    return [check for check in plan.checks if "accuracy" in check.target]


def test_targets_pass_and_fail_by_the_exact_statements(tmp_path: Path) -> None:
    plan = plan_of(
        "    - {mechanism: rows, count: 1000, relative_error: 0.25, confidence: 0.95}\n"
        "    - {mechanism: rows, count: 200, relative_error: 0.25, confidence: 0.95}\n"
        "    - {mechanism: mean-age, absolute_error: 0.5, confidence: 0.99}\n",
        tmp_path,
    )
    big, small, mean = accuracy_checks(plan)
    assert big.passed and big.value == count_accuracy(20, 0.1, 1000, relative_error=0.25).within
    assert not small.passed and small.value == pytest.approx(0.434, abs=1e-3)  # half the cells of 200 are suppressed
    scale = next(m for m in plan.mechanisms if m.name == "mean-age").facts["lambda"]
    assert mean.value == laplace_half_width(scale, 0.99) and mean.passed == (mean.value <= 0.5)
    assert not plan.passed


def test_every_interval_of_a_mechanism_is_stated_at_its_targets_confidence(tmp_path: Path) -> None:
    """A target at 90% puts the data-free table of cell sizes, its report heading and the
    intervals of the published counts all at 90% (not a fixed 95%)."""
    from privrelease.reports.render import _accuracy

    plan = plan_of("    - {mechanism: rows, count: 1000, relative_error: 0.25, confidence: 0.9}\n", tmp_path)
    statement = plan.accuracy["rows"]
    assert {cell.confidence for cell in statement.cells} == {0.9}
    assert statement.published_counts is not None and statement.published_counts.confidence == 0.9
    cell = next(cell for cell in statement.cells if cell.count == 1000)
    assert cell.interval == count_accuracy(20, 0.1, 1000, confidence=0.9).interval
    assert cell.interval != count_accuracy(20, 0.1, 1000).interval
    view = _accuracy(statement)
    assert view is not None and view["interval_level"] == "90%"


@pytest.mark.parametrize(
    ("target", "message"),
    [
        (
            "{mechanism: nobody, count: 10, relative_error: 0.1}",
            "names no mechanism: 'nobody'; mechanisms: rows, mean-age",
        ),
        ("{mechanism: rows, absolute_error: 3}", "states count and relative_error; got absolute_error"),
        ("{mechanism: mean-age, count: 10, relative_error: 0.1}", "states absolute_error; got count, relative_error"),
        ("{mechanism: rows, count: 10, relative_error: 0.1, confidence: 1.5}", "confidence"),
        (
            "{mechanism: rows, count: 10, relative_error: 0.1, confidence: 0.3}",
            "confidence must be a number in [0.5, 1); got 0.3",
        ),
        ("{mechanism: rows, count: 0, relative_error: 0.1}", "count"),
    ],
)
def test_bad_targets_name_the_field(tmp_path: Path, target: str, message: str) -> None:
    with pytest.raises(UserError, match="targets.accuracy") as info:
        plan_of(f"    - {target}\n", tmp_path)
    assert message in str(info.value)


def test_plan_exits_1_on_an_unmet_accuracy_target(tmp_path: Path) -> None:
    text = POLICY.replace("{targets}", "    - {mechanism: rows, count: 200, relative_error: 0.1}\n")
    (tmp_path / "policy.yaml").write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "privrelease", "plan", str(tmp_path / "policy.yaml"), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    failed = [c for c in json.loads(result.stdout)["checks"] if not c["passed"]]
    assert [c["target"] for c in failed] == ["rows: accuracy at 95% (a cell of 200 people published and within +-10%)"]


def test_a_mean_is_worded_as_the_clamped_sum_over_the_declared_rows(tmp_path: Path) -> None:
    """A mean publishes (clamped sum + noise) / dataset.rows, the mean only for a file of exactly
    that many rows: its statement (report, release.json), target row, frontier caption and plan
    line say so in one wording (the kind's ``quantity``); plan prints that line although the
    mean has no groups."""
    text = POLICY.replace("{targets}", "    - {mechanism: mean-age, absolute_error: 0.5, confidence: 0.95}\n")
    loaded = load_policy_text(text, tmp_path)
    mechanism = loaded.policy.mechanism("mean-age")
    quantity = "clamped sum of age divided by the declared dataset.rows = 1000 (the mean only if the data has exactly 1000 rows)"
    assert mechanism.quantity(loaded) == quantity
    plan = plan_policy(loaded)
    statement = plan.accuracy["mean-age"]
    assert statement.as_dict()["estimate"] == statement.estimate == f"the published value of the {quantity}"
    (check,) = accuracy_checks(plan)
    assert check.target == f"mean-age: accuracy at 95% (noise half-width on the {quantity})"
    frontier = mechanism.frontier(loaded)
    assert frontier is not None
    assert f"the published value is within ± the half-width of the true {quantity} with probability 95%" in (
        frontier.note
    )
    (tmp_path / "policy.yaml").write_text(text)
    result = subprocess.run(
        [sys.executable, "-m", "privrelease", "plan", str(tmp_path / "policy.yaml")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "COLUMNS": "400"},
    )
    assert result.returncode == 0, result.stderr
    half = laplace_half_width(plan.mechanisms[1].facts["lambda"], 0.95)
    line = f"accuracy of mean-age: the published value of the {quantity} is within +-{half:.4g} of the true one"
    assert line in result.stdout
