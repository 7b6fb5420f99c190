"""Tables that add up: a set of marginal tables measured with Gaussian noise and reconstructed by
generalized least squares (GLS) into ONE estimate, of which every published table is a margin.

**Domain.** Flat attributes ``j`` with sizes ``n_j`` and at most one hierarchical attribute (the
geography) with nested levels ``0`` (finest) .. ``L-1`` and the implicit root ``L`` (the total).
A :class:`Table` is a subset ``F`` of the flat attributes at one geography level (or the root).
One row changes one cell of every table by 1 (L1 and L2 sensitivity 1 per table; with ``m`` rows
per person the caller multiplies the sensitivity by ``m``).

**Strategy = workload.** Table ``t`` is measured once, ``y_t = table_t(x) + N(0, sigma_t^2 I)``
(the kind samples it with OpenDP's float Gaussian, exact on a lattice of spacing ``2^-1074``:
Gaussian far below any printed digit, so the variances and half-widths below are exact for it).

**Residual decomposition** (ResidualPlanner, Xiong, He, Kifer, NeurIPS 2023; McKenna et al., HDMM,
VLDB 2018). For a subset ``S`` of the flat attributes the S-residual of a table over ``F ⊇ S`` is
``A_S y``: ``(I - J/n_j)`` on every ``j`` in ``S``, the sum over every ``j`` in ``F \\ S``. From
``y_t`` it has covariance ``sigma_t^2 prod_{j in F_t \\ S} n_j`` times the projector onto the
residual subspace, and residuals of different ``S`` are independent, so GLS splits into one
problem per ``S`` with the precision ``a_{S,l} = sum_{t: S ⊆ F_t, g_t = l} 1 / (sigma_t^2
prod_{F_t \\ S} n_j)`` at level ``l`` (inverse-variance weights within a level).

**Geography** (Hay, Rastogi, Miklau, Suciu, VLDB 2010, generalized to any fan-out and per-level
variance: the Kalman/RTS smoother on the tree). Per ``S``, from the finest measured level up:
leaves ``z = y, u = 1/a``; a node with children ``c``: ``s = sum z_c, U = sum u_c``, and if
measured ``z = (a y + s/U) / (a + 1/U), u = 1 / (a + 1/U)``, else ``z = s, u = U``. Down: at the
root ``x = z, V = u``; a child ``c`` of ``v``: ``x_c = z_c + (u_c/U_v)(x_v - s_v)``,
``V_c = u_c + (u_c/U_v)^2 (V_v - U_v)``.

**Reconstruction.** Table ``s`` = ``sum_{S ⊆ F_s}`` the S-residual estimate at ``s``'s level spread
over ``F_s \\ S`` by ``1/n_j``; its cell variance at node ``c`` is ``sum_{S ⊆ F_s} V_S(c)
prod_{j in S} (1 - 1/n_j) prod_{j in F_s \\ S} 1/n_j^2``. Cells of one table differ only by node.

**Accuracy.** Each cell: ``sqrt(V) Phi^-1((1 + C)/2)`` (:func:`each_cell_half_width`). Every
cell of a table at once: the cells are correlated, and Sidak's inequality makes the product of
the per-cell coverages a lower bound (:func:`simultaneous_half_width`).
**Allocation** (:func:`allocate`): the least ``sum_t 1/sigma_t^2`` (zCDP ``rho``, :func:`privacy_cost`)
meeting every target as plan checks it: each cell's variance within its limit
(:func:`variance_limit`), every cell at once by Sidak's product over the real variances
(global for confidences >= 0.894, where the problem is convex); :func:`naive_sigmas` is the
alternative without reconstruction.
**Non-negative integer tables** (:func:`nonnegative_integer`): post-processing, a non-negative
least-squares fit (no geography; approximate on large sparse arrays: :data:`NNLS_WORK`) or
top-down over the geography, every table still a margin of one array.

The array layout of a table: axis 0 the geography nodes at its level (absent at the root), then
its flat attributes in :attr:`Domain.flat` order.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy import optimize, sparse, special

from privrelease.errors import UserError
from privrelease.mechanisms.accuracy import each_cell_miss
from privrelease.mechanisms.confidence import check_confidence
from privrelease.mechanisms.randomness import random_uint64

_U = float(np.finfo(float).eps)


@dataclass(frozen=True, eq=False)
class Geography:
    """The one hierarchical attribute: levels finest first, ``parents[l][i]`` the node of level
    ``l + 1`` that node ``i`` of level ``l`` belongs to (``len(parents) == len(levels) - 1``)."""

    name: str
    levels: tuple[str, ...]
    sizes: tuple[int, ...]
    parents: tuple[np.ndarray, ...]

    def __post_init__(self) -> None:
        if not self.levels or len(self.sizes) != len(self.levels) or len(self.parents) != len(self.levels) - 1:
            raise UserError(
                f"geography {self.name!r}: {len(self.levels)} levels, {len(self.sizes)} sizes and "
                f"{len(self.parents)} parent arrays; need one size per level and one parent array fewer",
                field="geography",
                allowed="sizes per level, parents between consecutive levels",
            )
        for size in self.sizes:
            if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
                raise UserError(
                    f"geography {self.name!r}: level size {size!r}", field="geography", allowed="integers >= 1"
                )
        for level, parent in enumerate(self.parents):
            parent = np.asarray(parent)
            children, coarse = self.sizes[level], self.sizes[level + 1]
            if parent.shape != (children,) or not np.issubdtype(parent.dtype, np.integer):
                raise UserError(
                    f"geography {self.name!r}: parents of {self.levels[level]!r} have shape {parent.shape}",
                    field="geography",
                    allowed=f"{children} integer indexes into {self.levels[level + 1]!r}",
                )
            if parent.min() < 0 or parent.max() >= coarse or np.unique(parent).size != coarse:
                raise UserError(
                    f"geography {self.name!r}: parents of {self.levels[level]!r} must map onto every one of "
                    f"the {coarse} nodes of {self.levels[level + 1]!r}",
                    field="geography",
                    allowed=f"indexes 0..{coarse - 1}, each used at least once",
                )


@dataclass(frozen=True)
class Domain:
    """Flat attributes ``(name, size)`` in a fixed order, and at most one :class:`Geography`."""

    flat: tuple[tuple[str, int], ...]
    geography: Geography | None = None

    @property
    def root(self) -> int:
        """The index of the root level (the total): the number of geography levels."""
        return 0 if self.geography is None else len(self.geography.levels)

    def nodes(self, level: int) -> int:
        """Node count at ``level`` (``root`` included: 1)."""
        return 1 if level == self.root else self.geography.sizes[level]  # type: ignore[union-attr]


@dataclass(frozen=True)
class Table:
    """A marginal table: flat attribute names (in :attr:`Domain.flat` order) at a geography level
    index (``None``: the geography summed out)."""

    flat: tuple[str, ...]
    level: int | None = None

    def shape(self, domain: Domain) -> tuple[int, ...]:
        """The array shape: (nodes at its level if any,) then the flat sizes."""
        sizes = dict(domain.flat)
        head = () if self.level is None else (domain.nodes(self.level),)
        return head + tuple(sizes[name] for name in self.flat)


@dataclass
class _Structure:
    """What follows from (domain, tables) alone: attribute indexes, levels, the subsets ``S`` and
    the matrix ``K`` with ``a[(S, l)] = K @ p`` (``p_t = 1 / sigma_t^2``)."""

    domain: Domain
    tables: tuple[Table, ...]
    sizes: tuple[int, ...]
    attrs: list[tuple[int, ...]]  # per table: flat attribute indexes
    levels: list[int]  # per table: level index (root = domain.root)
    subsets: list[tuple[int, ...]]
    coefficients: np.ndarray  # (subsets, levels + 1, tables)
    aggregate: list[Any] = field(default_factory=list)  # sparse (nodes l+1) x (nodes l), l = 0..root-1
    parents: list[np.ndarray] = field(default_factory=list)


def _structure(domain: Domain, tables: Sequence[Table]) -> _Structure:
    names = [name for name, _ in domain.flat]
    if len(set(names)) != len(names):
        raise UserError(f"domain attributes {names} repeat a name", field="domain", allowed="distinct names")
    sizes = tuple(int(size) for _, size in domain.flat)
    if any(size < 1 for size in sizes):
        raise UserError(f"domain sizes {sizes}", field="domain", allowed="sizes >= 1")
    if not tables:
        raise UserError("no tables", field="tables", allowed="at least one table")
    attrs, levels = [], []
    for table in tables:
        unknown = [name for name in table.flat if name not in names]
        if unknown:
            raise UserError(
                f"table {list(table.flat)}: {unknown[0]!r} is not an attribute of the domain",
                field="tables",
                allowed=f"attributes of {names}",
            )
        index = tuple(names.index(name) for name in table.flat)
        if list(index) != sorted(set(index)):
            raise UserError(
                f"table {list(table.flat)}: attributes repeat or are out of the domain's order",
                field="tables",
                allowed=f"distinct attributes in the order {names}",
            )
        if table.level is not None and not (
            isinstance(table.level, int) and not isinstance(table.level, bool) and 0 <= table.level < domain.root
        ):
            raise UserError(
                f"table {list(table.flat)}: geography level {table.level!r}",
                field="tables",
                allowed=f"None or a level index 0..{domain.root - 1}" if domain.root else "None (no geography)",
            )
        attrs.append(index)
        levels.append(domain.root if table.level is None else table.level)
    subsets = sorted(
        {sub for index in attrs for k in range(len(index) + 1) for sub in itertools.combinations(index, k)},
        key=lambda sub: (len(sub), sub),
    )
    coefficients = np.zeros((len(subsets), domain.root + 1, len(tables)))
    for i, sub in enumerate(subsets):
        for t, index in enumerate(attrs):
            if set(sub) <= set(index):
                coefficients[i, levels[t], t] = 1.0 / math.prod(sizes[j] for j in index if j not in sub)
    structure = _Structure(domain, tuple(tables), sizes, attrs, levels, subsets, coefficients)
    for level in range(domain.root):
        children = domain.nodes(level)
        parent = (
            np.asarray(domain.geography.parents[level], dtype=np.int64)  # type: ignore[union-attr]
            if level + 1 < domain.root
            else np.zeros(children, dtype=np.int64)
        )
        structure.parents.append(parent)
        structure.aggregate.append(
            sparse.csr_matrix(
                (np.ones(children), (parent, np.arange(children))), shape=(domain.nodes(level + 1), children)
            )
        )
    return structure


def _precisions(sigmas: Sequence[float], count: int) -> np.ndarray:
    values = np.asarray(sigmas, dtype=float)
    if values.shape != (count,) or not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise UserError(
            f"sigmas {list(sigmas)!r}", field="sigmas", allowed=f"{count} finite numbers > 0, one per table"
        )
    return 1.0 / values**2


def _tree(
    structure: _Structure, a: np.ndarray, y: dict[int, np.ndarray] | None = None
) -> tuple[dict[int, np.ndarray], dict[int, np.ndarray]]:
    """The RTS smoother on the geography tree for one subset ``S`` with precision ``a[l]`` per
    level (complex for complex-step derivatives): the variance ``V`` per node and, given the
    level measurements ``y`` (node axis first), the estimate ``x`` per node, at every level from
    the finest measured one up to the root (the module's docstring has the recursion)."""
    root = len(a) - 1
    finest = int(np.flatnonzero(a.real > 0)[0])
    u = {finest: np.full(structure.domain.nodes(finest), 1.0 / a[finest], dtype=a.dtype)}
    z = {} if y is None else {finest: y[finest]}
    totals: dict[int, np.ndarray] = {}
    sums: dict[int, np.ndarray] = {}
    for level in range(finest + 1, root + 1):
        aggregate = structure.aggregate[level - 1]
        totals[level] = aggregate @ u[level - 1]
        measured = a[level].real > 0
        u[level] = 1.0 / (a[level] + 1.0 / totals[level]) if measured else totals[level]
        if y is not None:
            below = z[level - 1]
            sums[level] = (aggregate @ below.reshape(below.shape[0], -1)).reshape((-1,) + below.shape[1:])
            total = _column(totals[level], below.ndim)
            z[level] = (
                (a[level] * y[level] + sums[level] / total) * _column(u[level], below.ndim) if measured else sums[level]
            )
    variance, estimate = {root: u[root]}, {} if y is None else {root: z[root]}
    for level in range(root - 1, finest - 1, -1):
        parent = structure.parents[level]
        share = u[level] / totals[level + 1][parent]
        variance[level] = u[level] + share**2 * (variance[level + 1][parent] - totals[level + 1][parent])
        if y is not None:
            gap = estimate[level + 1][parent] - sums[level + 1][parent]
            estimate[level] = z[level] + _column(share, gap.ndim) * gap
    return variance, estimate


def _node_variances(structure: _Structure, precision: np.ndarray) -> list[dict[int, np.ndarray]]:
    """Per subset ``S``: ``V_S`` per node at each level from its finest measured one (none if
    ``S`` is not measured)."""
    return [_tree(structure, a)[0] if np.any(a.real > 0) else {} for a in structure.coefficients @ precision]


def _cell_factors(structure: _Structure, t: int) -> list[tuple[int, float]]:
    """For table ``t``: (subset index, ``prod_S (1 - 1/n_j) prod_{F \\ S} 1/n_j^2``) per ``S ⊆ F``."""
    index, sizes = structure.attrs[t], structure.sizes
    return [
        (
            i,
            math.prod(1 - 1 / sizes[j] for j in sub) * math.prod(1 / sizes[j] ** 2 for j in index if j not in sub),
        )
        for i, sub in enumerate(structure.subsets)
        if set(sub) <= set(index)
    ]


def _table_node_variances(structure: _Structure, precision: np.ndarray) -> list[np.ndarray]:
    """Per table, the cell variance per node of its level (``inf`` where not estimable)."""
    trees = _node_variances(structure, precision)
    out = []
    for t, level in enumerate(structure.levels):
        total: np.ndarray = np.zeros(structure.domain.nodes(level), dtype=precision.dtype)
        for i, factor in _cell_factors(structure, t):
            node = trees[i].get(level)
            total = total + (np.inf if node is None else factor * node)
        out.append(total)
    return out


def cell_variances(domain: Domain, tables: Sequence[Table], sigmas: Sequence[float]) -> list[np.ndarray]:
    """Per table, the variance of each reconstructed cell (an array of the table's shape)."""
    structure = _structure(domain, tables)
    per_node = _table_node_variances(structure, _precisions(sigmas, len(tables)))
    return [_spread(values, table, domain) for values, table in zip(per_node, tables, strict=True)]


def _spread(per_node: np.ndarray, table: Table, domain: Domain) -> np.ndarray:
    shape = table.shape(domain)
    if table.level is None:
        return np.full(shape, float(per_node[0]))
    return np.broadcast_to(per_node.reshape((-1,) + (1,) * (len(shape) - 1)), shape).copy()


def _residual(values: np.ndarray, index: tuple[int, ...], sub: tuple[int, ...]) -> np.ndarray:
    """``A_S`` on an array (node axis first, then the attributes ``index``): sum out the
    attributes not in ``S``, centre those in ``S``."""
    out = values.sum(axis=tuple(1 + k for k, j in enumerate(index) if j not in sub))
    for axis in range(1, 1 + len(sub)):
        out = out - out.mean(axis=axis, keepdims=True)
    return out


def reconstruct(
    domain: Domain,
    tables: Sequence[Table],
    sigmas: Sequence[float],
    measured: Sequence[np.ndarray],
    *,
    releases: int | None = None,
) -> list[np.ndarray]:
    """The GLS estimate of every table from the noisy ``measured`` tables (each of its table's
    shape): margins of one estimate, so cells add up to every table and across levels. With
    ``releases`` = R, every array has a last axis of R independent releases (simulation), and
    so has every estimate."""
    structure = _structure(domain, tables)
    precision = _precisions(sigmas, len(tables))
    if len(measured) != len(tables):
        raise UserError(
            f"{len(measured)} measured tables for {len(tables)} tables", field="measured", allowed="one per table"
        )
    arrays = []
    for table, values in zip(tables, measured, strict=True):
        values = np.asarray(values, dtype=float)
        expected = table.shape(domain) + (() if releases is None else (releases,))
        if values.shape != expected:
            raise UserError(
                f"measured table {list(table.flat)} has shape {values.shape}",
                field="measured",
                allowed=f"shape {expected}",
            )
        arrays.append(values[np.newaxis] if table.level is None else values)
    estimates = _residual_estimates(structure, precision, arrays)
    return [_assemble(structure, estimates, t) for t in range(len(tables))]


def _residual_estimates(
    structure: _Structure, precision: np.ndarray, arrays: list[np.ndarray]
) -> list[dict[int, np.ndarray]]:
    """Per subset, per level from its finest measured one up: the GLS estimate of the
    S-residual (node axis first)."""
    result = []
    for i, sub in enumerate(structure.subsets):
        a = structure.coefficients[i] @ precision
        y: dict[int, np.ndarray] = {}
        for level in (
            int(level) for level in np.flatnonzero(a > 0)
        ):  # inverse-variance weights of the tables measured at the level
            weights = structure.coefficients[i, level] * precision
            y[level] = np.zeros(())
            for t in np.flatnonzero(weights):
                y[level] = y[level] + weights[t] * _residual(arrays[t], structure.attrs[t], sub)
            y[level] = y[level] / a[level]
        result.append(_tree(structure, a, y)[1])
    return result


def _column(vector: np.ndarray, ndim: int) -> np.ndarray:
    return vector.reshape((-1,) + (1,) * (ndim - 1))


def _assemble(structure: _Structure, estimates: list[dict[int, np.ndarray]], t: int) -> np.ndarray:
    """Table ``t`` from the residual estimates at its level, each spread over ``F \\ S`` by
    ``1/n_j`` (ResidualPlanner's reconstruction)."""
    index, level = structure.attrs[t], structure.levels[t]
    batch = estimates[0][level].shape[1:]  # subsets[0] is S = {}: (nodes, releases...)
    shape = (structure.domain.nodes(level),) + tuple(structure.sizes[j] for j in index) + batch
    out = np.zeros(shape)
    for i, sub in enumerate(structure.subsets):
        if not set(sub) <= set(index):
            continue
        part = estimates[i][level]
        spread = math.prod(structure.sizes[j] for j in index if j not in sub)
        view = part.reshape((shape[0],) + tuple(structure.sizes[j] if j in sub else 1 for j in index) + batch)
        out += view / spread
    return out[0] if structure.tables[t].level is None else out


def _check_variances(variances: np.ndarray | Sequence[float]) -> np.ndarray:
    values = np.asarray(variances, dtype=float).ravel()
    if not values.size or not np.all(np.isfinite(values)) or np.any(values <= 0):
        raise UserError("cell variances must be finite and > 0", field="variances", allowed="finite numbers > 0")
    return values


def each_cell_half_width(variances: np.ndarray | Sequence[float], confidence: float) -> np.ndarray:
    """Per cell, the ``w`` with ``P(|N(0, v)| <= w) = C``: ``sqrt(v) Phi^-1((1 + C) / 2)``."""
    values = np.asarray(variances, dtype=float)
    _check_variances(values)
    return np.sqrt(values) * float(special.ndtri((1 + check_confidence(confidence)) / 2))


def simultaneous_half_width(variances: np.ndarray | Sequence[float], confidence: float) -> float:
    """One ``w`` with ``P(every cell within +-w at once) >= C`` for centred Gaussian errors of
    these variances, however correlated: by Sidak's inequality (Sidak, JASA 1967) the
    probability is at least ``prod_c P(|Z_c| <= w)``, and ``w`` solves ``sum_c ln(1 -
    erfc(w / sqrt(2 v_c))) = ln C`` (equal variances: ``sqrt(v) Phi^-1(1 - m/2)`` with ``m`` =
    :func:`.accuracy.each_cell_miss`, the bracket's ends). Raised by a relative 1e-12 until the
    computed product is >= C, so the coverage is never overstated."""
    confidence = check_confidence(confidence)
    values, counts = np.unique(_check_variances(variances), return_counts=True)
    target = math.log(confidence)

    def log_coverage(width: float) -> float:
        return float(np.sum(counts * np.log1p(-special.erfc(width / np.sqrt(2 * values)))))

    quantile = float(special.ndtri(1 - each_cell_miss(confidence, int(counts.sum())) / 2))
    low, high = math.sqrt(values[0]) * quantile, math.sqrt(values[-1]) * quantile
    while log_coverage(high) < target:  # float rounding at the bracket's end
        high *= 1 + 1e-12
    if log_coverage(low) >= target:
        width = low
    else:
        width = optimize.brentq(lambda w: log_coverage(w) - target, low, high, xtol=1e-300, rtol=4 * _U)
    while log_coverage(width) < target:
        width *= 1 + 1e-12
    return float(width)


def variance_limit(half_width: float, confidence: float, cells: int) -> float:
    """The largest per-cell variance ``v`` for which ``cells`` cells of variance at most ``v`` are
    all within ``+-half_width`` at once with probability >= C (``cells`` = 1: each cell):
    ``(w / Phi^-1(1 - m/2))^2``, ``m`` = :func:`.accuracy.each_cell_miss` (by Sidak's inequality,
    whatever the correlations). This turns an accuracy target into a limit for :func:`allocate`."""
    if not (math.isfinite(half_width) and half_width > 0):
        raise UserError(f"half-width {half_width!r}", field="absolute_error", allowed="a finite number > 0")
    quantile = float(special.ndtri(1 - each_cell_miss(confidence, cells) / 2))
    return (half_width / quantile) ** 2 * MARGIN


MARGIN = 1 - 1e-9
"""Variances are kept a relative 1e-9 below what a half-width target allows: far below any
printed digit, above the float noise of the half-width."""


def privacy_cost(sigmas: Sequence[float], rows_per_person: int = 1, value_bound: int = 1) -> float:
    """zCDP ``rho = (m B)^2 sum_t 1 / (2 sigma_t^2)``: the tables together are one Gaussian
    mechanism of L2 sensitivity ``m B`` per table with ``1 / sigma_eff^2 = sum_t 1 / sigma_t^2``
    (Bun and Steinke 2016, Prop. 1.6 and Lemma 2.3). ``B`` = ``value_bound`` is the most one row
    adds to one cell: 1 for counts; for totals the larger bound in size, ``B`` and the sigmas in
    units of the resolution (one person's rows move a table's totals by at most ``m B`` in L2)."""
    precision = _precisions(sigmas, len(sigmas))
    return float((rows_per_person * value_bound) ** 2 * precision.sum() / 2)


FLOOR = 1e-6
"""Every table is measured with a precision ``1 / sigma^2`` at least FLOOR times the largest of
the starting allocation (each table on its own at its limit): sigma at most 1,000 times the
smallest, at a cost of at most FLOOR per table."""


def _check_limits(limits: Sequence[float | None], count: int) -> np.ndarray:
    """``limits`` as floats (``nan`` for None), or a UserError."""
    if len(limits) != count or any(
        limit is not None and not (isinstance(limit, (int, float)) and math.isfinite(limit) and limit > 0)
        for limit in limits
    ):
        raise UserError(
            f"limits {list(limits)!r}", field="limits", allowed=f"{count} variances > 0 or None, one per table"
        )
    return np.array([math.nan if limit is None else float(limit) for limit in limits])


def _require_a_target(bounds: np.ndarray) -> np.ndarray:
    """``bounds`` (per table a variance bound, ``nan`` for none), or a UserError when none has one."""
    if np.all(np.isnan(bounds)):
        raise UserError("no table has an accuracy target", field="limits", allowed="at least one limit")
    return bounds


def _check_at_once(
    at_once: Sequence[Sequence[tuple[float, float]]] | None, count: int
) -> list[list[tuple[float, float]]]:
    """``at_once`` as lists of ``(half-width, confidence)`` (None: none), or a UserError."""
    if at_once is None:
        return [[] for _ in range(count)]
    if len(at_once) != count:
        raise UserError(
            f"{len(at_once)} lists of every-cell targets for {count} tables", field="at_once", allowed="one per table"
        )
    out = []
    for pairs in at_once:
        checked = []
        for width, confidence in pairs:
            if not (isinstance(width, (int, float)) and math.isfinite(width) and width > 0):
                raise UserError(f"half-width {width!r}", field="at_once", allowed="a finite number > 0")
            checked.append((float(width), check_confidence(confidence)))
        out.append(checked)
    return out


def naive_sigmas(domain: Domain, tables: Sequence[Table], limits: Sequence[float | None]) -> tuple[float, ...]:
    """Each table measured and published on its own (cell variance ``sigma^2``), the budget
    split equally (one sigma for all): ``sigma^2`` = the smallest limit."""
    _structure(domain, tables)
    sigma = math.sqrt(float(np.nanmin(_require_a_target(_check_limits(limits, len(tables))))))
    return (sigma,) * len(tables)


def allocate(
    domain: Domain,
    tables: Sequence[Table],
    limits: Sequence[float | None],
    at_once: Sequence[Sequence[tuple[float, float]]] | None = None,
) -> tuple[float, ...]:
    """Per table the sigma minimizing the privacy cost ``sum_t p_t`` (``p_t = 1 / sigma_t^2``:
    zCDP rho and every Gaussian epsilon at fixed delta increase with it) subject to the checks
    plan makes: every cell's variance <= its table's limit (each cell: :func:`variance_limit`
    over one cell; None: no limit) and, per ``(w, C)`` of ``at_once[t]`` (every cell at once),
    :func:`simultaneous_half_width` of the table's real cell variances ``<= w``: ``sum_c ln(1 -
    erfc(w / sqrt(2 v_c))) >= ln C``. A table with neither is still measured, at least at
    :data:`FLOOR`.

    Two SLSQP runs over ``p / p_start`` with exact gradients (complex step). First with every
    cell bounded by its table's largest variance (the limit, and :func:`variance_limit` over
    the table's cells per ``(w, C)``: sufficient), from ``p_t = 1 / bound_t`` (each table on its
    own): the variances are convex in ``p`` (diagonals of the inverse of a matrix affine in
    ``p``) and the cost linear, so that optimum is global; it is taken on the distinct node
    variances of each table. Then, where a table with a ``(w, C)`` has cells of different
    variances (a geography's nodes), from that optimum with the Sidak sums over every cell
    instead of its bound. Each feasible cell has ``P(|Z_c| <= w) >= C``, and ``-ln erf(w /
    sqrt(2 v))`` is increasing and convex in ``v`` wherever ``erf(w / sqrt(2 v)) >= 0.894``, so
    for ``C >= 0.894`` the problem is convex and that optimum global (below, a local one). The
    result is checked as plan checks it and scaled up if rounding missed (variances scale as
    ``1/c``, half-widths as ``1 / sqrt(c)``, when ``p`` scales by ``c``); the cheapest of the
    start and the two optima is returned."""
    structure = _structure(domain, tables)
    limit = _check_limits(limits, len(tables))
    once = _check_at_once(at_once, len(tables))
    cells = [math.prod(table.shape(domain)) for table in tables]
    bound = limit.copy()
    for t, pairs in enumerate(once):
        for width, confidence in pairs:
            bound[t] = np.fmin(bound[t], variance_limit(width, confidence, cells[t]))
    _require_a_target(bound)
    constrained = [int(t) for t in np.flatnonzero(~np.isnan(bound))]
    start = np.where(np.isnan(bound), 1 / np.nanmax(bound), 1 / bound)
    floor = FLOOR * start.max()
    per_node = [cells[t] // structure.domain.nodes(structure.levels[t]) for t in range(len(tables))]

    def excess(precision: np.ndarray) -> float:  # plan's check: at most 1 where every target is met
        variances = _table_node_variances(structure, precision)
        ratios = [float(variances[t].max()) / limit[t] for t in np.flatnonzero(~np.isnan(limit))]
        for t, pairs in enumerate(once):
            for width, confidence in pairs:  # met by the bound (as before: not costlier) or exactly
                largest = float(variances[t].max()) / variance_limit(width, confidence, cells[t])
                every = simultaneous_half_width(np.repeat(variances[t], per_node[t]), confidence)
                ratios.append(min(largest, (every / width) ** 2 / MARGIN))
        return max(ratios)

    def feasible(precision: np.ndarray) -> np.ndarray:
        precision = np.maximum(precision, floor)
        while (ratio := excess(precision)) > 1:
            precision = precision * ratio * (1 + 1e-12)
        return precision

    # the distinct node-variance functions of each constrained table: equal at two random points
    probe = np.random.default_rng(0)
    probes = [_table_node_variances(structure, start * probe.uniform(0.5, 2, start.size)) for _ in range(2)]
    nodes = {
        t: np.unique(np.round(np.log([probes[0][t], probes[1][t]]), 9), axis=1, return_index=True)[1]
        for t in constrained
    }

    def bounded(q: np.ndarray) -> np.ndarray:  # variance / bound at the distinct nodes
        variances = _table_node_variances(structure, start * q)
        return np.concatenate([variances[t][nodes[t]] / bound[t] for t in constrained])

    candidates = [start, start * _least(bounded, start, np.ones(len(tables)), floor / start)]
    if any(pairs and len(nodes[t]) > 1 for t, pairs in enumerate(once)):
        limited = [int(t) for t in np.flatnonzero(~np.isnan(limit))]

        def exact(q: np.ndarray) -> np.ndarray:  # variance / limit; ln(Sidak coverage) / ln C
            variances = _table_node_variances(structure, start * q)
            used = [variances[t][nodes[t]] / limit[t] for t in limited]
            for t, pairs in enumerate(once):
                for width, confidence in pairs:
                    terms = np.log1p(-special.erfc(width / np.sqrt(2 * variances[t] / MARGIN)))
                    used.append(np.atleast_1d(per_node[t] * terms.sum() / math.log(confidence)))
            return np.concatenate(used)

        candidates.append(start * _least(exact, start, candidates[1] / start, floor / start))
    best = min((feasible(p) for p in candidates), key=lambda p: float(p.sum()))
    return tuple(float(s) for s in 1 / np.sqrt(best))


def _least(used: Any, start: np.ndarray, q: np.ndarray, lower: np.ndarray) -> np.ndarray:
    """SLSQP from ``q``: the least ``start @ q`` with ``used(q) <= 1`` and ``q >= lower``; the
    gradient of ``used`` by complex step, ``Im used(q + ih e_k) / h``, exact to rounding."""
    weight = start / start.sum()

    def slack(q: np.ndarray) -> np.ndarray:
        return 1 - used(q).real

    def slack_gradient(q: np.ndarray) -> np.ndarray:
        return np.stack([-used(q + 1j * 1e-20 * np.eye(q.size)[k]).imag / 1e-20 for k in range(q.size)], axis=1)

    def cost(q: np.ndarray, *_: object) -> float:
        return float(weight @ q)

    def cost_gradient(q: np.ndarray, *_: object) -> np.ndarray:
        return weight

    result = optimize.minimize(
        cost,
        q,
        jac=cost_gradient,
        method="SLSQP",
        bounds=optimize.Bounds(lower, np.inf),
        constraints=optimize.NonlinearConstraint(slack, 0.0, np.inf, jac=slack_gradient),
        options={"ftol": 1e-14, "maxiter": 1000},
    )
    return np.asarray(result.x)


def nonnegative_integer(
    domain: Domain,
    tables: Sequence[Table],
    estimates: Sequence[np.ndarray],
    rng: np.random.Generator | None = None,
    sigmas: Sequence[float] | None = None,
) -> list[np.ndarray]:
    """Non-negative integer tables that still add up: every table a margin of ONE non-negative
    integer array (post-processing of the noisy tables: no privacy cost), of the cells any
    table needs (the union of the tables' attributes at their finest level). Its total is
    ``T``, the estimated total rounded (0 if negative). The rounding within a group of values
    adding up to an integer: floors, plus 1 on the ``total - sum floors`` values of largest
    remainder, ties broken uniformly at random (``rng``, default the OS CSPRNG).

    **No table below the root** (no geography): the non-negative least-squares fit in the
    metric of the measurements, as far as :data:`NNLS_WORK` reaches it
    (:func:`_nonnegative_least_squares`, ``sigmas``: the tables'
    noise, equal if None), so a margin of many cells stays close to its linear estimate
    wherever its cells are well above 0; then (:func:`_round_flat`) the largest table below
    the array is projected onto ``{m >= 0, sum m = T}`` and rounded, and the cells of each of
    its cells projected onto it and rounded: that table within 1 of the fit (after a
    projection that moves it by the fit's distance from ``T``), the others by at most the
    rounding of their cells.

    **With a geography**, top down (as the Census TopDown algorithm goes from nation to block):

    1. The full estimate ``x``, of which the consistent ``estimates`` are margins: per subset
       ``S`` its residual from a table containing ``S`` at the finest such level, split evenly
       over the nodes below (no table reads them), spread by ``1/n_j``.
    2. At the root, the Euclidean projection of ``x`` summed over the geography onto ``{x >= 0,
       sum x = T}``: ``max(x - tau, 0)`` with ``tau`` from the sorted values (Held, Wolfe,
       Crowder 1974; Duchi et al. 2008), then the rounding keeping ``T``.
    3. At each finer level, per group of the children of one node in one flat cell, the same
       projection onto the parent's integer count; where there are flat cells, the nodes' own
       totals are first made integers adding up to their parent's (the same projection and
       rounding over the children of each node), and the projected values raked to them
       (:func:`_rake`) before the rounding per group. The children add up to their parent
       exactly; a node's integer total is NOT within the rounding of its linear total: the
       projection moves it by its parent's ``tau`` (measured on geo-tables, 40 releases: up to
       3.8 for counties whose linear total is 20 or more, up to 23 where it is negative).

    A single projection of a whole array (one ``tau``) moves every cell by the same amount
    and margins of many cells far (the root step with a geography does it over the flat cells
    summed over the geography, where counts are large); bench/tables.py prints how far each
    table's integer cells depart from the linear ones.

    What holds: the accuracy statements (variances, half-widths) are those of the linear
    ``estimates``; for an integer table, ``half-width + max |integer - linear|`` over its cells
    is a valid bound at the same confidence. The integer cells are biased (upwards where the
    true counts are near 0: negative values are removed)."""
    structure = _structure(domain, tables)
    arrays = []
    for t, (table, values) in enumerate(zip(tables, estimates, strict=True)):
        values = np.asarray(values, dtype=float)
        if values.shape != table.shape(domain):
            raise UserError(
                f"estimate of table {list(table.flat)} has shape {values.shape}",
                field="estimates",
                allowed=f"shape {table.shape(domain)}",
            )
        arrays.append(values.reshape((domain.nodes(structure.levels[t]),) + values.shape[table.level is not None :]))
    union = tuple(sorted({j for index in structure.attrs for j in index}))
    finest = min(structure.levels)
    shape = (domain.nodes(finest),) + tuple(structure.sizes[j] for j in union)
    total = np.array([max(0, round(float(arrays[0].sum())))])
    if finest == domain.root:  # no table below the root: one fit of the whole array
        precision = np.ones(len(tables)) if sigmas is None else _precisions(sigmas, len(tables))
        start = _full_estimate(structure, arrays, union, shape)[0]
        fitted = _nonnegative_least_squares(structure, [values[0] for values in arrays], union, precision, start)
        integer = _round_flat(structure, union, fitted, total, rng)
    else:
        integer = _top_down(structure, arrays, union, shape, total, rng)
    integer = integer.reshape(shape)
    out = []
    for t, index in enumerate(structure.attrs):
        table = integer.sum(axis=tuple(1 + k for k, j in enumerate(union) if j not in index))
        for level in range(finest, structure.levels[t]):
            table = (structure.aggregate[level] @ table.reshape(table.shape[0], -1)).reshape((-1,) + table.shape[1:])
        table = np.rint(table).astype(np.int64)  # sums of integers below 2^53: exact in float64
        out.append(table[0] if tables[t].level is None else table)
    return out


NNLS_WORK = 10_000_000
"""The non-negative fit's budget in cells x iterations: at most ``max(50, NNLS_WORK / cells)``
L-BFGS-B iterations (:func:`nnls_iterations`; fewer once converged: 10,000 cells converge
within it, tests/test_tables_math.py certifies it). Measured on sparse gamma-Poisson arrays
(half the cells near 0) when this replaced trust-region ``lsq_linear`` capped at 200
iterations: the weighted squared error at 10,000 cells the optimum's (trust region: 1.22 times
it); at 100,000 cells 100 iterations 1.15 times the optimum (trust region: 4.3 times); at
1,000,000 cells 50 iterations 104,288 (trust region: 388,777)."""


def nnls_iterations(cells: int) -> int:
    """At most this many iterations of the non-negative fit of ``cells`` cells (:data:`NNLS_WORK`)."""
    return max(50, NNLS_WORK // max(cells, 1))


def _nonnegative_least_squares(
    structure: _Structure, estimates: list[np.ndarray], union: tuple[int, ...], precision: np.ndarray, start: np.ndarray
) -> np.ndarray:
    """The array ``x >= 0`` over the flat attributes ``union`` minimizing ``sum_t p_t ||A_t x -
    e_t||^2 / 2`` (``A_t`` sums ``x`` to table ``t``, ``e_t`` its consistent estimate, ``p_t = 1 /
    sigma_t^2``): the least-squares fit to the measurements ``y_t`` under ``x >= 0``, since
    ``y_t - e_t`` is orthogonal to every ``A_t x`` in that metric (Lawson and Hanson 1974).
    Approached by L-BFGS-B (Byrd, Lu, Nocedal, Zhu 1995) from ``start`` moved into ``x >= 0``,
    with the exact gradient ``sum_t p_t A_t^T (A_t x - e_t)`` (a pass per table, no matrix
    built), for at most :func:`nnls_iterations` iterations: the minimizer on small and mid-sized
    tables, an approximation of it on large sparse arrays."""
    shape = tuple(structure.sizes[j] for j in union)
    axes = [tuple(k for k, j in enumerate(union) if j not in index) for index in structure.attrs]
    views = [tuple(structure.sizes[j] if j in index else 1 for j in union) for index in structure.attrs]

    def cost_and_gradient(x: np.ndarray) -> tuple[float, np.ndarray]:
        cells, gradient, cost = x.reshape(shape), np.zeros(shape), 0.0
        for p, axis, view, estimate in zip(precision, axes, views, estimates, strict=True):
            residual = cells.sum(axis=axis).reshape(view) - np.reshape(estimate, view)
            cost += float(p) * float(np.vdot(residual, residual)) / 2
            gradient += float(p) * residual
        return cost, gradient.ravel()

    result = optimize.minimize(
        cost_and_gradient,
        np.maximum(start, 0.0).ravel(),
        jac=True,
        method="L-BFGS-B",
        bounds=optimize.Bounds(0.0, np.inf),
        options={"maxiter": nnls_iterations(math.prod(shape)), "ftol": 1e-15, "gtol": 1e-10},
    )
    return np.maximum(result.x, 0.0).reshape(shape)


def _round_flat(
    structure: _Structure,
    union: tuple[int, ...],
    fitted: np.ndarray,
    total: np.ndarray,
    rng: np.random.Generator | None,
) -> np.ndarray:
    """The non-negative ``fitted`` array made integers adding up to ``total``: the table of most
    cells below the array (the total if none) projected onto ``{m >= 0, sum m = total}`` and
    rounded, then the cells within each of its cells projected onto its integer and rounded
    (:func:`_project_groups`, :func:`_round_groups`)."""
    below = [t for t, index in enumerate(structure.attrs) if len(index) < len(union)]
    index = max(
        (structure.attrs[t] for t in below), key=lambda index: math.prod(structure.sizes[j] for j in index), default=()
    )
    sizes = tuple(structure.sizes[j] for j in index)
    margin = fitted.sum(axis=tuple(k for k, j in enumerate(union) if j not in index)).ravel()
    one = np.zeros(margin.size, dtype=np.int64)
    counts = _round_groups(_project_groups(margin, one, total), one, total, rng)
    view = tuple(structure.sizes[j] if j in index else 1 for j in union)
    groups = np.broadcast_to(np.arange(math.prod(sizes)).reshape(view), fitted.shape).ravel()
    return _round_groups(_project_groups(fitted.ravel(), groups, counts), groups, counts, rng)


def _top_down(
    structure: _Structure,
    arrays: list[np.ndarray],
    union: tuple[int, ...],
    shape: tuple[int, ...],
    total: np.ndarray,
    rng: np.random.Generator | None,
) -> np.ndarray:
    """Steps 1-3 of :func:`nonnegative_integer` with a geography: the integer array (finest
    level used x ``union``), projected and rounded from the root down."""
    domain, finest = structure.domain, min(structure.levels)
    full = _full_estimate(structure, arrays, union, shape)
    cells = full[0].size
    levels = [full.reshape(shape[0], cells)]  # finest .. root, every level's (nodes, flat cells)
    for level in range(finest, domain.root):
        levels.append(structure.aggregate[level] @ levels[-1])
    groups = np.zeros(cells, dtype=np.int64)
    integer = _round_groups(_project_groups(levels[-1].ravel(), groups, total), groups, total, rng)
    for level in range(domain.root - 1, finest - 1, -1):  # a group: the children of one node, one flat cell
        parent, above = structure.parents[level], integer
        groups = (parent[:, None] * cells + np.arange(cells)).ravel()
        values = _project_groups(levels[level - finest].ravel(), groups, above).reshape(-1, cells)
        if cells > 1:  # rake to the nodes' own totals too, integers adding up to their parent's
            parent_totals = above.reshape(-1, cells).sum(axis=1)
            nodes = _round_groups(
                _project_groups(levels[level - finest].sum(axis=1), parent, parent_totals), parent, parent_totals, rng
            )
            values = _rake(values, nodes, above.reshape(-1, cells), structure.aggregate[level], parent)
        integer = _round_groups(values.ravel(), groups, above, rng)
    return integer


def _full_estimate(
    structure: _Structure, arrays: list[np.ndarray], union: tuple[int, ...], shape: tuple[int, ...]
) -> np.ndarray:
    """Step 1 of :func:`nonnegative_integer`: the full estimate (finest level used x ``union``)
    of which the consistent ``arrays`` are margins: per subset ``S`` its residual from a table
    containing ``S`` at the finest such level, split evenly over the nodes below, spread by ``1/n_j``."""
    finest = min(structure.levels)
    full = np.zeros(shape)
    for sub in structure.subsets:
        level, t = min((structure.levels[t], t) for t, index in enumerate(structure.attrs) if set(sub) <= set(index))
        part = _residual(arrays[t], structure.attrs[t], sub)
        for below in range(level - 1, finest - 1, -1):  # split evenly over the children
            parent = structure.parents[below]
            part = part[parent] / _column(np.bincount(parent)[parent], part.ndim)
        full += part.reshape(shape[:1] + tuple(structure.sizes[j] if j in sub else 1 for j in union)) / math.prod(
            structure.sizes[j] for j in union if j not in sub
        )
    return full


def _rake(values: np.ndarray, rows: np.ndarray, columns: np.ndarray, aggregate: Any, parent: np.ndarray) -> np.ndarray:
    """Iterative proportional fitting (Deming and Stephan 1940) of the non-negative ``values``
    (nodes x flat cells) to the node totals ``rows`` and, per parent node and flat cell, the
    parent's ``columns``, ending on the columns (exact); a tiny floor lets empty cells move."""
    values = values + 1e-6
    for _ in range(RAKE_SWEEPS):
        sums = values.sum(axis=1)
        if np.abs(sums - rows).max() <= RAKE_TOLERANCE:
            break
        values *= _column(np.divide(rows, sums, out=np.zeros_like(sums), where=sums > 0), 2)
        sums = aggregate @ values
        values *= np.divide(columns, sums, out=np.zeros_like(sums), where=sums > 0)[parent]
    return values


RAKE_SWEEPS, RAKE_TOLERANCE = 50, 1e-3
"""At most 50 sweeps of :func:`_rake`, fewer once every node total is within 1e-3 (far below the
rounding to integers that follows)."""


def _sorted_groups(groups: np.ndarray, order: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For entries put in ``order`` (sorted by group): each one's group, its rank (from 0)
    within the group, and each group's first position."""
    group = groups[order]
    sizes = np.bincount(group, minlength=count)
    starts = np.cumsum(sizes) - sizes
    return group, np.arange(group.size) - starts[group], starts


def _project_groups(values: np.ndarray, groups: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Per group ``g``, the Euclidean projection onto ``{x >= 0, sum x = totals[g]}``:
    ``max(v - tau, 0)``, ``tau = (sum of the k largest - total) / k`` for the largest ``k``
    with ``k v_(k) > sum of the k largest - total`` (values sorted descending; Held, Wolfe,
    Crowder 1974; Duchi et al. 2008); 0 where the total is 0."""
    order = np.lexsort((-values, groups))
    group, rank, starts = _sorted_groups(groups, order, totals.size)
    ordered = values[order]
    running = np.cumsum(ordered)
    within = running - np.concatenate(([0.0], running))[starts][group]  # sum of the rank + 1 largest
    largest = np.bincount(group, weights=ordered * (rank + 1) > within - totals[group], minlength=totals.size)
    largest = largest.astype(np.int64)
    tau = np.full(totals.size, np.inf)
    some = (largest > 0) & (totals > 0)
    tau[some] = (within[starts[some] + largest[some] - 1] - totals[some]) / largest[some]
    return np.maximum(values - tau[groups], 0.0)


def _round_groups(
    values: np.ndarray, groups: np.ndarray, totals: np.ndarray, rng: np.random.Generator | None
) -> np.ndarray:
    """Per group, floors plus 1 on the ``total - sum floors`` entries of largest remainder (the
    group's sum of ``values`` is its integer total up to float rounding), ties broken uniformly
    at random (``rng``, default the OS CSPRNG)."""
    floors = np.floor(values)
    remainder = values - floors
    missing = totals - np.rint(np.bincount(groups, weights=floors, minlength=totals.size)).astype(np.int64)
    ties = random_uint64(values.size) if rng is None else rng.integers(0, 2**63, values.size)
    order = np.lexsort((ties, -remainder, groups))
    group, rank, _ = _sorted_groups(groups, order, totals.size)
    out = floors.astype(np.int64)
    out[order[rank < missing[group]]] += 1
    return out
