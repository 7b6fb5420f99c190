"""Privacy of (k, beta)-SDGS: Theorem 1's delta, the exact hockey-stick delta, the f-smooth bound.

Notation (Li, Qardaji, Su, "Provably Private Data Anonymization", Section 4): a row t whose
generalized value is shared by n rows of D (t included); ``X ~ Bin(n, beta)`` copies survive
sampling; the cell is published with its count when ``X >= k`` and suppressed otherwise;
``f(j; n, beta)`` is the binomial pmf and ``gamma = (e^eps - 1 + beta) / e^eps``.

* Theorem 1 (probabilistic DP, the papers' notion): for ``eps >= -ln(1 - beta)``,
  ``d(k, beta, eps) = max_{n >= ceil(k/gamma - 1)} sum_{j > gamma n}^{n} f(j; n, beta)``.
* Exact hockey-stick delta (standard (eps, delta)-DP, add/remove one row): the other cells are
  distributed identically under D and D - t, so the privacy loss lives in the count of t's cell:
  ``delta(eps) = sup_n max(H(P_n || P_{n-1}), H(P_{n-1} || P_n))`` with
  ``H(P || Q) = sum_o max(0, P(o) - e^eps Q(o))`` over the outcomes o in {suppressed, k, ..., n}.
* Theorem 6 (f-smooth): ``delta(eps) <= exp(-k (ln(gamma/beta) - (gamma - beta)/gamma))``.

The maxima over n are exact: n is scanned in vectorized blocks until a proven bound on every
later n falls below the best value found (Chernoff-Hoeffding, ``P[Bin(n, b) >= a n] <=
exp(-n KL(a || b))`` for ``a > b``, which decreases in n); no fixed cut-off. Tails come from
scipy's regularized incomplete beta (``betainc``/``betaincc``, Boost) in double precision; below 1e-280 the
same vectorized scans run on the logs of the terms, each tail summed from its first term
(:func:`.binomial.log_upper_tail`: a few hundred terms, never the whole support, so k = 100,000
with beta = 1e-4 answers in milliseconds), so values far below 1e-308 stay exact. A reported
delta is the computed one raised by ``SAFETY_MARGIN`` (relative; plus the cancellation error of
the exact formula), a thousand times the largest error measured against mpmath in the tests, so
it is never below the true value; in log space also by the rounding of log-gammas of size
n ln n (:func:`_log_rounding`: a relative 7e-7 at n = 3.4e6, 1.4e-4 at n = 4.8e8).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import special

from privrelease.errors import UserError
from privrelease.mechanisms.binomial import log_pmf as _log_pmf
from privrelease.mechanisms.binomial import log_upper_tail as _log_upper_tail
from privrelease.mechanisms.binomial import lower_tail as _lower_tail
from privrelease.mechanisms.binomial import pmf as _pmf
from privrelease.mechanisms.binomial import upper_tail as _upper_tail
from privrelease.mechanisms.limits import MIN_BETA

SAFETY_MARGIN = 1e-9
"""Relative amount by which every reported delta exceeds the computed one."""

_DOUBLE_ERROR = 1e-12
"""Bound on the relative error of one tail or pmf value (measured against mpmath in the tests)."""

_TINY = 1e-280
"""Below this, values are recomputed in log space (double precision underflows near 1e-308)."""

_BLOCK = 16
_MAX_BLOCK = 4096


@dataclass(frozen=True)
class SdgsDelta:
    """A delta with the n (rows sharing t's generalized value) that attains it.

    ``delta`` is None where the theorem gives no delta (then ``reason`` says why).
    ``log10_delta`` stays exact where ``delta`` underflows a double (below about 1e-308; the
    float is then the smallest positive double, never below the truth).
    """

    delta: float | None
    log10_delta: float | None
    argmax_n: int | None
    reason: str = ""


def gamma_of(beta, epsilon):
    """gamma = (e^eps - 1 + beta) / e^eps = 1 - (1 - beta) e^-eps (Theorem 1)."""
    return 1.0 - (1.0 - beta) * np.exp(-np.asarray(epsilon, dtype=float))


def min_theorem1_epsilon(beta: float) -> float:
    """Theorem 1 holds for eps >= -ln(1 - beta); below it gives no delta."""
    return -math.log1p(-beta) if beta < 1 else math.inf


def check_parameters(k: int, beta: float, epsilon: float) -> None:
    """UserError unless k is an integer >= 1, MIN_BETA <= beta <= 1 and epsilon >= 0 (finite)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise UserError(f"k must be an integer >= 1; got {k!r}")
    if not isinstance(beta, (int, float)) or not MIN_BETA <= beta <= 1:
        raise UserError(f"beta must be in [{MIN_BETA:g}, 1]; got {beta!r}")
    if not isinstance(epsilon, (int, float)) or not (0 <= epsilon < math.inf):
        raise UserError(f"epsilon must be a finite number >= 0; got {epsilon!r}")


# --- binomial pieces (broadcasting over cells x n) ------------------------------------------


def _kl(a, b):
    """Bernoulli KL(a || b), lowered by a relative 1e-9 so stopping rules built on it stay
    valid under rounding."""
    a = np.clip(a, 1e-300, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = special.xlogy(a, a / b) + special.xlog1py(1 - a, -a) - special.xlog1py(1 - a, -b)
    return np.maximum(np.nan_to_num(kl, nan=0.0), 0.0) * (1 - 1e-9)


def _first_above(gamma, n):
    """floor(gamma n) + 1, the smallest j with j > gamma n. Where gamma n lies within 1e-12 of
    an integer the boundary j = gamma n is counted as bad too (conservative)."""
    return np.floor(gamma * n * (1 - 1e-12)) + 1


def _n_m(k, gamma):
    """n_m = ceil(k/gamma - 1); where k/gamma lies within 1e-9 of an integer the smaller
    candidate is taken (a larger maximum: conservative under rounding)."""
    return np.maximum(1, np.ceil(k / gamma - 1 - 1e-9))


def _log_mean_excess(n, a, beta):
    """log of a bound on E[(X/n - a)_+] for a > beta, or on E[(a - X/n)_+] for a < beta,
    X ~ Bin(n, beta): integrating Chernoff-Hoeffding P[X/n >= a + t] <= exp(-n KL(a + t || beta))
    over t, with KL(a + t) >= KL(a) + KL'(a) t (convexity), gives
    exp(-n KL(a || beta)) / (n |KL'(a)|), KL'(a) = ln(a (1 - beta) / (beta (1 - a))); the
    bound decreases in n, and as a moves away from beta. +inf where a == beta."""
    with np.errstate(divide="ignore", invalid="ignore"):
        slope = np.abs(np.log(a * (1 - beta) / (beta * (1 - a)))) * (1 - 1e-9)
        value = -n * _kl(a, beta) - np.log(n * slope)
    return np.where((slope > 0) & (a > 0) & (a < 1), value, np.inf)


def _log_tv_bound(beta, n):
    """log of a bound on both hockey-stick divergences at every n' >= n (any eps >= 0):
    Bin(n', beta) = (1 - beta) Bin(n'-1) + beta (Bin(n'-1) + 1), so the total variation distance
    to Bin(n'-1, beta), and to anything computed from the count (e.g. after suppression), is
    beta times the largest pmf value of Bin(n'-1, beta); that value is nonincreasing in n'
    because each pmf value of Bin(m+1) is a convex combination of two of Bin(m)."""
    mode = np.floor(n * beta)  # the mode of Bin(n - 1, beta)
    return np.log(beta) + _log_pmf(mode, n - 1, beta) + 1e-9


# --- block scans, vectorized over cells -------------------------------------------------------


def _scan_up(values, start, log_bound, best=None, argmax=None, *, in_log=False):
    """Per cell, the max of values(cells, n) over n >= start[cell], scanning blocks of n until
    log_bound(cells, n0) (log of a bound on every term at n >= n0, nonincreasing in n0) is
    below the log of the best term (or below log 1e-280 while nothing representable was found).
    Given (best, argmax) from another part of the same maximum, folds into them (and stops
    as soon as no later term can beat them). ``in_log``: values are logs of the terms (never
    underflow; the scan goes on while nothing above -inf was found). Returns (best, argmax)."""
    cells = len(start)
    if best is None:
        best, argmax = np.full(cells, -np.inf if in_log else 0.0), start.astype(float).copy()
    n0 = start.astype(float).copy()
    active, block = np.arange(cells), _BLOCK
    while active.size:
        n = n0[active, None] + np.arange(block)
        vals = values(active, n)
        i = np.argmax(vals, axis=1)
        top = vals[np.arange(active.size), i]
        better = top > best[active]
        best[active[better]] = top[better]
        argmax[active[better]] = n[better, i[better]]
        n0[active] += block
        level = best[active] if in_log else np.log(np.maximum(best[active], _TINY))
        with np.errstate(divide="ignore"):
            done = log_bound(active, n0[active]) < level
        active = active[~done]
        block = min(2 * block, _MAX_BLOCK)
    return best, argmax


def _scan_down(values, top, bottom, bound, best, argmax, *, in_log=False):
    """Per cell, fold into (best, argmax) the max of values(cells, n) for bottom <= n <= top,
    scanning down in blocks while bound(cells, hi) (a bound on every term at n <= hi,
    nondecreasing in hi) may exceed the best (``in_log``: values and bound are logs)."""
    hi = top.astype(float).copy()
    active, block = np.arange(len(hi)), _BLOCK

    def open_cells(cells):
        keep = hi[cells] >= bottom[cells]
        keep[keep] = bound(cells[keep], hi[cells[keep]]) > best[cells[keep]]
        return cells[keep]

    active = open_cells(active)
    while active.size:
        n = hi[active, None] - np.arange(block)
        vals = np.where(n >= bottom[active, None], values(active, np.maximum(n, 1)), -np.inf if in_log else 0.0)
        i = np.argmax(vals, axis=1)
        topv = vals[np.arange(active.size), i]
        better = topv > best[active]
        best[active[better]] = topv[better]
        argmax[active[better]] = n[better, i[better]]
        hi[active] -= block
        active = open_cells(active)
        block = min(2 * block, _MAX_BLOCK)
    return best, argmax


def _as_cells(k, beta, epsilon):
    k, beta, epsilon = np.broadcast_arrays(
        np.asarray(k, dtype=float), np.asarray(beta, dtype=float), np.asarray(epsilon, dtype=float)
    )
    return k.ravel(), beta.ravel(), epsilon.ravel()


def _report(value: float, log_value: float, argmax: float | None) -> SdgsDelta:
    """Raise by the safety margin; keep the exact log10 where the float underflows."""
    n = None if argmax is None else int(argmax)
    if value >= _TINY:
        delta = value * (1 + SAFETY_MARGIN)
        return SdgsDelta(delta, math.log10(delta), n)
    if log_value == -math.inf:
        return SdgsDelta(0.0, -math.inf, n)
    log_delta = log_value + SAFETY_MARGIN
    delta = math.exp(log_delta) * (1 + 1e-12)
    return SdgsDelta(max(delta, 5e-324), log_delta / math.log(10), n)


# --- Theorem 1 -----------------------------------------------------------------------------


def theorem1_grid(k, beta, epsilon) -> list[SdgsDelta]:
    """delta = d(k, beta, eps) of Theorem 1 for every cell of broadcast (k, beta, eps) arrays.

    The max starts at n_m = ceil(k/gamma - 1) and stops once the Chernoff-Hoeffding bound
    exp(-n KL(gamma || beta)) on every later term (it decreases in n) is below the best term.
    Cells with beta = 1 or eps < -ln(1 - beta) get delta None and the reason.
    """
    k, beta, epsilon = _as_cells(k, beta, epsilon)
    results: list[SdgsDelta | None] = [None] * len(k)
    valid = np.zeros(len(k), dtype=bool)
    for c in range(len(k)):
        check_parameters(int(k[c]), float(beta[c]), float(epsilon[c]))
        if beta[c] >= 1:
            results[c] = SdgsDelta(
                None,
                None,
                None,
                "Theorem 1 needs beta < 1: k-DGS without "
                "sampling gives no (eps, delta)-DP for any delta < 1 "
                "(Proposition 4)",
            )
        elif epsilon[c] < min_theorem1_epsilon(float(beta[c])):
            results[c] = SdgsDelta(
                None,
                None,
                None,
                "Theorem 1 needs epsilon >= -ln(1 - beta) "
                f"= {min_theorem1_epsilon(float(beta[c])):.6g}; "
                f"got {epsilon[c]:g}",
            )
        else:
            valid[c] = True
    idx = np.flatnonzero(valid)
    if idx.size:
        kk, bb = k[idx], beta[idx]
        gg = gamma_of(bb, epsilon[idx])
        kl = _kl(gg, bb)
        best, argmax = _scan_up(
            lambda c, n: _upper_tail(_first_above(gg[c, None], n), n, bb[c, None]),
            _n_m(kk, gg),
            lambda c, n0: -n0 * kl[c],
        )
        for pos, c in enumerate(idx.tolist()):
            if best[pos] >= _TINY:
                results[c] = _report(best[pos], math.log(best[pos]), argmax[pos])
            else:
                results[c] = _theorem1_log_space(int(kk[pos]), float(bb[pos]), float(gg[pos]), float(kl[pos]))
    return _filled(results)


def _log_rounding(n, beta):
    """A bound on the absolute error of a log pmf or log tail at n trials (:func:`_log_pmf`):
    three log-gammas of about n ln n and two terms of about n |ln beta|, n |ln(1 - beta)|, each
    within a few ulps (2.2e-16 relative); bounded by 1e-14 of their sum (the tail's own relative
    error, 1e-12, besides). At n = 3.4e6 and beta = 0.01 about 7e-7, at n = 4.8e8 and beta = 1e-4
    about 1.4e-4: a tiny delta is reported to that relative precision, never below the truth."""
    return 1e-14 * (n + 1) * (np.log(n + 1) + abs(math.log(beta)) + abs(math.log1p(-beta)) + 3) + 1e-12


def _theorem1_log_space(k: int, beta: float, gamma: float, kl: float) -> SdgsDelta:
    """Theorem 1's max where it underflows a double: the same scan on the logs of the terms,
    each raised by its rounding bound (:func:`_log_rounding`)."""
    best, argmax = _scan_up(
        lambda c, n: _log_upper_tail(_first_above(gamma, n), n, beta) + _log_rounding(n, beta),
        np.array([_n_m(k, gamma)], dtype=float),
        lambda c, n0: -n0 * kl,
        in_log=True,
    )
    return _report(0.0, float(best[0]), argmax[0])


def delta_theorem1(k: int, beta: float, epsilon: float) -> SdgsDelta:
    """delta = d(k, beta, eps) of Theorem 1 (Li, Qardaji, Su), with the maximizing n.

    >>> f"{delta_theorem1(20, 0.1, 1.0).delta:.3g}"
    '4.07e-14'
    """
    return theorem1_grid(k, beta, epsilon)[0]


# --- exact hockey-stick delta ----------------------------------------------------------------


def _exact_add(k, beta, epsilon, n):
    """H(P_n || P_{n-1}): only outcomes j >= k with j > gamma n have f(j; n) > e^eps f(j; n-1);
    with m = max(k, floor(gamma n) + 1),
    sum_{j>=m} f(j;n) - e^eps f(j;n-1) = beta f(m-1; n-1) - (e^eps - 1) P[Bin(n-1) >= m].
    Raised by the worst-case cancellation error of that difference."""
    m = np.maximum(k, _first_above(gamma_of(beta, epsilon), n))
    positive = beta * _pmf(m - 1, n - 1, beta)
    negative = np.expm1(epsilon) * _upper_tail(m, n - 1, beta)
    value = positive - negative
    return np.where(value > 0, value + _DOUBLE_ERROR * (positive + negative), 0.0)


def _exact_remove(k, beta, epsilon, n):
    """H(P_{n-1} || P_n), nonzero only when e^eps (1 - beta) < 1 (eps < -ln(1 - beta)): the
    suppressed outcome gives F(k-1; n-1) - e^eps F(k-1; n) when positive, and outcomes
    k <= j < c n, c = 1 - e^eps (1 - beta), give f(j; n-1) - e^eps f(j; n) each."""
    growth = np.exp(epsilon)
    c = 1.0 - growth * (1.0 - beta)
    s_plus, s_minus = _lower_tail(k - 1, n - 1, beta), growth * _lower_tail(k - 1, n, beta)
    a = np.ceil(c * n * (1 + 1e-12)) - 1  # largest j < c n (one more at near-ties: conservative)
    t_plus = _lower_tail(a, n - 1, beta) - s_plus
    t_minus = growth * _lower_tail(a, n, beta) - s_minus
    value = np.maximum(s_plus - s_minus, 0.0) + np.where(a >= k, np.maximum(t_plus - t_minus, 0), 0)
    error = 2 * _DOUBLE_ERROR * (s_plus + s_minus + np.abs(t_plus) + np.abs(t_minus))
    return np.where(value > 0, value + error, 0.0)


def _log_remove_bound(k, beta, epsilon, n):
    """log of a bound on H(P_{n'-1} || P_{n'}) for all n' >= n. With f(j; n) = f(j; n-1)
    (1 - beta) n / (n - j), the suppressed outcome gives at most F(k-1; n-1) - F(k-1; n) =
    beta f(k-1; n-1) <= beta F(k-1; n-1), and each count j < c n gives
    f(j; n-1) (c - j/n) / (1 - j/n) <= f(j; n-1) (c - j/n) / (1 - c), in all at most
    E[(c' - Y)_+] / (1 - c), Y = Bin(n-1, beta) / (n-1), c' = c n / (n-1) (see
    :func:`_log_mean_excess`). Both pieces decrease in n once (k-1)/(n-1) < beta and c' < beta;
    otherwise the total-variation bound alone."""
    c = np.maximum(1.0 - np.exp(epsilon) * (1.0 - beta), 0.0)
    trials = np.maximum(n - 1, 1)
    f1, f2 = (k - 1) / trials, c * n / trials
    with np.errstate(divide="ignore", invalid="ignore"):
        suppressed = np.log(beta) - trials * _kl(f1, beta)
        counts = _log_mean_excess(trials, f2, beta) - np.log1p(-c)
        chernoff = np.logaddexp(suppressed, counts)
    chernoff = np.where((f1 < beta) & (f2 < beta) & (f2 > 0) & (n > 1), chernoff, 0.0)
    return np.minimum(chernoff, _log_tv_bound(beta, n))


def _remove_split(k, beta, epsilon):
    """n_lo = floor(min(k / c, (k - 1) / beta)), c = 1 - e^eps (1 - beta) > 0: at n <= k / c no
    count j >= k lies below c n (the remove direction's counts piece is empty, up to the
    near-tie rounding of :func:`_exact_remove`), and f(k-1; n-1) is nondecreasing in n for
    n <= (k - 1) / beta (f(j; N+1) / f(j; N) = (N + 1)(1 - beta) / (N + 1 - j) >= 1 iff
    N + 1 <= j / beta)."""
    c = -np.expm1(epsilon + np.log1p(-beta))
    return np.maximum(np.floor(np.minimum(k / (c * (1 + 1e-9)), (k - 1) / beta)), 0.0)


def _remove_bound_below(k, beta, epsilon, hi):
    """A bound on H(P_{n-1} || P_n) for every n <= hi <= n_lo (:func:`_remove_split`),
    nondecreasing in hi: there only the suppressed outcome counts, F(k-1; n-1) - e^eps F(k-1; n)
    = beta f(k-1; n-1) - (e^eps - 1) F(k-1; n) (as F(j; n-1) - F(j; n) = beta f(j; n-1)), whose
    first term grows with n up to hi and whose subtracted term shrinks. Raised by the rounding
    of the two values; 0 where the difference is negative beyond that rounding."""
    positive, negative = beta * _pmf(k - 1, hi - 1, beta), np.expm1(epsilon) * _lower_tail(k - 1, hi, beta)
    error = _DOUBLE_ERROR * (positive + negative)
    return np.where(positive - negative > -error, np.maximum(positive - negative, 0.0) + error, 0.0)


def _filled(results: list[SdgsDelta | None]) -> list[SdgsDelta]:
    """``results`` once every cell has its delta."""
    filled = [result for result in results if result is not None]
    assert len(filled) == len(results), "a cell has no result"
    return filled


def exact_grid(k, beta, epsilon) -> list[SdgsDelta]:
    """The exact hockey-stick delta of (k, beta)-SDGS for every cell (see :func:`delta_exact`)."""
    k, beta, epsilon = _as_cells(k, beta, epsilon)
    for c in range(len(k)):
        check_parameters(int(k[c]), float(beta[c]), float(epsilon[c]))
    results: list[SdgsDelta | None] = [None] * len(k)
    sampled = beta < 1
    for c in np.flatnonzero(~sampled).tolist():
        results[c] = SdgsDelta(
            1.0,
            0.0,
            int(k[c]),
            "k-DGS without sampling (beta = 1): no (eps, delta)-DP for any delta < 1 (Proposition 4)",
        )
    idx = np.flatnonzero(sampled)
    if not idx.size:
        return _filled(results)
    kk, bb, ee = k[idx], beta[idx], epsilon[idx]
    gg = gamma_of(bb, ee)
    kl = _kl(gg, bb)
    n_m = np.maximum(kk, _n_m(kk, gg))

    def add(c, n):
        return _exact_add(kk[c, None], bb[c, None], ee[c, None], n)

    # add direction, n >= n_m: with f(j; n) - e^eps f(j; n-1) = f(j; n) (j/n - gamma) / (1 - gamma),
    # at most E[(Bin(n)/n - gamma)_+] / (1 - gamma) (:func:`_log_mean_excess`), or total variation;
    # n < n_m: P[Bin(n) >= k], increasing
    def add_bound(c, n0):
        excess = _log_mean_excess(n0, gg[c], bb[c]) - np.log1p(-gg[c])
        return np.minimum(np.minimum(-n0 * kl[c], excess), _log_tv_bound(bb[c], n0))

    best, argmax = _scan_up(add, n_m, add_bound)
    best, argmax = _scan_down(add, n_m - 1, kk, lambda c, hi: _upper_tail(kk[c], hi, bb[c]), best, argmax)
    remove = np.flatnonzero(ee < -np.log1p(-bb))
    if remove.size:
        rk, rb, re = kk[remove], bb[remove], ee[remove]

        def remove_value(c, n):
            return _exact_remove(rk[c, None], rb[c, None], re[c, None], n)

        # seeded with the add direction's maximum: each scan stops once no n can beat it; from
        # n_lo down (:func:`_remove_bound_below`), then up from n_lo + 1
        n_lo = _remove_split(rk, rb, re)
        part, where = _scan_down(
            remove_value,
            n_lo,
            np.ones(remove.size),
            lambda c, hi: _remove_bound_below(rk[c], rb[c], re[c], hi),
            best[remove],
            argmax[remove],
        )
        best[remove], argmax[remove] = _scan_up(
            remove_value, n_lo + 1, lambda c, n0: _log_remove_bound(rk[c], rb[c], re[c], n0), part, where
        )
    for pos, c in enumerate(idx.tolist()):
        if best[pos] >= _TINY:
            results[c] = _report(best[pos], math.log(best[pos]), argmax[pos])
        else:
            found = _exact_log_space(int(kk[pos]), float(bb[pos]), float(ee[pos]), float(kl[pos]), int(n_m[pos]))
            if ee[pos] < -math.log1p(-bb[pos]) and (found.delta or 0.0) < _TINY:
                # the remove direction was scanned in floats: every n of it is below _TINY (scanned,
                # or pruned by a bound under max(best, _TINY)), which therefore bounds it
                found = _report(_TINY, math.log(_TINY), argmax[pos])
            results[c] = found
    return _filled(results)


def _log_exact_add(k, beta, epsilon, n):
    """log of :func:`_exact_add` without underflow (-inf where it is 0), vectorized over n:
    pos - neg = pos (1 - e^d), pos = beta f(m-1; n-1), d = log(neg / pos). d is taken from the
    exact ratio f(m; n-1) / f(m-1; n-1) = (n - m) beta / (m (1 - beta)) and the tail's series
    P[Bin(n-1) >= m] / f(m; n-1), never from two log-gammas of size n ln n (their rounding,
    about 1e-6 at n = 1e9, would swamp 1 - e^d). Raised by pos's rounding (:func:`_log_rounding`)
    and by d's (a relative 1e-12 of the tail, plus 4 ulps of log f(m; n-1)), which moves
    1 - e^d by at most e^d (e^dd - 1)."""
    m = np.maximum(k, _first_above(gamma_of(beta, epsilon), n))
    log_pos = math.log(beta) + _log_pmf(m - 1.0, n - 1.0, beta)
    log_pmf_m = _log_pmf(m, n - 1.0, beta)
    with np.errstate(invalid="ignore", divide="ignore"):
        series = _log_upper_tail(m, n - 1, beta) - log_pmf_m  # log of P[Bin(n-1) >= m] / f(m; n-1)
        d = math.log(math.expm1(epsilon)) + np.log((n - m) / m) - math.log1p(-beta) + series
        slack = 1e-12 + 4 * 2.3e-16 * np.abs(log_pmf_m)
        ratio = np.exp(np.minimum(d, 0.0))
        value = (
            log_pos
            + np.log1p(-ratio)
            + _log_rounding(n, beta)
            + np.log1p(np.exp(np.minimum(d, 0.0)) * np.expm1(slack) / (1 - ratio))
        )
    return np.where((m < n) & (d < 0), value, np.where(m == n, log_pos + _log_rounding(n, beta), -np.inf))


def _exact_log_space(k: int, beta: float, epsilon: float, kl: float, n_m: int) -> SdgsDelta:
    """The add direction in log space, scanned as in :func:`exact_grid` on the logs of the terms
    (the remove direction is never tiny: it is only present for eps < -ln(1 - beta), where the
    suppressed outcome alone carries a large divergence)."""
    start, bottom = np.array([float(n_m)]), np.array([float(k)])
    best, argmax = _scan_up(
        lambda c, n: _log_exact_add(k, beta, epsilon, n), start, lambda c, n0: -n0 * kl, in_log=True
    )
    best, argmax = _scan_down(
        lambda c, n: _log_exact_add(k, beta, epsilon, n),
        start - 1,
        bottom,
        lambda c, hi: _log_upper_tail(k, hi, beta),
        best,
        argmax,
        in_log=True,
    )
    return _report(0.0, float(best[0]), argmax[0])


def delta_exact(k: int, beta: float, epsilon: float) -> SdgsDelta:
    """The smallest delta for which (k, beta)-SDGS is (eps, delta)-DP under add/remove-one-row
    neighbours: the exact hockey-stick divergence, maximized over n and both directions.

    At most Theorem 1's d(k, beta, eps), and defined for every eps >= 0. ``beta = 1`` (k-DGS)
    gives delta = 1: a cell of n >= k identical rows is published with count n under D and
    n - 1 under D - t (Proposition 4).
    """
    return exact_grid(k, beta, epsilon)[0]


# --- f-smooth bound (Theorem 6) and its composition (Theorem 5) ---------------------------


def fsmooth_delta(k: int, beta: float, epsilon: float) -> float:
    """Theorem 6's bound delta(eps) = exp(-k (ln(gamma/beta) - (gamma - beta)/gamma)),
    gamma = gamma(eps); the paper states it for eps >= eps0 >= -ln(1 - beta) (its proof
    approximates the max over n >= ceil(k/gamma - 1) by n >= k/gamma)."""
    check_parameters(k, beta, epsilon)
    gamma = gamma_of(beta, epsilon)
    return math.exp(-k * (math.log(gamma / beta) - (gamma - beta) / gamma))


@dataclass(frozen=True)
class FSmooth:
    """f-smooth (eps0, delta0)-DP (Definition 5): (x eps0, delta0 f(x))-DP for every x >= 1.

    ``parts`` are the (k, beta, eps0) SDGS releases composed; by Theorem 5 (its proof's bound
    delta1 f1(x) + delta2 f2(x) <= (delta1 + delta2) max(f1, f2)(x)) the composition is
    f-smooth (sum eps0, sum delta0) with ``delta_at(x) = sum_i delta_i f_i(x)``.
    """

    parts: tuple[tuple[int, float, float], ...]

    @property
    def epsilon0(self) -> float:
        return sum(eps0 for _, _, eps0 in self.parts)

    @property
    def delta0(self) -> float:
        return self.delta_at(1.0)

    def delta_at(self, x: float) -> float:
        """delta0 f(x): the delta at epsilon = x * epsilon0, x >= 1."""
        if x < 1:
            raise ValueError(f"x must be >= 1 (epsilon >= epsilon0); got {x}")
        return sum(fsmooth_delta(k, beta, x * eps0) for k, beta, eps0 in self.parts)

    def f(self, x: float) -> float:
        """The smoothing function, f(1) = 1, decreasing (0 where delta0 underflows a double:
        every delta_at(x) <= delta0 does too)."""
        delta0 = self.delta0
        return self.delta_at(x) / delta0 if delta0 > 0 else 0.0

    def curve(self, xs) -> list[tuple[float, float]]:
        """(epsilon, delta) points for the multipliers xs."""
        return [(x * self.epsilon0, self.delta_at(x)) for x in xs]


# --- amplification by sampling -------------------------------------------------------------


def amplified_epsilon(beta: float, epsilon: float) -> float:
    """Corollary 4: an eps-DP algorithm run on a Bernoulli(beta) sample is eps'-DP with
    eps' = ln(1 + beta (e^eps - 1)) (so (e^eps' - 1)/(e^eps - 1) = beta).

    >>> round(math.exp(amplified_epsilon(0.1, math.log(2))), 12)
    1.1
    """
    if not 0 < beta <= 1:
        raise ValueError(f"beta must be in (0, 1]; got {beta!r}")
    return math.log1p(beta * math.expm1(epsilon))
