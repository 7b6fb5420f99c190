"""Noisy tables (the ``noisy_tables`` kind): a release of several tables about the same people
(counts by county x age x sex, the county totals, the state totals, the grand total) that add
up: every published table is a margin of ONE estimate, across margins and geography levels.

**Policy.** ``tables``: each a list of columns, ``[]`` the grand total. A column is a dataset
column with a declared domain (its declared values generalized by its scheme, or a hierarchy's
labels, as for ``noisy_counts``) or a level named in ``levels``: ``levels: {state: {of: county,
level: 2}}`` is level 2 of the hierarchy file that generalizes ``county``
(``generalization.county: {type: hierarchy, hierarchy: geo.csv, level: L}``, ``L`` < 2): public,
bound into the policy's hash, fixed before any data is read. At most one column has levels (the
geography). ``noise: {distribution: gaussian}``: each table's sigma chosen to meet
``targets.accuracy`` as plan checks it at the least privacy cost (:func:`.tables.allocate`:
global for confidences >= 0.894, else a local least), or given (``sigma: S`` for every table, or a list,
one per table). ``nonnegative: true``: published values are non-negative integers that still
add up (:func:`.tables.nonnegative_integer`).

**Privacy.** Each table is measured once with Gaussian noise of its sigma (:func:`measure`:
OpenDP's ``make_gaussian`` on floats, an exact sampler of the discrete Gaussian on the lattice
``2^k Z``, OpenDP's default ``k = -1074``, the spacing of the smallest subnormal double, the
sum then rounded to the nearest double; OS CSPRNG; its privacy map certifies zCDP only). One
person with at most m rows (``dataset.rows_per_person``; the kind reads all of them) changes the
cells of each table by a vector of non-negative integers summing to at most m, so of L2 norm at
most m, for ANY spread of the rows; Rényi divergences of independent measurements add, so the
release is rho-zCDP with ``rho = m^2 sum_t 1 / (2 sigma_t^2)`` (Bun and Steinke 2016; OpenDP's
map ``m^2 / (2 sigma_t^2)`` is checked at each release), one :class:`GaussianTables` event
accounted by :mod:`.zcdp` (CKS Proposition 12, Markov, a dominating PLD). Reconstruction is
post-processing.

**Estimate.** Generalized least squares over all measurements (ResidualPlanner, Xiong, He,
Kifer, NeurIPS 2023; on the geography tree Hay, Rastogi, Miklau, Suciu, VLDB 2010):
:func:`.tables.reconstruct`. Per table and cell the variance is exact for the linear estimator
(:func:`.tables.cell_variances`); "each cell" is within ``z_{(1+C)/2} sd`` with probability C;
"every cell at once" within the simultaneous half-width with probability at least C (Sidak's
inequality, :func:`.tables.simultaneous_half_width`). These treat the noise as Gaussian of
variance ``sigma^2``, which the sampler's is up to the lattice ``2^-1074`` and one rounding to
a double (a relative error of ``2^-53`` of the noisy count): both far below any printed digit,
so the statements hold for the published tables as stated (checked by simulation with the
kind's own sampler: tests/test_noisy_tables.py). With ``nonnegative`` they hold for the
unrounded estimate, which is not published (:data:`ROUNDING`).

**Totals and means.** With ``total: {column, bounds: [lo, hi], resolution: r}`` (noisy sums'
fields and validation: :class:`TableTotal`), each row's value is rounded to a multiple of r and
clamped into ``[lo, hi]`` (:func:`.noisy_sums.clamped_units`), and every table's per-cell totals
``T_t`` (integers, in units r) are measured once more, ``T_t + N(0, tau_t^2)`` by the same
:func:`measure`, ``tau_t`` = ``noise.sigma_total`` / r (given, or chosen like the counts' sigmas
to meet ``statistic: total`` targets at the least cost). One person moves each table's totals by
a vector ``u`` with ``|u_i| <= B c_i``, ``B = max(|lo|, |hi|) / r``, ``c`` their counts' change,
so ``|u|_2 <= B |c|_2 <= m B`` whatever the spread: the release is rho-zCDP with ``rho = m^2
sum_t 1 / (2 sigma_t^2) + (m B)^2 sum_t 1 / (2 tau_t^2)`` (one :class:`GaussianTables` event).
The totals are reconstructed by the same least squares (:func:`.tables.reconstruct` with the
``tau``'s), so they are margins of one estimate as the counts are, with the same exact variances
and half-widths. They are never rounded or made non-negative (``nonnegative`` applies to the
counts): they add up up to floating-point rounding. Each cell's mean is ``total / count`` of the
published numbers moved into ``[lo, hi]`` (null where the count is below 1) with noisy sums'
union-bound interval (:func:`.noisy_sums.mean_interval`: the total's and the count's intervals
at ``1 - (1 - C) / 2`` each, the count's widened by the table's rounding shift with
``nonnegative``).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, StrictBool, model_validator

from privrelease.errors import UserError
from privrelease.mechanisms.columns import INTERVAL, SUMS_TABLE, taken_name
from privrelease.mechanisms.kinds import (
    AccuracyCheck,
    Axis,
    ColumnRef,
    Event,
    Frontier,
    Issue,
    Loc,
    MechanismKind,
    Model,
    Name,
    Planned,
    at_least,
    by_columns,
    checked,
    epsilon_at_target,
    frontier_of,
    log_grid,
)
from privrelease.mechanisms.kinds.noisy_counts import (
    MAX_NOISE,
    MIN_NOISE,
    CountJob,
    CountPartial,
    Sigma,
    sample,
)
from privrelease.mechanisms.kinds.noisy_sums import (
    CLAMPING,
    MEAN,
    Bounds,
    Resolution,
    SigmaTotal,
    SumJob,
    SumPartial,
    bound_units,
    check_bounds,
    mean_interval,
)
from privrelease.mechanisms.zcdp import ZCDPGaussian, stated_epsilon
from privrelease.policies.fields import Level, num

if TYPE_CHECKING:
    from privrelease.mechanisms.kinds import AccuracyStatement, AccuracyTarget, LoadedPolicy, MechanismResult, Policy
    from privrelease.mechanisms.tables import Domain, Table

MAX_CELLS = 10_000_000
"""The most cells the tables of one mechanism may have together (every cell is published)."""

DEFAULT_CONFIDENCE = 0.95
"""The confidence of a table's statements and ``lower``/``upper`` without a target naming it."""

SIGMA_DIGITS = 6
"""Allocated sigmas are rounded down to this many significant digits (less noise: every
accuracy target still holds; the event charges the sigma used)."""

TABLE_COLUMNS = INTERVAL
"""The columns a published table adds to its cells' labels."""

TOTAL_COLUMNS = (*SUMS_TABLE[:3], *SUMS_TABLE[6:])
"""The columns a table with a ``total`` adds besides: ``total``, ``mean`` and their intervals."""

STATISTICS = ("count", "total")
"""What a ``targets.accuracy`` entry on noisy tables names in ``statistic`` (default count)."""

UNTARGETED_WARNING = 10.0
"""plan warns of a table no target names whose half-width is over this many times the widest of
the targeted tables' (:meth:`NoisyTablesMechanism.plan_warnings`)."""

UNROUNDED = "the unrounded least-squares estimate"
"""What the statements and target checks are of with ``nonnegative`` (it is not published)."""

ROUNDING = (
    f"The published tables are non-negative integers that still add up, not {UNROUNDED}: a published value can "
    "differ from it by a further rounding shift that the data decides, so the half-widths and the accuracy target "
    f"checks hold for {UNROUNDED}, not for the published integers. Each table's largest shift is stated after the "
    "release (the report's published files, release.json's rounding_shift), and each published value's lower and "
    "upper are widened by it."
)
"""What holds of ``nonnegative`` tables (plan, the report, ``release.json``)."""


