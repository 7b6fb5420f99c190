"""SPLU-Gen (Fu, Wang, Wong, Wang, Jiang, Section 3): decoy groups of gamma sensitive values,
each value replaced by a uniform pick among its group; the other ``columns`` published
generalized. Small-sum privacy and large-sum utility, **not** differential privacy.

Privacy: :class:`~privrelease.mechanisms.events.SPLUGen` (unsupported by every DP accountant);
T_p from ``targets.splu_privacy`` (Theorem 4). Accuracy: T_f from ``targets.splu_utility``,
exact from the binomial model (:func:`.splu_guarantees.utility_threshold`; the paper's
Inequality (3) has an arithmetic error). In-process only: decoy groups of gamma rows must be
drawn over the whole table, not per partition.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import pyarrow as pa
from pydantic import model_validator

from privrelease.mechanisms.events import SPLUGen
from privrelease.mechanisms.kinds import ColumnRef, FieldError, Issue, Loc, MechanismKind, Names, Planned, at_least
from privrelease.mechanisms.splu_scope import NO_UTILITY, UTILITY_SCOPE
from privrelease.policies.fields import Gamma

if TYPE_CHECKING:
    from privrelease.mechanisms.kinds import AccuracyStatement, LoadedPolicy, MechanismResult, Policy


class SpluGenMechanism(MechanismKind):
    """SPLU-Gen (Fu et al., Section 3): each ``sensitive`` value replaced by a uniform pick among
    its decoy group of size gamma; ``columns`` published generalized by their schemes."""

    type: Literal["splu_gen"]
    gamma: Gamma
    sensitive: Annotated[Names, at_least(1, "sensitive column")]
    columns: Names = ()

    def column_refs(self) -> list[ColumnRef]:
        refs = [ColumnRef(("sensitive", i), c) for i, c in enumerate(self.sensitive)]
        return refs + [ColumnRef(("columns", i), c, needs_scheme=True) for i, c in enumerate(self.columns)]

    def policy_issues(self, policy: Policy, here: Loc) -> Iterator[Issue]:
        """A sensitive column with a declared domain needs at least gamma values."""
        for j, column in enumerate(self.sensitive):
            spec = policy.dataset.columns.get(column)
            if spec is not None and spec.values is not None and len(spec.values) < self.gamma:
                yield Issue(
                    (*here, "sensitive", j),
                    f"sensitive column {column!r} declares {len(spec.values)} values; decoy groups "
                    f"of size gamma = {self.gamma} need at least {self.gamma} distinct values",
                )

    @model_validator(mode="after")
    def _disjoint(self) -> SpluGenMechanism:
        for i, column in enumerate(self.columns):
            if column in self.sensitive:
                raise FieldError.at(
                    ("columns", i),
                    f"column {column!r} is listed as sensitive too; a column is one or the other",
                )
        return self

    differentially_private: ClassVar[bool] = False
    label: ClassVar[str] = "SPLU-Gen (not differential privacy)"
    in_process_only: ClassVar[str] = (
        "its decoy groups of gamma rows must be drawn over the whole table, not per partition"
    )
    accuracy_elsewhere: ClassVar[str] = "targets.splu_utility (T_f)"

    def plan(self, loaded: LoadedPolicy) -> Planned:
        """The event, and T_p / T_f from the policy's SPLU targets."""
        from privrelease.mechanisms import splu_guarantees

        targets = loaded.policy.targets
        facts: dict[str, Any] = {"model": "small-sum privacy / large-sum utility (not differential privacy)"}
        if targets.splu_privacy is not None:
            privacy = splu_guarantees.privacy_threshold(
                self.gamma, targets.splu_privacy.epsilon, targets.splu_privacy.alpha
            )
            facts.update(t_p=privacy.t_p, t_p_argmin_f=privacy.argmin_f)
        if targets.splu_utility is not None:
            facts["t_f"] = splu_guarantees.utility_threshold(
                self.gamma, targets.splu_utility.epsilon, targets.splu_utility.t_e
            )
        return Planned(SPLUGen(gamma=self.gamma, sensitive=tuple(self.sensitive)), facts)

    def accuracy(self, loaded: LoadedPolicy, planned: Planned) -> AccuracyStatement | None:
        """T_f: a lone sensitive value's count of at least T_f is estimated within relative error
        epsilon except with probability T_E (conjunctions: no such guarantee)."""
        from privrelease.mechanisms.accuracy import LargeSumUtility
        from privrelease.mechanisms.kinds import AccuracyStatement

        utility = loaded.policy.targets.splu_utility
        if utility is None or "t_f" not in planned.facts:
            return None
        return AccuracyStatement(
            "privrelease estimate", large_sum=LargeSumUtility(planned.facts["t_f"], utility.epsilon, utility.t_e)
        )

    def run(self, loaded: LoadedPolicy, table: pa.Table) -> MechanismResult:
        from privrelease.mechanisms.generalization import generalize
        from privrelease.mechanisms.splu import splu_gen

        columns = {name: table.column(name) for name in self.sensitive}
        if self.columns:
            generalized = generalize(table, loaded.schemes(self.columns))
            columns.update({name: generalized.column(name) for name in self.columns})
        return splu_gen(pa.table(columns), list(self.sensitive), self.gamma)

    def example_run(self, loaded: LoadedPolicy, rows: int) -> tuple[dict[str, Any], int]:
        """Every row published, three decoy groups per sensitive column."""
        return {"rows_in": rows, "decoy_groups": len(self.sensitive) * 3}, rows

    def explanations(self) -> tuple[str, ...]:
        return (SPLU,)


KINDS = (SpluGenMechanism,)

SPLU = (
    """<dt>SPLU-Gen is not differential privacy</dt>
<dd>SPLU-Gen (Fu, Wang, Wong, Wang, Jiang) replaces each sensitive value by a value drawn uniformly from a decoy group of γ values. It promises <em>small-sum privacy</em>: any combination of values that occurs only f ≤ α times is estimated from the release with a relative error above ε with probability at least T_p{% with privacy = targets.splu_privacy %}{% if privacy %} (here α = {{ privacy.alpha }}, ε = {{ privacy.epsilon|num }}, required T_p ≥ {{ privacy.t_p|num }}){% endif %}{% endwith %}; and <em>large-sum utility</em>: """
    + UTILITY_SCOPE
    + """, if at least T_f, is estimated within relative error ε except with probability T_E{% with utility = targets.splu_utility %}{% if utility %} (here ε = {{ utility.epsilon|num }}, T_E = {{ utility.t_e|num }}){% endif %}{% endwith %}. """
    + NO_UTILITY
    + """ T_f is computed exactly from the distribution of the estimate (Binomial(γf, 1/γ)): the paper's Lemma 1 formula, (γ ε² T_E)<sup>-1/2</sup>, rests on an arithmetic error in its Inequality (3) and understates T_f many times over. <strong>These are not differential-privacy guarantees</strong>: they bound no (ε, δ) and do not add up with the guarantees of differentially private releases.</dd>"""
)
