"""Count estimation from a table published by SPLU-Gen: the user side (Fu, Wang, Wong, Wang,
Jiang, "Small sum privacy and large sum utility in data publishing", 2014, Sections 4-5).

- A single sensitive value s: the published count ``f'_s`` is the maximum-likelihood estimate of
  the true count (Theorem 2): it is Binomial(gamma f_s, 1/gamma) with mean f_s.
- A conjunction of non-sensitive conditions P with one value s_k of each of w sensitive
  attributes: iterative Bayesian reconstruction (Eq. 13-14) over the K = 2^(w+1) states
  (P or not P, s_1 or not s_1, ...). With ``y`` the observed state counts in the published table
  and ``x^0 = y``::

      x_i^{t+1} = sum_j y_j m_ij x_i^t / sum_r m_rj x_r^t,      M = M_0 (x) M_1 (x) ... (x) M_w

  ``M_0 = I`` (non-sensitive values are published unchanged) and, per sensitive attribute,
  ``M_k = [[1 - a_k, a_k], [(gamma-1)/gamma, 1/gamma]]`` (Section 5.2), where ``a_k`` is the
  probability that a row whose true value is not s_k is published with s_k, evaluated at
  ``f_k = sum of x^t over the states with s_k`` (the paper's ``a_ij^t``).
  The paper's Fig. 6 prints ``a_k = f_k / N``. Under SPLU-Gen the exact value is
  ``a_k = f_k (gamma - 1) / (gamma (N - f_k))``: s_k lies in f_k decoy groups, whose
  ``f_k (gamma - 1)`` rows without s_k each publish s_k with probability 1/gamma. Only the exact
  value keeps the expected published count of s_k equal to f_k, as Theorem 2 requires (with
  ``f_k / N`` a lone value's count would be estimated near ``f gamma / (gamma + 1)``), so it is
  the default; ``transition="paper"`` reproduces Fig. 6 as printed.
  Stopping rule (Section 5.1): every state's relative change ``|x^{t+1} - x^t| / x^t <= 0.01``;
  a state whose absolute change is below ``absolute_tolerance`` (a state on its way to 0, where
  the relative change never shrinks) also counts as settled; at most ``max_iterations``.
  From ``x^0 = y`` that rule stops far too early (see :func:`reconstruct`), so the iteration
  starts at the closed-form interior fixed point (:func:`fixed_point`) and runs in SQUAREM
  cycles; ``start="observed", accelerate=False`` is the procedure as printed.

:class:`PublishedTable` encodes a published table once (dictionary codes per column) and answers
many queries in one batch: the counts of all conjunctions a batch needs are read from shared
per-column-set histograms, and the reconstructions of all queries run together as arrays.
"""

from __future__ import annotations

import csv
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NoReturn

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from privrelease.errors import UserError

Transition = Literal["exact", "paper"]
Condition = tuple[str, str]

DEFAULT_TOLERANCE = 0.01
DEFAULT_ABSOLUTE_TOLERANCE = 1e-3
DEFAULT_MAX_ITERATIONS = 10_000
DEFAULT_CONFIDENCE = 0.95
_MAX_SENSITIVE = 6


@dataclass(frozen=True)
class CountQuery:
    """``where``: conditions ``column = value`` on non-sensitive columns (published unchanged);
    ``sensitive``: one condition per sensitive column (randomized by SPLU-Gen). The query counts
    the rows satisfying all of them."""

    where: tuple[Condition, ...] = ()
    sensitive: tuple[Condition, ...] = ()

    @classmethod
    def of(
        cls,
        where: Mapping[str, str] | Iterable[Condition] = (),
        sensitive: Mapping[str, str] | Iterable[Condition] = (),
    ) -> CountQuery:
        """Build from dicts or ``(column, value)`` pairs."""

        def pairs(
            items: Mapping[str, str] | Iterable[Condition],
        ) -> tuple[Condition, ...]:
            source = items.items() if isinstance(items, Mapping) else items
            return tuple((str(column), str(value)) for column, value in source)

        return cls(where=pairs(where), sensitive=pairs(sensitive))

    def describe(self) -> str:
        """``age=30-39 & occupation=Sales`` (sensitive conditions last)."""
        return " & ".join(f"{column}={value}" for column, value in self.where + self.sensitive)


