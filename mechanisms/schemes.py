"""Generalization schemes, fixed before any data is read (what makes SDGS private).

These are the compiled, data-independent specifications that :mod:`.generalization` applies to
columns; the policy layer builds them from YAML (hierarchy files already read into memory).
Each maps one input value to one output label; a value outside the scheme's domain is an error,
never silently passed through.
"""

from __future__ import annotations

from dataclasses import dataclass

SUPPRESSED = "*"


@dataclass(frozen=True)
class Keep:
    """Publish the value unchanged (as text)."""


@dataclass(frozen=True)
class Suppress:
    """Replace every value by ``*``."""


@dataclass(frozen=True)
class Bins:
    """Interval bins ``[edges[i], edges[i+1])`` (the last one closed: ``[edges[-2], edges[-1]]``).

    ``edges`` strictly increasing; ``labels`` one per bin (default ``"lo-hi"``). A value outside
    ``[edges[0], edges[-1]]`` is outside the domain.
    """

    edges: tuple[float, ...]
    labels: tuple[str, ...] | None = None


@dataclass(frozen=True)
class TopBottomCoding:
    """Top/bottom coding of a numeric column: v >= upper -> ``">=upper"``, v <= lower ->
    ``"<=lower"`` (bounds printed with ``:g``); values strictly between are kept (as text)."""

    lower: float | None = None
    upper: float | None = None


@dataclass(frozen=True)
class ValueMap:
    """An explicit map value -> label; ``default`` labels every other value (None: other values
    are outside the domain). An ARX hierarchy at level L compiles to the map leaf -> column L."""

    mapping: tuple[tuple[str, str], ...]
    default: str | None = None


ColumnScheme = Keep | Suppress | Bins | TopBottomCoding | ValueMap
