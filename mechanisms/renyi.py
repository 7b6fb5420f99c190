"""Rényi DP: a closed form for composing any number of releases (a billion runs in milliseconds).

The Rényi divergence of order ``a > 1`` of a pair (P, Q) is
``D_a(P||Q) = ln E_P[e^((a - 1) L)] / (a - 1)``, ``L = ln P/Q`` the privacy loss (Mironov,
"Rényi Differential Privacy", CSF 2017). It adds up under composition, adaptive included
(Mironov Proposition 1), and bounds the hockey-stick divergence (Canonne, Kamath, Steinke,
"The Discrete Gaussian for Differential Privacy", NeurIPS 2020, Proposition 12; as
OpenDP's ``cdp_delta``): ``D_a(P||Q) <= tau`` gives, for every ``eps``,

    H_{e^eps}(P||Q) <= e^((a - 1)(tau - eps)) (1 - 1/a)^(a - 1) / a,

so ``eps = tau + (ln(1/delta) + (a - 1) ln(1 - 1/a) - ln a) / (a - 1)`` reaches ``delta``; any
order gives a sound answer and the smallest over :data:`ORDERS` is taken. Everything is
computed in logs: no overflow at any count.

A release's divergences (:func:`of_event`): its closed form where it has one
(:meth:`~privrelease.mechanisms.events.Event.renyi`: the discrete Gaussian's ``a / (2 sigma^2)``;
an epsilon-bounded-range selection's ``a epsilon^2 / 8`` or its PLD's, the smaller), else those
of the dominating pair of its privacy loss distribution
(:mod:`.pld`), which bounds every neighbouring pair's divergence because D_a is a function of
the pair's loss distribution that only grows under the domination the PLDs are built for
(a neighbouring pair is a post-processing of the dominating pair, and D_a satisfies data
processing). The largest over the PLD's two directions is used for both. A pure epsilon-DP
release is also bounded by randomized response's divergences at epsilon (every epsilon-DP pair is
a post-processing of it).

An infinite loss (mass ``m`` of P where Q has none: SDGS publishing all k copies of a cell)
makes D_a infinite; it is split off: with ``P = (1 - m) P' + m * (bottom)``, for the
composition of releases i ``H_x(prod P_i || prod Q_i) <= 1 - prod(1 - m_i) + H_x(prod P'_i ||
prod Q_i)`` (the outcomes where some release hits ``bottom`` count at most their probability;
on the others ``prod P_i <= prod P'_i``), so the Rényi bound is applied to the normalized
finite parts P' (``D_a(P'||Q) = (ln E_P[e^((a - 1) L); L < inf] - a ln(1 - m)) / (a - 1)``).
A Q of total mass q above 1 by rounding is replaced by Q/q (below Q: its hockey-stick
divergences only grow), adding ``ln q`` to every divergence.

Floating point: each divergence is raised by a bound on the rounding of its sum (relative
``8 (n + 8) u`` of the sum of the magnitudes, n terms) and the answers by a relative 1e-12.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from privrelease.mechanisms.events import Event

__all__ = [
    "ORDERS",
    "Renyi",
    "convert_delta",
    "convert_epsilon",
    "delta_for_epsilon",
    "epsilon_for_delta",
    "of_event",
    "of_pld",
    "pure",
]

ORDERS = 1.0 + np.logspace(-8, 4, 601)
"""The orders ``a`` tried (``a - 1`` from 1e-8 to 1e4, 50 a decade): a billion Gaussian
releases of sigma 4 want ``a - 1`` near 1e-4, one pure-DP release of epsilon 0.1 near 10."""

_ROUND_UP = 1 + 1e-12


@dataclass(frozen=True)
class Renyi:
    """Upper bounds of a release's Rényi divergences at :data:`ORDERS` (of the finite part of
    its dominating pair) and the mass ``infinite`` of its infinite loss."""

    divergences: np.ndarray
    infinite: float = 0.0


def pure(epsilon: float) -> Renyi:
    """Randomized response with odds e^epsilon (losses +-epsilon, P-masses 1 / (1 + e^-+epsilon)):
    every epsilon-DP pair is a post-processing of it (Kairouz-Oh-Viswanath), so its divergences
    bound every pure epsilon-DP release's."""
    from privrelease.mechanisms.pld import pair_divergences

    probs = np.array([1 / (1 + math.exp(-epsilon)), 1 / (1 + math.exp(epsilon))])
    return Renyi(pair_divergences(np.array([epsilon, -epsilon]), probs, 0.0, ORDERS))


