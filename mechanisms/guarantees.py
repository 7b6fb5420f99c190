"""The one guarantee type: (epsilon, delta) under an accounting notion, or unsupported.

* ``probabilistic`` — the papers' notion (Li, Qardaji, Su): with probability >= 1 - delta the
  privacy loss is at most epsilon; the stated points of several releases add up (Theorem 2).
* ``approximate`` — standard (eps, delta)-DP under add/remove-one-row neighbours.

An event nobody can vouch for (not DP, or outside what is proven) is *unsupported*: infinite
epsilon and delta 1 with the reason — fail closed, never a guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

RELATIVE_SLACK = 1e-9
"""A budget is met up to this relative slack (rounding of sums and bisections)."""

Notion = Literal["probabilistic", "approximate"]
NOTIONS: tuple[Notion, ...] = ("probabilistic", "approximate")


@dataclass(frozen=True)
class Budget:
    """An (epsilon, delta) pair: a lifetime budget, or what releases compose to."""

    epsilon: float
    delta: float

    def fits(self, limit: Budget) -> bool:
        """Within ``limit``, up to a relative slack of :data:`RELATIVE_SLACK` for rounding."""
        return _within(self.epsilon, limit.epsilon) and _within(self.delta, limit.delta)

    def __str__(self) -> str:
        return f"epsilon={self.epsilon:.6g}, delta={self.delta:.6g}"

    def as_dict(self) -> dict[str, float]:
        """``{"epsilon": ..., "delta": ...}`` (JSON, the audit records, the report's context)."""
        return {"epsilon": float(self.epsilon), "delta": float(self.delta)}


def _within(value: float, limit: float) -> bool:
    return value <= limit * (1 + RELATIVE_SLACK) + 1e-300


@dataclass(frozen=True)
class Guarantee:
    """(epsilon, delta) under ``notion``; unsupported ones are (inf, 1) with the reason."""

    notion: str
    epsilon: float
    delta: float
    supported: bool = True
    detail: str = ""

    @property
    def budget(self) -> Budget:
        """Its (epsilon, delta) pair."""
        return Budget(self.epsilon, self.delta)

    def as_dict(self) -> dict[str, Any]:
        return {
            "notion": self.notion,
            "epsilon": self.epsilon if math.isfinite(self.epsilon) else None,
            "delta": self.delta,
            "supported": self.supported,
            "detail": self.detail,
        }


def unsupported(notion: str, why: str) -> Guarantee:
    """No guarantee: (inf, 1), with the reason."""
    return Guarantee(notion, math.inf, 1.0, False, why)


class Unsupported(ValueError):
    """An event without a privacy loss distribution (not differentially private, or outside
    what is proven)."""


def pure(notion: str, epsilon: float, detail: str) -> Guarantee:
    """Pure epsilon-DP: the same (epsilon, 0) under every notion."""
    return Guarantee(notion, epsilon, 0.0, True, detail)
