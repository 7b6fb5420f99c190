"""Noisy sums (the ``noisy_sums`` kind): per cell of a declared domain, the total of a clamped
numeric column, the number of rows and their ratio the mean, with discrete Gaussian noise.

``column``, ``bounds: [lo, hi]``, ``resolution`` r (default 1), ``by`` (the cells' columns,
declared domains, every cell published, empty ones included; ``by: []`` is one grand total) and
``noise: {distribution: gaussian, sigma_total: S_T, sigma_count: S_N}``. Each value is clamped
to ``[lo, hi]`` (values outside are moved to the nearer bound: a bias that depends on the data,
never published: counting the clamped values would cost privacy) and rounded to the nearest
multiple of r (``lo`` and ``hi`` are multiples), so that a cell's total is an integer number
``T`` of units r. The statistics published, and what their intervals hold, are those of these
rounded and clamped values (rounding moves a value by at most r / 2). Published per cell:
``r (T + Z_T)`` with ``Z_T ~ N_Z(0, (S_T / r)^2)`` and
``N + Z_N`` with ``Z_N ~ N_Z(0, S_N^2)``, both from OpenDP's exact discrete Gaussian sampler
(Canonne, Kamath, Steinke, "The Discrete Gaussian for Differential Privacy", NeurIPS 2020):
integers plus integer noise, no floating-point noise to leak through its low bits (Mironov
2012), which is why the values are rounded to units rather than given continuous noise.

**Sensitivity.** One person has at most m rows (``dataset.rows_per_person``: ``max_rows`` of
the person column, else 1). Adding or removing that person moves the counts by a vector ``c``
of nonnegative integers with ``sum c_i <= m`` and the totals by ``t`` with ``|t_i| <= B c_i``,
``B = max(|lo|, |hi|) / r`` (a clamped value is at most B units in size, whatever its sign):
in L2 ``|c|_2 <= m`` and ``|t|_2 <= B |c|_2 <= m B``, both largest when every row sits in one
cell at the bound of larger size. The L2 bound is the one that matters for Gaussian noise.

**Privacy.** For integers ``mu``, ``D_a(N_Z(mu, s^2) || N_Z(0, s^2)) <= a mu^2 / (2 s^2)``
(CKS Proposition 5: the shifted sum ``sum_z e^(-(z - x)^2 / (2 s^2))`` is largest at integer
``x``), and Rényi divergences of independent coordinates add: the release is rho-zCDP with
``rho = m^2 / (2 S_N^2) + (m B)^2 / (2 (S_T / r)^2)`` for every spread of the person's rows
(both directions). Its (epsilon, delta): CKS Proposition 12's conversion over the orders of
:mod:`.renyi` (``approximate``); ``P[L > eps] <= e^((a - 1)(a rho - eps))`` (Markov's
inequality on ``e^((a - 1) L)``), least at ``a = (eps + rho) / (2 rho)``: ``e^(-(eps - rho)^2 /
(4 rho))`` for ``eps > rho`` (``probabilistic``). These are bounds, not the exact curve of one
spread; the PLD given for composition is the dominating pair of the stated (epsilon, delta)
point (sound, loose), and the Rényi divergences ``a rho`` compose exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from privrelease.errors import UserError
from privrelease.mechanisms import zcdp
from privrelease.mechanisms.columns import SUMS_TABLE
from privrelease.mechanisms.kinds import (
    AccuracyCheck,
    Axis,
    ColumnRef,
    Epsilon,
    Event,
    FieldError,
    Frontier,
    Issue,
    Loc,
    MechanismKind,
    Model,
    Name,
    Names,
    Number,
    Planned,
    by_columns,
    checked,
    frontier_of,
    half_width_target,
    log_grid,
)
from privrelease.mechanisms.kinds.noisy_counts import (
    CHOSEN,
    CHOSEN_BY_PLAN,
    MAX_CELLS,
    MAX_NOISE,
    MIN_NOISE,
    CellIndex,
    CountJob,
    Sigma,
    add_noise,
    all_cells_half_width,
    domain_issues,
    error_targets,
    half_width,
    most_noise,
)
from privrelease.mechanisms.zcdp import ZCDPGaussian, stated_epsilon
from privrelease.policies.fields import num

if TYPE_CHECKING:
    from privrelease.mechanisms.kinds import AccuracyStatement, AccuracyTarget, LoadedPolicy, MechanismResult, Policy

MAX_UNITS = 10**9
"""The largest bound a policy may give, in units of its resolution (a total of a billion rows
of that size still fits an int64)."""

STATISTICS = ("total", "count")
"""What a ``targets.accuracy`` entry on noisy sums names in ``statistic``."""


def zcdp_rho(sigma_count: float, sigma_total: float, count_sensitivity: int, total_sensitivity: int) -> float:
    """``rho = D_N^2 / (2 S_N^2) + D_T^2 / (2 S_T^2)``: the zCDP of one release whose counts move
    by at most ``D_N = m`` and totals by ``D_T = m B`` in L2 for one person of at most m rows
    (``S_T``, ``B`` in units; module docstring)."""
    return count_sensitivity**2 / (2 * sigma_count**2) + total_sensitivity**2 / (2 * sigma_total**2)


def calibrate(
    epsilon: float, delta: float, rows_per_person: int, bound: float, count_share: float = 0.25
) -> tuple[float, float]:
    """``(sigma_total, sigma_count)`` meeting (``epsilon``, ``delta``) by
    :func:`.zcdp.approximate_delta`: the largest rho (to a relative 1e-9, by bisection on the
    nonincreasing delta) whose conversion reaches ``delta`` at ``epsilon``, ``count_share`` of it
    spent on the counts: ``sigma_count = m / sqrt(2 s rho)``, ``sigma_total = m B / sqrt(2 (1 - s)
    rho)``, ``B = max(|lo|, |hi|)`` (in the column's units) and m = ``rows_per_person``."""
    if not 0 < count_share < 1:
        raise UserError(f"count_share must be in (0, 1); got {count_share!r}", field="count_share")
    if not (epsilon > 0 and 0 < delta < 1):
        raise UserError(f"epsilon must be > 0 and delta in (0, 1); got {epsilon!r}, {delta!r}", field="epsilon")
    low, high = 0.0, 1.0
    while zcdp.approximate_delta(high, epsilon) <= delta:
        low, high = high, 2 * high
    while high - low > 1e-9 * high:
        middle = (low + high) / 2
        if zcdp.approximate_delta(middle, epsilon) <= delta:
            low = middle
        else:
            high = middle
    rho = low * (1 - 1e-9)
    m = rows_per_person
    return m * bound / math.sqrt(2 * (1 - count_share) * rho), m / math.sqrt(2 * count_share * rho)


class GaussianSums(ZCDPGaussian, Event):
    """Noisy totals and counts of every cell (module docstring): discrete Gaussian noise of
    parameter ``sigma_count`` on the counts and ``sigma_total_units`` (in units of the
    resolution: the policy's sigma_total / resolution) on the totals; one person moves the counts
    by at most ``count_sensitivity`` and the totals by at most ``total_sensitivity_units`` units in
    L2. Its guarantee is stated at ``epsilon``."""

    kind: Literal["gaussian_sums"] = "gaussian_sums"
    sigma_count: float = Field(gt=0)
    sigma_total_units: float = Field(gt=0)
    count_sensitivity: int = Field(ge=1)
    total_sensitivity_units: int = Field(ge=0)
    epsilon: float = Field(ge=0)
    noise_label: ClassVar[str] = "discrete Gaussian sums"

    @property
    def rho(self) -> float:
        return zcdp_rho(
            self.sigma_count, self.sigma_total_units, self.count_sensitivity, self.total_sensitivity_units
        ) * (1 + 1e-15)


def _sigma_ok(value: float) -> bool:
    return MIN_NOISE <= value


SigmaTotal = Annotated[float, checked("sigma_total", f"a number >= {MIN_NOISE:g}", _sigma_ok)]
"""A total's noise, in the column's units (noisy sums, noisy tables' totals)."""

Bounds = Annotated[
    tuple[Number, Number], Field(description="[lo, hi]: two numbers, lo < hi, each a multiple of resolution")
]
"""``[lo, hi]``, the clamping bounds of a summed column (:func:`check_bounds`)."""

Resolution = Annotated[float, checked("resolution", "a number > 0", lambda v: v > 0)]
"""The unit a summed value is rounded to (default 1)."""


def check_bounds(bounds: tuple[float, float], resolution: float) -> None:
    """A FieldError at ``bounds`` (relative to the model holding them) unless ``lo < hi`` and each
    is a multiple of ``resolution`` of at most :data:`MAX_UNITS` times it in size."""
    lo, hi = bounds
    if not lo < hi:
        raise FieldError.at(("bounds",), f"bounds must be [lo, hi] with lo < hi; got [{num(lo)}, {num(hi)}]")
    for i, bound in enumerate(bounds):
        units = bound / resolution
        if abs(units) > MAX_UNITS or abs(units - round(units)) > 1e-9 * max(1.0, abs(units)):
            raise FieldError.at(
                ("bounds", i),
                f"each bound must be a multiple of resolution {num(resolution)} of at most "
                f"{MAX_UNITS:,} times it in size; got {num(bound)}",
            )


def bound_units(bounds: tuple[float, float], resolution: float) -> tuple[int, int]:
    """The bounds (checked by :func:`check_bounds`) in units of the resolution."""
    return round(bounds[0] / resolution), round(bounds[1] / resolution)


class GaussianSumsNoise(Model):
    """Discrete Gaussian noise: ``sigma_total`` (in the column's units) on each cell's total,
    ``sigma_count`` on each cell's count; either left out is chosen by plan, the largest whose
    half-width meets every ``absolute_error`` target on its statistic naming the release."""

    distribution: Literal["gaussian"]
    sigma_total: SigmaTotal | None = CHOSEN
    sigma_count: Sigma | None = CHOSEN


class NoisySumsMechanism(MechanismKind):
    """Per cell of the declared domain of ``by`` (every cell, empty ones included; none: one
    grand total), the total of ``column`` clamped to ``bounds`` and rounded to ``resolution``,
    the number of rows and the mean (their ratio), with discrete Gaussian noise on the total and
    the count (module docstring). Each comes with ``_lower`` / ``_upper``: its interval at the
    accuracy target's confidence (default 95%), cell by cell."""

    type: Literal["noisy_sums"]
    column: Name
    bounds: Bounds
    resolution: Resolution = 1.0
    by: Names = ()
    noise: GaussianSumsNoise
    epsilon: Epsilon | None = None

    label: ClassVar[str] = "noisy sums (totals, counts and means by cell)"
    accuracy_fields: ClassVar[tuple[str, ...]] = ("absolute_error",)
    accuracy_statistics: ClassVar[tuple[str, ...]] = STATISTICS
    reads_max_rows: ClassVar[bool] = True
    """It reads up to ``max_rows`` rows of each person: its sensitivity is m (module docstring)."""

    @model_validator(mode="after")
    def _check_bounds(self) -> NoisySumsMechanism:
        check_bounds(self.bounds, self.resolution)
        sigma_total = self.noise.sigma_total
        if sigma_total is not None and not MIN_NOISE <= sigma_total / self.resolution <= MAX_NOISE:
            raise FieldError.at(
                ("noise", "sigma_total"),
                f"sigma_total / resolution must be in [{MIN_NOISE:g}, {MAX_NOISE:g}]; got "
                f"{num(sigma_total)} / {num(self.resolution)}: raise resolution or lower sigma_total",
            )
        return self

    @property
    def _units(self) -> tuple[int, int]:
        """The bounds in units of the resolution."""
        return bound_units(self.bounds, self.resolution)

    @property
    def _total_sigma(self) -> float:
        """The total's noise parameter in units (of a :meth:`resolved` release)."""
        assert self.noise.sigma_total is not None, "a resolved release has both sigmas"
        return self.noise.sigma_total / self.resolution

    @property
    def _count_sigma(self) -> float:
        """The count's noise parameter (of a :meth:`resolved` release)."""
        assert self.noise.sigma_count is not None, "a resolved release has both sigmas"
        return self.noise.sigma_count

    def resolved(self, loaded: LoadedPolicy) -> NoisySumsMechanism:
        """This release with both sigmas: the policy's, or each it leaves out chosen by plan, the
        largest whose exact half-width meets every ``absolute_error`` target on its statistic
        naming the release (:func:`.noisy_counts.largest_noise`; sigma_total from the noise in
        units, a relative 1e-12 below, so that dividing by the resolution again stays within it)."""
        chosen: dict[str, float] = {}
        for statistic, field in (("total", "sigma_total"), ("count", "sigma_count")):
            if getattr(self.noise, field) is not None:
                continue
            targets = error_targets(loaded.policy, self.name, statistic)
            if statistic == "total":
                chosen[field] = most_noise("gaussian", targets, self.resolution) * self.resolution * (1 - 1e-12)
            else:
                chosen[field] = most_noise("gaussian", targets)
        return self.model_copy(update={"noise": self.noise.model_copy(update=chosen)}) if chosen else self

    def _chosen_note(self) -> str:
        """What the plan's noise fact adds for the sigmas it chose."""
        chosen = [field for field in ("sigma_total", "sigma_count") if getattr(self.noise, field) is None]
        if not chosen:
            return ""
        return f" ({' and '.join(chosen)} {CHOSEN_BY_PLAN})"

    def column_refs(self) -> list[ColumnRef]:
        refs = [ColumnRef(("by", i), c) for i, c in enumerate(self.by)]
        return [ColumnRef(("column",), self.column, numeric=True), *refs]

    def published_columns(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.by, self.column)))

    def policy_issues(self, policy: Policy, here: Loc) -> Iterator[Issue]:
        """Every ``by`` column has a declared domain and no output column's name; a sigma left out
        has an ``absolute_error`` target on its statistic naming the release to choose it by."""
        yield from domain_issues(policy, (*here, "by"), self.by, "a noisy-sums table", SUMS_TABLE)
        for statistic, field in (("total", "sigma_total"), ("count", "sigma_count")):
            if getattr(self.noise, field) is None and not error_targets(policy, self.name, statistic):
                yield Issue(
                    (*here, "noise", field),
                    f"give noise.{field}, or an accuracy target naming {self.name!r} with statistic: {statistic} "
                    f"and absolute_error (targets.accuracy) for plan to choose the most noise that meets it",
                )

    def delta_reason(self) -> str | None:
        return "has Gaussian noise"

    def _event(self, loaded: LoadedPolicy) -> GaussianSums:
        """The release's event (of its :meth:`resolved` sigmas)."""
        release = self.resolved(loaded)
        m = loaded.policy.dataset.rows_per_person
        lo, hi = release._units
        event = GaussianSums(
            sigma_count=release._count_sigma,
            sigma_total_units=release._total_sigma,
            count_sensitivity=m,
            total_sensitivity_units=m * max(abs(lo), abs(hi)),
            epsilon=0.0,
        )
        targets = loaded.policy.targets
        epsilon = release.epsilon
        if epsilon is None:
            epsilon = stated_epsilon(event.rho, targets.delta, targets.accounting)
        return event.model_copy(update={"epsilon": epsilon})

    def _cells(self, loaded: LoadedPolicy) -> int:
        return math.prod(len(labels) for labels in loaded.labels(self.by).values())

    def plan(self, loaded: LoadedPolicy) -> Planned:
        cells, m = self._cells(loaded), loaded.policy.dataset.rows_per_person
        lo, hi = self.bounds
        size = max(abs(lo), abs(hi))
        event, noise = self._event(loaded), self.resolved(loaded).noise
        digits = ".10g" if self._chosen_note() else "g"
        facts: dict[str, Any] = {
            "cells": cells,
            "noise": f"discrete Gaussian, sigma_total {noise.sigma_total:{digits}}, sigma_count "
            f"{noise.sigma_count:{digits}}{self._chosen_note()}",
            "sensitivity": (
                f"one person (at most {m} row{'s' if m > 1 else ''}) moves the counts by at most {m} and the "
                f"totals by at most {m} x {num(size)} = {num(m * size)} in L2"
            ),
            "clamping": f"values outside [{num(lo)}, {num(hi)}] are moved to the nearer bound",
            "zcdp_rho": event.rho,
        }
        if cells > MAX_CELLS:
            return Planned(None, facts, ("declared domain", f"at most {MAX_CELLS:,} cells; it has {cells:,}"))
        return Planned(event, facts)

    def _widths(self, statistic: str, confidence: float, cells: int = 1) -> float:
        """The half-width of each cell's total (in the column's units) or count at ``confidence``;
        ``cells`` > 1: of all of them at once (:func:`.noisy_counts.all_cells_half_width`)."""
        sigma = self._total_sigma if statistic == "total" else self._count_sigma
        width = (
            half_width("gaussian", sigma, confidence)
            if cells == 1
            else all_cells_half_width("gaussian", sigma, confidence, cells)
        )
        return width * self.resolution if statistic == "total" else width

    def accuracy(self, loaded: LoadedPolicy, planned: Planned) -> AccuracyStatement:
        """Each cell's total within +-w_T and count within +-w_N with probability >= C (exact
        discrete Gaussian half-widths), all cells at once within the wider ones; the mean's
        interval is formed after the data (:func:`mean_interval`)."""
        from privrelease.mechanisms.kinds import CONFIDENCES, AccuracyStatement, StatedAccuracy

        release = self.resolved(loaded)
        cells = release._cells(loaded)
        confidence = half_width_target(loaded, release.name)[0]
        rows: list[tuple[str, ...]] = []
        document: dict[str, Any] = {}
        for statistic in STATISTICS:
            each = {f"{c:g}": release._widths(statistic, c) for c in CONFIDENCES}
            together = {f"{c:g}": release._widths(statistic, c, cells) for c in CONFIDENCES}
            document[statistic] = {"half_width": each, "all_cells_half_width": together}
            rows += [
                (statistic, f"{c:.0%}", f"±{num(each[f'{c:g}'])}", *([f"±{num(together[f'{c:g}'])}"] * (cells > 1)))
                for c in CONFIDENCES
            ]
        lo, hi = release.bounds
        document.update(
            cells=cells,
            clamping=CLAMPING.format(lo=num(lo), hi=num(hi), r=num(release.resolution)),
            mean=MEAN.format(c=f"{confidence:g}", lo=num(lo), hi=num(hi)),
            interval_confidence=confidence,
        )
        together_words = f"; all {cells} cells at once within the wider half-width" if cells > 1 else ""
        caption = (
            f"Each published total and count is within ± the half-width of its true value with the stated "
            f"probability, cell by cell{together_words} (exact discrete Gaussian tails). Clamping: "
            + document["clamping"]
            + ". Mean: "
            + document["mean"]
            + "."
        )
        columns = ("statistic", "confidence", "each cell", *([f"all {cells} cells at once"] * (cells > 1)))
        stated = StatedAccuracy("sums", caption, columns, tuple(rows), document)
        return AccuracyStatement(
            "the published total, count and mean (total / count, moved into the bounds) of each cell", stated=(stated,)
        )

    def accuracy_check(self, loaded: LoadedPolicy, target: AccuracyTarget, planned: Planned) -> AccuracyCheck:
        """Each cell's total (or count) within +-absolute_error with probability >= confidence."""
        assert target.absolute_error is not None and target.statistic in STATISTICS
        value = self.resolved(loaded)._widths(target.statistic, target.confidence)
        return AccuracyCheck(f"each cell's {target.statistic} half-width", "<=", target.absolute_error, value)

    def frontier(self, loaded: LoadedPolicy) -> Frontier:
        """Over sigma_total on a log grid, a decade either side of the policy's (sigma_count as
        it is): the release's epsilon at the target delta and each cell's total half-width at
        the accuracy target's confidence (default 95%)."""
        release = self.resolved(loaded)
        confidence, limit, label = half_width_target(loaded, release.name, "total")
        if limit is None:  # no target on the total: the published intervals' confidence, no requirement drawn
            confidence = half_width_target(loaded, release.name)[0]
        axis = Axis(
            "σ total",
            "noise.sigma_total",
            f"{confidence:.0%} half-width of each total",
            False,
            f"Accuracy: each published total (each cell on its own) is within ± the half-width of its true "
            f"total with probability at least {confidence:.0%} (discrete Gaussian noise, exact); sigma_count "
            f"stays {release._count_sigma:g}.",
            limit,
            label,
            log_x=True,
        )
        r, sigma_total = release.resolution, release.noise.sigma_total
        assert sigma_total is not None, "a resolved release has both sigmas"
        return frontier_of(
            loaded,
            axis,
            sigma_total,
            log_grid(sigma_total, low=MIN_NOISE * r, high=MAX_NOISE * r),
            lambda value: release._with_sigma_total(value)._event(loaded),
            lambda value: release._with_sigma_total(value)._widths("total", confidence),
        )

    def _with_sigma_total(self, value: float) -> NoisySumsMechanism:
        """This release with sigma_total ``value`` (its delta stated at the target delta)."""
        noise = self.noise.model_copy(update={"sigma_total": value})
        return self.model_copy(update={"noise": noise, "epsilon": None})

    def job(self, loaded: LoadedPolicy) -> SumJob:
        return SumJob(CountJob.declared(loaded, self.by), self.column, *self._units, self.resolution)

    def finish(self, loaded: LoadedPolicy, merged: Any) -> MechanismResult:
        """Noise added once to the exact counts and totals of every cell (merged over partitions)."""
        return self._release(loaded, self.job(loaded), merged)

    def _release(self, loaded: LoadedPolicy, job: SumJob, merged: Any) -> MechanismResult:
        """The table: ``merged`` (exact counts and totals in units, row-major over the cells) with noise."""
        from privrelease.mechanisms.kinds import MechanismResult

        release = self.resolved(loaded)
        counts, totals = np.asarray(merged, dtype=np.int64)
        noisy_count = add_noise(counts, "gaussian", release._count_sigma)
        noisy_total = add_noise(totals, "gaussian", release._total_sigma).astype(np.float64) * release.resolution
        confidence = half_width_target(loaded, release.name)[0]
        total_width, count_width = (release._widths(s, confidence) for s in STATISTICS)
        total_half, count_half = (release._widths(s, 1 - (1 - confidence) / 2) for s in STATISTICS)
        mean, mean_lower, mean_upper = mean_interval(noisy_total, noisy_count, total_half, count_half, release.bounds)
        columns = job.cells.labels()
        values = (
            noisy_total,
            noisy_total - total_width,
            noisy_total + total_width,
            noisy_count,
            np.maximum(noisy_count - count_width, 0),
            np.maximum(noisy_count + count_width, 0),
        )
        for name, value in zip(SUMS_TABLE[:6], values, strict=True):
            columns[name] = pa.array(value)
        columns["mean"] = pa.array(mean, mask=np.isnan(mean))
        columns["mean_lower"], columns["mean_upper"] = pa.array(mean_lower), pa.array(mean_upper)
        public = {"cells": int(noisy_count.size), "noise": "discrete gaussian", "interval_confidence": confidence}
        internal = {"rows_summed": int(np.sum(counts))}
        return MechanismResult(pa.table(columns), release._event(loaded), public, internal)

    def explanations(self) -> tuple[str, ...]:
        return (EXPLANATION,)

    def example_run(self, loaded: LoadedPolicy, rows: int) -> tuple[dict[str, Any], int]:
        """Every cell of the declared domain published, each row summed."""
        return {"rows_summed": rows}, self._cells(loaded)