@dataclass(frozen=True)
class CountEstimate:
    """The estimated true count of ``query`` (``estimate``), the number of published rows that
    satisfy it (``observed``), and how the reconstruction ended (0 iterations: no iteration was
    needed, e.g. the single-value MLE). ``interval``: for one sensitive value alone, the exact
    confidence interval of the true count at ``confidence``
    (:func:`~privrelease.mechanisms.splu_guarantees.count_interval`); None for a reconstructed
    conjunction (no exact interval is known for the iterative reconstruction)."""

    query: CountQuery
    estimate: float
    observed: int
    iterations: int
    converged: bool
    interval: tuple[int, int] | None = None
    confidence: float | None = None

    def as_dict(self) -> dict[str, object]:
        return {
            "where": dict(self.query.where),
            "sensitive": dict(self.query.sensitive),
            "estimate": self.estimate,
            "observed": self.observed,
            "iterations": self.iterations,
            "converged": self.converged,
            "interval": None if self.interval is None else list(self.interval),
            "confidence": self.confidence,
        }


@dataclass(frozen=True)
class Reconstruction:
    """Result of :func:`reconstruct`: ``x`` (Q, K) estimated true state counts, ``iterations``
    and ``converged`` per query."""

    x: np.ndarray
    iterations: np.ndarray
    converged: np.ndarray


def _check_gamma(gamma: int) -> int:
    if isinstance(gamma, bool) or not isinstance(gamma, (int, np.integer)) or gamma < 2:
        raise UserError(f"gamma must be an integer >= 2; got {gamma!r}")
    return int(gamma)


def transition_matrices(x: np.ndarray, gamma: int, rows: int, transition: Transition = "exact") -> np.ndarray:
    """``M = I_2 (x) M_1 (x) ... (x) M_w`` for each query: shape ``(Q, K, K)`` for state counts
    ``x`` of shape ``(Q, K)``, ``K = 2^(w+1)``. State index bits, most significant first:
    P, s_1, ..., s_w (Fu et al., Definition 5 and Section 5.2)."""
    queries, states = x.shape
    w = round(math.log2(states)) - 1
    assert 2 ** (w + 1) == states and w >= 1, "K must be 2^(w+1) with w >= 1"
    cube = x.reshape((queries,) + (2,) * (w + 1))
    matrix = np.broadcast_to(np.eye(2), (queries, 2, 2))
    for k in range(1, w + 1):
        other_axes = tuple(a for a in range(1, w + 2) if a != k + 1)
        f = cube.sum(axis=other_axes)[:, 1]
        if transition == "exact":
            with np.errstate(divide="ignore", invalid="ignore"):
                a = f * (gamma - 1) / (gamma * (rows - f))
            a = np.where(rows - f > 0, a, 1.0)
        elif transition == "paper":
            a = f / rows
        else:
            raise UserError(f"transition must be 'exact' or 'paper'; got {transition!r}")
        a = np.clip(a, 0.0, 1.0)
        m_k = np.empty((queries, 2, 2))
        m_k[:, 0, 0] = 1.0 - a
        m_k[:, 0, 1] = a
        m_k[:, 1, 0] = (gamma - 1) / gamma
        m_k[:, 1, 1] = 1.0 / gamma
        size = matrix.shape[1]
        matrix = np.einsum("qab,qcd->qacbd", matrix, m_k).reshape(queries, 2 * size, 2 * size)
    return matrix


def em_step(
    x: np.ndarray,
    y: np.ndarray,
    gamma: int,
    rows: int,
    transition: Transition = "exact",
) -> np.ndarray:
    """One update of Eq. 13-14 for every query: ``x_i <- sum_j y_j m_ij x_i / sum_r m_rj x_r``
    with ``M`` evaluated at ``x`` (shapes ``(Q, K)``)."""
    matrix = transition_matrices(x, gamma, rows, transition)
    predicted = np.einsum("qi,qij->qj", x, matrix)
    ratio = np.divide(y, predicted, out=np.zeros_like(y), where=predicted > 0)
    return x * np.einsum("qij,qj->qi", matrix, ratio)


