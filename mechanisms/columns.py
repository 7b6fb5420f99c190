"""The names of the columns mechanisms add to their output tables beside the cells' labels.

A light module (no Arrow, no numpy): the policy check that no generalized column takes one of
these names loads no mechanism.
"""

from __future__ import annotations

COUNT = "count"
"""A cell's count (histograms, noisy counts)."""

INTERVAL = ("estimate", "lower", "upper")
"""A histogram count's estimate count / beta and its exact interval (:mod:`.count_intervals`)."""

HISTOGRAM = (COUNT, *INTERVAL)
"""The columns a crowd-blending histogram adds to its cells' labels."""

NOISY_TABLE = (COUNT, *INTERVAL[1:])
"""The columns a noisy-counts table adds to its cells' labels: the noisy count and its
per-cell interval (count -+ the half-width at the stated confidence, never below 0)."""


def taken_name(column: str, table: str, added: tuple[str, ...]) -> str | None:
    """Why a ``table`` (a histogram, a noisy table) that adds the columns ``added`` to its cells'
    labels cannot have a label column named ``column``; None when it can."""
    if column not in added:
        return None
    return (
        f"{table} cannot generalize a column named {column!r}: the output uses that name "
        f"(its columns are the cells' labels and {', '.join(added)})"
    )


SUMS_TABLE = (
    "total",
    "total_lower",
    "total_upper",
    COUNT,
    "count_lower",
    "count_upper",
    "mean",
    "mean_lower",
    "mean_upper",
)
"""The columns a noisy-sums table adds to its cells' labels: the noisy total and count, their
ratio the mean, each with its interval (:mod:`.kinds.noisy_sums`)."""
