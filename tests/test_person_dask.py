"""The person bound on Dask: a person's rows may sit in different partitions, and the release
keeps exactly the in-process distribution (:func:`privrelease.flows.scaled.person_shares`).

- the flow's draw and a partition's part of it (pure functions, many draws): each person keeps
  min(n, m) rows, a uniformly random subset of all its rows wherever they sit, and each one-row
  kind reads one row of the kept ones, uniform over all the person's rows (chi-square tests,
  each failing a correct implementation with probability at most ALPHA);
- on a real LocalCluster with persons split across partitions: every person keeps exactly
  min(n, m) rows, and each one-row kind exactly one row of each person (exact merged counts);
- the discharges example on Dask: the same guarantees, unit of privacy and layout as in-process.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy import stats

pytest.importorskip("distributed", reason="the dask extra is not installed: pip install -e '.[dask]'")

from test_person import assert_every_person_bounded, write_visits  # noqa: E402
from test_scale_dask import cluster, work  # noqa: E402, F401 (the module's LocalCluster; its work folder)

from privrelease.mechanisms.persons import partition_rows, partition_shares  # noqa: E402

pytestmark = pytest.mark.timeout(300)

ALPHA = 1e-6
"""Every statistical test below fails a correct implementation with probability at most ALPHA."""

EXAMPLES = Path(__file__).resolve().parent.parent / "policies" / "examples"


def _split_draw(splits: list[int], people: int, max_rows: int, picks: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """``people`` persons, each with ``sum(splits)`` rows, ``splits[p]`` of them in partition
    ``p`` (rows numbered 0.. in partition order): the flow's draw, then each partition's part of
    it, as on Dask. Returns which of its rows each person keeps (a bit mask per person) and,
    per one-row kind, the row each person's pick is (-1: none)."""
    present = [p for p, size in enumerate(splits) if size]
    person = np.repeat(np.arange(people), len(present))  # entries grouped by person, partitions in order
    counts = np.tile([splits[p] for p in present], people)
    quota, picked = partition_shares(person, counts, max_rows, picks)
    masks = np.zeros(people, dtype=np.int64)
    chosen = [np.full(people, -1) for _ in range(picks)]
    offset = 0
    for i, p in enumerate(present):
        codes = np.repeat(np.arange(people), splits[p])  # the partition's rows, its persons coded 0..
        kept, rows = partition_rows(codes, quota[i :: len(present)], picked[:, i :: len(present)])
        np.bitwise_or.at(masks, codes[kept], 1 << (offset + kept % splits[p]))
        for pick, row in zip(chosen, rows, strict=True):
            assert (pick[codes[row]] == -1).all(), "one row of each person per kind"
            pick[codes[row]] = offset + row % splits[p]
        offset += splits[p]
    return masks, chosen


def test_a_persons_rows_split_across_partitions_keep_a_uniform_subset_and_uniform_one_rows() -> None:
    """30,000 persons with 6 rows split 2 / 1 / 3 over three partitions, m = 2, two one-row
    kinds: each keeps exactly 2 rows, which 2 uniform over the C(6, 2) = 15 subsets (chi-square,
    14 degrees of freedom); each kind's row is one of the kept ones and uniform over the 6 rows
    (chi-square, 5 degrees of freedom), the two kinds' rows independent given the kept rows
    (equal with probability 1/2: a two-sided binomial test). Each test at ALPHA."""
    people = 30_000
    masks, (first, second) = _split_draw([2, 1, 3], people, 2, 2)
    assert (np.bitwise_count(masks) == 2).all()
    subsets = sorted({(1 << a) | (1 << b) for a in range(6) for b in range(a + 1, 6)})
    observed = np.bincount(np.searchsorted(subsets, masks), minlength=15)
    assert stats.chisquare(observed).statistic < stats.chi2.isf(ALPHA, 14), observed
    for pick in (first, second):
        assert (pick >= 0).all() and ((masks >> pick) & 1 == 1).all(), "a one-row kind reads a kept row"
        rows = np.bincount(pick, minlength=6)
        assert stats.chisquare(rows).statistic < stats.chi2.isf(ALPHA, 5), rows
    assert stats.binomtest(int((first == second).sum()), people, 0.5).pvalue > ALPHA


