"""rho-differential identifiability: calibrating Laplace noise to a bound on re-identification.

Lee & Clifton, "Differential Identifiability" (KDD 2012), file ``001`` in ``../shared/papers``.

The model (Section 3.3). An informed adversary knows every row of the database but one
(``D'``) and the universe ``U`` the missing row comes from. The *possible worlds* are
``Psi = {D' + {i} : i in U}``, equally likely a priori, ``m = |Psi|`` of them. A mechanism is
rho-differentially identifiable (Definition 4) when, for every response R, the adversary's
posterior that any one world is the true database is at most rho.

Theorem 1 (Section 4.1). Laplace noise ``R = f(D) + Lap(lambda)`` with::

    lambda = S(f) / ln((m - 1) rho / (1 - rho))                                  (Eq. 15)

achieves it, where ``S(f) = max over two worlds of ||f(w1) - f(w2)||`` is the *sensitive range*
(Definition 3; the L1 norm for a vector of statistics, which is what the triangle inequality of
Eq. 9 needs when independent Laplace noise is added to each coordinate). When
``rho <= 1/m`` no noise suffices (Eq. 14): the adversary's random guess among m worlds already
succeeds with probability 1/m. That case is reported as ``feasible=False``, never raised.

Choices this module makes (the paper leaves them to the user):

* **Universe size m.** Section 5 projects the database on the attribute the query reads
  (``D = Pi_hours-per-week(DB)``) and takes the worlds ``D' + {v}`` for every value v of the
  declared domain, duplicates of values already in D' included (a multiset: with 48,841 known
  rows every value is already present, yet the paper uses m - 1 = 98 for the range 1..99). We do
  the same: for ``sum`` and ``mean`` of an integer column ``[lower, upper]``,
  ``m = upper - lower + 1``. Section 4's small example instead uses sets (``m = |U| - |D'|``,
  values in D' excluded); that is a data-dependent m, which a release planned before reading
  the data cannot use. For ``count`` the column's values are never read: the attribute is the
  group label, so ``m = groups`` (the number of labels in the declared group domain).
* **Real-valued columns** (``integer=False``) have no finite value domain; with a continuum
  of worlds the uniform prior of Eq. 5 makes every single world's posterior 0 and the bound
  empty. We take the smallest non-trivial universe, ``m = 2``: the guarantee then holds against
  an adversary who has narrowed the missing value to any two candidates (Section 4.1, last
  paragraph: m may be replaced by ``1 / max prior``). rho must then exceed 1/2. Declare an
  integer grid instead (e.g. cents) to use the size of that grid.
* **Grouped releases.** One release covers all groups (one noisy vector). The missing row can
  sit in any group, so the worlds' vectors can differ in two coordinates: the L1 sensitive range
  is ``2 max(|lower|, |upper|)`` for sums and ``2`` for counts. For a sum we still take
  ``m = upper - lower + 1`` (not ``groups * m``): the guarantee then also holds against an
  adversary who knows the target's group labels (its quasi-identifiers), the usual re-
  identification attacker. A grouped mean would need public group sizes and is refused.
* **Sensitive range with declared bounds** (Definition 3, maximised over every ``D'`` since the
  release does not know which row the adversary misses, Section 3.4): ``sum``: ``upper - lower``
  (Section 5: "for f = sum, the noise is independent of dataset size"); ``mean`` over the
  declared public row count N: ``(upper - lower) / N`` (Section 5: ``98 / 48842``); ``count``
  by group: 2. An ungrouped count of rows is the same in every possible world (each has N rows),
  so it discloses nothing about who is in the data: it is refused as a query needing no noise.
  S(f) for one given D' is smaller than Delta_f in the paper's examples (Section 3.5: Delta_f =
  9/4 while the worlds' means span 6/4; Section 4: S = 8/3 for D' = {1, 3} while the bounds
  1..10 give 9/3); a release planned before data access cannot know D', so it uses the maximum,
  and then S(f) equals the replace-one sensitivity. Table 4's Std. Dev. rows use data-dependent
  S(f) values; :func:`laplace_scale` reproduces them from the printed S(f).

Equivalent epsilon. The calibrated mechanism is epsilon-DP with ``epsilon = Delta_f / lambda``,
``Delta_f`` the query's global sensitivity for *bounded* DP (Definition 1: neighbours replace one
row, the paper's convention, Section 3.1). For every query above ``Delta_f = S(f)`` (the
maximisation over D' of Definition 3 is exactly the replace-one sensitivity), so
``epsilon = ln((m - 1) rho / (1 - rho))``, the paper's upper bound on epsilon for a given rho
(Section 4.1). Conversely any epsilon-DP (replace-one) mechanism is
``rho = 1 / (1 + (m - 1) e^-epsilon)``-identifiable (Section 4.1, via Eq. 6). For the add/remove
neighbours used by SDGS (Li, Qardaji, Su) ``Calibration.sensitivity_add_remove`` gives
``max(|lower|, |upper|)`` for a sum (``/ N`` for a mean) and 1 for counts.

The noise itself (OpenDP's exact discrete sampler, not a floating-point Laplace) and the
release on data are in :mod:`.statistics`.

Numerics. ``ln((m - 1) rho / (1 - rho)) = log1p((m rho - 1) / (1 - rho))`` with the argument
evaluated exactly in rationals (rho is a binary fraction, m an integer), so the feasibility test
``m rho > 1`` is exact and the logarithm keeps full relative precision even when rho is just
above 1/m. Every reported lambda is raised by ``LAMBDA_MARGIN`` (relative) above the computed one
and every epsilon rounded up, so rounding never weakens the stated guarantee.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from privrelease.errors import TargetNotMet, UserError
from privrelease.mechanisms.events import Laplace

QUERIES = ("count", "sum", "mean")

LAMBDA_MARGIN = 1e-12
"""Relative amount by which a reported lambda exceeds the computed S(f) / ln(...) (whose
floating-point error is a few units in the last place, about 1e-15)."""


@dataclass(frozen=True)
class Calibration:
    """The Laplace scale that makes ``query`` rho-differentially identifiable.

    ``feasible``: False when ``rho <= 1/m`` (then ``lambda_`` and ``epsilon`` are None and
    ``reason`` says why). ``lambda_``: the Laplace scale (Theorem 1). ``epsilon``: the pure-DP
    epsilon of that mechanism for replace-one neighbours, ``sensitivity / lambda_``.
    ``universe_size``: m. ``sensitive_range``: S(f). ``sensitivity``: the replace-one global
    sensitivity Delta_f. The remaining fields echo the inputs (``groups``: number of labels in
    the declared group domain, 1 for an ungrouped release) and give the add/remove sensitivity.
    """

    feasible: bool
    lambda_: float | None
    epsilon: float | None
    universe_size: int
    sensitive_range: float
    sensitivity: float
    reason: str = ""
    query: str = ""
    lower: float = 0.0
    upper: float = 0.0
    rho: float = 0.0
    rows: int | None = None
    integer: bool = True
    groups: int = 1
    sensitivity_add_remove: float = 0.0

    @property
    def epsilon_add_remove(self) -> float | None:
        """epsilon of the same mechanism for add/remove-one neighbours (None when infeasible)."""
        if self.lambda_ is None:
            return None
        return _round_up(self.sensitivity_add_remove / self.lambda_)


def _round_up(x: float) -> float:
    return math.nextafter(x, math.inf)


def _check_rho(rho: float) -> None:
    if isinstance(rho, bool) or not isinstance(rho, (int, float)) or not 0.0 < rho < 1.0:
        raise UserError(f"rho must be in (0, 1); got {rho!r}")


def _check_universe(universe_size: int) -> None:
    if isinstance(universe_size, bool) or not isinstance(universe_size, (int, np.integer)):
        raise UserError(f"universe_size must be an integer >= 2; got {universe_size!r}")
    if universe_size < 2:
        raise UserError(f"universe_size must be an integer >= 2; got {universe_size!r}")


def _log_odds_excess(rho: float, universe_size: int) -> float | None:
    """``ln((m - 1) rho / (1 - rho))``, or None when it is <= 0 (``rho <= 1/m``).

    Computed as ``log1p(z)`` with ``z = (m rho - 1) / (1 - rho)`` exact in rationals, then
    rounded once to a double."""
    r = Fraction(rho)
    z = (universe_size * r - 1) / (1 - r)
    if z <= 0:
        return None
    return math.log1p(float(z))


def epsilon_of_rho(rho: float, universe_size: int) -> float | None:
    """The largest epsilon such that every epsilon-DP (replace-one) mechanism is
    rho-identifiable over m worlds: ``epsilon = ln((m - 1) rho / (1 - rho))`` (Lee & Clifton,
    Section 4.1). None when ``rho <= 1/m`` (no epsilon > 0 suffices).

    >>> round(epsilon_of_rho(0.1, 99), 6)
    2.387743
    """
    _check_rho(rho)
    _check_universe(universe_size)
    return _log_odds_excess(rho, universe_size)


def rho_of_epsilon(epsilon: float, universe_size: int) -> float:
    """Identifiability of any epsilon-DP (replace-one) mechanism over m equally likely worlds:
    ``rho = 1 / (1 + (m - 1) e^-epsilon)`` (Lee & Clifton, Section 4.1, from Eq. 6).

    Evaluated as a logistic function of ``t = epsilon - ln(m - 1)`` without overflow for any
    epsilon and m.

    >>> round(rho_of_epsilon(2.0, 3), 6)
    0.786986
    """
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)):
        raise UserError(f"epsilon must be a number >= 0; got {epsilon!r}")
    if not epsilon >= 0.0:
        raise UserError(f"epsilon must be >= 0; got {epsilon!r}")
    _check_universe(universe_size)
    t = float(epsilon) - math.log(universe_size - 1)
    if t >= 0:
        return 1.0 / (1.0 + math.exp(-t))
    e = math.exp(t)
    return e / (1.0 + e)


def identifiability_bound(sensitive_range: float, lambda_: float, universe_size: int) -> float:
    """Eq. 9: the adversary's posterior on any world is at most
    ``1 / (1 + (m - 1) exp(-S(f) / lambda))`` for Laplace noise of scale lambda."""
    if not sensitive_range >= 0 or not lambda_ > 0:
        raise UserError(f"sensitive_range must be >= 0 and lambda > 0; got {sensitive_range!r}, {lambda_!r}")
    return rho_of_epsilon(sensitive_range / lambda_, universe_size)


def laplace_scale(sensitive_range: float, universe_size: int, rho: float) -> float | None:
    """Theorem 1 / Eq. 15: ``lambda = S(f) / ln((m - 1) rho / (1 - rho))``, raised by
    ``LAMBDA_MARGIN``; None when ``rho <= 1/m`` (infeasible, Eq. 14).

    >>> round(laplace_scale(98 / 48842, 99, 0.1), 8)  # Lee & Clifton, Section 5
    0.00084032
    """
    _check_rho(rho)
    _check_universe(universe_size)
    if not (math.isfinite(sensitive_range) and sensitive_range > 0):
        raise UserError(f"sensitive_range must be finite and > 0; got {sensitive_range!r}")
    denominator = _log_odds_excess(rho, universe_size)
    if denominator is None:
        return None
    return (sensitive_range / denominator) * (1.0 + LAMBDA_MARGIN)


def world_posterior(response: float | Sequence[float], world_values: Sequence, lambda_: float) -> np.ndarray:
    """The informed adversary's posterior over possible worlds (Eq. 5-6, uniform prior) after
    seeing ``response`` of Laplace noise of scale ``lambda_`` added to ``f``.

    ``world_values``: f(w) for each world (scalars, or vectors of the response's length, with
    independent noise per coordinate, i.e. the L1 distance). Computed in log space."""
    if not lambda_ > 0:
        raise UserError(f"lambda must be > 0; got {lambda_!r}")
    values = np.asarray(world_values, dtype=np.float64)
    r = np.asarray(response, dtype=np.float64)
    distance = np.abs(values - r)
    if distance.ndim > 1:
        distance = distance.sum(axis=tuple(range(1, distance.ndim)))
    log_w = -distance / lambda_
    log_w -= log_w.max()
    w = np.exp(log_w)
    return w / w.sum()


def _validate_bounds(lower: float, upper: float, integer: bool) -> None:
    for name, value in (("lower", lower), ("upper", upper)):
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise UserError(f"{name} must be a number; got {value!r}")
        if not math.isfinite(value):
            raise UserError(f"{name} must be finite; got {value!r}")
        if integer and not float(value).is_integer():
            raise UserError(
                f"{name} must be an integer for an integer column; got {value!r} "
                "(declare the column real-valued with integer=False)"
            )
    if not lower < upper:
        raise UserError(f"upper must be > lower; got lower={lower!r}, upper={upper!r}")


def calibrate(
    query: str,
    lower: float,
    upper: float,
    rho: float,
    rows: int | None = None,
    integer: bool = True,
    groups: int = 1,
) -> Calibration:
    """Calibrate Laplace noise so that ``query`` over a column declared in ``[lower, upper]``
    is rho-differentially identifiable (Lee & Clifton, Theorem 1; choices in the module doc).

    ``query``: ``count``, ``sum`` or ``mean``. ``rows``: the declared public row count N
    (required for ``mean``, whose S(f) is ``(upper - lower) / N``). ``integer``: the column takes
    integer values (``m = upper - lower + 1``); otherwise ``m = 2``. ``groups``: the number of
    labels of the declared group domain (1: ungrouped; ``count`` needs >= 2, ``mean`` needs 1).

    >>> c = calibrate("mean", 1, 99, 0.1, rows=48842)  # hours-per-week, Section 5
    >>> c.universe_size, round(c.sensitive_range, 4), round(c.lambda_, 8)
    (99, 0.002, 0.00084032)
    >>> calibrate("mean", 1, 99, 0.001, rows=48842).feasible
    False
    """
    if query not in QUERIES:
        raise UserError(f"query must be one of {', '.join(QUERIES)}; got {query!r}")
    _check_rho(rho)
    _validate_bounds(lower, upper, integer)
    if isinstance(groups, bool) or not isinstance(groups, (int, np.integer)) or groups < 1:
        raise UserError(f"groups must be an integer >= 1; got {groups!r}")
    groups = int(groups)
    if rows is not None:
        if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 1:
            raise UserError(f"rows (the declared public row count N) must be an integer >= 1; got {rows!r}")
        rows = int(rows)
    lower_f, upper_f = float(lower), float(upper)
    width = upper_f - lower_f
    magnitude = max(abs(lower_f), abs(upper_f))

    if query == "count":
        if groups < 2:
            raise UserError(
                "query 'count' needs a group domain of >= 2 labels (groups); an ungrouped count "
                "is the row count, the same in every possible world (Lee & Clifton, Section 3.3), "
                "so it needs no noise: publish it as the declared public row count"
            )
        universe_size = groups
        sensitive_range = sensitivity = 2.0
        add_remove = 1.0
    else:
        universe_size = int(upper) - int(lower) + 1 if integer else 2
        if query == "sum":
            grouped = groups > 1
            sensitive_range = sensitivity = 2.0 * magnitude if grouped else width
            add_remove = magnitude
        else:
            if groups != 1:
                raise UserError(
                    f"query 'mean' by group is not supported (groups={groups}): each group's "
                    "mean needs its own public row count; release 'sum' and 'count' by group"
                )
            if rows is None:
                raise UserError(
                    "rows (the declared public row count N) is required for query 'mean': "
                    "its sensitive range is (upper - lower) / N (Lee & Clifton, Section 5)"
                )
            sensitive_range = sensitivity = width / rows
            add_remove = magnitude / rows
        if sensitive_range == 0.0:
            raise UserError(
                f"the sensitive range of {query} over [{lower!r}, {upper!r}] is 0: the query "
                "reveals nothing and needs no noise"
            )

    lambda_ = laplace_scale(sensitive_range, universe_size, rho)
    reason = ""
    if lambda_ is None:
        reason = (
            f"rho={rho!r} <= 1/m = 1/{universe_size}: an adversary guessing at random among "
            f"the m={universe_size} possible worlds already succeeds with probability 1/m, "
            "so no amount of noise reaches rho (Lee & Clifton, Eq. 14)"
        )
    return Calibration(
        feasible=lambda_ is not None,
        lambda_=lambda_,
        epsilon=None if lambda_ is None else _round_up(sensitivity / lambda_),
        universe_size=universe_size,
        sensitive_range=sensitive_range,
        sensitivity=sensitivity,
        reason=reason,
        query=query,
        lower=lower_f,
        upper=upper_f,
        rho=float(rho),
        rows=rows,
        integer=integer,
        groups=groups,
        sensitivity_add_remove=add_remove,
    )


def laplace_event(calibration: Calibration) -> Laplace:
    """The privacy event of a Laplace release with this calibration (feasible ones only;
    an infeasible one raises :class:`TargetNotMet` with its reason)."""
    if not calibration.feasible or calibration.lambda_ is None:
        raise TargetNotMet(calibration.reason or "the calibration is infeasible")
    return Laplace(
        scale=calibration.lambda_,
        sensitivity=calibration.sensitivity_add_remove,
        sensitive_range=calibration.sensitive_range,
        universe_size=calibration.universe_size,
    )