class TableLevel(Model):
    """A coarser level of a hierarchy column: ``of`` (the column, generalized by a hierarchy
    file) at ``level`` (a column of that file, coarser than the column's own level)."""

    of: Name
    level: Annotated[Level, checked("level", "an integer >= 1", lambda v: v >= 1, integer=True)]


class TablesNoise(Model):
    """Gaussian noise on every cell of every table: ``sigma`` one number for all, a
    list (one per table, in order), or absent (chosen to meet ``targets.accuracy`` at the
    least privacy cost, each target as plan checks it: every cell at once by Sidak's
    inequality over the cells' own variances; below confidence 0.894 a local least);
    ``sigma_total`` the same for the totals (with ``total``), in the column's units."""

    distribution: Literal["gaussian"]
    sigma: Sigma | tuple[Sigma, ...] | None = None
    sigma_total: SigmaTotal | tuple[SigmaTotal, ...] | None = None


class TableTotal(Model):
    """The numeric ``column`` totalled in every cell of every table: each value rounded to a
    multiple of ``resolution`` and clamped into ``bounds`` ``[lo, hi]`` (as noisy sums'
    ``column``, ``bounds`` and ``resolution``)."""

    column: Name
    bounds: Bounds
    resolution: Resolution = 1.0

    @model_validator(mode="after")
    def _check_bounds(self) -> TableTotal:
        check_bounds(self.bounds, self.resolution)
        return self

    @property
    def bound(self) -> int:
        """``B``: the most one row adds to a cell's total in size, in units."""
        return max(abs(unit) for unit in bound_units(self.bounds, self.resolution))


def table_name(columns: Sequence[str]) -> str:
    """A table's name in files and statements: its columns joined by ``-``, ``total`` for ``[]``."""
    return "-".join(columns) if columns else "total"


@dataclass(frozen=True)
class Layout:
    """The mechanism's tables over their declared domain (:mod:`.tables`'s structure), with the
    labels of every axis: ``axes[t]`` the output columns of table t in array order (geography
    level first, then the flat columns in domain order) and ``labels[name]`` each one's labels."""

    domain: Domain
    tables: tuple[Table, ...]
    axes: tuple[tuple[str, ...], ...]
    labels: dict[str, list[str]]

    def cells(self, index: int) -> int:
        return math.prod(len(self.labels[axis]) for axis in self.axes[index])


