"""`guarantee compose`, `ledger runway` and the runway in `ledger show`, as a user runs them:
JSON shapes, numbers that agree with the composition module, exit codes, no tracebacks."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from privrelease.audit import approvals, database, ledger, records
from privrelease.mechanisms import composition
from privrelease.planning import plan_policy
from privrelease.policies import load_policy

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "policies" / "examples"


def cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "privrelease", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def test_compose_twelve_monthly_adult_releases(adult_dir) -> None:
    result = cli(
        "guarantee", "compose", str(EXAMPLES / "adult-sdgs.yaml"), "--times", "12", "--delta", "1e-6", "--json"
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert {"epsilon", "delta", "times", "method", "candidates"} <= document.keys()
    assert document["times"] == 12 and document["delta"] == 1e-6
    assert document["unit_of_privacy"]["neighbours"].startswith("add or remove one row")
    assert document["method"] == composition.PLD and document["epsilon"] < 0.5
    assert document["candidates"][composition.BASIC]["epsilon"] == pytest.approx(12.0)
    tree = plan_policy(load_policy(EXAMPLES / "adult-sdgs.yaml")).event
    assert document["epsilon"] == composition.epsilon_at([tree], 1e-6, times=12).epsilon
    back = json.loads(
        cli(
            "guarantee", "compose", str(EXAMPLES / "adult-sdgs.yaml"), "--times", "12", "--epsilon", "0.5", "--json"
        ).stdout
    )
    assert back["epsilon"] == 0.5 and back["delta"] < 1e-6


WEAK = """name: weak
version: "1"
dataset:
  id: weak-census
  path: data.csv
  columns: {sex: {type: string}}
generalization: {sex: keep}
mechanisms:
  - {name: rows, type: sdgs, columns: [sex], beta: 0.5, k: 2, epsilon: 1.0}
