"""A Parquet file read and released one row group at a time in this process.

- :func:`privrelease.datasets.read_row_groups`: the same checked rows as
  :func:`~privrelease.datasets.read_dataset` (row-group boundaries, empty row groups, one row
  group, rows dropped), the bytes hashed before anything is parsed, errors naming the file's
  own data rows;
- :func:`privrelease.mechanisms.partitioned.streamed_sdgs`: given the same sample (beta = 1)
  the same cells, counts and facts as :func:`privrelease.mechanisms.sdgs.sdgs` of the whole
  table, however the rows are split (a row group with no row left included); with beta < 1
  every row drawn on its own (statistical: failure probability below 1e-7, no seed);
- the release flow on a Parquet file whose mechanisms all stream (SDGS with or without
  scheme selection, histogram): read row group by row group (the whole table is never read),
  the cells of the in-process release; a file swapped after its fingerprint is refused or
  never seen, as for the one-table read; a bad value in a later row group named by its row in
  the file, nothing published.
"""

from __future__ import annotations

import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_flow_steps import ledger_entries, runs, swap_after_fingerprint, verify_intact

from privrelease.datasets import read_dataset, read_row_groups
from privrelease.errors import UserError
from privrelease.files import sha256_file
from privrelease.flows import data as flow_data
from privrelease.flows import scaled
from privrelease.flows.steps import DataStepError, release_plain
from privrelease.mechanisms import partitioned
from privrelease.mechanisms.results import Pieces
from privrelease.mechanisms.schemes import Bins, Keep, Suppress, TopBottomCoding, ValueMap
from privrelease.mechanisms.sdgs import sdgs

COLUMNS = {"age": "integer", "sex": "string", "zone": "string"}
SCHEMES = {
    "age": Bins(edges=(0, 40, 100)),
    "sex": Keep(),
    "zone": ValueMap((("n", "north"), ("s", "south"), ("e", "east"), ("w", "east"))),
}


def write_groups(path: Path, groups: list[int], *, seed: int = 0, missing_at: int | None = None) -> pa.Table:
    """Row groups of these sizes (0: an empty row group) of COLUMNS (test data: a seeded
    generator); ``zone`` is None at row ``missing_at``. Returns the whole table written."""
    rng = np.random.default_rng(seed)
    rows = sum(groups)
    zones = rng.choice(["n", "s", "e", "w"], rows).astype(object)
    if missing_at is not None:
        zones[missing_at] = None
    table = pa.table(
        {
            "age": rng.integers(0, 100, rows),
            "sex": rng.choice(["F", "M"], rows),
            "zone": pa.array(zones, pa.string()),
        }
    )
    with pq.ParquetWriter(path, table.schema) as writer:
        start = 0
        for size in groups:
            writer.write_table(table.slice(start, size))
            start += size
    assert [pq.ParquetFile(path).metadata.row_group(i).num_rows for i in range(len(groups))] == groups
    return table


def values(table: pa.Table) -> dict[str, list]:
    return {name: table.column(name).to_pylist() for name in table.column_names}


# --------------------------------------------------------------------------- read_row_groups


@pytest.mark.parametrize("groups", [[1000], [300, 300, 400], [250, 0, 500, 0, 250], [1, 999]])
def test_row_groups_are_the_whole_read(tmp_path, groups):
    """Concatenated, the row groups are what read_dataset reads (types, values, order); empty
    row groups give nothing; a file of one row group is one read."""
    path = tmp_path / "data.parquet"
    write_groups(path, groups)
    reads = list(read_row_groups(path, columns=COLUMNS))
    assert [read.table.num_rows for read in reads] == [size for size in groups if size]
    whole = read_dataset(path, format="parquet", columns=COLUMNS)
    streamed = pa.concat_tables([read.table for read in reads])
    assert streamed.schema == whole.table.schema
    assert values(streamed) == values(whole.table)
    assert sum(read.rows_read for read in reads) == whole.rows_read == sum(groups)