def of_pld(pld: Any) -> Renyi:
    """The divergences of a ``dp_accounting`` PLD's dominating pairs (:func:`.pld.divergences`)."""
    from privrelease.mechanisms.pld import divergences

    return Renyi(*divergences(pld, ORDERS))


@functools.lru_cache(maxsize=256)
def of_event(event: Event) -> Renyi:
    """A non-composed release's divergences: its closed form when it has one, else those of its
    PLD's finite part (:func:`.pld.event_pld`) with the PLD's infinite mass; at each order no
    more than randomized response's at its epsilon when it is pure epsilon-DP (:func:`pure`;
    the module docstring's argument runs per order, the release replaced by whichever pair
    bounds it there). :class:`~.guarantees.Unsupported` when it has neither."""
    from privrelease.mechanisms.accountants import account
    from privrelease.mechanisms.pld import event_pld

    closed = event.renyi(ORDERS)
    found = Renyi(np.asarray(closed, dtype=float) * _ROUND_UP) if closed is not None else of_pld(event_pld(event))
    stated = account(event, "approximate")
    if stated.supported and stated.delta == 0 and math.isfinite(stated.epsilon):
        return Renyi(np.minimum(found.divergences, pure(stated.epsilon).divergences), found.infinite)
    return found


def _composed(releases: Mapping[Event, int]) -> tuple[np.ndarray, float]:
    """The summed divergences of ``releases`` (release -> count) and the probability
    ``1 - prod(1 - m_i)`` that some release hits its infinite loss (rounded up)."""
    total = np.zeros(len(ORDERS))
    log_keep = 0.0
    for event, count in releases.items():
        part = of_event(event)
        total = total + count * part.divergences
        log_keep += count * math.log1p(-part.infinite) if part.infinite < 1 else -math.inf
    lost = min(1.0, -math.expm1(log_keep) * _ROUND_UP)
    return total * _ROUND_UP, lost


def _log_conversion() -> np.ndarray:
    """``(a - 1) ln(1 - 1/a) - ln a`` at every order (CKS Proposition 12's constant, in logs)."""
    return (ORDERS - 1) * np.log1p(-1 / ORDERS) - np.log(ORDERS)


def convert_epsilon(divergences: np.ndarray, lost: float, delta: float) -> float:
    """The smallest epsilon over :data:`ORDERS` with ``lost + e^((a - 1)(D_a - eps)) (1 - 1/a)^(a - 1)
    / a <= delta`` (``divergences``: D_a at :data:`ORDERS`; module docstring), rounded up; inf
    when none."""
    rest = delta - lost
    if rest <= 0:
        return math.inf
    epsilons = divergences + (_log_conversion() - math.log(rest)) / (ORDERS - 1)
    best = float(np.min(np.where(np.isfinite(epsilons), epsilons, np.inf)))
    return max(0.0, best * _ROUND_UP) if math.isfinite(best) else math.inf


def convert_delta(divergences: np.ndarray, lost: float, epsilon: float) -> float:
    """The smallest delta over :data:`ORDERS` at ``epsilon`` (as :func:`convert_epsilon`), at most 1."""
    logs = (ORDERS - 1) * (divergences - epsilon) + _log_conversion()
    best = float(np.min(np.where(np.isfinite(logs), logs, np.inf)))
    return min(1.0, (lost + math.exp(min(best, 0.0))) * _ROUND_UP)


def epsilon_for_delta(releases: Mapping[Event, int], delta: float) -> float:
    """The smallest epsilon at which ``releases`` (release -> count) compose to
    (epsilon, delta)-DP by the Rényi bound; inf when none does."""
    return convert_epsilon(*_composed(releases), delta)


def delta_for_epsilon(releases: Mapping[Event, int], epsilon: float) -> float:
    """The smallest delta of ``releases`` at ``epsilon`` by the Rényi bound, at most 1."""
    return convert_delta(*_composed(releases), epsilon)
