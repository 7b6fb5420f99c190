"""The plan of a release: its privacy event tree and every guarantee, computed from the policy
alone (no data is read), checked against the policy's targets.

The same event tree is what the flow realizes, the ledger charges and the report shows.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any

from privrelease.mechanisms import accountants, composition
from privrelease.mechanisms.accuracy import AccuracyStatement
from privrelease.mechanisms.events import Composed, Event, Laplace, counted, event_to_json, is_dp, leaves
from privrelease.mechanisms.guarantees import Guarantee
from privrelease.mechanisms.sdgs_math import min_theorem1_epsilon
from privrelease.policies import LoadedPolicy


@dataclass(frozen=True)
class Check:
    """One target of the policy: what it requires, what the release achieves, pass or fail."""

    target: str
    required: str
    achieved: str
    passed: bool
    relation: str | None = None
    """``<=`` or ``>=`` between ``value`` and ``limit`` (None: a yes/no check)."""
    limit: float | dict[str, float] | None = None
    value: float | dict[str, float] | None = None

    def as_dict(self) -> dict[str, Any]:
        """For JSON: numbers as numbers (``required``/``achieved``), the text forms apart."""
        return {
            "target": self.target,
            "relation": self.relation,
            "required": self.limit,
            "achieved": self.value,
            "passed": self.passed,
            "text": {"required": self.required, "achieved": self.achieved},
        }


@dataclass(frozen=True)
class MechanismPlan:
    name: str
    type: str
    event: Event
    guarantees: dict[str, Guarantee]
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    loaded: LoadedPolicy
    mechanisms: list[MechanismPlan]
    event: Composed
    composed: dict[str, Guarantee]
    facts: dict[str, Any]
    checks: list[Check]
    accuracy: dict[str, AccuracyStatement | None] = field(default_factory=dict)
    """Per mechanism name, its data-free accuracy statements (:func:`mechanism_accuracy`)."""
    warnings: tuple[str, ...] = ()
    """What the policy alone shows a run will likely miss (cells that cannot reach k: each
    kind's :meth:`~privrelease.mechanisms.kinds.MechanismKind.plan_warnings`); never a failed check."""

    @property
    def notion(self) -> accountants.Notion:
        return self.loaded.policy.targets.accounting

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def charged_event(self) -> Composed | None:
        """The differentially private part of the release, which its dataset's lifetime budget
        is charged; None when nothing is charged."""
        charged = tuple(m.event for m in self.mechanisms if is_dp(m.event))
        return Composed(events=charged) if charged else None

    @property
    def guarantee(self) -> Guarantee:
        """The composed guarantee under the notion the policy demands."""
        return self.composed[self.notion]

    @property
    def unit_of_privacy(self) -> dict[str, Any]:
        """:func:`unit_of_privacy` of the policy."""
        return unit_of_privacy(self.loaded)

    @property
    def kinds(self) -> dict[str, dict[str, str]]:
        """:func:`kind_sources` of the policy: the code each mechanism type ran from."""
        return kind_sources(self.loaded.policy)

    def as_dict(self) -> dict[str, Any]:
        policy = self.loaded.policy
        return {
            "policy": {"name": policy.name, "version": policy.version, "sha256": self.loaded.sha256},
            "accounting": self.notion,
            "unit_of_privacy": self.unit_of_privacy,
            "kinds": self.kinds,
            "mechanisms": [
                {
                    "name": m.name,
                    "type": m.type,
                    "event": json.loads(event_to_json(m.event))["event"],
                    "guarantees": {notion: g.as_dict() for notion, g in m.guarantees.items()},
                    "facts": m.facts,
                }
                for m in self.mechanisms
            ],
            "composed": {notion: g.as_dict() for notion, g in self.composed.items()},
            "facts": self.facts,
            "checks": [check.as_dict() for check in self.checks],
            "accuracy": {name: {} if s is None else s.as_dict() for name, s in self.accuracy.items()},
            "passed": self.passed,
            "warnings": list(self.warnings),
            "event_tree": json.loads(event_to_json(self.event)),
        }


def kind_sources(policy: Any) -> dict[str, dict[str, str]]:
    """Each mechanism ``type`` the policy uses -> the distribution and version that define it:
    a plugin's (:func:`~privrelease.mechanisms.kinds.defined_by`), or privrelease's own. An
    approval binds the ``type``; the run's record and report say which code it was."""
    from privrelease.mechanisms.kinds import defined_by
    from privrelease.version import VERSION

    found = {}
    for spec in policy.mechanisms:
        shipped = defined_by(type(spec))
        found[spec.type] = {"distribution": "privrelease", "version": VERSION} if shipped is None else shipped.as_dict()
    return dict(sorted(found.items()))


def neighbours(loaded: LoadedPolicy) -> str:
    """The neighbouring relation of the policy's releases: one person (``dataset.person`` names
    a column: every row with its value) or one row (absent, or ``row``)."""
    from privrelease.mechanisms.events import PERSON, ROW
    from privrelease.policies.schema import Person

    person = loaded.policy.dataset.person
    return PERSON + person.column if isinstance(person, Person) else ROW


def unit_of_privacy(loaded: LoadedPolicy) -> dict[str, Any]:
    """Who one person is, in words (``statement``, the report's public statement and
    ``release.json``), the neighbouring relation every guarantee is for (``neighbours``) and the
    rule each mechanism applied to a person's rows (``rules``, by mechanism name)."""
    from privrelease.mechanisms.events import describe_relation
    from privrelease.policies.schema import Person

    policy = loaded.policy
    person = policy.dataset.person
    if isinstance(person, Person):
        m = person.max_rows
        statement = (
            f"one person = all rows with the same {person.column}, at most {m} kept "
            "(drawn at random before any mechanism runs; the rest are dropped)"
        )
        rules = {
            spec.name: f"at most {m} random rows per person, sensitivity {m}"
            if policy.dataset.rows_read(spec) > 1
            else "one random row per person"
            for spec in policy.mechanisms
        }
    else:
        statement = "each row is taken to be a different person" + (
            " (dataset.person: row)" if person == "row" else " (the policy names no person column)"
        )
        rules = {spec.name: "each row is one person" for spec in policy.mechanisms}
    return {"statement": statement, "neighbours": describe_relation(neighbours(loaded)), "rules": rules}


def counted_rows(loaded: LoadedPolicy, spec: Any) -> str | None:
    """With ``dataset.person`` naming a column, what a mechanism's true values (the counts,
    totals, cells its accuracy statements hold around) are of: the rows it reads, at most
    ``max_rows`` random rows of each person or one random row of each (:func:`.flows.data.mechanism_rows`),
    never a person's rows beyond them (a bias the accuracy statements do not cover, not
    published: it depends on the data). None without one (each row is a person)."""
    from privrelease.policies.schema import Person

    person = loaded.policy.dataset.person
    if not isinstance(person, Person):
        return None
    m = loaded.policy.dataset.rows_read(spec)
    if m > 1:
        return (
            f"true values are of the rows kept, at most {m} random rows per person: the rows of a person beyond {m} "
            "are not counted (a bias toward fewer rows that depends on the data and is not published)"
        )
    return (
        "true values are of one random row per person (each person counted once): the other rows of a person "
        "are not read (a bias that depends on the data and is not published)"
    )


def released_event(loaded: LoadedPolicy, event: Event) -> Event:
    """A mechanism's event under the policy's neighbouring relation (:func:`neighbours`)."""
    from privrelease.mechanisms.events import person_level

    return person_level(event, neighbours(loaded))


def plan_policy(loaded: LoadedPolicy) -> Plan:
    """Every guarantee of the policy's release and a pass/fail check per target."""
    mechanisms: list[MechanismPlan] = []
    infeasible: list[Check] = []
    accuracy: dict[str, AccuracyStatement | None] = {}
    for mechanism in loaded.policy.mechanisms:
        planned = mechanism.plan(loaded)
        event, facts = planned.event, dict(planned.facts)
        if event is None:
            what, required = planned.infeasible or ("feasible", "a release")
            infeasible.append(Check(f"{mechanism.name}: {what}", required, "infeasible", False))
            continue
        event = released_event(loaded, event)
        statement = mechanism.accuracy(loaded, planned)
        counted = counted_rows(loaded, mechanism)
        accuracy[mechanism.name] = None if statement is None else replace(statement, counted=counted)
        guarantees: dict[str, accountants.Guarantee] = {
            notion: accountants.account(event, notion) for notion in accountants.NOTIONS
        }
        facts.update(_fsmooth_fact(event))
        rho = accountants.identifiability(event)
        if rho is not None:
            facts["rho_achieved"] = rho
        mechanisms.append(MechanismPlan(mechanism.name, mechanism.type, event, guarantees, facts))
    tree = mechanisms_tree(mechanisms)
    composed: dict[str, accountants.Guarantee] = {
        notion: accountants.account(tree, notion) for notion in accountants.NOTIONS
    }
    composed["approximate"], facts = _approximate(loaded, tree, composed["approximate"])
    facts.update(_composed_facts(loaded, tree))
    checks = infeasible + _checks(loaded, mechanisms, composed, facts)
    warnings = tuple(warning for spec in loaded.policy.mechanisms for warning in spec.plan_warnings(loaded))
    return Plan(loaded, mechanisms, tree, composed, facts, checks, accuracy, warnings)


def dp_plan(loaded: LoadedPolicy) -> Plan:
    """The plan of a release that has an (epsilon, delta)-DP guarantee to compose or charge
    (``guarantee compose``, the runway); UserError naming the reason when it has none."""
    from privrelease.errors import UserError

    plan = plan_policy(loaded)
    guarantee = accountants.account(plan.event, plan.notion)
    if not plan.mechanisms or not guarantee.supported:
        where = loaded.path or f"{loaded.policy.name}@{loaded.policy.version}"
        raise UserError(
            f"{where}: the release has no (epsilon, delta)-DP guarantee to compose: "
            f"{guarantee.detail or 'no differentially private mechanism'}"
        )
    return plan


def composed_runs(
    plan: Plan, *, times: int, delta: float | None = None, epsilon: float | None = None, option: str = ""
) -> composition.Composition:
    """The (epsilon, delta)-DP of ``times`` runs of ``plan``'s release (:func:`dp_plan`) under
    its accounting notion, by the tightest sound method: give ``delta`` for the smallest epsilon,
    or ``epsilon`` for the delta. A bad argument is a UserError naming it with ``option`` in
    front (``--`` on the command line)."""
    from privrelease.errors import UserError

    if times < 1:
        raise UserError(
            f"{option}times must be an integer >= 1; got {times}", field=f"{option}times", allowed="an integer >= 1"
        )
    if (delta is None) == (epsilon is None):
        raise UserError(f"give exactly one of {option}delta (to get epsilon) or {option}epsilon (to get delta)")
    if delta is not None and not 0 < delta < 1:
        raise UserError(
            f"{option}delta must be in (0, 1); got {delta:g}", field=f"{option}delta", allowed="a number in (0, 1)"
        )
    if epsilon is not None and not 0 <= epsilon < math.inf:
        raise UserError(
            f"{option}epsilon must be a finite number >= 0; got {epsilon:g}",
            field=f"{option}epsilon",
            allowed="a finite number >= 0",
        )
    if delta is not None:
        return composition.epsilon_at([plan.event], delta, times=times, notion=plan.notion)
    assert epsilon is not None, "exactly one of delta and epsilon is given"
    return composition.delta_at([plan.event], epsilon, times=times, notion=plan.notion)


def _approximate(loaded: LoadedPolicy, tree: Composed, stated: Guarantee) -> tuple[Guarantee, dict[str, Any]]:
    """The release's approximate-DP guarantee by the tightest composition
    (:mod:`~privrelease.mechanisms.composition`): the smallest epsilon at the target delta, or
    without a delta target the delta at the stated epsilons' sum; and the composition's facts
    (method, every method's answer, the delta at ``max_epsilon``)."""
    targets = loaded.policy.targets
    guarantee, result = composition.release_approximate(tree, stated, targets.accounting, targets.delta)
    if result is None:
        return stated, {}
    facts: dict[str, Any] = {"composition": {**result.as_dict(), "composed": counted([tree])}}
    if targets.max_epsilon is not None:
        facts["approximate_delta_at_max_epsilon"] = composition.delta_at([tree], targets.max_epsilon).delta
    return guarantee, facts


def _fsmooth_fact(event: Event) -> dict[str, Any]:
    """``{"fsmooth": ...}`` when the event's SDGS releases have Theorem 6's f-smooth bound
    (composed by Theorem 5; stated for eps0 >= -ln(1 - beta) only), else nothing."""
    fsmooth = accountants.fsmooth(event)
    if fsmooth is None or any(eps0 < min_theorem1_epsilon(beta) for _, beta, eps0 in fsmooth.parts):
        return {}
    return {"fsmooth": {"epsilon0": fsmooth.epsilon0, "delta0": fsmooth.delta0, "f(2)": fsmooth.f(2.0)}}


def _composed_facts(loaded: LoadedPolicy, tree: Composed) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    laplace = Composed(events=tuple(leaf for leaf in leaves(tree) if isinstance(leaf, Laplace)))
    if laplace.events:
        facts["rho_composed_statistics"] = accountants.identifiability(laplace)
    facts.update(_fsmooth_fact(tree))
    if not is_dp(tree):
        facts["not_dp"] = (
            "SPLU-Gen output is not differentially private: the release as a whole has no (eps, delta)-DP guarantee"
        )
    return facts


def _fmt(value: float | None, digits: int = 4) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "none"
    return f"{value:.{digits}g}"


def _digits(value: float | None, limit: float, relation: str, passed: bool) -> int:
    """The significant digits (at least 4; the limit's at least 6, as ``:g``) at which the
    printed value and limit compare as the check decided: a check failed by a rounding margin
    (epsilon 1.000000001 against a maximum of 1) prints the digit that decides it, never
    "1 against 1, FAIL"."""
    digits = 4
    if value is None or not math.isfinite(value):
        return digits
    while digits < 17:
        shown, bound = float(f"{value:.{digits}g}"), float(f"{limit:.{max(6, digits)}g}")
        if (shown <= bound if relation == "<=" else shown >= bound) == passed:
            break
        digits += 1
    return digits


def _compared(target: str, relation: str, limit: float, value: float, passed: bool) -> Check:
    """A numeric check, its requirement and achieved value printed with the digits that
    decide it (:func:`_digits`)."""
    digits = _digits(value, limit, relation, passed)
    required = f"{relation} {limit:.{max(6, digits)}g}"
    return Check(target, required, _fmt(value, digits), passed, relation, limit, value)


def mechanisms_tree(mechanisms: list[MechanismPlan]) -> Composed:
    """The event tree of a release: its mechanisms' events, composed."""
    return Composed(events=tuple(m.event for m in mechanisms))


def _checks(
    loaded: LoadedPolicy, mechanisms: list[MechanismPlan], composed: dict[str, Guarantee], facts: dict[str, Any]
) -> list[Check]:
    targets = loaded.policy.targets
    guarantee = composed[targets.accounting]
    checks: list[Check] = []
    delta = guarantee.delta
    if targets.accounting == "approximate":  # the delta at max_epsilon: the same curve, read the other way
        delta = facts.get("approximate_delta_at_max_epsilon", delta if math.isfinite(guarantee.epsilon) else 1.0)
    for target, limit, value in (
        ("max_epsilon", targets.max_epsilon, guarantee.epsilon),
        ("delta", targets.delta, delta),
    ):
        if limit is not None and guarantee.supported:
            checks.append(_compared(f"{target} ({targets.accounting})", "<=", limit, value, value <= limit))
        elif limit is not None:
            none = f"none: {guarantee.detail}"
            checks.append(Check(f"{target} ({targets.accounting})", f"<= {limit:g}", none, False, "<=", limit, None))
    if targets.delta is None and any(is_dp(m.event) and m.guarantees[targets.accounting].delta > 0 for m in mechanisms):
        checks.append(Check("delta", "declared", "no delta target, but a mechanism has delta > 0", False))
    if targets.rho is not None:
        for m in mechanisms:
            if "rho_achieved" in m.facts:
                rho = m.facts["rho_achieved"]
                checks.append(_compared(f"{m.name}: rho", "<=", targets.rho, rho, rho <= targets.rho * (1 + 1e-9)))
        if facts.get("rho_composed_statistics") is not None and sum("rho_achieved" in m.facts for m in mechanisms) > 1:
            rho = facts["rho_composed_statistics"]
            checks.append(
                _compared("rho (statistics composed)", "<=", targets.rho, rho, rho <= targets.rho * (1 + 1e-9))
            )
    for m in mechanisms:
        if "t_p" in m.facts:
            want = targets.splu_privacy
            assert want is not None, "T_p is only computed for a privacy target"
            t_p = m.facts["t_p"]
            what = f"{m.name}: SPLU T_p (eps {want.epsilon:g}, alpha {want.alpha})"
            checks.append(_compared(what, ">=", want.t_p, t_p, t_p >= want.t_p))
        if "t_f" in m.facts:
            utility = targets.splu_utility
            assert utility is not None, "T_f is only computed for a utility target"
            t_f = m.facts["t_f"]
            what = f"{m.name}: SPLU T_f (eps {utility.epsilon:g}, T_E {utility.t_e:g})"
            checks.append(_compared(what, "<=", utility.t_f, t_f, t_f <= utility.t_f))
    budget = targets.lifetime_budget
    if budget is not None and any(is_dp(m.event) for m in mechanisms):
        if guarantee.supported and targets.accounting == "approximate" and 0 < budget.delta < 1:
            # as the ledger measures it: the epsilon at the lifetime delta
            guarantee = Guarantee(
                "approximate", composition.epsilon_at([mechanisms_tree(mechanisms)], budget.delta).epsilon, budget.delta
            )
        fits = guarantee.supported and guarantee.epsilon <= budget.epsilon and guarantee.delta <= budget.delta
        eps_digits = _digits(guarantee.epsilon, budget.epsilon, "<=", guarantee.epsilon <= budget.epsilon)
        delta_digits = _digits(guarantee.delta, budget.delta, "<=", guarantee.delta <= budget.delta)
        checks.append(
            Check(
                "fits the lifetime budget (before earlier releases)",
                f"eps <= {budget.epsilon:.{max(6, eps_digits)}g}, delta <= {budget.delta:.{max(6, delta_digits)}g}",
                f"eps {_fmt(guarantee.epsilon, eps_digits)}, delta {_fmt(guarantee.delta, delta_digits)}",
                fits,
                "<=",
                budget.budget.as_dict(),
                guarantee.budget.as_dict() if guarantee.supported else None,
            )
        )
    checks.extend(_accuracy_checks(loaded, mechanisms))
    return checks


def _accuracy_checks(loaded: LoadedPolicy, mechanisms: list[MechanismPlan]) -> list[Check]:
    """One check per ``targets.accuracy`` entry, by the kind of the mechanism it names
    (:meth:`~privrelease.mechanisms.kinds.MechanismKind.accuracy_check`, from the policy alone)."""
    from privrelease.mechanisms.kinds import Planned

    planned = {m.name: Planned(m.event, m.facts) for m in mechanisms}
    checks = []
    for target in loaded.policy.targets.accuracy:
        spec = loaded.policy.mechanism(target.mechanism)
        check = spec.accuracy_check(loaded, target, planned.get(target.mechanism, Planned(None)))
        what = f"{target.mechanism}: accuracy at {target.confidence:.0%} ({check.what})"
        if check.value is not None:
            checks.append(_compared(what, check.relation, check.limit, check.value, check.passed))
            continue
        checks.append(
            Check(what, f"{check.relation} {check.limit:g}", check.achieved, check.passed, check.relation, check.limit)
        )
    return checks
