"""`guarantee compose`, `ledger runway` and the runway in `ledger show`, as a user runs them:
JSON shapes, numbers that agree with the composition module, exit codes, no tracebacks."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

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
    once = cli("guarantee", "compose", str(EXAMPLES / "adult-sdgs.yaml"), "--times", "1", "--delta", "1e-6")
    assert "1 run of adult-sdgs (1 release): " in once.stdout


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


def _two_runs() -> float:
    """A lifetime epsilon (at delta 1e-6) that two runs of adult-sdgs fit and three do not."""
    tree = plan_policy(load_policy(EXAMPLES / "adult-sdgs.yaml")).event
    budget = math.ceil(composition.epsilon_at([tree], 1e-6, times=2).epsilon * 1e4) / 1e4
    assert composition.epsilon_at([tree], 1e-6, times=3).epsilon > budget
    return budget


def _small(adult_dir: Path, tmp_path: Path, name: str, *changes: tuple[str, str]) -> Path:
    """adult-sdgs.yaml with lifetime budget (:func:`_two_runs`, 1e-6) and ``changes`` (old,
    new) made, written to ``tmp_path``."""
    text = (EXAMPLES / "adult-sdgs.yaml").read_text().replace("../../../shared/data/adult/", f"{adult_dir}/")
    for old, new in (("lifetime_budget: {epsilon: 10,", f"lifetime_budget: {{epsilon: {_two_runs()},"), *changes):
        assert old in text, old
        text = text.replace(old, new)
    (tmp_path / f"{name}.yaml").write_text(text)
    return tmp_path / f"{name}.yaml"


@pytest.fixture
def small_ledger(adult_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An audit database (the commands' ``PRIVRELEASE_DB_URL``) with adult-census registered at
    (:func:`_two_runs`, 1e-6) under approximate DP; ``charge()`` commits one more run of
    adult-sdgs to it."""
    from typer.testing import CliRunner

    from privrelease.cli import app

    url = f"sqlite:///{tmp_path / 'audit.db'}"
    monkeypatch.setenv("PRIVRELEASE_DB_URL", url)
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path))
    monkeypatch.delenv("PRIVRELEASE_DEFAULT_LIFETIME_BUDGET", raising=False)
    policy = _small(adult_dir, tmp_path, "small")
    loaded = load_policy(policy)
    engine = database.open_database(url, create=True)
    with database.session(engine) as s:
        approvals.register_policy(s, approvals.policy_facts(loaded))
        records.register_dataset(
            s,
            "ab" * 32,
            identity="adult-census",
            size_bytes=1,
            row_count=1,
            lifetime_epsilon=_two_runs(),
            lifetime_delta=1e-6,
            notion="approximate",
        )

    def charge() -> None:
        with database.session(engine) as s:
            run = records.start_run(s, policy_sha256=loaded.sha256, code_version="test").id
            ledger.commit(s, ledger.reserve(s, "adult-census", run, plan_policy(loaded).event, "approximate"))

    def invoke(*args: str) -> Any:
        return CliRunner().invoke(app, list(args))

    yield SimpleNamespace(policy=policy, engine=engine, charge=charge, invoke=invoke)
    database.dispose_engines()


def test_runway_and_plan_refuse_what_run_refuses(adult_dir: Path, tmp_path: Path, small_ledger: Any) -> None:
    """A policy stating another lifetime budget or accountant than its dataset's registered one,
    or none: `run` refuses it, so `ledger runway` refuses it too (exit 2, as run) and `plan`
    warns, naming both; an accountant that differs is not called a budget change (audit 5,
    findings 2 and 14)."""
    from privrelease.errors import UserError

    budget = _two_runs()
    registered = (
        f"dataset adult-census already has lifetime budget epsilon={budget:g}, delta=1e-06 under the approximate "
        "accountant"
    )
    cases = {
        "budget": (
            (f"lifetime_budget: {{epsilon: {budget},", "lifetime_budget: {epsilon: 2,"),
            f"{registered}; got epsilon=2, delta=1e-06 (approximate): a dataset's lifetime budget cannot be changed",
        ),
        "accountant": (
            ("accounting: approximate", "accounting: probabilistic"),
            f"{registered}; got epsilon={budget:g}, delta=1e-06 (probabilistic): a dataset's accountant cannot be changed",
        ),
        "none": (
            (f"  lifetime_budget: {{epsilon: {budget}, delta: 1.0e-6}}", ""),
            f"the policy states no lifetime budget (dataset adult-census has epsilon={budget:g}, delta=1e-06 "
            "registered: state it as targets.lifetime_budget)",
        ),
    }
    for name, (change, message) in cases.items():
        policy = _small(adult_dir, tmp_path, name, change)
        refused = small_ledger.invoke("ledger", "runway", str(policy))
        assert isinstance(refused.exception, UserError) and str(refused.exception) == message, (name, refused.output)
        assert "more run" not in refused.output
        planned = small_ledger.invoke("plan", str(policy), "--json")  # its targets may fail: exit 1
        assert f"{message}: `run` refuses this policy" in json.loads(planned.output)["warnings"], name
    result = cli("ledger", "runway", str(tmp_path / "budget.yaml"))
    assert result.returncode == 2 and "a dataset's lifetime budget cannot be changed" in result.stderr
    assert "Traceback" not in result.stderr


