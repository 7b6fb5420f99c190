"""rho-differentially identifiable statistics: a count, sum or mean, per group of the
generalized ``by`` columns, with Laplace noise calibrated so that no one's presence can be
inferred with probability above rho (Lee & Clifton, Theorem 1: lambda = S(f) / ln((m - 1) rho
/ (1 - rho))); every group of the declared domain is released, absent ones included.

Privacy: :class:`~privrelease.mechanisms.events.Laplace` with its universe size and sensitive
range (eps = sensitivity / lambda; rho from the accountants). Accuracy: the Laplace half-width
b ln(1 / (1 - C)) at confidence C, and the clamping bias. Dask: each partition computes its
exact per-group count or clamped sum; the flow merges them exactly and adds the noise once
(:mod:`privrelease.mechanisms.statistics`); never noise per partition.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import model_validator

from privrelease.mechanisms.kinds import (
    AccuracyCheck,
    Axis,
    ColumnRef,
    FieldError,
    Frontier,
    Issue,
    Loc,
    MechanismKind,
    Name,
    Names,
    Number,
    Planned,
    by_columns,
    fed,
    frontier_of,
    half_width_target,
    log_grid,
)
from privrelease.policies.fields import Rho, num

if TYPE_CHECKING:
    from privrelease.mechanisms.identifiability import Calibration
    from privrelease.mechanisms.kinds import AccuracyStatement, AccuracyTarget, LoadedPolicy, MechanismResult, Policy
    from privrelease.mechanisms.schemes import ColumnScheme

COUNT_COLUMN = "__privrelease_rows__"
"""The constant value column that stands in for a count."""

RHO_TOP = 0.95
"""The largest rho a frontier is drawn at."""


class IdentifiableStatisticMechanism(MechanismKind):
    """A count, sum or mean with Laplace noise calibrated to rho-differential identifiability
    (Lee & Clifton, Theorem 1: lambda = S(f) / ln((m - 1) rho / (1 - rho))), per ``by`` group."""

    type: Literal["identifiable_statistic"]
    query: Literal["count", "sum", "mean"]
    column: Name | None = None
    lower: Number | None = None
    upper: Number | None = None
    rho: Rho
    by: Names = ()

    def column_refs(self) -> list[ColumnRef]:
        refs = [ColumnRef(("by", i), c, needs_domain=True) for i, c in enumerate(self.by)]
        if self.column is not None:
            refs.insert(0, ColumnRef(("column",), self.column, numeric=self.query != "count"))
        return refs

    def policy_issues(self, policy: Policy, here: Loc) -> Iterator[Issue]:
        """A mean needs the public row count; bounds of an integer column are whole numbers."""
        if self.query == "mean" and policy.dataset.rows is None:
            yield Issue(
                (*here, "query"),
                f"a mean needs dataset.rows (the public number of {policy.dataset.size_unit}, its denominator); "
                "add dataset.rows: an integer >= 1",
            )
        spec = policy.dataset.columns.get(self.column or "")
        if spec is not None and spec.type == "integer":
            for field in ("lower", "upper"):
                bound = getattr(self, field)
                if bound is not None and bound != int(bound):
                    yield Issue(
                        (*here, field),
                        f"{field} must be a whole number for the integer column {self.column!r}; got {num(bound)}",
                    )

    @model_validator(mode="after")
    def _bounds(self) -> IdentifiableStatisticMechanism:
        if self.query == "count":
            for field in ("lower", "upper"):
                if getattr(self, field) is not None:
                    raise FieldError.at(
                        (field,),
                        f"{field} applies to sum and mean only; remove it for a count",
                    )
            return self
        for field in ("column", "lower", "upper"):
            if getattr(self, field) is None:
                what = "the numeric column to aggregate" if field == "column" else "a number (the clamp bound)"
                raise FieldError.at((field,), f"a {self.query} needs {field}: {what}")
        assert self.lower is not None and self.upper is not None
        if not self.lower < self.upper:
            raise FieldError.at(
                ("upper",),
                f"lower must be < upper; got lower {num(self.lower)}, upper {num(self.upper)}",
            )
        return self

    label: ClassVar[str] = "ρ-identifiable statistic (Laplace)"
    accuracy_fields: ClassVar[tuple[str, ...]] = ("absolute_error",)

    def calibration(self, loaded: LoadedPolicy) -> Calibration:
        """lambda, m and S(f) from the policy alone (:func:`.identifiability.calibrate`)."""
        from privrelease.mechanisms import identifiability

        groups = math.prod(len(labels) for labels in loaded.labels(self.by).values())
        column = loaded.policy.dataset.columns.get(self.column) if self.column else None
        return identifiability.calibrate(
            self.query,
            self.lower if self.lower is not None else 0,
            self.upper if self.upper is not None else 1,
            self.rho,
            rows=loaded.policy.dataset.rows,
            integer=column is None or column.type == "integer",
            groups=groups,
        )

    def quantity(self, loaded: LoadedPolicy) -> str:
        """What the published value estimates, in words. A mean is the clamped sum divided by
        the declared dataset.rows, whatever the number of rows read."""
        if self.query == "count":
            return "count"
        if self.query == "sum":
            return f"clamped sum of {self.column}"
        dataset = loaded.policy.dataset
        return (
            f"clamped sum of {self.column} divided by the declared dataset.rows = {dataset.rows} "
            f"(the mean only if the data has exactly {dataset.rows} {dataset.size_unit})"
        )

    def plan(self, loaded: LoadedPolicy) -> Planned:
        from privrelease.mechanisms.identifiability import laplace_event

        calibration = self.calibration(loaded)
        facts = {
            "query": self.query,
            "column": self.column,
            "rho": self.rho,
            "feasible": calibration.feasible,
            "lambda": calibration.lambda_,
            "universe_size": calibration.universe_size,
            "sensitive_range": calibration.sensitive_range,
            "reason": calibration.reason,
        }
        if not calibration.feasible:
            return Planned(None, facts, ("rho feasible", "rho > 1/m"))
        return Planned(laplace_event(calibration), facts)

    def accuracy(self, loaded: LoadedPolicy, planned: Planned) -> AccuracyStatement | None:
        """The Laplace half-width at each confidence, each group's and, with several ``by``
        groups (i.i.d. noise), all groups' at once (:func:`.accuracy.laplace_all_half_width`),
        and the clamping bias."""
        from privrelease.mechanisms.accuracy import laplace_all_half_width
        from privrelease.mechanisms.kinds import CONFIDENCES, AccuracyStatement, NoiseAccuracy, laplace_half_width

        scale = planned.facts.get("lambda")
        if scale is None:
            return None
        clamping = (
            None
            if self.query == "count"
            else f"values outside [{self.lower:g}, {self.upper:g}] count as the nearer bound"
        )
        widths = {c: laplace_half_width(scale, c) for c in CONFIDENCES}
        groups = math.prod(len(labels) for labels in loaded.labels(self.by).values())
        together = {c: laplace_all_half_width(scale, c, groups) for c in CONFIDENCES} if groups > 1 else {}
        noise = NoiseAccuracy(scale, widths, clamping, groups, together, unit="group")
        return AccuracyStatement(f"the published value of the {self.quantity(loaded)}", noise=noise)

    def accuracy_check(self, loaded: LoadedPolicy, target: AccuracyTarget, planned: Planned) -> AccuracyCheck:
        """The Laplace noise within +-absolute_error with probability >= confidence: its
        half-width at that confidence is at most absolute_error (the noise on a mean is
        Lap(lambda) too)."""
        from privrelease.mechanisms.kinds import laplace_half_width

        assert target.absolute_error is not None
        scale = planned.facts.get("lambda")
        half = laplace_half_width(scale, target.confidence) if scale is not None else None
        what = ("each group's " if self.by else "") + f"noise half-width on the {self.quantity(loaded)}"
        return AccuracyCheck(what, "<=", target.absolute_error, half, "none: rho infeasible")

    def frontier(self, loaded: LoadedPolicy) -> Frontier | None:
        """Over rho (log grid, feasible values only): the statistic's epsilon at the target
        delta (its Laplace event with that rho, :func:`.epsilon_at_target`) and the Laplace
        half-width lambda ln(1 / (1 - C)) at the accuracy target's confidence (default 95%).
        None when the policy's rho is infeasible."""
        from privrelease.mechanisms.kinds import laplace_half_width

        calibration = self.calibration(loaded)
        if not calibration.feasible:
            return None
        confidence, limit, label = half_width_target(loaded, self.name)
        unit = (
            ""
            if self.query == "count"
            else f" (clamped sum of {self.column}{' / declared rows' * (self.query == 'mean')})"
        )
        axis = Axis(
            "ρ",
            "rho",
            f"{confidence:.0%} half-width of the published value{unit}",
            False,
            f"Accuracy: the published value is within ± the half-width of the true {self.quantity(loaded)} "
            f"with probability {confidence:.0%} (Laplace noise of scale λ; universe size m = {calibration.universe_size}, "
            f"so ρ must exceed 1/m).",
            limit,
            label,
            log_x=True,
        )
        planned = {
            rho: self.model_copy(update={"rho": rho}).plan(loaded)
            for rho in log_grid(self.rho, low=1 / calibration.universe_size, high=RHO_TOP)
        }
        return frontier_of(
            loaded,
            axis,
            self.rho,
            planned,
            lambda rho: planned[rho].event,  # None: rho too close to 1/m for floating point
            lambda rho: laplace_half_width(planned[rho].facts["lambda"], confidence),
        )

    def job(self, loaded: LoadedPolicy) -> StatisticJob:
        by = loaded.published_schemes(self.by)
        domain = loaded.labels(self.by) if self.by else None
        return StatisticJob(
            self.column,
            by,
            self.calibration(loaded),
            None if domain is None else {name: tuple(labels) for name, labels in domain.items()},
        )

    def run(self, loaded: LoadedPolicy, table: pa.Table) -> MechanismResult:
        from privrelease.mechanisms.statistics import noisy_statistic

        job = self.job(loaded)
        prepared, column = job.prepared(table)
        return noisy_statistic(prepared, column, job.calibration, group_domain=job.domain)

    def finish(self, loaded: LoadedPolicy, merged: Any) -> MechanismResult:
        """Laplace noise added once, to the merged exact totals."""
        from privrelease.mechanisms.statistics import noisy_release

        job = self.job(loaded)
        return noisy_release(merged, job.column or COUNT_COLUMN, job.calibration, job.domain)

    def explanations(self) -> tuple[str, ...]:
        return (RHO,)