class NoisyTablesMechanism(MechanismKind):
    """A set of tables about the same people that add up: ``tables``, each a list of columns
    (``[]``: the grand total), dataset columns with declared domains or ``levels`` of one
    hierarchy column (``state: {of: county, level: 1}``: column 1 of the hierarchy file that
    generalizes ``county``). Each table is measured once with Gaussian noise (``noise``:
    ``sigma`` for all, one per table, or absent: chosen to meet ``targets.accuracy`` as plan
    checks it at the least privacy cost; below confidence 0.894 a local least) and the
    published tables are one least-squares estimate, every table a margin of it;
    ``nonnegative``: non-negative integers, still adding up. Each table is its own file
    ``<name>-<columns joined by ->`` (``<name>-total``), every cell with ``estimate``, ``lower``
    and ``upper``; with ``total`` (a numeric column, its ``bounds`` and ``resolution``) also
    ``total``, ``mean`` and their intervals, the totals adding up like the counts."""

    type: Literal["noisy_tables"]
    tables: Annotated[tuple[tuple[Name, ...], ...], at_least(1, "table")]
    levels: dict[Name, TableLevel] = {}
    total: TableTotal | None = None
    noise: TablesNoise
    nonnegative: StrictBool = False

    label: ClassVar[str] = "noisy tables that add up (Gaussian noise, least-squares consistent)"
    accuracy_fields: ClassVar[tuple[str, ...]] = ("absolute_error",)
    accuracy_options: ClassVar[tuple[str, ...]] = ("table", "cells")
    accuracy_statistics: ClassVar[tuple[str, ...]] = STATISTICS
    accuracy_default_statistic: ClassVar[str | None] = "count"
    omitted_when_absent: ClassVar[tuple[tuple[str, ...], ...]] = (("total",), ("noise", "sigma_total"))
    reads_max_rows: ClassVar[bool] = True
    """It reads up to ``max_rows`` rows of each person: its sensitivity is m per table (module docstring)."""

    # --- the policy -------------------------------------------------------------------------

    def column_refs(self) -> list[ColumnRef]:
        refs = [
            ColumnRef(("tables", i, j), column)
            for i, table in enumerate(self.tables)
            for j, column in enumerate(table)
            if column not in self.levels
        ]
        refs += [ColumnRef(("levels", name, "of"), level.of) for name, level in self.levels.items()]
        if self.total is not None:
            refs.append(ColumnRef(("total", "column"), self.total.column, numeric=True))
        return refs

    def published_columns(self) -> tuple[str, ...]:
        totalled = () if self.total is None else (self.total.column,)
        return tuple(dict.fromkeys([*(column for table in self.tables for column in table), *totalled]))

    def column_scheme(self, policy: Policy, column: str) -> Any:
        """A level: that column of the hierarchy file of the column it is a level of."""
        from privrelease.policies.schema import HierarchyScheme

        level = self.levels.get(column)
        if level is None:
            return policy.scheme_for(column)
        scheme = policy.scheme_for(level.of)
        assert isinstance(scheme, HierarchyScheme), "the policy checks require a hierarchy"
        return HierarchyScheme(hierarchy=scheme.hierarchy, level=level.level)

    def delta_reason(self) -> str | None:
        return "has Gaussian noise"

    def policy_issues(self, policy: Policy, here: Loc) -> Iterator[Issue]:
        """Tables: known columns with declared domains, none twice, no table twice, one
        geography at one level per table; levels of a hierarchy column; sigmas one per table or
        accuracy targets to choose them."""
        from privrelease.policies.schema import HierarchyScheme

        seen: dict[frozenset[str], int] = {}
        for i, table in enumerate(self.tables):
            if len(set(table)) < len(table):
                twice = sorted({c for c in table if table.count(c) > 1})
                yield Issue((*here, "tables", i), f"table {list(table)} names column {twice[0]!r} twice")
            key = frozenset(table)
            if key in seen:
                yield Issue(
                    (*here, "tables", i), f"table {list(table)} is listed twice (also tables[{seen[key]}]): drop one"
                )
            seen.setdefault(key, i)
            clash = next((j for j, other in enumerate(self.tables[:i]) if table_name(other) == table_name(table)), None)
            if clash is not None and frozenset(self.tables[clash]) != key:
                yield Issue(
                    (*here, "tables", i),
                    f"tables[{clash}] and tables[{i}] would both be published as file "
                    f"{self.name}-{table_name(table)}: rename a column",
                )
            geography = [c for c in table if c in self.levels or c in {lv.of for lv in self.levels.values()}]
            if len(geography) > 1:
                yield Issue(
                    (*here, "tables", i),
                    f"table {list(table)} names {', '.join(map(repr, geography))}: levels of one hierarchy; "
                    "a table takes at most one level (the coarser is a margin of the finer)",
                )
            added = TABLE_COLUMNS if self.total is None else (*TABLE_COLUMNS, *TOTAL_COLUMNS)
            for j, column in enumerate(table):
                if (taken := taken_name(column, "a noisy table", added)) is not None:
                    yield Issue((*here, "tables", i, j), taken)
                if column in self.levels:
                    continue
                spec = policy.dataset.columns.get(column)
                if spec is None:
                    continue  # the column check names it
                if spec.values is None and not isinstance(policy.scheme_for(column), HierarchyScheme):
                    yield Issue(
                        (*here, "tables", i, j),
                        f"column {column!r} needs declared values (dataset.columns.{column}.values) or a "
                        "hierarchy: every cell of a table is published, so its domain is fixed before the data is read",
                    )
        owners = sorted({level.of for level in self.levels.values()})
        if len(owners) > 1:
            yield Issue(
                (*here, "levels"),
                f"levels name several hierarchy columns ({', '.join(owners)}); at most one column (the geography) "
                "may have levels",
            )
        for name, level in self.levels.items():
            if name in policy.dataset.columns:
                yield Issue(
                    (*here, "levels", name), f"level {name!r} is also a dataset column: name the level differently"
                )
            scheme = policy.scheme_for(level.of)
            if level.of in policy.dataset.columns and not isinstance(scheme, HierarchyScheme):
                yield Issue(
                    (*here, "levels", name, "of"),
                    f"column {level.of!r} has no hierarchy: levels are columns of the hierarchy file that "
                    f"generalizes it (generalization.{level.of}: {{type: hierarchy, hierarchy: FILE, level: 0}})",
                )
            elif isinstance(scheme, HierarchyScheme) and level.level <= scheme.level:
                yield Issue(
                    (*here, "levels", name, "level"),
                    f"level {name!r} must be coarser than column {level.of!r} itself (hierarchy level "
                    f"{scheme.level}): an integer > {scheme.level}; got {level.level}",
                )
        named = {frozenset(table) for table in self.tables}
        targeted: set[str | None] = set()
        for k, target in enumerate(policy.targets.accuracy):
            if target.mechanism != self.name:
                continue
            targeted.add(self.statistic_of(target))
            if target.table is not None and frozenset(target.table) not in named:
                yield Issue(
                    ("targets", "accuracy", k, "table"),
                    f"table {list(target.table)} is not one of mechanism {self.name!r}'s tables: "
                    + "; ".join(str(list(t)) for t in self.tables),
                )
            if target.statistic == "total" and self.total is None:
                yield Issue(
                    ("targets", "accuracy", k, "statistic"),
                    f"statistic 'total' needs a total section on mechanism {self.name!r} (total: {{column, bounds, "
                    "resolution}}); without one the tables publish counts only: statistic count",
                )
        yield from self._noise_issues(here, targeted)

    def _noise_issues(self, here: Loc, targeted: set[str | None]) -> Iterator[Issue]:
        """Per statistic: sigmas one per table or one number, or targets to choose them; no
        ``sigma_total`` without a ``total``."""
        if self.total is None and self.noise.sigma_total is not None:
            yield Issue(
                (*here, "noise", "sigma_total"),
                "noise.sigma_total is the totals' noise, but the mechanism has no total section: add total: "
                "{column, bounds, resolution} or remove noise.sigma_total",
            )
        for statistic, field in (("count", "sigma"), ("total", "sigma_total")):
            if statistic == "total" and self.total is None:
                continue
            sigma = getattr(self.noise, field)
            if isinstance(sigma, tuple) and len(sigma) != len(self.tables):
                yield Issue(
                    (*here, "noise", field),
                    f"noise.{field} lists {len(sigma)} sigmas for {len(self.tables)} tables: one per table, or one "
                    "number",
                )
            if sigma is None and statistic not in targeted:
                yield Issue(
                    (*here, "noise", field),
                    f"noise.{field} is absent, so the sigmas are chosen to meet targets.accuracy, but no accuracy "
                    f"target names mechanism {self.name!r}"
                    + (" with statistic: total" if statistic == "total" else "")
                    + f": add one (absolute_error, table) or set noise.{field}",
                )

    # --- structure ----------------------------------------------------------------------------

    def layout(self, loaded: LoadedPolicy) -> Layout:
        """The tables over their domain (:class:`Layout`): the flat columns in order of first
        appearance, the geography's levels from its hierarchy file (finest: the column's own
        level, every declared value a leaf), each level nested in the next (a UserError naming
        the level and the node that has two parents)."""
        return _layout(self, loaded)

    def sigmas(self, loaded: LoadedPolicy, statistic: str = "count") -> tuple[float, ...]:
        """Each table's sigma for ``statistic`` (the totals': in the column's units): the
        policy's, or the least-cost allocation meeting its targets as :meth:`accuracy_check`
        checks them (:func:`.tables.allocate`)."""
        return _sigmas(self, loaded, statistic)

    def resolved(self, loaded: LoadedPolicy) -> NoisyTablesMechanism:
        """With the sigmas the plan chose (:meth:`sigmas`, one per table) when the policy leaves them out."""
        chosen: dict[str, tuple[float, ...]] = {}
        if self.noise.sigma is None:
            chosen["sigma"] = self.sigmas(loaded)
        if self.total is not None and self.noise.sigma_total is None:
            chosen["sigma_total"] = self.sigmas(loaded, "total")
        if not chosen:
            return self
        return self.model_copy(update={"noise": self.noise.model_copy(update=chosen)})

    def event(
        self, loaded: LoadedPolicy, sigmas: Sequence[float], total_sigmas: Sequence[float] | None = None
    ) -> GaussianTables:
        """The tables measured with ``sigmas`` (and, with a ``total``, their totals with
        ``total_sigmas`` in the column's units, default the release's) for persons of at most
        ``dataset.rows_per_person`` rows, stated at the smallest epsilon reaching
        ``targets.delta`` under its accounting."""
        targets = loaded.policy.targets
        m = loaded.policy.dataset.rows_per_person
        totals: dict[str, Any] = {}
        if self.total is not None:
            taus = self.sigmas(loaded, "total") if total_sigmas is None else tuple(total_sigmas)
            totals = {
                "total_sigmas_units": tuple(tau / self.total.resolution for tau in taus),
                "total_sensitivity_units": m * self.total.bound,
            }
        event = GaussianTables(sigmas=tuple(sigmas), sensitivity=m, epsilon=0.0, **totals)
        return event.model_copy(update={"epsilon": stated_epsilon(event.rho, targets.delta, targets.accounting)})

    # --- privacy and accuracy maps ----------------------------------------------------------

    def plan(self, loaded: LoadedPolicy) -> Planned:
        layout = self.layout(loaded)
        cells = [layout.cells(i) for i in range(len(self.tables))]
        m = loaded.policy.dataset.rows_per_person
        facts: dict[str, Any] = {
            "tables": {table_name(t): n for t, n in zip(self.tables, cells, strict=True)},
            "sensitivity": "1 per table in L2 (one person changes one cell of each table by one)"
            if m == 1
            else f"{m} per table in L2 (one person, at most {m} rows, changes the cells of each table by at most "
            f"{m} in all)",
            "consistency": "tables add up: every table is a margin of one least-squares estimate",
        }
        if self.total is not None:
            lo, hi = self.total.bounds
            size = max(abs(lo), abs(hi))
            facts["total_sensitivity"] = (
                f"the totals of {self.total.column}: {m} x {num(size)} = {num(m * size)} per table in L2 (one person, "
                f"at most {m} row{'s' if m > 1 else ''}, each at most {num(size)} in size)"
            )
            facts["clamping"] = (
                f"each value rounded to a multiple of {num(self.total.resolution)}; values outside [{num(lo)}, "
                f"{num(hi)}] moved to the nearer bound"
            )
        if sum(cells) > MAX_CELLS:
            return Planned(
                None, facts, ("declared domain", f"at most {MAX_CELLS:,} cells; the tables have {sum(cells):,}")
            )
        if self.nonnegative and (union := _union_cells(layout)) > MAX_CELLS:
            return Planned(
                None,
                facts,
                (
                    "nonnegative",
                    f"at most {MAX_CELLS:,} cells in the array every table is a margin of; it has {union:,}",
                ),
            )
        sigmas = self.sigmas(loaded)
        facts["sigmas"] = {table_name(t): s for t, s in zip(self.tables, sigmas, strict=True)}
        if self.total is not None:
            taus = self.sigmas(loaded, "total")
            facts["sigma_totals"] = {table_name(t): s for t, s in zip(self.tables, taus, strict=True)}
        event = self.event(loaded, sigmas)
        facts["zcdp_rho"] = event.cost
        naive = self.naive(loaded)
        if naive is not None:
            facts["naive_sigma"] = naive[0]
            naive_event = self.event(loaded, naive, self.naive(loaded, "total"))
            facts["naive_zcdp_rho"] = naive_event.cost
            facts["naive_epsilon"] = epsilon_at_target(loaded, naive_event)
        return Planned(event, facts)

    def naive(self, loaded: LoadedPolicy, statistic: str = "count") -> tuple[float, ...] | None:
        """The naive alternative at the same targets: each table measured on its own (no
        reconstruction), the budget split equally (:func:`.tables.naive_sigmas`); None when no
        target bounds it (the totals: then the release's own sigmas)."""
        from privrelease.mechanisms import tables

        if statistic == "total" and self.total is None:
            return None
        limits = self._limits(loaded, statistic)
        if all(limit is None for limit in limits):
            return self.sigmas(loaded, "total") if statistic == "total" else None
        layout = self.layout(loaded)
        return tuple(tables.naive_sigmas(layout.domain, layout.tables, limits))

    def _limits(self, loaded: LoadedPolicy, statistic: str = "count", each: bool = False) -> list[float | None]:
        """Per table, the largest per-cell variance of ``statistic`` meeting every target naming
        it (``each``: every ``cells: each`` target) (:func:`.tables.variance_limit`: ``cells:
        each`` over one cell, ``all`` over the table's)."""
        from privrelease.mechanisms import tables

        layout = self.layout(loaded)
        limits: list[float | None] = []
        for index, table in enumerate(self.tables):
            found = []
            for target in self._targets(loaded, table, statistic):
                assert target.absolute_error is not None, "the policy checks require absolute_error"
                if each and target.cells != "each":
                    continue
                cells = 1 if target.cells == "each" else layout.cells(index)
                found.append(tables.variance_limit(target.absolute_error, target.confidence, cells))
            limits.append(min(found) if found else None)
        return limits

    def _at_once(self, loaded: LoadedPolicy, statistic: str = "count") -> list[list[tuple[float, float]]]:
        """Per table, ``(absolute_error, confidence)`` of every ``cells: all`` target of
        ``statistic`` naming it (:func:`.tables.allocate` checks them as plan does)."""
        return [
            [
                (float(target.absolute_error), target.confidence)
                for target in self._targets(loaded, table, statistic)
                if target.cells != "each" and target.absolute_error is not None
            ]
            for table in self.tables
        ]

    def _targets(self, loaded: LoadedPolicy, table: Sequence[str], statistic: str = "count") -> list[AccuracyTarget]:
        """The accuracy targets naming this mechanism, ``statistic`` and ``table`` (or every table)."""
        return [
            target
            for target in loaded.policy.targets.accuracy
            if target.mechanism == self.name
            and self.statistic_of(target) == statistic
            and (target.table is None or set(target.table) == set(table))
        ]

    def confidence(self, loaded: LoadedPolicy, table: Sequence[str], statistic: str = "count") -> float:
        """The confidence of a table's statements and intervals of ``statistic``: its first
        target's, else (totals) the counts', else 95%."""
        targets = self._targets(loaded, table, statistic)
        if targets:
            return targets[0].confidence
        return self.confidence(loaded, table) if statistic == "total" else DEFAULT_CONFIDENCE

    def plan_warnings(self, loaded: LoadedPolicy) -> tuple[str, ...]:
        """Each table no accuracy target names, while plan chooses the sigmas: it is measured at
        the least precision (:data:`.tables.FLOOR`), and where it is no margin of a targeted
        table (finer than they are) its cells are all but unknown: warned, with the half-width
        it gets, where that is over UNTARGETED_WARNING times the widest of the targeted tables'."""
        found = []
        for statistic, field in (("count", "sigma"), ("total", "sigma_total")):
            if (statistic == "total" and self.total is None) or getattr(self.noise, field) is not None:
                continue
            limits = self._limits(loaded, statistic)
            if all(limit is None for limit in limits):
                continue  # refused by the policy check: no target to choose them by
            rows = self.statements(loaded, statistic=statistic)
            widest = max(row["each_cell_half_width"] for row, limit in zip(rows, limits, strict=True) if limit)
            for table, row, limit in zip(self.tables, rows, limits, strict=True):
                if limit is None and row["each_cell_half_width"] > UNTARGETED_WARNING * widest:
                    named = "" if statistic == "count" else ", statistic: total"
                    found.append(
                        f"{self.name}: no accuracy target names the {statistic}s of table {row['table']}, so plan "
                        f"measures them at the least precision, and they are no margin of a targeted table: each "
                        f"cell's {statistic} only within ±{row['each_cell_half_width']:.4g} with probability "
                        f"{row['confidence']:g}; add a target naming it (table: [{', '.join(table)}]"
                        f"{named}) if its cells matter"
                    )
        return tuple(found)

    def statements_of(self) -> dict[str, str]:
        """What the half-widths and accuracy target checks are of (``statements_of``) and, with
        ``nonnegative``, how the published integers differ from it (``rounding``): plan's
        statement and ``calibrate noisy-tables`` say it alike."""
        if not self.nonnegative:
            return {"statements_of": "the published tables"}
        return {"statements_of": UNROUNDED, "rounding": ROUNDING}

    def statements(
        self, loaded: LoadedPolicy, sigmas: Sequence[float] | None = None, statistic: str = "count"
    ) -> list[dict[str, Any]]:
        """Per table, of ``statistic``: cells, sigma, the largest standard error of a cell, the
        "each cell" and "every cell at once" half-widths at its confidence (the largest over its
        cells where geography blocks differ)."""
        from privrelease.mechanisms import tables

        layout = self.layout(loaded)
        sigmas = self.sigmas(loaded, statistic) if sigmas is None else tuple(sigmas)
        variances = tables.cell_variances(layout.domain, layout.tables, sigmas)
        found = []
        for table, sigma, variance in zip(self.tables, sigmas, variances, strict=True):
            confidence = self.confidence(loaded, table, statistic)
            found.append(
                {
                    "table": table_name(table),
                    "columns": list(table),
                    "cells": int(variance.size),
                    "sigma": sigma,
                    "standard_error": math.sqrt(float(np.max(variance))),
                    "confidence": confidence,
                    "each_cell_half_width": _half_width(variance, confidence, each=True),
                    "all_cells_half_width": _half_width(variance, confidence, each=False),
                }
            )
        return found

    def accuracy(self, loaded: LoadedPolicy, planned: Planned) -> AccuracyStatement:
        """Per table: the standard error of a cell, each cell within +-w with probability C,
        every cell at once within +-W with probability at least C; the naive alternative; with a
        ``total``, the same of the totals (:meth:`_totals_accuracy`)."""
        from privrelease.mechanisms.kinds import AccuracyStatement, StatedAccuracy

        rows = self.statements(loaded)
        naive = self.naive(loaded)
        document: dict[str, Any] = {
            "tables": rows,
            **self.statements_of(),
            "consistency": "every table is a margin of one least-squares estimate: cells add up to every published "
            "margin and across geography levels, exactly with nonnegative (integers), else up to floating-point "
            "rounding in the last digits of the decimals",
            "noise": "Gaussian of variance sigma^2 (OpenDP's float sampler: exact on a lattice of spacing 2^-1074), "
            "as the estimator and these statements take it",
        }
        cost = self.event(loaded, self.sigmas(loaded)).cost
        if naive is not None:
            document["naive"] = {
                "how": "each table measured on its own, the budget split equally, sized to meet the same targets",
                "sigma": naive[0],
                "zcdp_rho": self.event(loaded, naive, self.naive(loaded, "total")).cost,
            }
        of = f", for {UNROUNDED} (not published)" if self.nonnegative else ""
        caption = (
            f"Tables that add up (every table is a margin of one least-squares estimate). Per table{of}: each cell is "
            "within ± the “each cell” half-width of its true count with the stated probability, cell by cell; every "
            "cell of the table at once is within ± the “every cell at once” half-width with at least that "
            "probability (the largest over the table's cells; exact for the linear estimator and the Gaussian noise)."
        )
        if naive is not None:
            totals = (
                ""
                if self.total is None
                else (
                    " (counts and totals together; the naive alternative's totals sized the same way to the totals' "
                    "targets, if any, else the release's)"
                )
            )
            caption += (
                f" The naive alternative (each table measured on its own, the budget split equally) needs σ "
                f"{naive[0]:.4g} for every table to meet the same targets: zCDP ρ {document['naive']['zcdp_rho']:.4g}, "
                f"against {cost:.4g} here{totals}."
            )
        if self.nonnegative:
            caption += " " + ROUNDING
        unrounded = " (unrounded)" if self.nonnegative else ""
        stated = [StatedAccuracy("tables", caption, _statement_columns(unrounded), _statement_rows(rows), document)]
        if self.total is not None:
            stated.append(self._totals_accuracy(loaded))
        estimate = (
            f"{UNROUNDED} (every table a margin of it), not published: the published tables are its non-negative "
            "integer rounding"
            if self.nonnegative
            else "the published estimate (every table a margin of one estimate)"
        )
        return AccuracyStatement(estimate, stated=tuple(stated))

    def _totals_accuracy(self, loaded: LoadedPolicy) -> Any:
        """The totals' statements (``release.json``: ``accuracy.totals``), in the words of the
        counts': each cell, every cell at once, standard error, probability; clamping and the mean."""
        from privrelease.mechanisms.kinds import StatedAccuracy

        assert self.total is not None
        rows = self.statements(loaded, statistic="total")
        confidences = {row["confidence"] for row in rows}
        # one probability for every table: the mean's in figures; else each table's totals'
        probability = f"{next(iter(confidences)):g}" if len(confidences) == 1 else "C"
        whose = "" if len(confidences) == 1 else " (C: the probability of its table's totals)"
        lo, hi = self.total.bounds
        column = self.total.column
        document: dict[str, Any] = {
            "tables": rows,
            "column": column,
            "statements_of": TOTALS_OF,
            "clamping": CLAMPING.format(lo=num(lo), hi=num(hi), r=num(self.total.resolution)),
            "mean": MEAN.format(c=probability, lo=num(lo), hi=num(hi)),
        }
        caption = (
            f"Totals of {column} that add up (every table's totals are margins of one least-squares estimate, in "
            f"the units of {column}). Per table: each cell's total is within ± the “each cell” half-width of its true "
            "total with the stated probability, cell by cell; every cell of the table at once is within ± the “every "
            "cell at once” half-width with at least that probability (the largest over the table's cells; exact for "
            f"the linear estimator and the Gaussian noise). {TOTALS_OF[0].upper()}{TOTALS_OF[1:]}. Clamping: "
            f"{document['clamping']}. Mean{whose}: {document['mean']}."
        )
        return StatedAccuracy("totals", caption, _statement_columns(""), _statement_rows(rows), document)

    def accuracy_check(self, loaded: LoadedPolicy, target: AccuracyTarget, planned: Planned) -> AccuracyCheck:
        """The half-width ``cells: all`` (every cell at once, default) or ``each`` at the
        target's confidence, of its table (without one: each table's own, the widest deciding),
        of its statistic (the counts': of the unrounded estimate with ``nonnegative``)."""
        assert target.absolute_error is not None
        from privrelease.mechanisms import tables

        statistic = self.statistic_of(target)
        assert statistic is not None, "a target on noisy tables names count by default"
        layout = self.layout(loaded)
        variances = tables.cell_variances(layout.domain, layout.tables, self.sigmas(loaded, statistic))
        widths = []
        for table, variance in zip(self.tables, variances, strict=True):
            if target.table is not None and set(target.table) != set(table):
                continue
            widths.append(_half_width(variance, target.confidence, each=target.cells == "each"))
        if target.table is not None:
            which = "each cell" if target.cells == "each" else "every cell at once"
            where = f"table {table_name(target.table)}, {which}"
        else:
            where = (
                "each table: each cell" if target.cells == "each" else "each table: every cell of that table at once"
            )
        if statistic == "total":
            of = " of the total"
        else:
            of = f" of {UNROUNDED}, not of the published integers" if self.nonnegative else ""
        return AccuracyCheck(f"{where}: half-width{of}", "<=", target.absolute_error, max(widths))

    def frontier(self, loaded: LoadedPolicy) -> Frontier:
        """Over the sigma of one table on a log grid, a decade either side of the release's, every
        table's sigma (and sigma_total) scaled with it in the proportions of the release: the
        release's epsilon at the target delta (its event with those sigmas) and that table's
        count half-width, of every cell at once or of each cell as the first count target naming
        a table says (without one: the first table, every cell at once, at 95%). The table's
        target, if any, is drawn. Every table's sigma stays within the range a policy may name."""
        from privrelease.mechanisms import tables

        release = self.resolved(loaded)
        sigmas = np.array(release.sigmas(loaded))
        taus = None if release.total is None else np.array(release.sigmas(loaded, "total"))
        named = [
            t
            for t in loaded.policy.targets.accuracy
            if t.mechanism == self.name and t.table is not None and self.statistic_of(t) == "count"
        ]
        target = named[0] if named else None
        index = 0 if target is None else [set(t) for t in self.tables].index(set(target.table or ()))
        each = target is not None and target.cells == "each"
        confidence = DEFAULT_CONFIDENCE if target is None else target.confidence
        layout = self.layout(loaded)
        name, chosen = table_name(self.tables[index]), float(sigmas[index])
        # every variance scales with the square of the common factor, so the half-width with it
        width = _half_width(tables.cell_variances(layout.domain, layout.tables, tuple(sigmas))[index], confidence, each)

        def event(value: float) -> GaussianTables:
            scale = value / chosen
            return release.event(loaded, tuple(sigmas * scale), None if taus is None else tuple(taus * scale))

        scope = "each cell" if each else "every cell at once"
        of = f", of {UNROUNDED}" if self.nonnegative else ""
        others = "every other σ and σ total" if taus is not None else "every other σ"
        axis = Axis(
            f"σ (table {name})",
            f"noise.sigma for table {name}, {others} scaled with it",
            f"{confidence:.0%} half-width of {scope} of table {name} (counts)",
            False,
            f"Every table's σ{' and σ total' if taus is not None else ''} scaled with table {name}'s, in the "
            f"release's proportions. Accuracy: {scope} of table {name} within ± the half-width of its true count "
            f"with probability at least {confidence:.0%}{of} (exact for the linear estimator and the Gaussian "
            "noise).",
            None if target is None else target.absolute_error,
            "" if target is None else f"required ±{target.absolute_error:g}",
            log_x=True,
        )
        floor = chosen * MIN_NOISE / float(sigmas.min())
        ceiling = chosen * MAX_NOISE / float(sigmas.max())
        grid = log_grid(chosen, low=floor, high=ceiling)
        return frontier_of(loaded, axis, chosen, grid, event, lambda value: width * (value / chosen))

    # --- engines ------------------------------------------------------------------------------

    def job(self, loaded: LoadedPolicy) -> TablesJob:
        """Per table its exact counts (:class:`.noisy_counts.CountJob`; None: the grand total),
        or with a ``total`` its counts and clamped totals in units (:class:`.noisy_sums.SumJob`)."""
        layout = self.layout(loaded)
        jobs: list[CountJob | SumJob | None] = []
        for axes in layout.axes:
            schemes = {_source(self, axis): _axis_scheme(self, loaded, axis) for axis in axes}
            domain = {_source(self, axis): tuple(layout.labels[axis]) for axis in axes}
            if self.total is not None:
                jobs.append(
                    SumJob(
                        CountJob(schemes, domain),
                        self.total.column,
                        *bound_units(self.total.bounds, self.total.resolution),
                        self.total.resolution,
                    )
                )
            else:
                jobs.append(CountJob(schemes, domain) if axes else None)
        return TablesJob(tuple(jobs))

    def finish(self, loaded: LoadedPolicy, merged: Any) -> MechanismResult:
        """Noise added once to each table's exact counts (and totals; merged over partitions on
        Dask), then the least-squares reconstruction."""
        return self._release(loaded, merged)

    def _release(self, loaded: LoadedPolicy, merged: Sequence[np.ndarray]) -> MechanismResult:
        from privrelease.mechanisms import tables
        from privrelease.mechanisms.kinds import MechanismResult

        layout = self.layout(loaded)
        sigmas = self.sigmas(loaded)
        m = loaded.policy.dataset.rows_per_person
        counts = [np.asarray(part)[0] if self.total is not None else np.asarray(part) for part in merged]
        measured = [
            measure(np.asarray(count, dtype=np.int64), sigma, m).reshape(_shape(layout, i))
            for i, (count, sigma) in enumerate(zip(counts, sigmas, strict=True))
        ]
        estimates = tables.reconstruct(layout.domain, layout.tables, sigmas, measured)
        variances = tables.cell_variances(layout.domain, layout.tables, sigmas)
        published: list[np.ndarray] = list(estimates)
        if self.nonnegative:
            published = tables.nonnegative_integer(layout.domain, layout.tables, estimates, sigmas=sigmas)
        totals = None if self.total is None else self._totals(loaded, layout, [np.asarray(p)[1] for p in merged])
        outputs: dict[str, pa.Table] = {}
        shifts: dict[str, float] = {}
        for i, table in enumerate(self.tables):
            confidence = self.confidence(loaded, table)
            width = tables.each_cell_half_width(variances[i], confidence)
            value = np.asarray(published[i])
            shift = float(np.max(np.abs(value - estimates[i]))) if self.nonnegative and value.size else 0.0
            columns = {
                "estimate": value,
                "lower": np.maximum(value - width - shift, 0.0),
                "upper": np.maximum(value + width + shift, 0.0),
            }
            if totals is not None:
                columns |= self._total_columns(loaded, i, totals, value, variances[i], shift)
            outputs[table_name(table)] = _cells_table(layout, i, columns)
            shifts[table_name(table)] = shift
        first = next(iter(outputs.values()))
        public: dict[str, Any] = {
            "tables": {name: out.num_rows for name, out in outputs.items()},
            "noise": "gaussian",
            "nonnegative": self.nonnegative,
        }
        if self.nonnegative:
            public["rounding_shift"] = shifts
        if self.total is not None:
            public["total"] = self.total.column
        internal = {"rows_counted": int(np.sum(counts[0]))}  # every table counts every row in its domain
        return MechanismResult(first, self.event(loaded, sigmas), public, internal, tables=outputs)

    def _totals(
        self, loaded: LoadedPolicy, layout: Layout, units: Sequence[np.ndarray]
    ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Each table's exact totals (in units) measured once with ``tau`` = sigma_total / r
        (:func:`measure`, OpenDP's map checked at sensitivity m B), back in the column's units,
        and reconstructed by least squares: the estimates and their cell variances."""
        from privrelease.mechanisms import tables

        assert self.total is not None
        r = self.total.resolution
        taus = self.sigmas(loaded, "total")
        sensitivity = loaded.policy.dataset.rows_per_person * self.total.bound
        measured = [
            measure(np.asarray(total, dtype=np.int64), tau / r, sensitivity).reshape(_shape(layout, i)) * r
            for i, (total, tau) in enumerate(zip(units, taus, strict=True))
        ]
        return (
            tables.reconstruct(layout.domain, layout.tables, taus, measured),
            tables.cell_variances(layout.domain, layout.tables, taus),
        )

    def _total_columns(
        self,
        loaded: LoadedPolicy,
        index: int,
        totals: tuple[list[np.ndarray], list[np.ndarray]],
        count: np.ndarray,
        count_variance: np.ndarray,
        shift: float,
    ) -> dict[str, np.ndarray]:
        """Table ``index``'s totals with each cell's interval at the totals' confidence C, and
        each cell's mean (published total / published count) with noisy sums' union-bound
        interval (:func:`.noisy_sums.mean_interval`: both intervals at ``1 - (1 - C) / 2``, the
        count's widened by the rounding ``shift``)."""
        from privrelease.mechanisms import tables

        assert self.total is not None
        estimates, variances = totals
        total, table = estimates[index], self.tables[index]
        confidence = self.confidence(loaded, table, "total")
        width = tables.each_cell_half_width(variances[index], confidence)
        half = 1 - (1 - confidence) / 2
        mean, mean_lower, mean_upper = mean_interval(
            total,
            count,
            tables.each_cell_half_width(variances[index], half),
            tables.each_cell_half_width(count_variance, half) + shift,
            self.total.bounds,
        )
        return {
            "total": total,
            "total_lower": total - width,
            "total_upper": total + width,
            "mean": mean,
            "mean_lower": mean_lower,
            "mean_upper": mean_upper,
        }

    # --- report -------------------------------------------------------------------------------

    def explanations(self) -> tuple[str, ...]:
        return (EXPLANATION,) if self.total is None else (EXPLANATION, TOTALS_EXPLANATION)

    def example_run(self, loaded: LoadedPolicy, rows: int) -> tuple[dict[str, Any], dict[str, int]]:
        """Every cell of every table published, one file per table, each row counted."""
        layout = self.layout(loaded)
        return {"rows_counted": rows}, {table_name(t): layout.cells(i) for i, t in enumerate(self.tables)}

    def files_in_words(self, files: Sequence[tuple[str, int]], public: Mapping[str, Any]) -> str:
        """One table per file, named with its cells (with ``nonnegative``: how far its published
        integers lie from the unrounded estimate, the run's ``rounding_shift``), and with a
        ``total`` the columns a cell has; every table a margin of one estimate, so the files are
        not one dataset."""
        shifts = public.get("rounding_shift", {})
        described = []
        for table, (file, cells) in zip(self.tables, files, strict=True):
            name = table_name(table)
            shift = (
                f"; its published integers within ±{shifts[name]:.4g} of the unrounded estimate"
                if name in shifts
                else ""
            )
            described.append(f"{name} ({file}: {cells:,} cell{'s' if cells != 1 else ''}{shift})")
        text = f"{self.name} publishes {len(files)} table{'s' if len(files) != 1 else ''}, one file each: "
        text += "; ".join(described) + "."
        if self.total is not None:
            text += (
                f" Each cell has its count (estimate, lower, upper), the total of {self.total.column} (total, "
                "total_lower, total_upper) and their ratio, the mean (mean, mean_lower, mean_upper)."
            )
        if len(files) > 1:
            text += (
                " Every table is a margin of one estimate (its cells add up to the others): do not add the files "
                "together or read them as one dataset: each table counts the same rows again."
            )
        return text


KINDS = (NoisyTablesMechanism,)


class GaussianTables(ZCDPGaussian, Event):
    """Every table of a ``noisy_tables`` release measured once with Gaussian noise of its sigma
    (``sigmas``, in table order; OpenDP's float Gaussian, zCDP); one person moves each table by
    at most ``sensitivity`` = m in L2; with totals, each table's totals measured too with
    ``total_sigmas_units`` (tau_t, in units of the resolution), moved by at most
    ``total_sensitivity_units`` = m B in L2. It is rho-zCDP with ``rho = m^2 sum_t 1 / (2
    sigma_t^2) + (m B)^2 sum_t 1 / (2 tau_t^2)`` (module docstring; :func:`.tables.privacy_cost`).
    Stated at ``epsilon``."""

    kind: Literal["gaussian_tables"] = "gaussian_tables"
    sigmas: Annotated[tuple[Annotated[float, Field(gt=0)], ...], Field(min_length=1)]
    sensitivity: int = Field(ge=1)
    total_sigmas_units: tuple[Annotated[float, Field(gt=0)], ...] = ()
    total_sensitivity_units: int = Field(default=0, ge=0)
    epsilon: float = Field(ge=0)
    noise_label: ClassVar[str] = "Gaussian tables"
    omitted_at_default: ClassVar[dict[str, Any]] = {
        **Event.omitted_at_default,
        "total_sigmas_units": [],
        "total_sensitivity_units": 0,
    }

    @property
    def cost(self) -> float:
        """``rho`` as computed, the counts' and the totals' (:func:`.tables.privacy_cost`)."""
        from privrelease.mechanisms import tables

        rho = tables.privacy_cost(self.sigmas, self.sensitivity)
        if self.total_sigmas_units:
            rho += tables.privacy_cost(self.total_sigmas_units, 1, self.total_sensitivity_units)
        return rho

    @property
    def rho(self) -> float:
        return self.cost * (1 + 1e-15)


def _half_width(variance: np.ndarray, confidence: float, each: bool) -> float:
    """A table's half-width at ``confidence`` from its cells' variances: ``each`` cell's on its own
    (the largest over the cells), else every cell's at once (Sidak: :func:`.tables.simultaneous_half_width`)."""
    from privrelease.mechanisms import tables

    if each:
        return float(np.max(tables.each_cell_half_width(variance, confidence)))
    return tables.simultaneous_half_width(variance.ravel(), confidence)


def measure(counts: np.ndarray, sigma: float, rows_per_person: int) -> np.ndarray:
    """``counts`` (integers, any shape) plus i.i.d. Gaussian noise of standard deviation
    ``sigma``, as float64 of the same shape: OpenDP's ``make_gaussian`` on floats (L2 distance;
    module docstring), its privacy map at ``rows_per_person`` = m checked against the claim
    ``m^2 / (2 sigma^2)`` (totals in units: m B and tau). Randomness only from OpenDP's sampler
    (OS CSPRNG)."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    measurement = dp.m.make_gaussian(domain, dp.l2_distance(T=float), scale=sigma)
    granted, claimed = measurement.map(float(rows_per_person)), rows_per_person**2 / (2 * sigma**2)
    assert granted <= claimed * (1 + 1e-9), (sigma, rows_per_person, granted, claimed)
    flat = np.asarray(counts, dtype=np.float64).ravel()
    if not flat.size:
        return flat.reshape(np.shape(counts))
    return sample(measurement, flat, np.float64).reshape(np.shape(counts))


def _union_cells(layout: Layout) -> int:
    """The cells of the one array every table is a margin of (non-negative integer tables,
    :func:`.tables.nonnegative_integer`): every flat attribute, at the finest level any table uses."""
    levels = [table.level for table in layout.tables if table.level is not None]
    geography = layout.domain.geography
    nodes = geography.sizes[min(levels)] if geography is not None and levels else 1
    return nodes * math.prod(size for _, size in layout.domain.flat)


def _source(mechanism: NoisyTablesMechanism, axis: str) -> str:
    """The dataset column an output column is counted from (a level: its hierarchy column)."""
    level = mechanism.levels.get(axis)
    return level.of if level is not None else axis


def _axis_scheme(mechanism: NoisyTablesMechanism, loaded: LoadedPolicy, axis: str) -> Any:
    """The compiled scheme mapping a data value to the output column's label (a level: the
    hierarchy file's column at that level)."""
    level = mechanism.levels.get(axis)
    if level is None:
        return loaded.published_schemes([axis])[axis]
    return mechanism.column_scheme(loaded.policy, axis).to_scheme(loaded.hierarchies[level.of])


def _shape(layout: Layout, index: int) -> tuple[int, ...]:
    return tuple(len(layout.labels[axis]) for axis in layout.axes[index])


def _cells_table(layout: Layout, index: int, values: Mapping[str, np.ndarray]) -> pa.Table:
    """One row per cell of table ``index`` in declared order (zeros included): its labels, then
    ``values`` (``estimate``, ``lower``, ``upper``; with a total :data:`TOTAL_COLUMNS`; NaN
    means are null)."""
    axes = layout.axes[index]
    shape = _shape(layout, index)
    size = math.prod(shape)
    position = np.unravel_index(np.arange(size), shape) if axes else ()
    columns = {axis: pa.array(layout.labels[axis]).take(pa.array(at)) for axis, at in zip(axes, position, strict=True)}
    for name, value in values.items():
        flat = np.ravel(value)
        columns[name] = pa.array(flat, mask=np.isnan(flat)) if name == "mean" else pa.array(flat)
    return pa.table(columns)


def _statement_columns(unrounded: str) -> tuple[str, ...]:
    """The columns of a table of :meth:`NoisyTablesMechanism.statements` (counts' or totals')."""
    return (
        "table",
        "cells",
        "σ",
        "standard error",
        f"each cell{unrounded}",
        f"every cell at once{unrounded}",
        "probability",
    )


def _statement_rows(rows: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, ...], ...]:
    """:meth:`NoisyTablesMechanism.statements` as the report's rows (:func:`_statement_columns`)."""
    return tuple(
        (
            row["table"],
            f"{row['cells']:,}",
            f"{row['sigma']:.4g}",
            f"{row['standard_error']:.4g}",
            f"±{row['each_cell_half_width']:.4g}",
            f"±{row['all_cells_half_width']:.4g}",
            f"{row['confidence']:g}",
        )
        for row in rows
    )


def _layout(mechanism: NoisyTablesMechanism, loaded: LoadedPolicy) -> Layout:
    from privrelease.mechanisms.tables import Domain, Table

    levels = mechanism.levels
    owner = next((level.of for level in levels.values()), None)
    flat: list[str] = []
    for table in mechanism.tables:
        flat += [c for c in table if c not in levels and c != owner and c not in flat]
    labels = {column: [str(v) for v in found] for column, found in loaded.labels(flat).items()}
    geography = None
    names: list[str] = []
    if owner is not None:
        names, geography, level_labels = _geography(mechanism, loaded, owner)
        labels.update(level_labels)
    domain = Domain(tuple((c, len(labels[c])) for c in flat), geography)
    tables, axes = [], []
    for table in mechanism.tables:
        level = next((names.index(c) for c in table if c in names), None)
        own = tuple(c for c in flat if c in table)
        tables.append(Table(own, level))
        axes.append(((names[level],) if level is not None else ()) + own)
    return Layout(domain, tuple(tables), tuple(axes), labels)


def _geography(
    mechanism: NoisyTablesMechanism, loaded: LoadedPolicy, owner: str
) -> tuple[list[str], Any, dict[str, list[str]]]:
    """The geography's level names (finest first), its :class:`.tables.Geography` and each
    level's labels (sorted), from the hierarchy rows of the column's declared domain."""
    from privrelease.mechanisms.tables import Geography
    from privrelease.policies.schema import HierarchyScheme

    scheme = loaded.policy.scheme_for(owner)
    assert isinstance(scheme, HierarchyScheme), "the policy checks require a hierarchy"
    rows = loaded.hierarchies[owner]
    declared = loaded.policy.dataset.columns[owner].values
    if declared is not None:
        keep = {str(v) for v in declared}
        rows = tuple(row for row in rows if row[0] in keep)
    ordered = sorted(mechanism.levels.items(), key=lambda item: item[1].level)
    depth = len(rows[0]) - 1
    for name, level in ordered:
        if level.level > depth:
            raise UserError(
                f"levels.{name}.level must be between {scheme.level + 1} and {depth} for the hierarchy of column "
                f"{owner!r} ({depth + 1} columns); got {level.level}",
                field=f"levels.{name}.level",
            )
    names = [owner] + [name for name, _ in ordered]
    columns = [scheme.level] + [level.level for _, level in ordered]
    labels = {name: sorted({row[column] for row in rows}) for name, column in zip(names, columns, strict=True)}
    parents = []
    for (fine, fine_column), (coarse, coarse_column) in zip(
        zip(names, columns, strict=True), zip(names[1:], columns[1:], strict=True), strict=False
    ):
        parent: dict[str, str] = {}
        for row in rows:
            if parent.setdefault(row[fine_column], row[coarse_column]) != row[coarse_column]:
                raise UserError(
                    f"levels.{coarse}: level {coarse!r} is not nested in {fine!r}: {fine} {row[fine_column]!r} lies "
                    f"in {coarse} {parent[row[fine_column]]!r} and {row[coarse_column]!r} (hierarchy of column "
                    f"{owner!r}); every {fine} must lie in one {coarse}",
                    field=f"levels.{coarse}",
                )
        index = {label: i for i, label in enumerate(labels[coarse])}
        parents.append(np.array([index[parent[label]] for label in labels[fine]], dtype=np.int64))
    geography = Geography(owner, tuple(names), tuple(len(labels[n]) for n in names), tuple(parents))
    return names, geography, labels


_SIGMAS: dict[tuple[str, str, str], tuple[float, ...]] = {}
"""Allocated sigmas by (policy hash, mechanism, statistic): the optimization runs once per policy."""


def _sigmas(mechanism: NoisyTablesMechanism, loaded: LoadedPolicy, statistic: str) -> tuple[float, ...]:
    assert statistic == "count" or mechanism.total is not None, "only a total section has total sigmas"
    sigma = mechanism.noise.sigma if statistic == "count" else mechanism.noise.sigma_total
    if isinstance(sigma, tuple):
        return tuple(float(s) for s in sigma)
    if sigma is not None:
        return (float(sigma),) * len(mechanism.tables)
    key = (loaded.sha256, mechanism.name, statistic)
    if key not in _SIGMAS:
        from privrelease.mechanisms import tables

        layout = mechanism.layout(loaded)
        found = tables.allocate(
            layout.domain,
            layout.tables,
            mechanism._limits(loaded, statistic, each=True),
            mechanism._at_once(loaded, statistic),
        )
        _SIGMAS[key] = tuple(_round_down(s) for s in found)
    return _SIGMAS[key]


def _round_down(sigma: float) -> float:
    """``sigma`` rounded down to :data:`SIGMA_DIGITS` significant digits."""
    scale = 10 ** (SIGMA_DIGITS - 1 - math.floor(math.log10(sigma)))
    return math.floor(sigma * scale) / scale


@dataclass(frozen=True)
class TablesJob:
    """The exact counts of every table (a :class:`.noisy_counts.CountJob` each; None: the grand
    total, the rows counted), or its counts and clamped totals (a :class:`.noisy_sums.SumJob`
    each: ``[counts, totals]``, exact integers, merged by summing)."""

    jobs: tuple[CountJob | SumJob | None, ...]

    def partial(self, table: pa.Table) -> list[np.ndarray]:
        return by_columns(self, table)

    def column_partial(self, rows: int) -> TablesPartial:
        """:meth:`partial` one column at a time."""
        return TablesPartial(rows, [None if job is None else job.column_partial(rows) for job in self.jobs])

    def merge(self, parts: list[list[np.ndarray]]) -> list[np.ndarray]:
        return [np.asarray(np.sum([part[i] for part in parts], axis=0, dtype=np.int64)) for i in range(len(self.jobs))]


@dataclass
class TablesPartial:
    """:meth:`TablesJob.partial` one column at a time: each table's (a grand total: the rows)."""

    rows: int
    parts: list[CountPartial | SumPartial | None]

    def add(self, name: str, column: pa.ChunkedArray) -> None:
        for part in self.parts:
            if part is not None:
                part.add(name, column)

    def result(self) -> list[np.ndarray]:
        return [np.array([self.rows], dtype=np.int64) if part is None else part.result() for part in self.parts]


TOTALS_OF = (
    "the totals are the unrounded least-squares estimate, never made non-negative or integer (nonnegative applies "
    "to the counts only), so they add up to every published margin up to floating-point rounding, and a total or "
    "its interval can be negative even when no value is"
)
"""What holds of the published totals (plan, the report, ``release.json``)."""

EXPLANATION = """<dt>Noisy tables that add up</dt>
<dd>Every cell of every table's declared domain is published, empty ones included. Each table is measured once with independent Gaussian noise (OpenDP's exact sampler on a lattice far finer than any printed digit); adding or removing one person (at most m rows) changes the cells of each table by at most m in all, so the release is ρ-zCDP with ρ = m² Σ 1/(2σ²) over the tables (with a total column, plus the totals' share, below), and (ε, δ)-differentially private at the ε and δ shown (Bun, Steinke 2016; Canonne, Kamath, Steinke 2020). The published tables are then one least-squares estimate from all the measurements together (Xiong, He, Kifer 2023; Hay, Rastogi, Miklau, Suciu 2010), which costs no privacy: every table is a margin of it, so cells add up to every published margin and across geography levels (up to floating-point rounding in the last digits of the decimals; non-negative integers add up exactly), and each table borrows strength from the others. Each cell comes with lower and upper: its interval at the stated probability, cell by cell; the accuracy section also states the wider half-width that covers every cell of a table at once. Where the policy asks for non-negative integers, the estimate is made non-negative (without a geography, the non-negative least-squares fit to all the measurements, approximated by a bounded number of solver iterations on large sparse tables; with one, projected from the top of the geography down) and rounded keeping the total, still adding up; the intervals are widened by the largest shift this makes.</dd>"""

TOTALS_EXPLANATION = """<dt>Totals and means that add up</dt>
<dd>With a total column, each value is first rounded to its resolution and moved into its declared bounds, and every table's per-cell totals are measured once more with Gaussian noise; one person with at most m rows moves each table's totals by at most m times the larger bound in size, whatever the spread of the rows, and the release's ρ adds that measurement's share. The totals are reconstructed by the same least squares as the counts, so they add up across margins and geography levels (up to floating-point rounding: they are never rounded to integers or made non-negative). Each cell's mean is its published total divided by its published count, moved into the bounds (null where the count is below 1); its interval (mean_lower, mean_upper) holds the mean of the rounded and clamped values with at least the stated probability, from the total's and the count's intervals at half the miss probability each.</dd>"""