def test_runway_ledger_and_plan_as_the_budget_runs_out(small_ledger: Any) -> None:
    """One run left: "1 more run ... fits"; none: the next run's total is said to be over the
    budget, and `plan` warns that `run` refuses the release. Under approximate DP the delta is
    where epsilon is read, not an amount spent (text and JSON: ``at_lifetime_delta``). A
    budget refusal says nothing was charged or published (audit 5, findings 8, 13 and 14)."""
    from privrelease.errors import TargetNotMet

    policy, invoke = str(small_ledger.policy), small_ledger.invoke
    small_ledger.charge()
    one = invoke("ledger", "runway", policy)
    assert one.exit_code == 0 and "1 more run of adult-sdgs fits the lifetime budget of adult-census" in one.output
    assert "over the budget" not in one.output
    assert invoke("plan", policy, "--json").exit_code == 0
    assert not [w for w in json.loads(invoke("plan", policy, "--json").output)["warnings"] if "ledger" in w]
    small_ledger.charge()
    none = invoke("ledger", "runway", policy)
    two = composition.epsilon_at([plan_policy(load_policy(policy)).event], 1e-6, times=2).epsilon
    three = composition.epsilon_at([plan_policy(load_policy(policy)).event], 1e-6, times=3).epsilon
    assert "0 more runs of adult-sdgs fit the lifetime budget" in none.output
    assert f"spent now        epsilon={two:g} at the lifetime delta 1e-06\n" in none.output
    assert f"after next run   epsilon={three:g} at the lifetime delta 1e-06: over the budget, so `run` refuses it" in (
        none.output
    )
    runway = json.loads(invoke("ledger", "runway", policy, "--json").output)
    assert runway["runs"] == 0 and runway["at_lifetime_delta"] is True
    left = f"epsilon={_two_runs() - two:g} at the lifetime delta 1e-06"
    warning = (
        f"the ledger of adult-census has too little left for this release ({left} remains): "
        "`run` refuses this policy (`privrelease ledger runway`)"
    )
    planned = invoke("plan", policy, "--json")
    assert planned.exit_code == 0 and warning in json.loads(planned.output)["warnings"]
    assert "all targets met (but see the" in invoke("plan", policy).output
    shown = invoke("ledger", "show", "adult-census")
    assert f"remaining        {left}\n" in shown.output
    assert f"spent            epsilon={two:g} at the lifetime delta 1e-06  (" in shown.output
    document = json.loads(invoke("ledger", "show", "adult-census", "--json").output)
    assert document["at_lifetime_delta"] is True and document["remaining"]["delta"] == 1e-6
    listed = invoke("ledger", "list")
    assert "delta spent / budget" in listed.output and "1e-06 / 1e-06" not in listed.output
    assert "not spent: epsilon is at the lifetime delta 1e-06" in " ".join(listed.output.split())
    assert json.loads(invoke("ledger", "list", "--json").output)["datasets"][0]["at_lifetime_delta"] is True
    with database.session(small_ledger.engine, readonly=True) as s:
        status = ledger.ledger_status(s, "adult-census")
    with pytest.raises(TargetNotMet, match="; nothing was charged or published$"):
        ledger.check_fits(status, plan_policy(load_policy(policy)).event)


def test_ledger_commands_show_no_figures_of_a_tampered_ledger(small_ledger: Any) -> None:
    """A committed charge edited into a refund: `ledger show`, `list` and `runway` refuse as the
    next run would (exit 1), naming the problem and `audit verify`, and print no figures."""
    import sqlalchemy as sa

    from privrelease.errors import AuditRefused

    small_ledger.charge()
    small_ledger.charge()
    with small_ledger.engine.begin() as connection:
        connection.execute(sa.text("UPDATE ledger_entry SET epsilon = 0.01, state = 'released' WHERE id = 1"))
    for args in (
        ("ledger", "show", "adult-census"),
        ("ledger", "list"),
        ("ledger", "runway", str(small_ledger.policy)),
    ):
        refused = small_ledger.invoke(*args)
        assert isinstance(refused.exception, AuditRefused) and refused.exception.exit_code == 1, args
        message = str(refused.exception)
        assert message.startswith("the ledger does not match its audit records (ledger entry 1 was edited after record")
        assert message.endswith("): no figures shown (`privrelease audit verify` names every problem)")
        assert "epsilon" not in refused.output


def test_compose_under_the_probabilistic_notion_with_no_delta_below_one(tmp_path: Path) -> None:
    """At an epsilon below the stated epsilons' sum the probabilistic notion gives delta 1,
    which guarantees nothing: exit 1 with the reason, as when no epsilon reaches a delta (audit 5,
    finding 11)."""
    policy = EXAMPLES / "demo.yaml"
    plan = plan_policy(load_policy(policy))
    total = composition.summed(composition.releases_of([plan.event], 3), "probabilistic").epsilon
    result = cli("guarantee", "compose", str(policy), "--times", "3", "--epsilon", "0.5")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert (
        "error: no delta below 1 at epsilon 0.5 for 3 runs of demo-census "
        f"(the probabilistic notion adds the stated epsilons: {total:g})"
    ) in " ".join(result.stderr.split())
