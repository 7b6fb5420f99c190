"""The operator's warnings about nearly empty outputs (:func:`privrelease.flows.release_facts.warnings`),
for every sampled kind alike: SDGS microdata and histograms both warn when their published rows
or cells hold less than LOW_SHARE of the sample."""

from __future__ import annotations

import pyarrow as pa
import pytest

from privrelease.flows.context import OutputFacts
from privrelease.flows.release_facts import LOW_SHARE, warnings
from privrelease.mechanisms.histogram import crowd_blending_histogram
from privrelease.mechanisms.schemes import Keep
from privrelease.mechanisms.sdgs import sdgs


def said(kind: str, crowd: int, singles: int) -> list[str]:
    """The warnings for a k = 20 release (beta 1: nothing sampled away) of ``crowd`` rows in one
    cell and ``singles`` rows alone in theirs."""
    values = [0] * crowd + list(range(1, singles + 1))
    table = pa.table({"v": pa.array(values, pa.int64())})
    release = sdgs if kind == "sdgs" else crowd_blending_histogram
    result = release(table, {"v": Keep()}, k=20, beta=1.0, epsilon=1.0)
    output = OutputFacts(
        "out", kind, "out.csv", "0" * 64, result.table.num_rows, 1, "{}", result.public_facts, result.internal_facts
    )
    return warnings([output], "rows")


@pytest.mark.parametrize("kind", ["sdgs", "histogram"])
def test_a_sampled_output_keeping_little_of_its_sample_is_flagged(kind: str) -> None:
    (line,) = said(kind, crowd=50, singles=950)  # 5% of the sample published
    assert line.startswith("out: published 5.0% of the sampled rows") and f"below {LOW_SHARE:.0%}" in line
    assert said(kind, crowd=500, singles=500) == []  # half of it
    (empty,) = said(kind, crowd=0, singles=100)
    assert empty.startswith("out: published no rows")