def log_likelihood(
    x: np.ndarray,
    y: np.ndarray,
    gamma: int,
    rows: int,
    transition: Transition = "exact",
) -> np.ndarray:
    """``sum_j y_j log(P(state j in D' | x))`` per query: the objective Eq. 13 climbs."""
    matrix = transition_matrices(x, gamma, rows, transition)
    predicted = np.einsum("qi,qij->qj", x, matrix)
    total = np.maximum(predicted.sum(axis=1, keepdims=True), 1e-300)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(y > 0, y * np.log(np.maximum(predicted, 0) / total), 0.0)
    return terms.sum(axis=1)


def _squarem_cycle(x0: np.ndarray, y: np.ndarray, gamma: int, rows: int, transition: Transition) -> np.ndarray:
    """One SQUAREM cycle (Varadhan & Roland 2008, scheme S3) of the Eq. 13 map F, per query:
    ``r = F(x0) - x0``, ``v = F(F(x0)) - F(x0) - r``, ``alpha = -|r| / |v|`` (at most -1),
    ``x' = x0 - 2 alpha r + alpha^2 v`` (step halved towards -1 while it leaves x >= 0), then one
    stabilizing step ``F(x')``; the plain ``F(F(x0))`` is kept where the likelihood would drop.
    It has the fixed points of F and cuts the thousands of steps a weakly identified query needs
    to tens."""
    x1 = em_step(x0, y, gamma, rows, transition)
    x2 = em_step(x1, y, gamma, rows, transition)
    r = x1 - x0
    v = x2 - x1 - r
    norm_r = np.sqrt((r * r).sum(axis=1))
    norm_v = np.sqrt((v * v).sum(axis=1))
    alpha = np.where(norm_v > 0, -norm_r / np.where(norm_v > 0, norm_v, 1.0), -1.0)
    alpha = np.minimum(alpha, -1.0)[:, None]
    candidate = x0 - 2 * alpha * r + alpha**2 * v
    for _ in range(30):
        bad = (candidate < 0).any(axis=1)
        if not bad.any():
            break
        alpha = np.where(bad[:, None], (alpha - 1.0) / 2.0, alpha)
        candidate = np.where(bad[:, None], x0 - 2 * alpha * r + alpha**2 * v, candidate)
    candidate = np.where((candidate < 0).any(axis=1)[:, None], x2, candidate)
    stabilized = em_step(candidate, y, gamma, rows, transition)
    worse = log_likelihood(stabilized, y, gamma, rows, transition) < log_likelihood(x2, y, gamma, rows, transition)
    return np.where(worse[:, None], x2, stabilized)


