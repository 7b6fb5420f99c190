"""Binomial distribution pieces, vectorized and broadcasting, from scipy.special alone.

``scipy.stats`` costs about a second to import; these use the regularized incomplete beta
function (``betainc``/``betaincc``, Boost) and ``gammaln``, which also serve values far in the
tails (relative error measured against mpmath in tests/test_sdgs_math.py).
"""

from __future__ import annotations

import numpy as np
from scipy import special


def upper_tail(j, n, p):
    """P[Bin(n, p) >= j] = I_p(j, n - j + 1) (1 where j <= 0, 0 where j > n)."""
    j, n = np.asarray(j, dtype=float), np.asarray(n, dtype=float)
    inside = (j >= 1) & (j <= n)
    out = special.betainc(np.where(inside, j, 1), np.where(inside, n - j + 1, 1), p)
    return np.where(j > n, 0.0, np.where(j <= 0, 1.0, out))


def lower_tail(j, n, p):
    """P[Bin(n, p) <= j] = 1 - I_p(j + 1, n - j) (0 where j < 0, 1 where j >= n)."""
    j, n = np.asarray(j, dtype=float), np.asarray(n, dtype=float)
    inside = (j >= 0) & (j < n)
    out = special.betaincc(np.where(inside, j + 1, 1), np.where(inside, n - j, 1), p)
    return np.where(j >= n, 1.0, np.where(j < 0, 0.0, out))


def log_pmf(j, n, p):
    """log f(j; n, p) (-inf outside 0..n)."""
    j, n = np.asarray(j, dtype=float), np.asarray(n, dtype=float)
    inside = (j >= 0) & (j <= n)
    jj, nn = np.where(inside, j, 0), np.where(inside, n, 0)
    value = (
        special.gammaln(nn + 1)
        - special.gammaln(jj + 1)
        - special.gammaln(nn - jj + 1)
        + special.xlogy(jj, p)
        + special.xlog1py(nn - jj, -p)
    )
    return np.where(inside, value, -np.inf)


_DEEP = 1e-290
"""Below this an upper tail from ``betainc`` nears the subnormal range; :func:`log_upper_tail`
sums it from its first term instead."""


def log_upper_tail(j, n, p):
    """log P[Bin(n, p) >= j], also where the tail underflows (-inf where j > n, 0 where j <= 0).

    Where :func:`upper_tail` is at least :data:`_DEEP` its log; below, j is far above the mean
    (hence above the mode: the terms f(j + i) decrease), and the tail is
    ``f(j) sum_i t_i`` with t_0 = 1, ``t_{i+1} = t_i (n - j - i) / (j + i + 1) p / (1 - p)``,
    summed term by term (vectorized over the entries) until a term adds less than 1e-17."""
    j, n, p = np.broadcast_arrays(np.asarray(j, dtype=float), np.asarray(n, dtype=float), np.asarray(p, dtype=float))
    direct = upper_tail(j, n, p)
    with np.errstate(divide="ignore"):
        out = np.array(np.log(direct), dtype=float)
    deep = (direct < _DEEP) & (j >= 1) & (j <= n) & (p > 0) & (p < 1)
    if deep.any():
        jj, nn, pp = j[deep], n[deep], p[deep]
        odds = pp / (1 - pp)
        term, total = np.ones_like(jj), np.ones_like(jj)
        for i in range(1_000_000):
            term = term * np.maximum(nn - jj - i, 0) / (jj + i + 1) * odds
            total += term
            if not (term > 1e-17 * total).any():
                break
        else:  # pragma: no cover - the ratio is below 1 beyond the mode
            raise AssertionError("binomial tail series did not converge")
        out[deep] = log_pmf(jj, nn, pp) + np.log(total)
    return out


def pmf(j, n, p):
    """f(j; n, p), the binomial probability mass (0 outside 0..n)."""
    return np.exp(log_pmf(j, n, p))