def test_bytes_are_hashed_before_anything_is_parsed(tmp_path):
    path = tmp_path / "data.parquet"
    write_groups(path, [100, 100])
    good = sha256_file(path)
    assert sum(r.rows_read for r in read_row_groups(path, columns=COLUMNS, expected_sha256=good)) == 200
    with pytest.raises(UserError, match="changed after it was fingerprinted"):
        next(read_row_groups(path, columns=COLUMNS, expected_sha256="0" * 64))


def test_errors_name_the_files_data_rows(tmp_path):
    """A missing value in the third row group is named by its row in the file."""
    path = tmp_path / "data.parquet"
    write_groups(path, [100, 0, 100, 100], missing_at=257)
    with pytest.raises(UserError, match="at data row 258"):
        list(read_row_groups(path, columns=COLUMNS))


def test_rows_dropped_per_row_group(tmp_path):
    """missing="drop": a row group whose only row is dropped gives an empty table (no error);
    a file with no row left is an error, as read_dataset's."""
    path = tmp_path / "data.parquet"
    write_groups(path, [50, 1, 50], missing_at=50)
    reads = list(read_row_groups(path, columns=COLUMNS, missing="drop"))
    assert [(r.table.num_rows, r.rows_read, r.rows_dropped) for r in reads] == [(50, 50, 0), (0, 1, 1), (50, 50, 0)]
    alone = tmp_path / "alone.parquet"
    write_groups(alone, [1], missing_at=0)
    with pytest.raises(UserError, match="nothing is left"):
        read_dataset(alone, format="parquet", columns=COLUMNS, missing="drop")
    with pytest.raises(UserError, match="nothing is left"):
        list(read_row_groups(alone, columns=COLUMNS, missing="drop"))


def test_a_file_of_empty_row_groups_has_no_data_rows(tmp_path):
    path = tmp_path / "data.parquet"
    write_groups(path, [0, 0])
    with pytest.raises(UserError, match="has no data rows"):
        list(read_row_groups(path, columns=COLUMNS))


# --------------------------------------------------------------------------- streamed SDGS


def cells(table: pa.Table) -> Counter:
    return Counter(zip(*[table.column(name).cast(pa.string()).to_pylist() for name in table.column_names]))


@pytest.mark.parametrize("groups", [[3000], [1000, 1000, 1000], [1, 1499, 0, 1500], [7] * 428 + [4]])
def test_streamed_sdgs_is_sdgs_of_the_whole_table(tmp_path, groups):
    """beta = 1 (the sample is every row): the same published rows, facts and event as SDGS
    of the whole table, wherever the row groups split the cells (age kept: 600 cells of about
    5 rows, k = 6 keeps some and suppresses others; a cell's rows spread over many row groups
    count together; each row group has its own ages, merged in numeric order)."""
    path = tmp_path / "data.parquet"
    write_groups(path, groups, seed=3)
    schemes = {**SCHEMES, "age": Keep()}
    whole = sdgs(read_dataset(path, format="parquet", columns=COLUMNS).table, schemes, k=6, beta=1.0, epsilon=0.0)
    tables = (read.table for read in read_row_groups(path, columns=COLUMNS))
    streamed = partitioned.streamed_sdgs(tables, schemes, k=6, beta=1.0, epsilon=0.0, rows_per_file=500)
    assert isinstance(streamed.table, Pieces)
    pieces = list(streamed.table.tables)
    assert len(pieces) == partitioned.file_count(whole.table.num_rows, 500) > 1
    assert cells(pa.concat_tables(pieces)) == cells(whole.table)
    assert whole.internal_facts["cells_suppressed"] > 0 and whole.public_facts["cells_published"] > 0
    assert streamed.public_facts == whole.public_facts
    assert streamed.internal_facts == whole.internal_facts
    assert streamed.event == whole.event


