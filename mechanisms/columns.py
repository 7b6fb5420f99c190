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
