"""The confidence levels privrelease states intervals and error bounds at: C in [1/2, 1).

Below 1/2 a statement is less sure than a coin flip, and the two-sided intervals (each tail
tested at (1 - C) / 2 > 1/4) lose the facts the count intervals rely on: for C >= 1/2 the lower
bound never exceeds the estimate c / beta (:mod:`.count_intervals`). One rule for the policy's
accuracy targets, the Python API and every ``--confidence`` option.
"""

from __future__ import annotations

from privrelease.errors import UserError

ALLOWED = "a number in [0.5, 1)"
"""What a confidence may be, in the words of every error and of the policy reference."""


def is_confidence(value: float) -> bool:
    """Whether ``value`` is a confidence level privrelease states results at."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0.5 <= value < 1


def check_confidence(confidence: float, name: str = "confidence") -> float:
    """``confidence`` as a float, or a :class:`UserError` naming ``name`` and what is allowed."""
    if not is_confidence(confidence):
        raise UserError(f"{name} must be {ALLOWED}; got {confidence!r}", field=name, allowed=ALLOWED)
    return float(confidence)