def fixed_point(y: np.ndarray, gamma: int, rows: int, transition: Transition = "exact") -> np.ndarray:
    """The interior fixed point of Eq. 13-14 in closed form: the ``x`` with ``M(x)^T x = y``
    (published state counts equal to their expectation), shape ``(Q, K)``; NaN where none exists.

    Summing ``M(x)^T x = y`` over the states with s_k gives the published count ``m_k`` of s_k
    as a function of ``f_k`` alone: ``m_k = f_k`` for the exact transition (Theorem 2) and
    ``m_k = f_k / gamma + (N - f_k) f_k / N`` for the paper's (the root in ``[0, N / 2]``). That
    fixes every ``M_k``, and ``x = (I (x) M_1^T (x) ... (x) M_w^T)^-1 y`` factor by factor.
    Entries may be negative (small true counts): then the fixed point Eq. 13 converges to lies on
    the boundary ``x >= 0`` and :func:`reconstruct` iterates towards it.
    """
    observed = np.atleast_2d(np.asarray(y, dtype=float))
    queries, states = observed.shape
    w = round(math.log2(states)) - 1
    cube = observed.reshape((queries,) + (2,) * (w + 1))
    for k in range(1, w + 1):
        other_axes = tuple(a for a in range(1, w + 2) if a != k + 1)
        published = cube.sum(axis=other_axes)[:, 1]
        if transition == "exact":
            f = published
            with np.errstate(divide="ignore", invalid="ignore"):
                a = f * (gamma - 1) / (gamma * (rows - f))
        else:
            b = 1.0 + 1.0 / gamma
            with np.errstate(invalid="ignore"):
                f = rows / 2.0 * (b - np.sqrt(b * b - 4.0 * published / rows))
            a = f / rows
        det = (1.0 - a * gamma) / gamma
        # (M_k^T)^-1 with M_k^T = [[1 - a, (gamma - 1) / gamma], [a, 1 / gamma]]
        inverse = np.empty((queries, 2, 2))
        with np.errstate(divide="ignore", invalid="ignore"):
            inverse[:, 0, 0] = (1.0 / gamma) / det
            inverse[:, 0, 1] = -((gamma - 1) / gamma) / det
            inverse[:, 1, 0] = -a / det
            inverse[:, 1, 1] = (1.0 - a) / det
        cube = np.moveaxis(
            np.einsum("qij,qj...->qi...", inverse, np.moveaxis(cube, k + 1, 1)),
            1,
            k + 1,
        )
    return cube.reshape(queries, states)


def reconstruct(
    y: np.ndarray,
    gamma: int,
    rows: int,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    absolute_tolerance: float = DEFAULT_ABSOLUTE_TOLERANCE,
    max_iterations: int = DEFAULT_MAX_ITERATIONS,
    transition: Transition = "exact",
    accelerate: bool = True,
    start: Literal["fixed_point", "observed"] = "fixed_point",
) -> Reconstruction:
    """Iterative Bayesian reconstruction (Fu et al., Eq. 13-14) of the true state counts from the
    observed state counts ``y`` (shape ``(Q, K)`` or ``(K,)``) of a table of ``rows`` rows
    published with ``gamma``. All Q queries iterate together.

    Stopping rule (Section 5.1): a query stops when every state changed by at most
    ``tolerance`` relative (or ``absolute_tolerance`` absolute: a state on its way to 0) from one
    iterate to the next, or after ``max_iterations`` applications of Eq. 13.

    The paper starts at ``x^0 = y`` (``start="observed"``). From there Eq. 13 moves slowly: the
    count of a popular value changes by well under 1% per step (the fixed-point contraction is
    0.99 and more when 1/gamma is close to the value's frequency), so the 1% rule stops it next to
    ``y``, far from the fixed point (a 30% error on UCI Adult instead of 11%). Hence the default
    starts at :func:`fixed_point`, the closed-form interior fixed point (negative entries raised
    to a small positive value so the iteration can move them), where the interior queries stop
    after one cycle and the others iterate to the boundary. ``accelerate`` applies Eq. 13 in
    SQUAREM cycles (:func:`_squarem_cycle`, 3 applications per cycle, the rule applied between
    cycles), which reaches the same fixed point from ``x^0 = y`` in tens of steps instead of
    thousands; ``accelerate=False, start="observed"`` is the paper's procedure as printed.
    """
    gamma = _check_gamma(gamma)
    if not 0 < tolerance < 1:
        raise UserError(f"tolerance must be in (0, 1); got {tolerance}")
    if max_iterations < 1:
        raise UserError(f"max_iterations must be >= 1; got {max_iterations}")
    if transition not in ("exact", "paper"):
        raise UserError(f"transition must be 'exact' or 'paper'; got {transition!r}")
    observed = np.asarray(y, dtype=float)
    single = observed.ndim == 1
    observed = np.atleast_2d(observed)
    if np.any(observed < 0) or not np.all(np.isfinite(observed)):
        raise UserError("observed state counts must be finite and >= 0")
    if start == "observed":
        x = observed.copy()
    elif start == "fixed_point":
        x = fixed_point(observed, gamma, rows, transition)
        usable = np.isfinite(x).all(axis=1)
        x = np.where(usable[:, None], np.maximum(x, absolute_tolerance / 2), observed)
    else:
        raise UserError(f"start must be 'fixed_point' or 'observed'; got {start!r}")
    count = x.shape[0]
    iterations = np.zeros(count, dtype=np.int64)
    converged = np.zeros(count, dtype=bool)
    active = np.arange(count)
    steps = 3 if accelerate else 1
    while active.size:
        current, target = x[active], observed[active]
        if accelerate:
            updated = _squarem_cycle(current, target, gamma, rows, transition)
        else:
            updated = em_step(current, target, gamma, rows, transition)
        change = np.abs(updated - current)
        settled = (change <= tolerance * current) | (change <= absolute_tolerance)
        done = settled.all(axis=1)
        x[active] = updated
        iterations[active] += steps
        converged[active[done]] = True
        active = active[~done & (iterations[active] + steps <= max_iterations)]
    if single:
        return Reconstruction(x=x[0], iterations=iterations[:1], converged=converged[:1])
    return Reconstruction(x=x, iterations=iterations, converged=converged)


