"""Crowd-blending histograms (Gehrke, Hay, Lui, Pass, "Crowd-Blending Privacy"): the count of
every generalized cell, with the cells whose count is below k removed.

With Bernoulli(beta) sampling first this releases exactly the information of (k, beta)-SDGS
microdata (Li, Qardaji, Su, Algorithm 4): the SDGS output is, up to its random row order, the
list of surviving cells each repeated ``count`` times. It is accounted identically, as
``SDGS(k, beta, epsilon, output="histogram")``; with beta = 1 it is k-DGS (no DP guarantee on its
own: Li, Qardaji, Su, Section 3; crowd-blending privacy needs the sampling to become DP).
The counting is :func:`.sdgs.count_cells`, shared with the microdata release.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from privrelease.errors import UserError
from privrelease.mechanisms import randomness
from privrelease.mechanisms.results import MechanismResult
from privrelease.mechanisms.schemes import ColumnScheme
from privrelease.mechanisms.sdgs import CellCounts, check_parameters, count_cells, release

COUNT_COLUMN = "count"


def crowd_blending_histogram(
    table: pa.Table,
    schemes: Mapping[str, ColumnScheme],
    *,
    k: int,
    beta: float = 1.0,
    epsilon: float | None = None,
) -> MechanismResult:
    """One row per generalized cell with at least k rows in the Bernoulli(beta) sample: its
    labels (dictionary-encoded) and ``count`` (int64); rows in uniformly random order.

    ``epsilon`` is the epsilon at which the guarantee is stated (None: 0, i.e. not claimed).
    Facts as in :func:`.sdgs.sdgs`."""
    check_histogram(schemes, k, beta, epsilon)
    return histogram_of_cells(count_cells(table, schemes, beta=beta), k=k, beta=beta, epsilon=epsilon)


def check_histogram(schemes: Mapping[str, ColumnScheme], k: int, beta: float, epsilon: float | None) -> None:
    """UserError for parameters :func:`crowd_blending_histogram` refuses."""
    if COUNT_COLUMN in schemes:
        raise UserError(f"a histogram cannot generalize a column named {COUNT_COLUMN!r}: the output uses that name")
    check_parameters(k, beta, 0.0 if epsilon is None else epsilon)


def histogram_of_cells(cells: CellCounts, *, k: int, beta: float, epsilon: float | None) -> MechanismResult:
    """The histogram of a sample's cell counts (all of them: the whole sample's, e.g. merged
    from partitions by :func:`.partitioned.merge_counts`): the cells with at least k rows, in
    uniformly random order."""
    epsilon = 0.0 if epsilon is None else epsilon
    published = np.flatnonzero(cells.counts >= k)
    published = published[randomness.permutation(len(published))]
    columns = cells.label_columns(published)
    columns[COUNT_COLUMN] = pa.array(cells.counts[published], pa.int64())
    return release(cells, pa.table(columns), k=k, beta=beta, epsilon=epsilon, output="histogram")
