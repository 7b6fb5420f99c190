"""rho-differentially identifiable count, sum and mean of a numeric column (Lee & Clifton).

``R = f(D) + Lap(lambda)`` with lambda from :func:`.identifiability.calibrate` (Theorem 1),
for ``f`` the count, sum or mean of one numeric column, its values clamped to the declared
``[lower, upper]`` (clamping is what makes the declared bounds true, and so S(f) and m).

Groups. With a group domain (the label domain of already generalized columns, e.g. the labels
of the generalization scheme), ``f`` is the vector of per-group statistics over *every*
combination of declared labels, in one release: one OpenDP measurement over the whole vector,
one :class:`~.events.Laplace` event whose sensitive range is the L1 one of the vector (the
missing row can move between two groups: ``2 max(|lower|, |upper|)`` for sums, 2 for counts).
Groups come only from the declared domain, never from the data: publishing the set of groups
present would itself disclose (a label that appears reveals that someone has it), so a declared
group with no rows is released too, as noise around 0, and a row whose label is outside the
domain is an error. True group sizes are neither published nor kept in the facts.

Mean. Section 5 of the paper releases ``mean + Lap(lambda)`` with ``S(f) = (upper - lower) / N``
for the public database size N. We release ``(sum + Lap(lambda * N)) / N`` with the declared
N, which has that distribution (division by a public constant is post-processing) and keeps the
noised quantity an exact integer sum for integer columns. N is a public constant of the
release, never checked against the table: ``(sum + Lap(lambda N)) / N`` is a release of every
table, whatever its size, with add/remove sensitivity ``max(|lower|, |upper|) / N``. Refusing a
table whose row count differs from N would itself be an output that tells a table of N rows from
the same table without one of them (an infinite privacy loss under add/remove neighbours), so
the count is only an internal fact (``rows_in``) and an operator warning
(:func:`~privrelease.flows.release_facts.warnings`). The output is not clamped to
``[lower, upper]`` (the paper's Table 4 shows such out-of-range responses).

Why OpenDP and not ``numpy.random.laplace``. A textbook floating-point Laplace sampler
(``-lambda * sign(u) * log(1 - 2|u|)`` on a double ``u``) cannot produce every double; the set
of outputs it can produce differs with the true value, so the low-order bits of ``f(D) + Y``
can reveal ``f(D)`` exactly (Mironov, "On significance of the least significant bits for
differential privacy", CCS 2012), whatever lambda is. OpenDP's ``make_laplace`` on a float
domain (``k`` left at its default, the finest granularity ``2^-1074``) treats the input as an
exact multiple of ``2^k`` (every double is one), adds noise from the *discrete* Laplace
distribution on that grid, sampled with exact big-integer/rational arithmetic from a
cryptographic random source (Canonne, Kamath & Steinke 2020), and rounds the exact sum to a
double. Because the discrete Laplace pmf is proportional to ``exp(-|R - f|/lambda)`` on a grid
containing every possible ``f``, Eq. 6 of the paper holds exactly, so the bound of Theorem 1
holds for the sampler actually used; the final rounding is post-processing. Its privacy map is
checked against the calibration's epsilon on every run.

Exactness of the noised input. Integer columns are summed exactly (an error when
``rows * max(|lower|, |upper|) >= 2^53`` would make the double sum inexact). Real columns are
summed per group with ``math.fsum`` (correctly rounded): the computed sum's sensitivity then
exceeds the exact one by at most one unit in the last place of the largest possible sum,
negligible against lambda for any sensible bounds.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from privrelease.errors import TargetNotMet, UserError
from privrelease.mechanisms.identifiability import Calibration, calibrate, laplace_event
from privrelease.mechanisms.randomness import permutation
from privrelease.mechanisms.results import MechanismResult

VALUE_COLUMN = "value"
LAMBDA_COLUMN = "lambda"
_EXACT_DOUBLE_INTEGERS = 2**53


def identifiable_statistic(
    table: pa.Table,
    column: str,
    query: str,
    lower: float,
    upper: float,
    rho: float,
    *,
    rows: int | None = None,
    integer: bool = True,
    group_domain: Mapping[str, Sequence[Any]] | None = None,
) -> MechanismResult:
    """Calibrate (:func:`.identifiability.calibrate`) and release (:func:`noisy_statistic`).

    An infeasible rho raises :class:`~privrelease.errors.TargetNotMet`; plan with ``calibrate``
    before reading data to find out earlier."""
    groups = _domain_size(group_domain)
    calibration = calibrate(query, lower, upper, rho, rows=rows, integer=integer, groups=groups)
    return noisy_statistic(table, column, calibration, group_domain=group_domain)


def noisy_statistic(
    table: pa.Table,
    column: str,
    calibration: Calibration,
    *,
    group_domain: Mapping[str, Sequence[Any]] | None = None,
) -> MechanismResult:
    """Release ``calibration.query`` of ``column`` (clamped to the calibration's bounds), per
    group of ``group_domain`` (group column -> its declared labels; every combination of labels
    is a group) or over the whole table, with Laplace noise of scale ``calibration.lambda_``.

    Returns the group columns (labels as text) + ``value`` (noisy statistic) + ``lambda`` (its
    Laplace scale), rows in random order; the event of :func:`.identifiability.laplace_event`.
    """
    partial = statistic_partial(table, column, calibration, group_domain)
    return noisy_release(partial, column, calibration, group_domain)


@dataclass(frozen=True)
class StatisticPartial:
    """The exact statistic of some rows per group, before noise: the floats ``terms[g]`` sum
    exactly (as real numbers) to group g's count or clamped sum. Counts and integer sums have
    one term (an integer below 2^53, so exact); a real sum has the terms of
    :func:`exact_terms`. Partials of disjoint rows merge by concatenating their terms
    (:func:`merge_partials`), so a statistic computed over partitions is exactly the one
    computed over the whole table: ``math.fsum`` of all terms is the correctly rounded exact
    sum either way."""

    terms: tuple[tuple[float, ...], ...]
    rows: int
    clamped_below: int
    clamped_above: int


def statistic_partial(
    table: pa.Table, column: str, calibration: Calibration, group_domain: Mapping[str, Sequence[Any]] | None = None
) -> StatisticPartial:
    """The :class:`StatisticPartial` of ``table``'s rows (checked as :func:`noisy_statistic`)."""
    domain = dict(group_domain or {})
    groups = _check_release(calibration, domain)
    values, clamped_below, clamped_above = _clamped_values(table, column, calibration)
    codes = _group_codes(table, domain)
    if calibration.query == "count":
        sums: np.ndarray = np.bincount(codes, minlength=groups).astype(np.float64)
        terms: list[tuple[float, ...]] = [(float(x),) for x in sums]
    elif values.dtype == np.int64:
        _check_exact_integer_sum(len(values), calibration)
        # every partial sum is an integer below 2^53 in magnitude, so the double sum is exact
        sums = np.bincount(codes, weights=values.astype(np.float64), minlength=groups)
        terms = [(float(x),) for x in sums]
    else:
        order = np.argsort(codes, kind="stable")
        bounds = np.cumsum(np.bincount(codes, minlength=groups))[:-1]
        terms = [exact_terms(part) for part in np.split(values[order], bounds)]
    return StatisticPartial(tuple(terms), table.num_rows, clamped_below, clamped_above)


def exact_terms(values: np.ndarray) -> tuple[float, ...]:
    """Floats whose exact sum is the exact sum of ``values``: ``t_1 = fsum(values)`` (the
    correctly rounded sum), then ``t_{i+1} = fsum(values, -t_1, ..., -t_i)`` (the remainder,
    correctly rounded) until the remainder is 0. Each remainder is at most half a unit in the
    last place of the one before and all are multiples of 2^-1074, so this ends (after 1-3
    passes in practice, at most about 40)."""
    terms: list[float] = []
    while (rest := math.fsum(itertools.chain(values.tolist(), (-t for t in terms)))) != 0.0:
        terms.append(rest)
    return tuple(terms) or (0.0,)


def merge_partials(parts: Sequence[StatisticPartial]) -> StatisticPartial:
    """The partial of the union of disjoint rows: terms concatenated per group, counts added."""
    assert parts and len({len(part.terms) for part in parts}) == 1, "partials of the same groups"
    return StatisticPartial(
        tuple(tuple(itertools.chain.from_iterable(group)) for group in zip(*(part.terms for part in parts))),
        sum(part.rows for part in parts),
        sum(part.clamped_below for part in parts),
        sum(part.clamped_above for part in parts),
    )


def noisy_release(
    partial: StatisticPartial,
    column: str,
    calibration: Calibration,
    group_domain: Mapping[str, Sequence[Any]] | None = None,
) -> MechanismResult:
    """The noisy statistic of the rows of ``partial`` (all the rows of the release): Laplace
    noise added once, to the exact statistic (:func:`noisy_statistic`)."""
    domain = dict(group_domain or {})
    groups = _check_release(calibration, domain)
    if calibration.query != "count" and calibration.integer:
        _check_exact_integer_sum(partial.rows, calibration)
    true = np.array([math.fsum(terms) for terms in partial.terms], dtype=np.float64)

    scale = calibration.lambda_
    assert scale is not None
    noised_scale = scale
    if calibration.query == "mean":
        assert calibration.rows is not None
        noised_scale = math.nextafter(scale * calibration.rows, math.inf)
    noisy = _opendp_laplace(true, noised_scale, calibration)
    if calibration.query == "mean":
        assert calibration.rows is not None
        noisy = noisy / calibration.rows

    order = permutation(groups)
    columns: dict[str, pa.Array] = {
        name: pa.array(label_values[order], type=pa.string()) for name, label_values in _group_labels(domain).items()
    }
    columns[VALUE_COLUMN] = pa.array(noisy[order], type=pa.float64())
    columns[LAMBDA_COLUMN] = pa.array(np.full(groups, scale), type=pa.float64())

    public_facts = {
        "mechanism": "rho-differential identifiability, Laplace (Lee & Clifton, Theorem 1)",
        "query": calibration.query,
        "column": column,
        "lower": calibration.lower,
        "upper": calibration.upper,
        "integer": calibration.integer,
        "rho": calibration.rho,
        "lambda": scale,
        "epsilon": calibration.epsilon,
        "epsilon_add_remove": calibration.epsilon_add_remove,
        "universe_size": calibration.universe_size,
        "sensitive_range": calibration.sensitive_range,
        "sensitivity": calibration.sensitivity,
        "rows": calibration.rows,
        "group_by": list(domain),
        "groups": groups,
        "noise": f"OpenDP {_opendp_version()} make_laplace (discrete Laplace on the 2^-1074 grid)",
    }
    internal_facts = {
        "rows_in": partial.rows,
        "values_clamped_below": partial.clamped_below,
        "values_clamped_above": partial.clamped_above,
    }
    return MechanismResult(
        table=pa.table(columns),
        event=laplace_event(calibration),
        public_facts=public_facts,
        internal_facts=internal_facts,
    )


def _check_release(calibration: Calibration, domain: Mapping[str, Sequence[Any]]) -> int:
    """The number of groups, once the calibration is feasible and made for this domain."""
    if not calibration.feasible or calibration.lambda_ is None:
        raise TargetNotMet(calibration.reason or "the calibration is infeasible")
    groups = _domain_size(domain)
    if groups != calibration.groups:
        raise UserError(
            f"groups: the calibration was made for {calibration.groups} group(s) but the group "
            f"domain has {groups}; calibrate with groups={groups}"
        )
    for name in domain:
        if name in (VALUE_COLUMN, LAMBDA_COLUMN):
            raise UserError(f"group column must not be named {name!r} (an output column)")
    return groups


def _check_exact_integer_sum(rows: int, calibration: Calibration) -> None:
    magnitude = max(abs(calibration.lower), abs(calibration.upper))
    if rows * magnitude >= _EXACT_DOUBLE_INTEGERS:
        raise UserError(
            f"rows * max(|lower|, |upper|) = {rows * magnitude:.3g} >= 2^53: the sum "
            "would not be exact in double precision; rescale the column"
        )


def _domain_size(group_domain: Mapping[str, Sequence[Any]] | None) -> int:
    size = 1
    for name, labels in (group_domain or {}).items():
        texts = [str(label) for label in labels]
        if not texts:
            raise UserError(f"group domain of column {name!r} is empty")
        if len(set(texts)) != len(texts):
            raise UserError(f"group domain of column {name!r} has duplicate labels")
        size *= len(texts)
    return size


def _clamped_values(table: pa.Table, column: str, calibration: Calibration) -> tuple[np.ndarray, int, int]:
    """The column as numbers clamped to the bounds (int64 for integer columns), and how many
    values were raised to ``lower`` / lowered to ``upper``."""
    if column not in table.column_names:
        raise UserError(f"column {column!r} not found; the table has {table.column_names}")
    data = table.column(column)
    kind = data.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_decimal(kind)):
        raise UserError(f"column {column!r} must be numeric; got type {kind}")
    if data.null_count:
        raise UserError(
            f"column {column!r} has missing values; impute or filter them before the release "
            "(a missing value is outside the declared domain)"
        )
    lo: float
    hi: float
    if pa.types.is_integer(kind):
        raw = data.to_numpy().astype(np.int64, copy=False)
        lo, hi = math.ceil(calibration.lower), math.floor(calibration.upper)
    else:
        raw = pc.cast(data, pa.float64()).to_numpy()
        if np.isnan(raw).any():
            raise UserError(f"column {column!r} has NaN values; they are outside any bounds")
        lo, hi = calibration.lower, calibration.upper
    below = int(np.count_nonzero(raw < lo))
    above = int(np.count_nonzero(raw > hi))
    values = np.clip(raw, lo, hi)
    if calibration.integer and calibration.query != "count" and values.dtype != np.int64:
        if not np.array_equal(values, np.floor(values)):
            raise UserError(
                f"column {column!r} has non-integer values but was declared integer; "
                "declare it real-valued (integer=False) or round it first"
            )
        values = values.astype(np.int64)
    return values, below, above