@functools.lru_cache(maxsize=16)
def mobius_matrix(atoms: int) -> np.ndarray:
    """``(2^atoms, 2^atoms)`` matrix turning counts of "all atoms in S hold" (column S, a bitmask)
    into counts of exact states (row j: atoms in j hold, the others fail)."""
    size = 1 << atoms
    subset = np.arange(size)
    state = subset[:, None]
    superset = (subset[None, :] & state) == state
    sign = np.where(_popcount(subset[None, :] & ~state) % 2 == 1, -1, 1)
    matrix = np.where(superset, sign, 0).astype(np.int64)
    matrix.flags.writeable = False
    return matrix


def _popcount(values: np.ndarray) -> np.ndarray:
    bits = np.zeros_like(values)
    values = values.copy()
    while np.any(values):
        bits += values & 1
        values >>= 1
    return bits


@dataclass
class _KeySpace:
    """Row keys of one column combination. ``kind``: "raw" (mixed-radix product of the codes),
    "relabeled" (``table[raw]`` = dense label or -1) or "sorted" (``table`` = sorted distinct raw
    keys, label = position)."""

    row_key: np.ndarray
    card: int
    radix: int
    kind: Literal["raw", "relabeled", "sorted"] = "raw"
    table: np.ndarray | None = None
    counts: np.ndarray | None = None


