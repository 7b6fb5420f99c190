"""The plan of a release: its privacy event tree and every guarantee, computed from the policy
alone (no data is read), checked against the policy's targets.

The same event tree is what the flow realizes, the ledger charges and the report shows.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow as pa

from privrelease.mechanisms import accountants, composition, identifiability, splu_guarantees
from privrelease.mechanisms.events import (
    SDGS,
    Composed,
    Event,
    ExponentialSelection,
    Laplace,
    SPLUGen,
    event_to_json,
    leaves,
)
from privrelease.mechanisms.generalization import generalize
from privrelease.mechanisms.schemes import Keep
from privrelease.mechanisms.sdgs_math import min_theorem1_epsilon
from privrelease.mechanisms.selection import sensitivity as selection_sensitivity
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
    guarantees: dict[str, accountants.Guarantee]
    facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    loaded: LoadedPolicy
    mechanisms: list[MechanismPlan]
    event: Composed
    composed: dict[str, accountants.Guarantee]
    facts: dict[str, Any]
    checks: list[Check]
    accuracy: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Per mechanism name, its data-free accuracy statements (:func:`mechanism_accuracy`)."""

    @property
    def notion(self) -> accountants.Notion:
        return self.loaded.policy.targets.accounting

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    @property
    def guarantee(self) -> accountants.Guarantee:
        """The composed guarantee under the notion the policy demands."""
        return self.composed[self.notion]

    def as_dict(self) -> dict[str, Any]:
        policy = self.loaded.policy
        return {
            "policy": {"name": policy.name, "version": policy.version, "sha256": self.loaded.sha256},
            "accounting": self.notion,
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
            "accuracy": self.accuracy,
            "passed": self.passed,
            "event_tree": json.loads(event_to_json(self.event)),
        }


def group_domain(loaded: LoadedPolicy, columns: tuple[str, ...]) -> dict[str, list[str]]:
    """The generalized labels of each group-by column's declared values: the groups a grouped
    statistic releases (fixed by the policy, so absent groups are released too)."""
    domain: dict[str, list[str]] = {}
    for column in columns:
        values = loaded.policy.dataset.columns[column].values or ()
        kind = loaded.policy.dataset.columns[column].type
        array = pa.array(values, type={"integer": pa.int64(), "float": pa.float64()}.get(kind, pa.string()))
        scheme = loaded.scheme(column) if loaded.policy.scheme_for(column) is not None else Keep()
        labels = generalize(pa.table({column: array}), {column: scheme}).column(column)
        domain[column] = sorted(set(labels.to_pylist()))
    return domain


def _statistic_calibration(loaded: LoadedPolicy, mechanism) -> identifiability.Calibration:
    groups = math.prod(len(labels) for labels in group_domain(loaded, mechanism.by).values())
    column = loaded.policy.dataset.columns.get(mechanism.column) if mechanism.column else None
    return identifiability.calibrate(
        mechanism.query,
        mechanism.lower if mechanism.lower is not None else 0,
        mechanism.upper if mechanism.upper is not None else 1,
        mechanism.rho,
        rows=loaded.policy.dataset.rows,
        integer=column is None or column.type == "integer",
        groups=groups,
    )


def mechanism_event(loaded: LoadedPolicy, mechanism) -> tuple[Event | None, dict[str, Any]]:
    """The privacy event of one policy mechanism (None for an infeasible rho), and
    policy-derived facts about it."""
    kind = mechanism.type
    if kind in ("sdgs", "histogram"):
        output: Literal["microdata", "histogram"] = "microdata" if kind == "sdgs" else "histogram"
        event: Event = SDGS(k=mechanism.k, beta=mechanism.beta, epsilon=mechanism.epsilon or 0.0, output=output)
        facts: dict[str, Any] = {
            "k_anonymity": mechanism.k,
            "crowd_blending": f"({mechanism.k}, 0)-crowd-blending private",
        }
        select = getattr(mechanism, "select_scheme", None)
        if select is not None:
            selection = ExponentialSelection(
                epsilon=select.epsilon,
                candidates=len(select.candidates),
                sensitivity=selection_sensitivity(mechanism.k, mechanism.beta),
            )
            facts["candidate_schemes"] = list(select.candidates)
            event = Composed(events=(selection, event))
        return event, facts
    if kind == "identifiable_statistic":
        calibration = _statistic_calibration(loaded, mechanism)
        facts = {
            "query": mechanism.query,
            "column": mechanism.column,
            "rho": mechanism.rho,
            "feasible": calibration.feasible,
            "lambda": calibration.lambda_,
            "universe_size": calibration.universe_size,
            "sensitive_range": calibration.sensitive_range,
            "reason": calibration.reason,
        }
        if not calibration.feasible:
            return None, facts
        return identifiability.laplace_event(calibration), facts
    if kind == "splu_gen":
        return SPLUGen(gamma=mechanism.gamma, sensitive=tuple(mechanism.sensitive)), _splu_facts(
            loaded, mechanism.gamma
        )
    raise AssertionError(f"unknown mechanism type {kind!r}")