KINDS = (NoisySumsMechanism,)


def mean_interval(
    total: np.ndarray,
    count: np.ndarray,
    total_half: float | np.ndarray,
    count_half: float | np.ndarray,
    bounds: tuple[float, float],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each cell's mean ``total / count`` (clamped to ``bounds``; NaN where the noisy count is
    below 1) and its interval, a union bound: if the true total T lies within ``total_half`` of
    the noisy one and the true count N within ``count_half`` (each with probability >= 1 -
    (1 - C) / 2, so both with >= C), then for N >= 1 the mean T / N is among ``t / n`` over
    ``t`` in ``[T' -+ total_half]`` and ``n`` in ``[max(1, N' - count_half), N' + count_half]``,
    whose extremes are at the corners (t / n is monotone in each for n > 0), and it lies in
    ``bounds`` (a mean of clamped values). Where ``N' + count_half < 1`` the count interval
    holds no N >= 1: the interval is ``bounds`` (nothing learnt; never an unbounded one). The
    half-widths are one number or one per cell (noisy tables' cells differ)."""
    lo, hi = bounds
    total, count = np.asarray(total, dtype=np.float64), np.asarray(count, dtype=np.float64)
    n_low, n_high = np.maximum(count - count_half, 1.0), count + count_half
    informative = n_high >= 1.0
    n_high = np.where(informative, n_high, 1.0)
    corners = np.stack([t / n for t in (total - total_half, total + total_half) for n in (n_low, n_high)])
    lower = np.where(informative, np.clip(corners.min(axis=0), lo, hi), lo)
    upper = np.where(informative, np.clip(corners.max(axis=0), lo, hi), hi)
    mean = np.where(count >= 1, np.clip(total / np.maximum(count, 1.0), lo, hi), np.nan)
    return mean, lower, upper


@dataclass(frozen=True)
class SumJob:
    """The exact count and clamped total (in units) of every cell of ``cells``' domain."""

    cells: CountJob
    column: str
    low: int
    high: int
    resolution: float

    def partial(self, table: pa.Table) -> np.ndarray:
        """``[counts, totals]`` (2 x cells, int64), the totals of :func:`clamped_units`."""
        return by_columns(self, table)

    def column_partial(self, rows: int) -> SumPartial:
        """:meth:`partial` one column at a time."""
        return SumPartial(self, CellIndex(self.cells, rows))

    def merge(self, parts: list[np.ndarray]) -> np.ndarray:
        return np.asarray(np.sum(parts, axis=0, dtype=np.int64))


@dataclass
class SumPartial:
    """:meth:`SumJob.partial` one column at a time: each row's cell and clamped value in units."""

    job: SumJob
    index: CellIndex
    units: np.ndarray | None = None

    def add(self, name: str, column: pa.ChunkedArray) -> None:
        self.index.add(name, column)
        if name == self.job.column:
            self.units = clamped_units(column, self.job.low, self.job.high, self.job.resolution)

    def result(self) -> np.ndarray:
        assert self.units is not None, f"column {self.job.column!r} is added"
        cell, cells = self.index.cells(), self.job.cells.cells
        totals = np.zeros(cells, dtype=np.int64)
        np.add.at(totals, cell, self.units)
        return np.stack([np.bincount(cell, minlength=cells).astype(np.int64), totals])


def clamped_units(column: pa.ChunkedArray, low: int, high: int, resolution: float) -> np.ndarray:
    """Each value of ``column`` rounded to the nearest multiple of ``resolution`` and clamped
    to ``[low, high]`` units, as int64 units (``lo`` and ``hi`` are whole units, so clamping
    then rounding lands in the same place)."""
    values = column.to_numpy().astype(np.float64)
    return np.clip(np.rint(values / resolution), low, high).astype(np.int64)


CLAMPING = (
    "each value is rounded to the nearest multiple of {r} and moved into [{lo}, {hi}] (values outside are moved to "
    "the nearer bound): the published statistics, and what their intervals hold, are those of these rounded and "
    "clamped values, a bias that depends on how many values lie outside (not published: counting them would cost "
    "privacy) and, by at most half of {r} a value, on the rounding"
)

MEAN = (
    "mean = total / count moved into [{lo}, {hi}] (where every mean of such values lies) where the noisy "
    "count is >= 1 (post-processing), else null; its interval [mean_lower, "
    "mean_upper] holds the mean of the cell's rounded and clamped values with probability >= {c} (for a cell with "
    "rows): a union bound over the total's and the count's intervals at 1 - (1 - {c}) / 2 each, the ratio's "
    "extremes over them, within [{lo}, {hi}]; where the count's interval holds no count >= 1 it is [{lo}, {hi}]"
)

EXPLANATION = """<dt>Noisy sums</dt>
<dd>For every cell of the table's declared domain, empty ones included, the total of a column and the number of rows are published with independent discrete Gaussian noise (OpenDP's exact sampler); the mean is their ratio, computed from the published numbers (post-processing, no privacy cost). Each value is first rounded to a multiple of the resolution and moved into its declared bounds, so one person with at most m rows changes the counts by at most m and the totals by at most m times the larger bound in size: the release is ρ-zCDP and (ε, δ)-differentially private at the ε and δ shown (Canonne, Kamath, Steinke 2020). Totals and counts come with intervals (the columns total_lower, total_upper, count_lower, count_upper) that hold their true values (the statistics of the rounded and clamped values) with the stated probability, cell by cell; the mean's interval (mean_lower, mean_upper) holds the mean of the rounded and clamped values with at least that probability, and is the whole range of the bounds where the noisy count is too small to say anything.</dd>"""