def test_a_row_group_without_rows_left_counts_nothing(tmp_path):
    """missing="drop" empties the middle row group: it adds no cell and no label, for every
    kind of scheme (top/bottom coding and keep take their labels from the values)."""
    path = tmp_path / "data.parquet"
    write_groups(path, [40, 1, 40], missing_at=40)
    schemes = {"age": TopBottomCoding(lower=20, upper=80), "sex": Keep(), "zone": Suppress()}
    whole = read_dataset(path, format="parquet", columns=COLUMNS, missing="drop")
    expected = sdgs(whole.table, schemes, k=1, beta=1.0, epsilon=0.0)
    tables = (read.table for read in read_row_groups(path, columns=COLUMNS, missing="drop"))
    streamed = partitioned.streamed_sdgs(tables, schemes, k=1, beta=1.0, epsilon=0.0)
    assert isinstance(streamed.table, Pieces)
    assert cells(pa.concat_tables(list(streamed.table.tables))) == cells(expected.table)
    assert streamed.internal_facts == expected.internal_facts


def test_streamed_sdgs_samples_each_row_independently(tmp_path):
    """beta = 0.3, k = 1 (nothing suppressed), 200 releases of 40 row groups of 25 rows: each
    cell's published count has mean size * 0.3 (within 6 standard errors), and the rows
    published in all, Binomial(1000, 0.3) when every row is drawn on its own, have a sample
    variance between 0.5 and 1.7 times 210 (its 199 degrees of freedom put each side beyond
    5.8 standard deviations, Wilson-Hilferty; one mask repeated over the row groups would
    multiply it by about 40). Failure probability below 1e-7."""
    path = tmp_path / "data.parquet"
    write_groups(path, [25] * 40, seed=5)
    reads = [read.table for read in read_row_groups(path, columns=COLUMNS)]
    truth = cells(sdgs(pa.concat_tables(reads), SCHEMES, k=1, beta=1.0, epsilon=0.0).table)
    draws = {cell: [] for cell in truth}
    for _ in range(200):
        result = partitioned.streamed_sdgs(reads, SCHEMES, k=1, beta=0.3, epsilon=0.0)
        assert isinstance(result.table, Pieces)
        found = cells(pa.concat_tables(list(result.table.tables)))
        for cell in truth:
            draws[cell].append(found[cell])
    for cell, size in truth.items():
        counts = np.array(draws[cell])
        assert abs(counts.mean() - size * 0.3) < 6 * (size * 0.21 / 200) ** 0.5, (cell, counts.mean(), size)
    totals = np.sum([draws[cell] for cell in truth], axis=0)
    assert 0.5 * 210 < totals.var(ddof=1) < 1.7 * 210, totals.var(ddof=1)


# --------------------------------------------------------------------------- the release flow

POLICY = """
name: streamed
version: "1"
dataset:
  id: streamed-population
  path: data.parquet
  format: parquet
  columns:
    age: {type: integer}
    sex: {type: string, values: [F, M]}
    zone: {type: string}
generalization:
  age: {bins: [0, 40, 100]}
  sex: keep
  zone: {map: {n: north, s: south, e: east, w: east}}
mechanisms:
  - {name: microdata, type: sdgs, columns: [age, sex, zone], beta: 0.1, k: 20, epsilon: 1.0}
  - {name: cells, type: histogram, columns: [age, sex], beta: 0.1, k: 20, epsilon: 1.0}
targets:
  accounting: approximate
  delta: 1.0e-6
  lifetime_budget: {epsilon: 10, delta: 1.0e-3}
"""


@pytest.fixture
def parquet_release(tmp_path, work) -> Path:
    """A policy over a Parquet file of three row groups whose mechanisms all stream."""
    folder = tmp_path / "release"
    folder.mkdir()
    write_groups(folder / "data.parquet", [4000, 3000, 3000], seed=9)
    (folder / "policy.yaml").write_text(POLICY)
    return folder


def never_one_table(*args, **kwargs):
    raise AssertionError("a streamed release never reads the whole table")