targets: {accounting: approximate, delta: 0.5}
"""


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--times", "0", "--delta", "1e-6"], 2, "--times must be an integer >= 1; got 0"),
        (["--times", "3", "--delta", "1.5"], 2, "--delta must be in (0, 1); got 1.5"),
        (["--times", "3"], 2, "give exactly one of --delta"),
        (["--times", "3", "--delta", "1e-6", "--epsilon", "1"], 2, "give exactly one of --delta"),
        (["--times", "3", "--epsilon", "-1"], 2, "--epsilon must be a finite number >= 0"),
    ],
)
def test_compose_bad_input(tmp_path: Path, args: list[str], code: int, message: str) -> None:
    (tmp_path / "weak.yaml").write_text(WEAK)
    result = cli("guarantee", "compose", str(tmp_path / "weak.yaml"), *args)
    assert result.returncode == code and message in result.stderr and "Traceback" not in result.stderr


def test_compose_when_no_epsilon_reaches_delta(tmp_path: Path) -> None:
    """k = 2, beta = 0.5: a cell of 2 rows is published whole with probability 1/4, an
    infinite privacy loss, so no epsilon reaches delta = 1e-6: exit 1 with the reason."""
    (tmp_path / "weak.yaml").write_text(WEAK)
    result = cli("guarantee", "compose", str(tmp_path / "weak.yaml"), "--times", "2", "--delta", "1e-6")
    assert result.returncode == 1 and "no epsilon reaches delta" in result.stderr


def test_compose_refuses_what_is_not_dp(adult_dir, tmp_path: Path) -> None:
    result = cli("guarantee", "compose", str(EXAMPLES / "adult-splu.yaml"), "--times", "2", "--delta", "1e-6")
    assert result.returncode == 2 and "not differential privacy" in result.stderr
    (tmp_path / "unsampled.yaml").write_text(WEAK.replace("beta: 0.5", "beta: 1.0"))
    result = cli("guarantee", "compose", str(tmp_path / "unsampled.yaml"), "--times", "2", "--delta", "1e-6")
    assert result.returncode == 2 and "Proposition 4" in result.stderr and "Traceback" not in result.stderr


def test_runway_fresh_and_after_charges(adult_dir, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    env = {"PRIVRELEASE_DB_URL": url, "PRIVRELEASE_WORK_DIR": str(tmp_path)}
    policy = EXAMPLES / "adult-sdgs.yaml"
    tree = plan_policy(load_policy(policy)).event
    stated = load_policy(policy).policy.targets.lifetime_budget
    budget = ledger.Budget(stated.epsilon, stated.delta)
    fresh_json = json.loads(cli("ledger", "runway", str(policy), "--json", env=env).stdout)
    expected = fresh_json["runs"]

    def fits(runs: int) -> bool:
        return composition.epsilon_at([tree], budget.delta, times=runs).epsilon <= budget.epsilon * (1 + 1e-9)

    assert fits(expected) and not fits(expected + 1)  # exactly where the composed curve crosses the budget
    engine = database.open_database(url)
    database.migrate(engine)
    assert fresh_json["spent"] == {"epsilon": 0.0, "delta": 0.0}
    assert {"runs", "spent", "after_next_run"} <= fresh_json.keys()
    with database.session(engine) as s:
        approvals.register_policy(s, approvals.policy_facts(load_policy(policy)))
        records.register_dataset(
            s,
            "ab" * 32,
            identity="adult-census",
            size_bytes=1,
            row_count=1,
            lifetime_epsilon=budget.epsilon,
            lifetime_delta=budget.delta,
            notion="approximate",
        )
        for _ in range(3):
            run = records.start_run(s, policy_sha256=load_policy(policy).sha256, code_version="test").id
            ledger.commit(s, ledger.reserve(s, "adult-census", run, tree, "approximate"))
    after = json.loads(cli("ledger", "runway", str(policy), "--json", env=env).stdout)
    assert after["runs"] == expected - 3
    assert after["unit_of_privacy"]["statement"] == "each row is taken to be a different person (dataset.person: row)"
    assert (
        "unit of privacy  each row is taken to be a different person"
        in cli("ledger", "runway", str(policy), env=env).stdout
    )
    assert after["spent"]["epsilon"] == pytest.approx(composition.epsilon_at([tree], 1e-6, times=3).epsilon)
    assert after["after_next_run"]["epsilon"] == pytest.approx(composition.epsilon_at([tree], 1e-6, times=4).epsilon)
    shown = cli("ledger", "show", "adult-census", env=env)
    assert shown.returncode == 0 and f"{expected - 3} more runs like the latest" in shown.stdout
    assert "unit of privacy  add or remove one row (each row taken to be a different person)" in shown.stdout
    assert json.loads(cli("ledger", "show", "adult-census", "--json", env=env).stdout)["runway"]["runs"] == expected - 3


def test_compose_follows_the_policys_accounting_notion_like_the_ledger(tmp_path: Path) -> None:
    """The demo policy accounts under the papers' probabilistic notion: `guarantee compose`
    answers under it (stated points add up, Theorem 2), as `ledger runway` charges it; it
    reported approximate DP for the same policy (issue 15, item 14)."""
    policy = EXAMPLES / "demo.yaml"
    plan = plan_policy(load_policy(policy))
    assert plan.notion == "probabilistic"
    stated = plan.guarantee
    document = json.loads(
        cli("guarantee", "compose", str(policy), "--times", "3", "--epsilon", "1000", "--json").stdout
    )
    assert document["notion"] == "probabilistic" and document["method"] == composition.SEQUENTIAL
    assert document["delta"] == pytest.approx(3 * stated.delta, rel=1e-12)
    env = {"PRIVRELEASE_DB_URL": f"sqlite:///{tmp_path / 'audit.db'}", "PRIVRELEASE_WORK_DIR": str(tmp_path)}
    database.migrate(database.open_database(env["PRIVRELEASE_DB_URL"]))
    runway = json.loads(cli("ledger", "runway", str(policy), "--json", env=env).stdout)
    assert runway["notion"] == "probabilistic"
    assert runway["this_run"]["epsilon"] == pytest.approx(stated.epsilon, rel=1e-12)
    assert runway["this_run"]["delta"] == pytest.approx(stated.delta, rel=1e-12)
    one = json.loads(
        cli("guarantee", "compose", str(policy), "--times", "1", "--delta", str(2 * stated.delta), "--json").stdout
    )
    assert one["epsilon"] == pytest.approx(runway["this_run"]["epsilon"], rel=1e-12)


@pytest.mark.parametrize("times", ["1000000000", "1000000000000000"])
def test_compose_answers_any_count(adult_dir, times: str) -> None:
    """`--times 10^9` never finished (10^6 took 12.6 s, issue 15, item 8): beyond
    PLD_MAX_RELEASES the closed forms answer (the Rényi bound, tighter than advanced composition,
    KOV Theorem 3.5). A billion runs of adult-noisy ended in an OverflowError traceback (issue
    25, item 7): the stated deltas add past delta, and the Rényi bound answers."""
    for name in ("adult-identifiable.yaml", "adult-noisy.yaml"):
        policy = EXAMPLES / name
        result = cli("guarantee", "compose", str(policy), "--times", times, "--delta", "1e-6", "--json")
        assert result.returncode == 0, result.stderr
        document = json.loads(result.stdout)
        assert document["method"] == composition.RENYI and composition.PLD not in document["candidates"]
        tree = plan_policy(load_policy(policy)).event
        assert document["epsilon"] == composition.epsilon_at([tree], 1e-6, times=int(times)).epsilon
        advanced = document["candidates"][composition.ADVANCED]["epsilon"]  # None: no epsilon (adult-noisy)
        assert document["epsilon"] < (advanced if advanced is not None else math.inf)