def mechanism_accuracy(loaded: LoadedPolicy, mechanism, facts: dict[str, Any]) -> dict[str, Any]:
    """What one mechanism's published numbers are worth, from the policy alone
    (:mod:`privrelease.mechanisms.accuracy`); published with the release."""
    from privrelease.mechanisms import accuracy

    kind = mechanism.type
    if kind in ("sdgs", "histogram"):
        k, beta = mechanism.k, mechanism.beta
        targets = tuple(t.count for t in loaded.policy.targets.accuracy if t.mechanism == mechanism.name and t.count)
        statement: dict[str, Any] = {
            "estimate": "the published count" if beta >= 1 else f"the published count / beta = count x {1 / beta:g}",
            "cells": [accuracy.count_accuracy(k, beta, n).as_dict() for n in accuracy.cell_sizes(k, beta, targets)],
        }
        select = getattr(mechanism, "select_scheme", None)
        if select is not None:
            statement["selection_gap"] = {
                "failure": 0.05,
                "rows": accuracy.selection_gap(
                    selection_sensitivity(k, beta), select.epsilon, len(select.candidates), 0.05
                ),
            }
        return statement
    if kind == "identifiable_statistic" and facts.get("lambda") is not None:
        scale = facts["lambda"]
        return {
            "estimate": "the published value",
            "noise_scale": scale,
            "half_width": {f"{c:g}": accuracy.laplace_half_width(scale, c) for c in accuracy.CONFIDENCES},
            "clamping": (
                None
                if mechanism.query == "count"
                else f"values outside [{mechanism.lower:g}, {mechanism.upper:g}] count as the nearer bound"
            ),
        }
    if kind == "splu_gen" and "t_f" in facts:
        utility = loaded.policy.targets.splu_utility
        assert utility is not None, "t_f is only computed for a utility target"
        return {"estimate": "privrelease estimate", "t_f": facts["t_f"], "epsilon": utility.epsilon, "t_e": utility.t_e}
    return {}


def _splu_facts(loaded: LoadedPolicy, gamma: int) -> dict[str, Any]:
    targets = loaded.policy.targets
    facts: dict[str, Any] = {"model": "small-sum privacy / large-sum utility (not differential privacy)"}
    if targets.splu_privacy is not None:
        privacy = splu_guarantees.privacy_threshold(gamma, targets.splu_privacy.epsilon, targets.splu_privacy.alpha)
        facts.update(t_p=privacy.t_p, t_p_argmin_f=privacy.argmin_f)
    if targets.splu_utility is not None:
        facts["t_f"] = splu_guarantees.utility_threshold(gamma, targets.splu_utility.epsilon, targets.splu_utility.t_e)
    return facts


def plan_policy(loaded: LoadedPolicy) -> Plan:
    """Every guarantee of the policy's release and a pass/fail check per target."""
    mechanisms: list[MechanismPlan] = []
    infeasible: list[str] = []
    for mechanism in loaded.policy.mechanisms:
        event, facts = mechanism_event(loaded, mechanism)
        if event is None:
            infeasible.append(f"{mechanism.name}: {facts['reason']}")
            continue
        guarantees: dict[str, accountants.Guarantee] = {
            notion: accountants.account(event, notion) for notion in accountants.NOTIONS
        }
        fsmooth = accountants.fsmooth(event)
        if fsmooth is not None and all(eps0 >= min_theorem1_epsilon(beta) for _, beta, eps0 in fsmooth.parts):
            facts["fsmooth"] = {"epsilon0": fsmooth.epsilon0, "delta0": fsmooth.delta0, "f(2)": fsmooth.f(2.0)}
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
    checks = _checks(loaded, mechanisms, composed, facts, infeasible)
    accuracy = {m.name: mechanism_accuracy(loaded, loaded.policy.mechanism(m.name), m.facts) for m in mechanisms}
    return Plan(loaded, mechanisms, tree, composed, facts, checks, accuracy)