def test_a_streamed_release_is_the_in_process_release(parquet_release, monkeypatch):
    """Every mechanism streams: the read computes their partials row group by row group (the
    one-table read is never called) and the outputs are those of the one-table release: every
    one of the 12 cells (about 830 rows each) published with a Binomial(size, 0.1) count
    (6-sigma bounds), and a histogram of the 4 cells of another beta = 0.1 sample."""
    folder = parquet_release
    whole = read_dataset(folder / "data.parquet", format="parquet", columns=COLUMNS).table
    truth = cells(sdgs(whole, SCHEMES, k=20, beta=1.0, epsilon=0.0).table)
    monkeypatch.setattr(flow_data, "_read", never_one_table)
    published = release_plain(policy_path=str(folder / "policy.yaml"), out_dir=str(folder / "out"))
    outputs = {Path(o["path"]).stem: pq.read_table(o["path"]) for o in published.outputs}
    found = cells(outputs["microdata"])
    assert set(found) == set(truth) and len(truth) == 12
    for cell, size in truth.items():
        assert abs(found[cell] - size * 0.1) < 6 * (size * 0.09) ** 0.5, (cell, found[cell], size)
    histogram = outputs["cells"]
    assert histogram.num_rows == 4 and min(histogram.column("count").to_pylist()) >= 20
    assert abs(sum(histogram.column("count").to_pylist()) - 1000) < 6 * (10_000 * 0.09) ** 0.5
    (run,) = runs()
    assert run.status == "succeeded" and run.dataset_fingerprint == sha256_file(folder / "data.parquet")
    verify_intact()


def test_a_policy_with_a_mechanism_without_a_job_reads_one_table(parquet_release, monkeypatch):
    """SPLU-Gen runs in-process only (no job: its decoy groups must not follow row groups), so
    a policy with it reads one table; statistics and noisy counts stream as SDGS does."""
    folder = parquet_release
    policy = folder / "policy.yaml"
    statistic = "  - {name: by-sex, type: identifiable_statistic, query: count, by: [sex], rho: 0.6}\n"
    policy.write_text(POLICY.replace("targets:", statistic + "targets:"))
    monkeypatch.setattr(flow_data, "_read", never_one_table)
    published = release_plain(policy_path=str(policy), out_dir=str(folder / "out"))
    assert {Path(o["path"]).stem for o in published.outputs} == {"microdata", "microdata.cells", "cells", "by-sex"}
    monkeypatch.undo()
    splu = "mechanisms:\n  - {name: splu, type: splu_gen, gamma: 2, sensitive: [zone], columns: [age]}\n"
    policy.write_text(POLICY.split("mechanisms:")[0].replace('version: "1"', 'version: "2"') + splu)
    monkeypatch.setattr(scaled, "stream_partials", never_one_table)
    published = release_plain(policy_path=str(policy), out_dir=str(folder / "out2"))
    assert {Path(o["path"]).stem for o in published.outputs} == {"splu"}


def _edited(path: Path) -> None:
    """One byte of the first row group's data changed, size and modification time kept."""
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def _renamed_over(path: Path) -> None:
    other = path.with_name("other.parquet")
    shutil.copy2(path, other)
    _edited(other)
    os.replace(other, path)


@pytest.mark.parametrize("swap", [_edited, _renamed_over])
@pytest.mark.parametrize("when", ["before the read", "before a second process reads"])
def test_a_parquet_file_swapped_after_the_fingerprint_is_never_released(parquet_release, monkeypatch, swap, when):
    """As for the one-table read: the streamed read hashes the very bytes it parses, read
    through the descriptor the fingerprint read. A file renamed over before the read is not
    seen (the checked file is released); an edit in place, or any swap before a task in
    another process reads again (the partials are then computed again there), fails the run
    and nothing is published or charged."""
    folder = parquet_release
    data = folder / "data.parquet"
    original_sha256 = sha256_file(data)
    monkeypatch.setattr(flow_data, "_read", never_one_table)
    swap_after_fingerprint(monkeypatch, when, lambda: swap(data))
    if when == "before the read" and swap is _renamed_over:
        release_plain(policy_path=str(folder / "policy.yaml"), out_dir=str(folder / "out"))
        (run,) = runs()
        assert run.status == "succeeded" and run.dataset_fingerprint == original_sha256
        return
    with pytest.raises(DataStepError) as caught:
        release_plain(policy_path=str(folder / "policy.yaml"), out_dir=str(folder / "out"))
    assert "changed after it was fingerprinted" in caught.value.detail
    assert not (folder / "out").exists() or not any((folder / "out").iterdir())
    (run,) = runs()
    assert run.status == "failed"
    assert [e.state for e in ledger_entries()] == ["released"]