KINDS = (IdentifiableStatisticMechanism,)


@dataclass(frozen=True)
class StatisticJob:
    """A rho-identifiable count, sum or mean, per group of the generalized ``by`` columns."""

    column: str | None
    by: dict[str, ColumnScheme]
    calibration: Calibration
    domain: dict[str, tuple[Any, ...]] | None

    def prepared(self, table: pa.Table) -> tuple[pa.Table, str]:
        """The columns the statistic reads: the value column (a constant one stands in for a
        count) and the ``by`` columns generalized with their schemes; and the value column's name."""
        return fed(self.column_partial(table.num_rows), table).prepared()

    def partial(self, table: pa.Table) -> Any:
        return by_columns(self, table)

    def column_partial(self, rows: int) -> StatisticColumnPartial:
        """:meth:`partial` one column at a time."""
        return StatisticColumnPartial(self, rows)

    def merge(self, parts: list[Any]) -> Any:
        """The exact per-group totals of all rows (:func:`.statistics.merge_partials`)."""
        from privrelease.mechanisms.statistics import merge_partials

        return merge_partials(parts)


@dataclass
class StatisticColumnPartial:
    """:meth:`StatisticJob.partial` of ``rows`` rows one column at a time: the value column
    kept, each ``by`` column generalized as it comes (its labels kept, the column dropped)."""

    job: StatisticJob
    rows: int
    columns: dict[str, pa.ChunkedArray] = field(default_factory=dict)

    def add(self, name: str, column: pa.ChunkedArray) -> None:
        from privrelease.mechanisms.generalization import generalize

        if name == self.job.column:
            self.columns[name] = column
        if name in self.job.by:  # a value column also grouped by is read generalized, as a whole table's
            self.columns[name] = generalize(pa.table({name: column}), {name: self.job.by[name]}).column(name)

    def prepared(self) -> tuple[pa.Table, str]:
        """:meth:`StatisticJob.prepared` of the columns added."""
        column = self.job.column or COUNT_COLUMN
        value = self.columns[column] if self.job.column else pa.array(np.zeros(self.rows, dtype=np.int64))
        by = {name: self.columns[name] for name in self.job.by}
        return pa.table({column: value, **by}), column

    def result(self) -> Any:
        from privrelease.mechanisms.statistics import statistic_partial

        prepared, column = self.prepared()
        return statistic_partial(prepared, column, self.job.calibration, self.job.domain)


RHO = """<dt>ρ-differential identifiability</dt>
<dd>For the statistics released with Laplace noise (Lee and Clifton): an adversary who knows every other record and sees the published statistic, and considers m possible individuals who could complete the data (the universe size), can tell which one it is with probability at most ρ. The noise scale λ is calibrated to that ρ; the statistic is also ε-differentially private with the ε shown.</dd>"""