def _approximate(
    loaded: LoadedPolicy, tree: Composed, stated: accountants.Guarantee
) -> tuple[accountants.Guarantee, dict[str, Any]]:
    """The release's approximate-DP guarantee by the tightest composition
    (:mod:`~privrelease.mechanisms.composition`): the smallest epsilon at the target delta, or
    without a delta target the delta at the stated epsilons' sum; and the composition's facts
    (method, every method's answer, the delta at ``max_epsilon``)."""
    targets = loaded.policy.targets
    releases = leaves(tree)
    if not stated.supported or not releases or (len(releases) > 1 and targets.accounting != "approximate"):
        return stated, {}  # composing several releases costs a PLD: only where the policy accounts so
    if targets.delta is not None:
        result = composition.epsilon_at([tree], targets.delta)
    else:
        result = composition.delta_at([tree], stated.epsilon)
    facts: dict[str, Any] = {"composition": result.as_dict()}
    if targets.max_epsilon is not None:
        facts["approximate_delta_at_max_epsilon"] = composition.delta_at([tree], targets.max_epsilon).delta
    detail = f"{result.method} of {result.releases} release{'s' if result.releases != 1 else ''}"
    return accountants.Guarantee("approximate", result.epsilon, result.delta, True, detail), facts


def _composed_facts(loaded: LoadedPolicy, tree: Composed) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    laplace = Composed(events=tuple(leaf for leaf in leaves(tree) if isinstance(leaf, Laplace)))
    if laplace.events:
        facts["rho_composed_statistics"] = accountants.identifiability(laplace)
    fsmooth = accountants.fsmooth(tree)
    if fsmooth is not None and all(eps0 >= min_theorem1_epsilon(beta) for _, beta, eps0 in fsmooth.parts):
        facts["fsmooth"] = {"epsilon0": fsmooth.epsilon0, "delta0": fsmooth.delta0, "f(2)": fsmooth.f(2.0)}
    if any(isinstance(leaf, SPLUGen) for leaf in leaves(tree)):
        facts["not_dp"] = (
            "SPLU-Gen output is not differentially private: the release as a whole has no (eps, delta)-DP guarantee"
        )
    return facts