def test_a_second_process_computes_the_partials_again(parquet_release, monkeypatch):
    """A mechanism task in another process (no partials held) reads the file again, from
    bytes hashing to the recorded fingerprint, and releases."""
    folder = parquet_release
    monkeypatch.setattr(flow_data, "_read", never_one_table)
    swap_after_fingerprint(monkeypatch, "before a second process reads", lambda: None)
    published = release_plain(policy_path=str(folder / "policy.yaml"), out_dir=str(folder / "out"))
    assert {Path(o["path"]).stem for o in published.outputs} == {"microdata", "microdata.cells", "cells"}
    (run,) = runs()
    assert run.status == "succeeded"


def planted_failure(folder: Path, column: str, value: str) -> DataStepError:
    """``value`` written into ``column`` at data row 4322 (in the second row group of 4,000
    rows), and the release of the folder's policy that fails on it."""
    data = folder / "data.parquet"
    table = pq.read_table(data)
    values = table.column(column).to_pylist()
    values[4_321] = value
    where = table.schema.get_field_index(column)
    pq.write_table(table.set_column(where, column, pa.array(values)), data, row_group_size=4_000)
    with pytest.raises(DataStepError) as caught:
        release_plain(policy_path=str(folder / "policy.yaml"), out_dir=str(folder / "out"))
    return caught.value


def test_a_bad_value_in_a_later_row_group_publishes_nothing(parquet_release):
    """``sex = 'planted-X7'`` (outside its declared values) in the second row group: the run
    fails before any output, the reservation is released; the operator's error names the
    value's row in the file, the recorded error does not quote it."""
    folder = parquet_release
    caught = planted_failure(folder, "sex", "planted-X7")
    assert "planted-X7" in caught.detail and "data row 4322" in caught.detail
    assert "planted-X7" not in str(caught)
    (run,) = runs()
    assert run.status == "failed" and "planted-X7" not in (run.error or "")
    assert [e.state for e in ledger_entries()] == ["released"]
    assert not (folder / "out").exists() or not any((folder / "out").iterdir())


def test_a_streamed_release_selects_its_scheme_from_all_rows(parquet_release, monkeypatch):
    """SDGS with ``select_scheme`` streams too: per row group the candidates' counts of all
    rows and of the sample; the exponential mechanism chooses from the merged counts, and the
    microdata are the chosen candidate's (both candidates publish every cell here)."""
    folder = parquet_release
    monkeypatch.setattr(flow_data, "_read", never_one_table)
    policy = folder / "policy.yaml"
    policy.write_text(
        POLICY.replace(
            "mechanisms:",
            "candidate_schemes:\n  coarse: {age: {bins: [0, 50, 100]}}\n  fine: {age: {bins: [0, 40, 100]}}\nmechanisms:",
        ).replace(
            "k: 20, epsilon: 1.0}\n  - {name: cells",
            "k: 20, epsilon: 1.0, select_scheme: {epsilon: 1.0, candidates: [coarse, fine]}}\n  - {name: cells",
        )
    )
    assert "select_scheme: {epsilon: 1.0, candidates: [coarse, fine]}" in policy.read_text()
    published = release_plain(policy_path=str(policy), out_dir=str(folder / "out"))
    micro = {Path(o["path"]).stem: pq.read_table(o["path"]) for o in published.outputs}["microdata"]
    ages = set(micro.column("age").cast(pa.string()).to_pylist())
    assert ages in ({"0-50", "50-100"}, {"0-40", "40-100"})
    assert 800 < micro.num_rows < 1200


def test_a_value_outside_a_scheme_in_a_later_row_group_names_the_row_groups_rows(parquet_release, monkeypatch):
    """``zone = 'q'`` (outside its value map, no declared values: found only when generalized)
    in the second row group: the error names the row within it and which data rows of the
    file that row group holds, as a Dask partition's does."""
    monkeypatch.setattr(flow_data, "_read", never_one_table)
    caught = planted_failure(parquet_release, "zone", "q")
    assert "value 'q' at row 322 is outside" in caught.detail
    assert "(in data rows 4001-8000 of 'data.parquet': row numbers count from the first of them)" in caught.detail