@dataclass
class PublishedTable:
    """A published (SPLU-Gen) table, encoded once for fast count estimation.

    Every column is compared as text (``age=30`` matches the integer 30). ``gamma`` is the
    published SPLU-Gen parameter.
    """

    table: pa.Table
    gamma: int
    _codes: dict[str, np.ndarray] = field(init=False, repr=False)
    _cards: dict[str, int] = field(init=False, repr=False)
    _lookup: dict[str, dict[str, int]] = field(init=False, repr=False)
    _keys: dict[tuple[int, ...], _KeySpace] = field(init=False, repr=False)
    _conditions: dict[tuple[str, str], tuple[int, int]] = field(init=False, repr=False)
    _index: dict[str, int] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.gamma = _check_gamma(self.gamma)
        if self.table.num_rows == 0:
            raise UserError("the published table has no rows")
        self._codes, self._cards, self._lookup, self._keys, self._conditions = {}, {}, {}, {}, {}
        for name in self.table.column_names:
            column = self.table.column(name)
            if pa.types.is_dictionary(column.type):  # categorical already: reuse its codes
                encoded = column.unify_dictionaries().combine_chunks()
                dictionary = encoded.dictionary.cast(pa.string())
                if len(pc.unique(dictionary)) != len(dictionary):
                    encoded = pc.dictionary_encode(encoded.cast(pa.string()), null_encoding="encode")
                    dictionary = encoded.dictionary
            else:
                text = column if column.type == pa.string() else column.cast(pa.string())
                encoded = pc.dictionary_encode(text.combine_chunks(), null_encoding="encode")
                dictionary = encoded.dictionary
            values = dictionary.to_pylist()
            indices = encoded.indices
            if indices.null_count:  # a missing value never matches a condition
                indices = indices.fill_null(len(values))
                values.append(None)
            self._codes[name] = indices.to_numpy(zero_copy_only=False).astype(np.int64)
            self._cards[name] = len(values)
            self._lookup[name] = {value: code for code, value in enumerate(values) if value is not None}
        self._index = {name: i for i, name in enumerate(self.table.column_names)}

    @classmethod
    def read(cls, path: str | Path, gamma: int, delimiter: str = ",") -> PublishedTable:
        """Read a published table from CSV (header row; every column as text) or Parquet."""
        path = Path(path)
        if not path.is_file():
            raise UserError(f"published table not found: {path}")
        if path.suffix.lower() in {".parquet", ".pq"}:
            import pyarrow.parquet as pq

            try:
                return cls(pq.read_table(path), gamma)
            except pa.ArrowInvalid as error:
                raise UserError(f"cannot read published table {path}: {error}") from error
        import pyarrow.csv as pacsv

        with path.open(newline="", encoding="utf-8") as handle:
            header = next(csv.reader(handle, delimiter=delimiter), None)
        if not header:
            raise UserError(f"published table {path} is empty (no header row)")
        try:
            table = pacsv.read_csv(
                path,
                parse_options=pacsv.ParseOptions(delimiter=delimiter),
                convert_options=pacsv.ConvertOptions(
                    column_types={name: pa.string() for name in header},
                    strings_can_be_null=False,
                ),
            )
        except pa.ArrowInvalid as error:
            raise UserError(f"cannot read published table {path}: {error}") from error
        return cls(table, gamma)

    @property
    def rows(self) -> int:
        return self.table.num_rows

    @property
    def columns(self) -> list[str]:
        return list(self.table.column_names)

    def _code(self, column: str, value: str) -> int:
        lookup = self._lookup.get(column)
        if lookup is None:
            raise UserError(f"column {column!r} is not in the published table; columns: {self.columns}")
        code = lookup.get(value)
        if code is None:
            sample = sorted(lookup)[:8]
            more = ", ..." if len(lookup) > 8 else ""
            raise UserError(
                f"value {value!r} does not occur in column {column!r} of the published table "
                f"({len(lookup)} distinct values: {', '.join(map(repr, sample))}{more})"
            )
        return code

    def count_value(self, column: str, value: str) -> int:
        """``f'_s``: the published count of ``value`` in the sensitive ``column``, the MLE of its
        true count (Fu et al., Theorem 2)."""
        code = self._code(column, value)
        return int(np.count_nonzero(self._codes[column] == code))

    # -- counting -------------------------------------------------------------------------------

    def _space(self, columns: tuple[int, ...]) -> _KeySpace:
        """Keys of every row for a column combination, built from the cached prefix
        combination (so ``(a, b)`` is shared by ``(a, b, c)`` and ``(a, b, d)``); the key space is
        relabeled densely when the product of cardinalities exceeds a few times the row count."""
        space = self._keys.get(columns)
        if space is not None:
            return space
        name = self.table.column_names[columns[-1]]
        last, radix = self._codes[name], self._cards[name]
        if len(columns) == 1:
            space = _KeySpace(row_key=last, card=radix, radix=radix)
        else:
            prefix = self._space(columns[:-1])
            key = prefix.row_key * radix + last
            card = prefix.card * radix
            space = _KeySpace(row_key=key, card=card, radix=radix)
            if card > max(4 * self.rows, 1 << 16):
                if card <= (1 << 26):
                    present = np.bincount(key, minlength=card) > 0
                    labels = np.where(present, np.cumsum(present) - 1, -1)
                    space = _KeySpace(labels[key], int(present.sum()), radix, "relabeled", labels)
                else:
                    unique, inverse = np.unique(key, return_inverse=True)
                    space = _KeySpace(inverse.reshape(-1), unique.size, radix, "sorted", unique)
        self._keys[columns] = space
        return space

    def _query_keys(self, columns: tuple[int, ...], values: np.ndarray) -> np.ndarray:
        """Keys of code tuples ``values`` (m, len(columns)) in the key space of ``columns``;
        -1 when the combination does not occur in the table."""
        space = self._space(columns)
        if len(columns) == 1:
            return values[:, 0]
        prefix = self._query_keys(columns[:-1], values[:, :-1])
        key = np.where(prefix >= 0, prefix * space.radix + values[:, -1], -1)
        if space.kind == "relabeled":
            assert space.table is not None
            return np.where(key >= 0, space.table[np.maximum(key, 0)], -1)
        if space.kind == "sorted":
            assert space.table is not None
            position = np.minimum(np.searchsorted(space.table, key), space.card - 1)
            return np.where((key >= 0) & (space.table[position] == key), position, -1)
        return key

    def _counts(self, columns: tuple[int, ...], values: np.ndarray) -> np.ndarray:
        """Number of rows matching each code tuple of ``values`` on ``columns``."""
        if not columns:
            return np.full(values.shape[0], self.rows, dtype=np.int64)
        space = self._space(columns)
        if space.counts is None:
            space.counts = np.bincount(space.row_key, minlength=space.card)
        keys = self._query_keys(columns, values)
        return np.where(keys >= 0, space.counts[np.maximum(keys, 0)], 0)

    # -- estimation -----------------------------------------------------------------------------

    def estimate(self, query: CountQuery, **options: Any) -> CountEstimate:
        """Estimate the true count of one query (see :meth:`estimate_many`)."""
        return self.estimate_many([query], **options)[0]

    def estimate_many(
        self,
        queries: Sequence[CountQuery],
        *,
        tolerance: float = DEFAULT_TOLERANCE,
        absolute_tolerance: float = DEFAULT_ABSOLUTE_TOLERANCE,
        max_iterations: int = DEFAULT_MAX_ITERATIONS,
        transition: Transition = "exact",
        confidence: float = DEFAULT_CONFIDENCE,
    ) -> list[CountEstimate]:
        """Estimate the true counts of many queries at once.

        A query with one sensitive condition and no ``where`` gets the published count (the
        MLE, Theorem 2) and its exact interval at ``confidence``. Every other query is reconstructed with :func:`reconstruct` from the
        counts of its K = 2^(w+1) states in the published table.
        Raises :class:`UserError` for an unknown column, a value absent from the published
        column, a query without sensitive condition, or a column used twice in a query.
        """
        signatures = self._encode_queries(queries)
        width_groups: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        for (where, sensitive), (positions, codes) in signatures.items():
            states = self._state_counts(where, sensitive, np.array(codes, dtype=np.int64))
            width_groups.setdefault(len(sensitive), []).append((np.array(positions, dtype=np.int64), states))
        estimate = np.zeros(len(queries))
        observed = np.zeros(len(queries), dtype=np.int64)
        iterations = np.zeros(len(queries), dtype=np.int64)
        converged = np.ones(len(queries), dtype=bool)
        for width, parts in width_groups.items():
            rows_of = np.concatenate([part[0] for part in parts])
            states = np.concatenate([part[1] for part in parts])
            observed[rows_of] = states[:, -1]
            # one sensitive value and no where: the published count is the MLE (Theorem 2)
            direct = np.array([width == 1 and not queries[p].where for p in rows_of])
            estimate[rows_of[direct]] = states[direct, -1]
            if not direct.all():
                found = reconstruct(
                    states[~direct],
                    self.gamma,
                    self.rows,
                    tolerance=tolerance,
                    absolute_tolerance=absolute_tolerance,
                    max_iterations=max_iterations,
                    transition=transition,
                )
                estimate[rows_of[~direct]] = found.x[:, -1]
                iterations[rows_of[~direct]] = found.iterations
                converged[rows_of[~direct]] = found.converged
        from privrelease.mechanisms.splu_guarantees import count_interval

        estimates = []
        for query, e, o, i, c in zip(
            queries, estimate.tolist(), observed.tolist(), iterations.tolist(), converged.tolist(), strict=True
        ):
            alone = len(query.sensitive) == 1 and not query.where
            interval = count_interval(int(o), self.gamma, confidence, self.rows) if alone else None
            estimates.append(
                CountEstimate(query, float(e), int(o), int(i), bool(c), interval, confidence if alone else None)
            )
        return estimates

    def _encode_queries(
        self, queries: Sequence[CountQuery]
    ) -> dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[list[int], list[list[int]]]]:
        """Queries grouped by their columns (where columns in table order, then sensitive
        columns), each as its value codes. Raises :class:`UserError` for a bad query."""
        conditions = self._conditions
        signatures: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[list[int], list[list[int]]]] = {}

        def encode(condition: tuple[str, str]) -> tuple[int, int]:
            found = conditions.get(condition)
            if found is None:
                column, value = condition
                found = conditions[condition] = (self._index.get(column, -1), self._code(column, value))
            return found

        for position, query in enumerate(queries):
            width = len(query.sensitive)
            if not width or width > _MAX_SENSITIVE:
                self._refuse(query)
            where = [encode(condition) for condition in query.where]
            if len(where) > 1:
                where.sort()
            sensitive = [encode(condition) for condition in query.sensitive]
            columns = tuple(column for column, _ in where)
            sensitive_columns = tuple(column for column, _ in sensitive)
            if len(where) + width > 1 and len(set(columns + sensitive_columns)) < len(where) + width:
                self._refuse(query)
            key = (columns, sensitive_columns)
            group = signatures.get(key)
            if group is None:
                group = signatures[key] = ([], [])
            group[0].append(position)
            group[1].append([code for _, code in where] + [code for _, code in sensitive])
        return signatures

    def _refuse(self, query: CountQuery) -> NoReturn:
        """Raise the :class:`UserError` that says what is wrong with ``query``."""
        if not query.sensitive:
            raise UserError(
                f"query {query.describe() or '(empty)'!r} has no sensitive condition; "
                "give at least one sensitive column = value"
            )
        if len(query.sensitive) > _MAX_SENSITIVE:
            raise UserError(
                f"at most {_MAX_SENSITIVE} sensitive conditions per query; "
                f"got {len(query.sensitive)} in {query.describe()!r}"
            )
        columns = [column for column, _ in query.where + query.sensitive]
        repeated = next(column for column in columns if columns.count(column) > 1)
        raise UserError(f"column {repeated!r} appears more than once in query {query.describe()!r}")

    def _state_counts(self, where: tuple[int, ...], sensitive: tuple[int, ...], codes: np.ndarray) -> np.ndarray:
        """Observed counts ``y`` (Q, 2^(w+1)) of the states of Q queries on the same columns
        (value codes ``codes``, where columns first): the counts of every sub-conjunction, read
        from one histogram per column combination, then inclusion-exclusion
        (:func:`mobius_matrix`). State bit ``w`` is P (an empty P holds for every row), bit
        ``w - 1 - k`` is s_k."""
        width = len(sensitive)
        atoms = width + 1
        subset_counts = np.empty((codes.shape[0], 1 << atoms), dtype=np.int64)
        for subset in range(1 << atoms):
            chosen = list(range(len(where))) if subset >> width & 1 else []
            chosen += [len(where) + k for k in range(width) if subset >> (width - 1 - k) & 1]
            columns = tuple((where + sensitive)[i] for i in chosen)
            subset_counts[:, subset] = self._counts(columns, codes[:, chosen])
        return subset_counts @ mobius_matrix(atoms).T


def estimate_count(table: pa.Table, column: str, value: str) -> int:
    """``f'_s``: the count of ``value`` in the published sensitive ``column`` of ``table``, the
    maximum-likelihood estimate of its true count (Fu et al., Theorem 2)."""
    if column not in table.column_names:
        raise UserError(f"column {column!r} is not in the published table; columns: {table.column_names}")
    array = table.column(column)
    if array.type != pa.string():
        array = array.cast(pa.string())
    return int(pc.sum(pc.equal(array, value)).as_py() or 0)
