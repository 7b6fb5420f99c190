"""Gaussian releases accounted by zero-concentrated DP (Bun and Steinke 2016): an event that is
rho-zCDP, ``D_a(P || Q) <= a rho`` for every order ``a > 1`` and both neighbour directions,
states its guarantee from rho alone (:class:`ZCDPGaussian`, shared by the kinds whose noise
certifies zCDP: ``noisy_sums``, ``noisy_tables``).

Its (epsilon, delta): CKS Proposition 12's conversion over the orders of :mod:`.renyi`
(``approximate``, :func:`approximate_delta`); ``P[L > eps] <= e^((a - 1)(a rho - eps))``
(Markov's inequality on ``e^((a - 1) L)``), least at ``a = (eps + rho) / (2 rho)``:
``e^(-(eps - rho)^2 / (4 rho))`` for ``eps > rho`` (``probabilistic``,
:func:`probabilistic_delta`). These are bounds, not the exact curve of one pair of
neighbours; the PLD given for composition is the dominating pair of the stated (epsilon,
delta) point (sound, loose), and the Rényi divergences ``a rho`` compose exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import numpy as np

from privrelease.mechanisms.guarantees import Guarantee, Notion


def probabilistic_delta(rho: float, epsilon: float) -> float:
    """``P[L > eps] <= min_a e^((a - 1)(a rho - eps)) = e^(-(eps - rho)^2 / (4 rho))`` for
    ``eps > rho`` (at ``a = (eps + rho) / (2 rho)``), 1 below; rounded up."""
    if epsilon <= rho:
        return 1.0
    return min(1.0, math.exp(-((epsilon - rho) ** 2) / (4 * rho)) * (1 + 1e-12))


def approximate_delta(rho: float, epsilon: float) -> float:
    """The (epsilon, delta) of a rho-zCDP release by CKS Proposition 12 over :data:`.renyi.ORDERS`."""
    from privrelease.mechanisms import renyi

    return renyi.convert_delta(renyi.ORDERS * rho, 0.0, epsilon)


STATED_EPSILON_LIMIT = 100.0
"""The largest epsilon a Gaussian table's guarantee is stated at (a policy's epsilons are at
most 100: beyond, a guarantee says nothing)."""


def smallest_stated_epsilon(delta_of: Callable[[float], float], delta: float) -> float:
    """The smallest epsilon in [0, 100] with delta_of(epsilon) <= delta (nonincreasing), to a
    relative 1e-9 and rounded up (:func:`.composition.smallest_epsilon`); 100 when none is."""
    from privrelease.mechanisms.composition import smallest_epsilon

    return min(smallest_epsilon(delta_of, delta, STATED_EPSILON_LIMIT), STATED_EPSILON_LIMIT)


def stated_epsilon(rho: float, delta: float | None, accounting: str) -> float:
    """The smallest epsilon (at most :data:`STATED_EPSILON_LIMIT`) at which a rho-zCDP release
    reaches ``delta`` under ``accounting`` (a policy's ``targets``)."""
    assert delta is not None, "the policy checks require targets.delta for Gaussian noise"
    delta_of = probabilistic_delta if accounting == "probabilistic" else approximate_delta
    return smallest_stated_epsilon(lambda e: delta_of(rho, e), delta)


def stated_pair_pld(epsilon: float, delta: float, discretization: float) -> Any:
    """The PLD of the pair dominating every (epsilon, delta)-DP release (dp_accounting's
    ``from_privacy_parameters``): sound for any release known only by that point."""
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld

    return pld.from_privacy_parameters(
        common.DifferentialPrivacyParameters(epsilon, delta), value_discretization_interval=discretization
    )


class _Stated(Protocol):
    @property
    def rho(self) -> float: ...

    @property
    def epsilon(self) -> float: ...

    @property
    def noise_label(self) -> str: ...


class ZCDPGaussian:
    """The privacy map of a rho-zCDP event stated at ``epsilon`` (module docstring): mixed into
    an :class:`~.events.Event` that has a ``rho`` and an ``epsilon``; ``noise_label`` names it."""

    noise_label: ClassVar[str]

    def noun(self: _Stated) -> str:
        return self.noise_label

    def guarantee(self: _Stated, notion: Notion) -> Guarantee:
        if notion == "probabilistic":
            delta, how = probabilistic_delta(self.rho, self.epsilon), "P[loss > eps] by Markov"
        else:
            delta, how = approximate_delta(self.rho, self.epsilon), "CKS Proposition 12"
        return Guarantee(notion, self.epsilon, delta, True, f"{self.noise_label}, {self.rho:.6g}-zCDP, {how}")

    def pld(self: _Stated, discretization: float) -> Any:
        """:func:`stated_pair_pld` of its stated (epsilon, delta)."""
        return stated_pair_pld(self.epsilon, approximate_delta(self.rho, self.epsilon), discretization)

    def renyi(self: _Stated, orders: Any) -> Any:
        """``a rho`` (zCDP)."""
        return np.asarray(orders, dtype=float) * self.rho
