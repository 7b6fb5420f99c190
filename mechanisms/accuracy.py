"""Data-free accuracy statements: what a published number is worth, from the policy alone.

Privacy guarantees follow from the policy before any data is read; so do these error
statements, which is why they can be published with the release and checked against accuracy
targets at plan time. Each is exact for the mechanism as run (no normal approximation):

* **SDGS counts and crowd-blending histograms** (Li, Qardaji, Su, Algorithm 4; Gehrke et al.).
  A cell of N people yields X ~ Binomial(N, beta) sampled rows and is published when X >= k;
  its count is estimated by X / beta. :func:`count_accuracy` gives the publication probability
  ``P[X >= k]``, the relative standard error ``sqrt((1 - beta) / (N beta))`` of X / beta, the
  relative bias that suppression adds to what is published (``E[X / beta | X >= k] / N - 1``,
  from ``E[X 1{X >= k}] = N beta P[Bin(N - 1, beta) >= k - 1]``), a central interval of the
  published estimate at confidence C, and the probability of the accuracy target "published and
  within +-r N". The interval is *conditional on publication* (the distribution a user of the
  published table faces: cells that were suppressed are not there to be read), built from exact
  binomial quantiles with at most (1 - C) / 2 of the conditional mass in each tail, so its
  coverage (also returned, exactly) is at least C; near k it is wider than a normal interval,
  which undercovers there (tested). After the data, each published count c gets an exact
  interval for the people N behind it (:mod:`.count_intervals`, :func:`published_counts` says
  how to read it).
* **Laplace statistics** (rho-differential identifiability, Lee & Clifton): noise Lap(b) is
  within ``b ln(1 / (1 - C))`` of 0 with probability exactly C (:func:`laplace_half_width`).
  OpenDP samples the discrete Laplace on the 2^-1074 grid, whose tails match the continuous
  ones to far below any printed digit. Clamping to [lower, upper] adds a bias that depends on
  the data (how many values lie outside); its size is an internal fact of the run.
* **Scheme selection** (the exponential mechanism with a monotone score, exponent
  ``epsilon u / Delta``): the chosen scheme's score is within
  ``(Delta / epsilon) (ln(|candidates| - 1) + ln(1 / t))`` of the best with probability at least
  1 - t (:func:`selection_gap`: each worse scheme is chosen with probability at most
  ``e^(-epsilon gap / Delta)``; a union bound over the candidates other than the best).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from fractions import Fraction
from typing import Any

import numpy as np

from privrelease.errors import UserError
from privrelease.mechanisms import binomial
from privrelease.mechanisms.columns import HISTOGRAM, INTERVAL
from privrelease.mechanisms.confidence import check_confidence
from privrelease.mechanisms.splu_scope import NO_UTILITY, UTILITY_SCOPE

_U = float(np.finfo(float).eps)


def _check_count(count: int) -> int:
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or count < 1:
        raise UserError(f"count (people in a cell) must be an integer >= 1; got {count!r}")
    return int(count)


@dataclass(frozen=True)
class CountAccuracy:
    """The accuracy of the published estimate X / beta of a cell of ``count`` people (module
    docstring). ``interval``: the estimate lies in it with probability ``coverage`` >= C, given
    the cell is published (None when it is never published). ``within``: the probability that
    the cell is published and its estimate is within +-``relative_error`` of ``count``."""

    count: int
    k: int
    beta: float
    publish_probability: float
    relative_standard_error: float
    suppression_bias: float | None
    confidence: float
    interval: tuple[float, float] | None
    coverage: float | None
    relative_error: float | None = None
    within: float | None = None

    def as_dict(self) -> dict[str, Any]:
        document = asdict(self)
        document["interval"] = list(self.interval) if self.interval is not None else None
        if self.relative_error is None:
            del document["relative_error"], document["within"]
        return document


def count_accuracy(
    k: int, beta: float, count: int, *, confidence: float = 0.95, relative_error: float | None = None
) -> CountAccuracy:
    """Accuracy of a (k, beta)-SDGS or crowd-blending histogram cell of ``count`` people
    (module docstring); ``relative_error`` r also gives ``P[X >= k, |X / beta - N| <= r N]``."""
    from privrelease.mechanisms.sdgs_math import check_parameters

    check_parameters(k, beta, 0.0)
    n, confidence = _check_count(count), check_confidence(confidence)
    published = float(binomial.upper_tail(k, n, beta))
    rse = math.sqrt((1 - beta) / (n * beta))
    bias = interval = coverage = None
    if published > 0:
        kept = float(binomial.upper_tail(k - 1, n - 1, beta))  # E[X 1{X >= k}] / (N beta)
        bias = kept / published - 1
        interval, coverage = _conditional_interval(k, beta, n, published, confidence)
    within = None
    if relative_error is not None:
        exact = Fraction(str(float(beta)))
        within = float(_within(k, n, [exact.numerator], exact.denominator, _check_relative_error(relative_error))[0])
    return CountAccuracy(n, k, beta, published, rse, bias, confidence, interval, coverage, relative_error, within)


def _least(holds: Any, low: int, high: int) -> int:
    """The least integer x in [low, high] with ``holds(x)``, for ``holds`` false then true on
    it and true at ``high`` (bisection: about log2(high - low) evaluations, whatever the count)."""
    while low < high:
        middle = (low + high) // 2
        if holds(middle):
            high = middle
        else:
            low = middle + 1
    return low


def _conditional_interval(
    k: int, beta: float, n: int, published: float, confidence: float
) -> tuple[tuple[float, float], float]:
    """The central interval [lo, hi] / beta of X / beta given X >= k: lo the least x with more
    than (1 - C) / 2 of the conditional mass at or below it, hi the least x with at most
    (1 - C) / 2 above it (both found by bisection over [k, n]: the conditional mass at or below
    x grows with x, and all of it lies at or below n); and its exact conditional coverage."""
    tail = (1 - confidence) / 2

    def beyond(x: int) -> float:  # P[X > x]
        return float(binomial.upper_tail(x + 1, n, beta))

    lo = _least(lambda x: (published - beyond(x)) / published > tail, k, n)  # P[k <= X <= x | pub] > tail
    hi = _least(lambda x: beyond(x) / published <= tail, k, n)  # P[X > x | pub] <= tail
    inside = float(binomial.upper_tail(lo, n, beta) - binomial.upper_tail(hi + 1, n, beta)) / published
    return (lo / beta, hi / beta), min(1.0, inside)


def _check_relative_error(relative_error: float) -> Fraction:
    """``relative_error`` as the exact decimal it prints as (0.1 is 1/10), once it is > 0."""
    if isinstance(relative_error, bool) or not isinstance(relative_error, (int, float)) or not relative_error > 0:
        raise UserError(f"relative_error must be a number > 0; got {relative_error!r}")
    return Fraction(str(float(relative_error)))


def _within(k: int, n: int, numerators: Any, denominator: int, relative_error: Fraction) -> np.ndarray:
    """``P[X >= k and |X / beta - n| <= r n]``, X ~ Binomial(n, beta), for each
    ``beta = numerator / denominator``: the limits ``ceil(beta n (1 - r))`` and
    ``floor(beta n (1 + r))`` in exact integer arithmetic (Python integers: no overflow
    whatever the count)."""
    r = relative_error
    steps = np.asarray(numerators, dtype=object)
    scale = denominator * r.denominator
    low = np.maximum(k, -((-steps * n * (r.denominator - r.numerator)) // scale)).astype(np.float64)
    high = np.minimum(n, (steps * n * (r.denominator + r.numerator)) // scale).astype(np.float64)
    betas = steps.astype(np.float64) / denominator
    inside = binomial.upper_tail(low, n, betas) - binomial.upper_tail(high + 1, n, betas)
    return np.where(high >= low, inside, 0.0)


def cell_sizes(k: int, beta: float, extra: tuple[int, ...] = ()) -> list[int]:
    """Cell sizes worth a statement for (k, beta): where the expected sample reaches k
    (``k / beta``), and 2, 5, 10 and 50 times that, with ``extra`` (a target's counts)."""
    reach = max(k, math.ceil(k / beta))
    return sorted({reach, 2 * reach, 5 * reach, 10 * reach, 50 * reach, *extra})


BETA_STEP = Fraction(1, 10_000)
"""The grid :func:`smallest_beta` searches (every beta it names is checked exactly)."""


def smallest_beta(k: int, count: int, relative_error: float, confidence: float) -> float | None:
    """The smallest beta on the grid of :data:`BETA_STEP` at which a cell of ``count`` people
    is published and within +-``relative_error`` with probability at least ``confidence``
    (every grid point evaluated, vectorized: the probability is not monotone in beta, the limits
    being integers); None when even beta = 1 does not reach it."""
    n, confidence = _check_count(count), check_confidence(confidence)
    steps = np.arange(1, int(1 / BETA_STEP) + 1)
    within = _within(k, n, steps.tolist(), BETA_STEP.denominator, _check_relative_error(relative_error))
    reached = np.flatnonzero(within >= confidence)
    return float(steps[reached[0]] / BETA_STEP.denominator) if len(reached) else None


CONFIDENCES = (0.9, 0.95, 0.99)
"""The confidence levels a statistic's noise half-width is stated at."""


def each_cell_miss(confidence: float, cells: int) -> float:
    """The probability ``m`` each of ``cells`` cells with independent noise may fall outside its
    half-width so that all of them are inside at once with probability at least C:
    ``P(all N within w) = P(|Z| <= w)^N`` (independence), which is >= C exactly when
    ``P(|Z| > w) <= 1 - C^(1/N)``. Computed as ``-expm1(ln C / N)`` (no cancellation) and
    rounded down by a bound on its float error, so a half-width found at ``m`` never overstates
    the simultaneous coverage. One cell: ``1 - C`` (exact for C >= 1/2, Sterbenz)."""
    confidence = check_confidence(confidence)
    if isinstance(cells, bool) or not isinstance(cells, (int, np.integer)) or cells < 1:
        raise UserError(f"cells must be an integer >= 1; got {cells!r}", field="cells", allowed="an integer >= 1")
    if cells == 1:
        return 1.0 - confidence
    return -math.expm1(math.log(confidence) / int(cells)) * (1 - 8 * _U)


def laplace_half_width(scale: float, confidence: float = 0.95) -> float:
    """The h with P[|Lap(scale)| <= h] = C: ``scale * ln(1 / (1 - C))`` (as -log1p(-C))."""
    confidence = check_confidence(confidence)
    return _check_scale(scale) * -math.log1p(-confidence)


def laplace_all_half_width(scale: float, confidence: float, values: int) -> float:
    """The h with P[all ``values`` independent Lap(scale) noises within +-h at once] >= C:
    ``P(|X| > h) = e^(-h / scale)`` must be at most ``m`` = :func:`each_cell_miss` (rounded
    down, so h is rounded up): ``h = scale * ln(1 / m)``; :func:`laplace_half_width` for one."""
    if values == 1:
        return laplace_half_width(scale, confidence)
    return _check_scale(scale) * -math.log(each_cell_miss(confidence, values))


def _check_scale(scale: float) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not 0 < scale < math.inf:
        raise UserError(f"scale must be a finite number > 0; got {scale!r}")
    return float(scale)


def selection_gap(sensitivity: float, epsilon: float, candidates: int, failure: float = 0.05) -> float:
    """With probability at least 1 - ``failure`` the exponential mechanism (monotone score,
    exponent ``epsilon u / sensitivity``) chooses a candidate whose score is within this of the
    best: ``(sensitivity / epsilon) (ln(candidates - 1) + ln(1 / failure))``, 0 for one candidate.
    A candidate more than ``g`` below the best OPT has probability at most
    ``e^(epsilon (OPT - g) / sensitivity) / Z <= e^(-epsilon g / sensitivity)`` (Z has the best's
    term), and at most ``candidates - 1`` of them are not the best: a union bound over those."""
    if not 0 < failure < 1:
        raise UserError(f"failure probability must be in (0, 1); got {failure!r}")
    if candidates < 1:
        raise UserError(f"candidates must be an integer >= 1; got {candidates!r}")
    if candidates == 1:
        return 0.0
    return sensitivity / epsilon * (math.log(candidates - 1) - math.log(failure))


# --- what a mechanism's published numbers are worth: one typed statement per mechanism ---------


@dataclass(frozen=True)
class SelectionGap:
    """The exponential mechanism's utility: the chosen scheme's score is within ``rows`` of the
    best with probability 1 - ``failure`` (:func:`selection_gap`)."""

    failure: float
    rows: float


@dataclass(frozen=True)
class NoiseAccuracy:
    """Additive noise of scale ``scale``: EACH published value within +-``half_width[C]`` of
    the true one with probability >= C (one value at a time); ``clamping``: the bias a clamp
    adds, in words. ``cells`` > 1 values (a table's cells, a statistic's groups) with independent noise also state
    ``all_cells_half_width[C]``: every value of the table within it AT ONCE with probability
    >= C (simultaneous, :func:`each_cell_miss`), and ``interval_confidence``: the confidence of
    the per-cell interval columns ``lower`` / ``upper`` of its output (None: it has none)."""

    scale: float
    half_width: Mapping[float, float]
    clamping: str | None = None
    cells: int = 1
    all_cells_half_width: Mapping[float, float] = field(default_factory=dict)
    interval_confidence: float | None = None
    unit: str = "cell"
    """What one of the ``cells`` values is, in words (a table's cell, a statistic's group)."""

    def as_dict(self) -> dict[str, Any]:
        """The statement's JSON keys (beside the mechanism's ``estimate``)."""
        document: dict[str, Any] = {
            "noise_scale": self.scale,
            "half_width": {f"{c:g}": width for c, width in self.half_width.items()},
            "clamping": self.clamping,
        }
        if self.all_cells_half_width:
            document["table_cells"] = self.cells
            document["all_cells_half_width"] = {f"{c:g}": width for c, width in self.all_cells_half_width.items()}
        if self.interval_confidence is not None:
            document["interval_columns"] = {"columns": list(INTERVAL[1:]), "confidence": self.interval_confidence}
        return document


@dataclass(frozen=True)
class LargeSumUtility:
    """SPLU-Gen's large-sum utility: the count of one sensitive value on its own, if at least
    ``t_f``, is estimated within relative error ``epsilon`` except with probability ``t_e``
    (:data:`.splu_guarantees.UTILITY_SCOPE`); conjunctions have no such guarantee
    (:data:`.splu_guarantees.NO_UTILITY`)."""

    t_f: int
    epsilon: float
    t_e: float

    def as_dict(self) -> dict[str, Any]:
        """The statement's JSON keys, its scope in words among them."""
        return {
            "t_f": self.t_f,
            "epsilon": self.epsilon,
            "t_e": self.t_e,
            "large_sum_covers": UTILITY_SCOPE,
            "large_sum_not_covered": NO_UTILITY,
        }


@dataclass(frozen=True)
class PublishedCounts:
    """After the data: how to read each published count of SDGS microdata or a histogram, the
    estimate count / beta with an exact interval for the people behind it at ``confidence``,
    conditional on publication (:mod:`.count_intervals`; post-processing, no privacy cost).
    ``columns``: the columns holding them, in the histogram or in the microdata's companion
    file of its published cells (``command``: the same for counts a user forms herself)."""

    confidence: float
    construction: str
    how: str
    columns: Mapping[str, str]
    command: str | None = None

    def as_dict(self) -> dict[str, Any]:
        document: dict[str, Any] = {"confidence": self.confidence, "construction": self.construction, "how": self.how}
        if self.columns:
            document["columns"] = dict(self.columns)
        if self.command:
            document["command"] = self.command
        return document


def published_counts(k: int, beta: float, confidence: float, output: str) -> PublishedCounts:
    """The after-the-data statement of an SDGS (``output`` "microdata") or histogram release."""
    from privrelease.mechanisms.count_intervals import CONSTRUCTION

    level = f"{confidence:g}"
    columns = dict(
        zip(
            HISTOGRAM,
            (
                "the sampled rows of the cell (published only when >= k)",
                f"count / beta = count x {1 / beta:g}: the people in the cell, estimated",
                f"the least N in the exact {level} interval for the people in the cell (>= count)",
                f"the largest N in the exact {level} interval for the people in the cell",
            ),
            strict=True,
        )
    )
    each = (
        f"'estimate' = c / beta estimates the people N behind it, "
        f"and [lower, upper] holds N with probability >= {level} given that the cell is published"
    )
    if output == "histogram":
        return PublishedCounts(confidence, CONSTRUCTION, f"each row's count c is a published count: {each}", columns)
    command = f"privrelease guarantee accuracy sdgs --k {k} --beta {beta:g} --observed c --confidence {level}"
    how = (
        "the companion file '<mechanism>.cells' lists each published cell (the published rows grouped by their "
        f"generalized values) with its row count c: {each}; for other groupings, `{command}` "
        "(Python: privrelease.count_intervals)"
    )
    return PublishedCounts(confidence, CONSTRUCTION, how, columns, command)


@dataclass(frozen=True)
class StatedAccuracy:
    """A kind's own accuracy statement, for what the shapes above do not describe (a plugin's
    randomized response, say): ``caption`` (one sentence saying what is stated, for whom and how
    it is computed) over a table of ``columns`` and ``rows`` of text, as the report shows it,
    and ``document`` (plain JSON data) published under ``key`` in ``plan --json`` and
    ``release.json``."""

    key: str
    caption: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    document: Mapping[str, Any]

    def __post_init__(self) -> None:
        assert all(len(row) == len(self.columns) for row in self.rows), "one cell per column"
        assert self.key not in _KEYS, f"{self.key!r} is a built-in accuracy key"


@dataclass(frozen=True)
class AccuracyStatement:
    """What one mechanism's published numbers are worth, from the policy alone (its kind's
    accuracy map): how to estimate, and the statements that apply to it (``stated``: the
    kind's own, :class:`StatedAccuracy`); ``counted``: with a person column, which of a
    person's rows the true values are of (:func:`privrelease.planning.counted_rows`)."""

    estimate: str
    cells: tuple[CountAccuracy, ...] = ()
    selection_gap: SelectionGap | None = None
    noise: NoiseAccuracy | None = None
    large_sum: LargeSumUtility | None = None
    published_counts: PublishedCounts | None = None
    stated: tuple[StatedAccuracy, ...] = ()
    counted: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """The statement in JSON (plan --json, release.json)."""
        document: dict[str, Any] = {"estimate": self.estimate}
        if self.counted is not None:
            document["counted"] = self.counted
        if self.cells:
            document["cells"] = [cell.as_dict() for cell in self.cells]
        if self.selection_gap is not None:
            document["selection_gap"] = {"failure": self.selection_gap.failure, "rows": self.selection_gap.rows}
        if self.noise is not None:
            document.update(self.noise.as_dict())
        if self.large_sum is not None:
            document.update(self.large_sum.as_dict())
        if self.published_counts is not None:
            document["published_counts"] = self.published_counts.as_dict()
        for own in self.stated:
            document[own.key] = dict(own.document)
        return document


_KEYS = frozenset(
    (
        "estimate",
        "counted",
        "cells",
        "selection_gap",
        "noise_scale",
        "half_width",
        "clamping",
        "t_f",
        "epsilon",
        "t_e",
        "large_sum_covers",
        "large_sum_not_covered",
        "published_counts",
    )
)
"""The keys of :meth:`AccuracyStatement.as_dict` the built-in shapes use."""