def _fmt(value: float | None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "none"
    return f"{value:.4g}"


def mechanisms_tree(mechanisms: list[MechanismPlan]) -> Composed:
    """The event tree of a release: its mechanisms' events, composed."""
    return Composed(events=tuple(m.event for m in mechanisms))


def _checks(loaded, mechanisms, composed, facts, infeasible) -> list[Check]:
    targets = loaded.policy.targets
    guarantee = composed[targets.accounting]
    checks = [Check(f"{name}: rho feasible", "rho > 1/m", "infeasible", False) for name in infeasible]
    dp_kinds = {"sdgs", "histogram", "identifiable_statistic"}
    delta = guarantee.delta
    if targets.accounting == "approximate":  # the delta at max_epsilon: the same curve, read the other way
        delta = facts.get("approximate_delta_at_max_epsilon", delta if math.isfinite(guarantee.epsilon) else 1.0)
    for target, limit, value in (
        ("max_epsilon", targets.max_epsilon, guarantee.epsilon),
        ("delta", targets.delta, delta),
    ):
        if limit is not None:
            achieved = _fmt(value) if guarantee.supported else f"none: {guarantee.detail}"
            checks.append(
                Check(
                    f"{target} ({targets.accounting})",
                    f"<= {limit:g}",
                    achieved,
                    guarantee.supported and value <= limit,
                    "<=",
                    limit,
                    value if guarantee.supported else None,
                )
            )
    if targets.delta is None and any(
        m.type in dp_kinds and m.guarantees[targets.accounting].delta > 0 for m in mechanisms
    ):
        checks.append(Check("delta", "declared", "no delta target, but a mechanism has delta > 0", False))
    if targets.rho is not None:
        for m in mechanisms:
            if "rho_achieved" in m.facts:
                checks.append(
                    Check(
                        f"{m.name}: rho",
                        f"<= {targets.rho:g}",
                        _fmt(m.facts["rho_achieved"]),
                        m.facts["rho_achieved"] <= targets.rho * (1 + 1e-9),
                        "<=",
                        targets.rho,
                        m.facts["rho_achieved"],
                    )
                )
        if facts.get("rho_composed_statistics") is not None and sum("rho_achieved" in m.facts for m in mechanisms) > 1:
            rho = facts["rho_composed_statistics"]
            checks.append(
                Check(
                    "rho (statistics composed)",
                    f"<= {targets.rho:g}",
                    _fmt(rho),
                    rho <= targets.rho * (1 + 1e-9),
                    "<=",
                    targets.rho,
                    rho,
                )
            )
    for m in mechanisms:
        if "t_p" in m.facts:
            want = targets.splu_privacy
            checks.append(
                Check(
                    f"{m.name}: SPLU T_p (eps {want.epsilon:g}, alpha {want.alpha})",
                    f">= {want.t_p:g}",
                    _fmt(m.facts["t_p"]),
                    m.facts["t_p"] >= want.t_p,
                    ">=",
                    want.t_p,
                    m.facts["t_p"],
                )
            )
        if "t_f" in m.facts:
            want = targets.splu_utility
            checks.append(
                Check(
                    f"{m.name}: SPLU T_f (eps {want.epsilon:g}, T_E {want.t_e:g})",
                    f"<= {want.t_f:g}",
                    _fmt(m.facts["t_f"]),
                    m.facts["t_f"] <= want.t_f,
                    "<=",
                    want.t_f,
                    m.facts["t_f"],
                )
            )
    budget = targets.lifetime_budget
    if budget is not None and any(m.type in dp_kinds for m in mechanisms):
        if guarantee.supported and targets.accounting == "approximate" and 0 < budget.delta < 1:
            # as the ledger measures it: the epsilon at the lifetime delta
            guarantee = accountants.Guarantee(
                "approximate", composition.epsilon_at([mechanisms_tree(mechanisms)], budget.delta).epsilon, budget.delta
            )
        fits = guarantee.supported and guarantee.epsilon <= budget.epsilon and guarantee.delta <= budget.delta
        checks.append(
            Check(
                "fits the lifetime budget (before earlier releases)",
                f"eps <= {budget.epsilon:g}, delta <= {budget.delta:g}",
                f"eps {_fmt(guarantee.epsilon)}, delta {_fmt(guarantee.delta)}",
                fits,
                "<=",
                {"epsilon": budget.epsilon, "delta": budget.delta},
                {"epsilon": guarantee.epsilon, "delta": guarantee.delta} if guarantee.supported else None,
            )
        )
    checks.extend(_accuracy_checks(loaded, mechanisms))
    return checks


def _accuracy_checks(loaded: LoadedPolicy, mechanisms: list[MechanismPlan]) -> list[Check]:
    """One check per ``targets.accuracy`` entry, from the data-free accuracy statements
    (:mod:`privrelease.mechanisms.accuracy`): a cell of ``count`` people published and within
    +-relative_error with probability >= confidence (SDGS, histograms), or the Laplace noise
    of a statistic within +-absolute_error with probability >= confidence (its half-width at
    that confidence is at most absolute_error; the noise on a mean is Lap(lambda) too)."""
    from privrelease.mechanisms.accuracy import count_accuracy, laplace_half_width

    planned = {m.name: m for m in mechanisms}
    checks = []
    for target in loaded.policy.targets.accuracy:
        spec = loaded.policy.mechanism(target.mechanism)
        label = f"{target.mechanism}: accuracy at {target.confidence:.0%}"
        if target.absolute_error is not None:
            scale = planned[target.mechanism].facts.get("lambda") if target.mechanism in planned else None
            half = laplace_half_width(scale, target.confidence) if scale is not None else math.inf
            checks.append(
                Check(
                    f"{label} (noise half-width)",
                    f"<= {target.absolute_error:g}",
                    _fmt(half) if scale is not None else "none: rho infeasible",
                    half <= target.absolute_error,
                    "<=",
                    target.absolute_error,
                    half if scale is not None else None,
                )
            )
            continue
        assert target.count is not None and target.relative_error is not None
        result = count_accuracy(spec.k, spec.beta, target.count, relative_error=target.relative_error)  # type: ignore[union-attr]
        checks.append(
            Check(
                f"{label} (a cell of {target.count} people published and within +-{target.relative_error:.0%})",
                f">= {target.confidence:g}",
                _fmt(result.within),
                result.within is not None and result.within >= target.confidence,
                ">=",
                target.confidence,
                result.within,
            )
        )
    return checks
