"""``guarantee compose`` and ``ledger runway``: how long a schedule of releases can go on.

Both compose under the accounting notion the policy names (``targets.accounting``), as the
ledger charges it: approximate (eps, delta)-DP by the tightest sound method, or the papers'
probabilistic notion by adding the stated points (:mod:`privrelease.mechanisms.composition`);
they read no data.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from privrelease.cli.output import print_json, say
from privrelease.errors import TargetNotMet

if TYPE_CHECKING:
    from privrelease.planning import Plan

JSON = typer.Option(False, "--json", help="Print one JSON document instead of text.")


def register(app: typer.Typer) -> None:
    from privrelease.cli.audit import ledger_app
    from privrelease.cli.calculus import guarantee_app

    guarantee_app.command("compose")(guarantee_compose)
    ledger_app.command("runway")(ledger_runway)


def _release_tree(path: Path) -> Plan:
    """The plan of one run of the policy at ``path``; UserError for what is not DP."""
    from privrelease.planning import dp_plan
    from privrelease.policies import load_policy

    return dp_plan(load_policy(path))


def _number(value: float) -> str:
    return f"{value:.6g}" if math.isfinite(value) else "none"


def guarantee_compose(
    policy: Path = typer.Argument(..., help="The release policy (YAML)."),
    times: int = typer.Option(..., "--times", help="How many runs of the policy's release to compose (>= 1)."),
    delta: float | None = typer.Option(None, "--delta", help="Find the smallest epsilon at this delta, in (0, 1)."),
    epsilon: float | None = typer.Option(None, "--epsilon", help="Find the delta at this epsilon (>= 0)."),
    json_out: bool = JSON,
) -> None:
    """The (epsilon, delta)-DP of TIMES runs of a policy's release under the policy's accounting
    notion, composed by the tightest sound method (privacy loss distributions, optimal,
    advanced or basic composition; under the probabilistic notion the stated points add up).
    Reads no data."""
    from privrelease.planning import composed_runs

    plan = _release_tree(policy)
    result = composed_runs(plan, times=times, delta=delta, epsilon=epsilon, option="--")
    document = {
        "policy": plan.loaded.policy.name,
        "notion": plan.notion,
        "unit_of_privacy": plan.unit_of_privacy,
        "times": times,
        **result.as_dict(),
    }
    if json_out:
        print_json(document)
    else:
        runs = f"{times} run{'s' if times != 1 else ''}"
        say(
            f"{runs} of {plan.loaded.policy.name} ({result.releases} release{'s' if result.releases != 1 else ''}): "
            f"({_number(result.epsilon)}, {result.delta:.6g})-DP ({plan.notion}) by {result.method}"
        )
        for method, (eps, dlt) in result.candidates.items():
            say(f"  {method}: epsilon {_number(eps)}, delta {dlt:.6g}")
        say(f"unit of privacy: {plan.unit_of_privacy['statement']}")
    if not math.isfinite(result.epsilon):
        raise TargetNotMet(f"no epsilon reaches delta = {delta:g} for {times} runs of {plan.loaded.policy.name}")
    if result.delta >= 1:
        raise TargetNotMet(_no_delta(plan, times, result.epsilon))


def _no_delta(plan: Plan, times: int, epsilon: float) -> str:
    """Why ``times`` runs of ``plan`` have no guarantee at ``epsilon`` (their delta there is 1)."""
    from privrelease.mechanisms import composition

    why = "a delta of 1 guarantees nothing"
    if plan.notion == "probabilistic":
        stated = composition.summed(composition.releases_of([plan.event], times), plan.notion).epsilon
        why = f"the probabilistic notion adds the stated epsilons: {stated:g}"
    runs = f"{times} run{'s' if times != 1 else ''}"
    return f"no delta below 1 at epsilon {epsilon:g} for {runs} of {plan.loaded.policy.name} ({why})"


def ledger_runway(
    policy: Path = typer.Argument(..., help="The release policy (YAML) whose next runs are counted."),
    json_out: bool = JSON,
) -> None:
    """How many more runs of a policy fit its dataset's lifetime budget, given what the
    ledger already holds for the dataset. Reads no data."""
    from privrelease.audit import ledger
    from privrelease.cli.audit import checked_session, runs_fit

    plan = _release_tree(policy)
    with checked_session() as s:
        status, result = ledger.policy_runway(s, plan)
    dataset = status.dataset.id
    document = {
        "policy": plan.loaded.policy.name,
        "dataset": dataset,
        "notion": status.dataset.notion,
        "unit_of_privacy": plan.unit_of_privacy,
        "runs": result.runs,
        "capped": result.capped,
        "budget": result.budget.as_dict(),
        "spent": result.spent.as_dict(),
        "after_next_run": result.after_next_run.as_dict(),
        "this_run": result.this_run.as_dict(),
        "at_lifetime_delta": status.at_lifetime_delta,
    }
    if json_out:
        print_json(document)
        return
    say(f"{runs_fit(result, f'of {plan.loaded.policy.name}')} the lifetime budget of {dataset} ({result.budget})")
    say(f"spent now        {status.shown(result.spent)}")
    over = "" if result.runs else ": over the budget, so `run` refuses it"
    say(f"after next run   {status.shown(result.after_next_run)}{over}")
    say(f"unit of privacy  {plan.unit_of_privacy['statement']}")
