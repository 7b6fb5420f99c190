"""Crowd-blending histograms (Gehrke, Hay, Lui, Pass, "Crowd-Blending Privacy"): the count of
every generalized cell, with the cells whose count is below k removed.

With Bernoulli(beta) sampling first this releases exactly the information of (k, beta)-SDGS
microdata (Li, Qardaji, Su, Algorithm 4): the SDGS output is, up to its random row order, the
list of surviving cells each repeated ``count`` times. It is accounted identically, as
``SDGS(k, beta, epsilon, output="histogram")``; with beta = 1 it is k-DGS (no DP guarantee on its
own: Li, Qardaji, Su, Section 3; crowd-blending privacy needs the sampling to become DP).
The counting is :func:`.sdgs.count_cells`, shared with the microdata release.

Each published cell also carries ``estimate`` (count / beta) and the exact interval
[``lower``, ``upper``] for the people behind it at the given confidence, conditional on
publication (:mod:`.count_intervals`): computed from the published count and the public k, beta
and confidence alone, so post-processing at no privacy cost.
"""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from privrelease.errors import UserError
from privrelease.mechanisms.columns import HISTOGRAM, taken_name
from privrelease.mechanisms.results import MechanismResult
from privrelease.mechanisms.schemes import ColumnScheme
from privrelease.mechanisms.sdgs import CellCounts, check_parameters, count_cells, published_cells_table, release


def crowd_blending_histogram(
    table: pa.Table,
    schemes: Mapping[str, ColumnScheme],
    *,
    k: int,
    beta: float = 1.0,
    epsilon: float | None = None,
    confidence: float = 0.95,
) -> MechanismResult:
    """One row per generalized cell with at least k rows in the Bernoulli(beta) sample: its
    labels (dictionary-encoded), ``count`` (int64), ``estimate`` = count / beta (float64) and
    the exact interval [``lower``, ``upper``] (int64) for the people behind the count at
    ``confidence`` (:func:`.count_intervals.count_intervals`); rows in uniformly random order.

    ``epsilon`` is the epsilon at which the guarantee is stated (None: 0, i.e. not claimed).
    Facts as in :func:`.sdgs.sdgs`."""
    check_histogram(schemes, k, beta, epsilon)
    cells = count_cells(table, schemes, beta=beta)
    return histogram_of_cells(cells, k=k, beta=beta, epsilon=epsilon, confidence=confidence)


def check_histogram(schemes: Mapping[str, ColumnScheme], k: int, beta: float, epsilon: float | None) -> None:
    """UserError for parameters :func:`crowd_blending_histogram` refuses."""
    for column in schemes:
        if (taken := taken_name(column, "a histogram", HISTOGRAM)) is not None:
            raise UserError(taken)
    check_parameters(k, beta, 0.0 if epsilon is None else epsilon)


def histogram_of_cells(
    cells: CellCounts, *, k: int, beta: float, epsilon: float | None, confidence: float = 0.95
) -> MechanismResult:
    """The histogram of a sample's cell counts (all of them: the whole sample's, e.g. merged
    from partitions by :func:`.partitioned.merge_counts`): the cells with at least k rows, in
    uniformly random order, with each count's estimate and interval at ``confidence``."""
    epsilon = 0.0 if epsilon is None else epsilon
    table = published_cells_table(cells, k=k, beta=beta, confidence=confidence)
    return release(cells, table, k=k, beta=beta, epsilon=epsilon, output="histogram")