def _group_codes(table: pa.Table, domain: Mapping[str, Sequence[Any]]) -> np.ndarray:
    """Each row's group index in the row-major product of the domains."""
    codes = np.zeros(table.num_rows, dtype=np.int64)
    for name, labels in domain.items():
        if name not in table.column_names:
            raise UserError(f"group column {name!r} not found; the table has {table.column_names}")
        texts = [str(label) for label in labels]
        column = table.column(name)
        if column.null_count:
            raise UserError(f"group column {name!r} has missing values")
        position = pc.index_in(pc.cast(column, pa.string()), value_set=pa.array(texts, pa.string()))
        outside = position.null_count
        if outside:
            raise UserError(
                f"group column {name!r}: {outside} rows have labels outside the declared group "
                "domain; generalize the column with the declared scheme first"
            )
        codes *= len(texts)
        codes += position.to_numpy().astype(np.int64)
    return codes


def _group_labels(domain: Mapping[str, Sequence[Any]]) -> dict[str, np.ndarray]:
    """The labels of every group index (row-major product of the domains), per column."""
    sizes = [len(labels) for labels in domain.values()]
    total = int(np.prod(sizes)) if sizes else 1
    index = np.arange(total, dtype=np.int64)
    labels_out: dict[str, np.ndarray] = {}
    stride = total
    for (name, labels), size in zip(domain.items(), sizes, strict=True):
        stride //= size
        labels_out[name] = np.asarray([str(label) for label in labels], dtype=object)[(index // stride) % size]
    return labels_out


def _opendp_laplace(true: np.ndarray, scale: float, calibration: Calibration) -> np.ndarray:
    """One OpenDP Laplace measurement over the whole vector (L1 metric), applied once; its
    privacy map must not exceed the calibration's epsilon."""
    import opendp.prelude as dp

    dp.enable_features("contrib")
    space = (
        dp.vector_domain(dp.atom_domain(T=float, nan=False), size=len(true)),
        dp.l1_distance(T=float),
    )
    measurement = dp.m.make_laplace(*space, scale=scale)
    # the noised quantity of a mean is the sum, of replace-one sensitivity upper - lower
    d_in = calibration.sensitivity
    if calibration.query == "mean":
        d_in = calibration.upper - calibration.lower
    opendp_epsilon = measurement.map(d_in)
    assert calibration.epsilon is not None
    assert opendp_epsilon <= calibration.epsilon * (1 + 1e-9), (
        opendp_epsilon,
        calibration,
    )
    return np.asarray(measurement([float(x) for x in true]), dtype=np.float64)


@functools.cache
def _opendp_version() -> str:
    from importlib.metadata import version

    return version("opendp")
