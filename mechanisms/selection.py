"""epsilon-safe k-anonymization: choosing the generalization scheme with the exponential mechanism.

Li, Qardaji, Su, "On sampling, anonymization, and differential privacy", Section 3.2: a
k-anonymization algorithm is *epsilon-safe* when its first step (choosing the partition of the
tuple space, i.e. the generalization scheme) is epsilon-DP; "consider various possible
generalization schemes, use a quality function to assign a quality to each of them, and then use
the exponential mechanism [McSherry-Talwar] to differentially privately select" one (ARX calls
this SafePub). The candidates are fixed before the data is read (they come from the approved
policy); only the choice among them looks at the data.

Utility. For a candidate scheme S, the score is the expected number of rows that
(k, beta)-SDGS with S would publish from the table D:

    u(S, D) = w_S * sum_cells g(n_c),   g(n) = E[X 1{X >= k}] = n beta P(Bin(n - 1, beta) >= k - 1),

X ~ Bin(n, beta) the sampled rows of a cell with n rows in D, and w_S in (0, 1] an optional
data-independent weight per candidate (e.g. the share of detail the scheme keeps; fixed in the
policy: without weights a coarser scheme always scores at least as high).

Sensitivity (neighbouring tables differ by adding or removing one row). Adding a row changes the
count of one cell only, n -> n + 1. Write X_{n+1} = X_n + B with B ~ Bernoulli(beta) independent;
if B = 1, (X + 1) 1{X + 1 >= k} - X 1{X >= k} = 1{X >= k} + k 1{X = k - 1}, so

    0 <= g(n + 1) - g(n) = beta [P(X_n >= k) + k f(k - 1; n, beta)] =: beta h(n).

Hence |u(S, D) - u(S, D')| <= w_S * Delta(k, beta) with Delta = beta * sup_n h(n). The sup is
computed over n <= N = 2 ceil((k - 1) / beta) + 20 and bounded beyond by 1 + k f(k - 1; N + 1, beta)
(f(k - 1; n, beta) decreases in n once n >= (k - 1) / beta, and P(X >= k) <= 1). Examples:
beta = 1 gives Delta = k (a cell reaching k publishes k rows at once: the "rows not suppressed"
score); k = 1 gives Delta = beta; k = 20, beta = 0.1 gives Delta ~ 0.24.

Monotone score. Adding a row never lowers a score (0 <= g(n + 1) - g(n) above, and the weights
are fixed): for D' = D + {x}, u(S, D) <= u(S, D') <= u(S, D) + Delta for every S. The exponential
mechanism with such a score is epsilon-DP with exponent ``epsilon u / Delta``, not
``epsilon u / (2 Delta)`` (McSherry-Talwar 2007, remark after Theorem 6; Dwork-Roth 2014,
remark after Theorem 3.10): Pr_{D'}[S] / Pr_D[S] = e^{epsilon (u'_S - u_S) / Delta} Z_D / Z_{D'},
the first factor in [1, e^epsilon] and the second in [e^-epsilon, 1], because every term of
Z_{D'} = sum_S e^{epsilon u'_S / Delta} is between 1 and e^epsilon times its term in Z_D. So the
selection spends all of the epsilon it is charged (with the factor 2 it was charged epsilon and
spent epsilon/2; the tests find a neighbouring pair at the charged epsilon).

Mechanism: Pr[S] proportional to exp(epsilon u(S) / Delta), computed in log space (subtract
the largest exponent) and sampled by inverse CDF with a uniform from the OS CSPRNG
(:mod:`.randomness`). Delta bounds the weighted scores too (w_S <= 1); using it whatever the
weights keeps the event a function of k and beta only, as planned before data access. It is
epsilon-DP and epsilon-bounded-range (the losses of a neighbouring pair lie in one interval of width
epsilon), realized as the event ``BoundedRangeSelection(epsilon, candidates, sensitivity=Delta)``,
whose composition is accounted by that range (:class:`~.events.BoundedRangeSelection`).
The SDGS run that follows samples afresh, so the release composes as Composed([selection, SDGS]).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from privrelease.errors import UserError
from privrelease.mechanisms import binomial, randomness
from privrelease.mechanisms.events import BoundedRangeSelection
from privrelease.mechanisms.schemes import ColumnScheme
from privrelease.mechanisms.sdgs import check_parameters, count_cells

_FLOAT_SLACK = 1e-9
"""Relative margin added to the computed sensitivity, above any floating-point error of scipy's
binomial pmf / survival function."""


@dataclass(frozen=True)
class Selection:
    """The chosen candidate: its ``name`` and ``scheme``, the privacy ``event``, and
    ``internal_facts`` (the scores, which describe the data: internal review only)."""

    name: str
    scheme: Mapping[str, ColumnScheme]
    event: BoundedRangeSelection
    internal_facts: dict[str, Any] = field(default_factory=dict)


def sensitivity(k: int, beta: float) -> float:
    """Delta(k, beta) = beta * sup_n [P(Bin(n, beta) >= k) + k f(k - 1; n, beta)]: the most one
    row can change the expected number of SDGS-published rows (module docstring)."""
    check_parameters(k, beta, 0.0)
    limit = 2 * math.ceil((k - 1) / beta) + 20
    n = np.arange(limit + 1)
    h = binomial.upper_tail(k, n, beta) + k * binomial.pmf(k - 1, n, beta)
    tail = 1.0 + k * float(binomial.pmf(k - 1, limit + 1, beta))
    return beta * max(float(h.max()), tail) * (1 + _FLOAT_SLACK)


def expected_published_rows(table: pa.Table, scheme: Mapping[str, ColumnScheme], *, k: int, beta: float) -> float:
    """sum over the cells of ``scheme`` on ``table`` of n beta P(Bin(n - 1, beta) >= k - 1): the
    expected number of rows (k, beta)-SDGS would publish."""
    return expected_published_of_counts(count_cells(table, scheme, beta=1.0).counts, k=k, beta=beta)


def expected_published_of_counts(counts: np.ndarray, *, k: int, beta: float) -> float:
    """:func:`expected_published_rows` from the cells' row counts (of all rows, e.g. merged
    over partitions)."""
    return float(np.sum(counts * beta * binomial.upper_tail(k - 1, counts - 1, beta)))


def selection_probabilities(scores: Sequence[float], *, epsilon: float, sensitivity: float) -> np.ndarray:
    """exp(epsilon u_i / sensitivity), normalized, computed in log space: the exponential
    mechanism for a score that never decreases when a row is added (module docstring)."""
    exponents = epsilon * np.asarray(scores, dtype=np.float64) / sensitivity
    weights = np.exp(exponents - exponents.max())
    return weights / weights.sum()


def exponential_mechanism(scores: Sequence[float], *, epsilon: float, sensitivity: float) -> int:
    """Index i drawn with probability :func:`selection_probabilities` ``[i]`` (inverse CDF of a
    53-bit uniform from the OS CSPRNG)."""
    cumulative = np.cumsum(selection_probabilities(scores, epsilon=epsilon, sensitivity=sensitivity))
    uniform = float(randomness.random_uint64(1)[0] >> np.uint64(11)) * 2.0**-53
    return min(
        int(np.searchsorted(cumulative, uniform * cumulative[-1], side="right")),
        len(cumulative) - 1,
    )


def select_scheme(
    table: pa.Table,
    candidates: Mapping[str, Mapping[str, ColumnScheme]],
    *,
    k: int,
    beta: float,
    epsilon: float,
    weights: Mapping[str, float] | None = None,
) -> Selection:
    """Choose one of ``candidates`` (name -> scheme, fixed before data access) by the
    exponential mechanism on the expected number of rows (k, beta)-SDGS would publish (times the
    candidate's weight, default 1). epsilon-DP; see the module docstring for the sensitivity."""
    if not candidates:
        raise UserError("candidates must name at least one generalization scheme")
    if not isinstance(epsilon, (int, float)) or not 0 < epsilon < math.inf:
        raise UserError(f"epsilon must be a finite number > 0; got {epsilon!r}")
    check_parameters(k, beta, epsilon)
    weights = dict(weights or {})
    unknown = sorted(set(weights) - set(candidates))
    if unknown:
        raise UserError(f"weights name {unknown[0]!r}, which is not a candidate; candidates: {', '.join(candidates)}")
    for name in candidates:
        weight = weights.setdefault(name, 1.0)
        if not isinstance(weight, (int, float)) or not 0 < weight <= 1:
            raise UserError(f"weight of candidate {name!r} must be in (0, 1]; got {weight!r}")
    scores = {
        name: weights[name] * expected_published_rows(table, candidates[name], k=k, beta=beta) for name in candidates
    }
    return select_by_scores(candidates, scores, k=k, beta=beta, epsilon=epsilon)


def select_by_scores(
    candidates: Mapping[str, Mapping[str, ColumnScheme]],
    scores: Mapping[str, float],
    *,
    k: int,
    beta: float,
    epsilon: float,
) -> Selection:
    """The exponential mechanism over the candidates' (weighted) scores, with the sensitivity
    of :func:`sensitivity` (the step of :func:`select_scheme` after the scores)."""
    names = list(candidates)
    bound = sensitivity(k, beta)
    chosen = names[exponential_mechanism([scores[name] for name in names], epsilon=epsilon, sensitivity=bound)]
    event = BoundedRangeSelection(epsilon=epsilon, candidates=len(names), sensitivity=bound)
    return Selection(chosen, candidates[chosen], event, {"scores": {name: scores[name] for name in names}})