def test_persons_at_or_below_max_rows_keep_every_row_wherever_it_sits() -> None:
    """Persons with 3 rows over partitions 0 and 2 (none in 1), m = 3 and m = 5: all 3 kept,
    and the one-row kind's row uniform over them (chi-square, 2 degrees of freedom, ALPHA)."""
    for max_rows in (3, 5):
        masks, (pick,) = _split_draw([1, 0, 2], 20_000, max_rows, 1)
        assert (masks == 0b111).all()
        rows = np.bincount(pick, minlength=3)
        assert stats.chisquare(rows).statistic < stats.chi2.isf(ALPHA, 2), rows


def test_unequal_persons_keep_min_n_m_in_shares_that_add_up() -> None:
    """Persons with 1 to 12 rows over up to 4 partitions: each keeps min(n, m) rows, no entry
    more than its rows; the one-row picks fall in an entry with a quota (index below it)."""
    rng = np.random.default_rng(7)  # the test's persons, not a mechanism
    people, m = 5_000, 4
    counts = rng.integers(1, 4, size=4 * people)
    person = np.repeat(np.arange(people), 4)
    counts[rng.random(4 * people) < 0.3] = 0
    person, counts = person[counts > 0], counts[counts > 0]
    quota, picked = partition_shares(person, counts, m, 3)
    totals = np.bincount(person, weights=counts).astype(int)
    present = totals > 0
    assert (np.bincount(person, weights=quota).astype(int)[present] == np.minimum(totals, m)[present]).all()
    assert ((0 <= quota) & (quota <= counts)).all()
    for pick in picked:
        chosen = pick >= 0
        assert (np.bincount(person[chosen], minlength=people)[present] == 1).all()
        assert (pick[chosen] < quota[chosen]).all()


# --------------------------------------------------------------------------- on a cluster


def test_on_a_cluster_every_person_keeps_min_n_m_rows_across_partitions(cluster, work) -> None:  # noqa: F811
    """:func:`write_visits` on Dask, a partition per row group: every person bounded across
    partitions (:func:`assert_every_person_bounded`)."""
    from privrelease.flows import engines, partitions
    from privrelease.flows.scaled import read_partials
    from privrelease.policies import load_policy

    rows, sizes, county = write_visits(work)
    loaded = load_policy(work / "visits.yaml")
    local, _ = cluster
    engine = engines.Engine("dask", address=local.scheduler_address, rows_per_partition=300)
    file = partitions.scan_file(str(work / "visits.parquet"))
    try:
        engines.connect("visits", engine)
        read = read_partials("visits", loaded, [file], engine)
    finally:
        engines.release("visits")
    assert read.partitions == -(-rows // 300) and (read.rows_read, read.rows_dropped) == (rows, 100)
    assert_every_person_bounded(read, sizes, county)


@pytest.mark.system
def test_the_discharges_example_on_dask_is_the_in_process_release(cluster, work, monkeypatch) -> None:  # noqa: F811
    """discharges.yaml (patients with 1 to 12 discharges, max_rows 4) on Dask in 8 partitions
    and in-process: the same unit of privacy, rules, events and guarantees in release.json, the
    same output files, columns and rows (25 cells each); no output holds the person column."""
    from privrelease.flows.steps import release_plain

    monkeypatch.setenv("PRIVRELEASE_DATA_ROOTS", str(work))
    shutil.copytree(EXAMPLES / "data", work / "data")
    text = (EXAMPLES / "discharges.yaml").read_text()
    (work / "local.yaml").write_text(text)
    local, _ = cluster
    engine = f"engine: {{name: dask, address: '{local.scheduler_address}', rows_per_partition: 1000}}\n"
    (work / "dask.yaml").write_text(text.replace('version: "1"', 'version: "2"') + engine)
    releases = [
        release_plain(policy_path=str(work / name), out_dir=str(work / name[:-5]))
        for name in ("local.yaml", "dask.yaml")
    ]
    facts = [json.loads((Path(r.release_dir) / "release.json").read_text()) for r in releases]
    assert facts[0]["unit_of_privacy"] == facts[1]["unit_of_privacy"]
    assert facts[1]["unit_of_privacy"]["statement"].startswith("one person = all rows with the same patient_id")
    for key in ("event", "guarantees"):
        assert [o.get(key) for o in facts[0]["outputs"]] == [o.get(key) for o in facts[1]["outputs"]]
    layouts = []
    for published in releases:
        tables = {Path(o["path"]).name: pq.read_table(o["path"]) for o in published.outputs}
        assert all("patient_id" not in table.column_names for table in tables.values())
        layouts.append({name: (table.schema, table.num_rows) for name, table in tables.items()})
    assert layouts[0] == layouts[1] and {rows for _, rows in layouts[0].values()} == {25}
    assert "8 partitions" in Path(releases[1].report).read_text()
