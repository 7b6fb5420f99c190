"""The one audited release flow on the Dask engine (``--engine dask``), against a real
LocalCluster of two worker processes with a memory limit.

- SDGS at beta = 1 (no sampling: the release is a function of the data), a crowd-blending
  histogram at beta = 1 and an exact count: the same outputs as the in-process run of the same
  policy; every step recorded, charged and reported as in-process, with the engine named;
- a Parquet folder of several files: fingerprinted file by file, the same release;
- a value outside its declared domain in one partition: nothing published, the run failed,
  the reservation released, the error names file and rows on the terminal only;
- a file swapped after the fingerprint: nothing read from it;
- a dataset larger than the workers' memory is released, each worker under its limit;
- a worker killed mid-map: the work is retried (a complete release) or the run fails, never a
  partial release; the reservation is released;
- an unreachable scheduler: one line naming the address, exit 2, nothing recorded;
- a file without a declared column: the error names the file and column;
- SPLU-Gen, or a CSV file in an encoding whose newlines are not newline bytes: refused before
  anything runs;
- a CSV dataset (the demo data): fingerprinted in blocks of lines, each block's bytes verified
  when a partition reads it; the same guarantees and cells as in-process (exact histogram
  counts at beta = 1), a changed file refused, a bad value named by its row in the file, a
  quoted field spanning a line end refused naming its row.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

pytest.importorskip("distributed", reason="the dask extra is not installed: pip install -e '.[dask]'")

from test_flow_steps import ledger_entries, runs, verify_intact  # noqa: E402

from privrelease.errors import ClusterFailure, UserError  # noqa: E402
from privrelease.flows.engines import LOCAL_HTTP  # noqa: E402
from privrelease.flows.steps import DataStepError, release_plain  # noqa: E402
from privrelease.mechanisms.count_intervals import count_intervals  # noqa: E402

pytestmark = pytest.mark.timeout(300)

WORKERS = 2
MEMORY_LIMIT = 400 * 2**20
"""Per worker. A worker process with pyarrow and privrelease imported holds about 150 MiB."""
WIDE_COLUMNS = 8


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes, one thread each, MEMORY_LIMIT each; a client to inspect them."""
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")  # the worker processes
    logging.getLogger("distributed").setLevel(logging.ERROR)
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=WORKERS,
            threads_per_worker=1,
            memory_limit=MEMORY_LIMIT,
            processes=True,
            dashboard_address=LOCAL_HTTP,
        ) as local,
        Client(local) as client,
    ):
        yield local, client


@pytest.fixture
def work(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.delenv("PRIVRELEASE_DB_URL", raising=False)
    monkeypatch.delenv("PRIVRELEASE_PRODUCTION", raising=False)
    return tmp_path


def wide_dataset(path: Path, rows: int, row_group: int, *, seed: int | None = None) -> None:
    """``rows`` rows of WIDE_COLUMNS int64 columns (0..99) and ``sex`` (F/M), written row
    group by row group (test data, not a mechanism: a seeded generator is fine)."""
    rng = np.random.default_rng(seed)
    schema = pa.schema([*((f"c{i}", pa.int64()) for i in range(WIDE_COLUMNS)), ("sex", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, row_group):
            size = min(row_group, rows - start)
            columns = {f"c{i}": rng.integers(0, 100, size) for i in range(WIDE_COLUMNS)}
            writer.write_table(pa.table({**columns, "sex": rng.choice(["F", "M"], size)}, schema=schema))


NAMES = ", ".join(f"c{i}" for i in range(WIDE_COLUMNS))
BINS = "\n".join(f"  c{i}: {{bins: [0, 50, 100]}}" for i in range(WIDE_COLUMNS))


def policy_file(
    folder: Path,
    data: str,
    *,
    beta: float = 0.1,
    engine: str = "",
    extra: str = "",
    generalization: str = BINS + "\n  sex: keep",
    sdgs: str = "",
) -> Path:
    columns = "\n".join(f"    c{i}: {{type: integer}}" for i in range(WIDE_COLUMNS))
    text = f"""
name: wide
version: "1"
dataset:
  id: wide-population
  path: {data}
  format: parquet
  columns:
{columns}
    sex: {{type: string, values: [F, M]}}
generalization:
{generalization}
mechanisms:
  - {{name: microdata, type: sdgs, columns: [{NAMES}, sex], beta: {beta}, k: 20, epsilon: 1.0{sdgs}}}
  - {{name: cells, type: histogram, columns: [c0, c1, sex], beta: {beta}, k: 20, epsilon: 1.0}}
  - {{name: people-by-sex, type: identifiable_statistic, query: count, by: [sex], rho: 0.6}}
  - {{name: total-c2, type: identifiable_statistic, query: sum, column: c2, lower: 0, upper: 99, rho: 0.6}}
{extra}
targets:
  accounting: approximate
  delta: 1.0e-6
  lifetime_budget: {{epsilon: 100, delta: 1.0e-3}}
{engine}
"""
    path = folder / "wide.yaml"
    path.write_text(text)
    return path


def dask_engine(cluster, rows_per_partition: int) -> str:
    local, _ = cluster
    return f"engine: {{name: dask, address: '{local.scheduler_address}', rows_per_partition: {rows_per_partition}}}"


def outputs(published) -> dict[str, pa.Table]:
    return {Path(o["path"]).stem: pq.read_table(o["path"]) for o in published.outputs}


def rows_of(table: pa.Table) -> Counter:
    return Counter(zip(*[table.column(name).cast(pa.string()).to_pylist() for name in table.column_names]))


def run_record(run_id: str):
    """The run's audit record and its ledger entries."""
    (run,) = [run for run in runs() if run.id == run_id]
    return run, [entry for entry in ledger_entries() if entry.run_id == run_id]


def latest_run():
    return run_record(runs()[-1].id)


# --------------------------------------------------------------------------- same release


def sampled_within_binomial_bounds(counts: Counter, truth: Counter, beta: float) -> None:
    """Every true cell is published, with a count within 6 sigma of beta times its size."""
    assert set(counts) == set(truth)
    for cell, size in truth.items():
        assert abs(counts[cell] - beta * size) < 6 * (size * beta * (1 - beta)) ** 0.5, (cell, counts[cell], size)


def generalized(data: Path, columns: list[str]) -> Counter:
    """The true cells of ``columns`` (c* binned at 50, sex kept), labelled as the outputs are."""
    table = pq.read_table(data, columns=columns)
    labels = [
        ["0-50" if v < 50 else "50-100" for v in table.column(c).to_pylist()] if c != "sex" else None for c in columns
    ]
    return Counter(
        zip(*[lab if lab is not None else table.column(c).to_pylist() for c, lab in zip(columns, labels, strict=True)])
    )


def test_same_release_as_in_process(cluster, work):
    """The same policy in-process and on Dask (8 partitions): both publish every one of the
    512 microdata cells and 8 histogram cells with beta-sampled counts (6-sigma binomial
    bounds), and counts by sex within Laplace noise of the truth; recorded, charged and
    reported alike, with the engine, partitions and workers named."""
    data = work / "wide.parquet"
    wide_dataset(data, 400_000, 50_000, seed=1)
    names = [*(f"c{i}" for i in range(WIDE_COLUMNS)), "sex"]
    true_micro, true_cells = generalized(data, names), generalized(data, ["c0", "c1", "sex"])
    truth = Counter(pq.read_table(data, columns=["sex"]).column("sex").to_pylist())
    local_policy = policy_file(work, "wide.parquet")
    in_process = release_plain(policy_path=str(local_policy), out_dir=str(work / "local"))
    dask_policy = policy_file(work, "wide.parquet", engine=dask_engine(cluster, 50_000))
    on_dask = release_plain(policy_path=str(dask_policy), out_dir=str(work / "dask"))
    for published in (in_process, on_dask):
        found = outputs(published)
        micro = found["microdata"]
        assert micro.schema.names == names
        sampled_within_binomial_bounds(rows_of(micro), true_micro, 0.1)
        companion = found["microdata.cells"]  # its published cells: the rows grouped, each count's interval
        assert rows_of(companion.select(names)) == Counter(rows_of(micro).keys())
        assert dict(zip(rows_of(companion.select(names)), companion.column("count").to_pylist())) == rows_of(micro)
        assert (companion.column("lower").to_numpy() >= companion.column("count").to_numpy()).all()
        cells = found["cells"]
        counted = Counter({tuple(str(r[c]) for c in ("c0", "c1", "sex")): r["count"] for r in cells.to_pylist()})
        sampled_within_binomial_bounds(counted, true_cells, 0.1)
        for row in found["people-by-sex"].to_pylist():
            assert abs(row["value"] - truth[row["sex"]]) < 100  # Laplace scale 1 / ln 1.5 = 2.5
    assert outputs(on_dask)["microdata"].schema == outputs(in_process)["microdata"].schema
    run, entries = run_record(on_dask.run_id)
    assert run.status == "succeeded" and [e.state for e in entries] == ["committed"]
    report = Path(on_dask.report).read_text()
    assert "Dask, on the cluster at" in report and "8 partitions on a cluster of 2 workers" in report
    assert "in-process" in Path(in_process.report).read_text()
    verify_intact()


def sorted_dataset(path: Path, rows: int, row_group: int) -> None:
    """:func:`wide_dataset` sorted by ``sex`` then ``c0``: the input order visible in the rows."""
    wide_dataset(path, rows, row_group, seed=5)
    pq.write_table(pq.read_table(path).sort_by([("sex", "ascending"), ("c0", "ascending")]), path, row_group)


def runs_of(values: list) -> int:
    """How many runs of equal consecutive values."""
    return 1 + sum(a != b for a, b in zip(values, values[1:])) if values else 0


def test_workers_write_the_microdata_in_pieces_and_the_flow_checks_their_hashes(cluster, work, monkeypatch):
    """On Dask the microdata's rows are built and written by the workers, one file each: in the
    flow's process no row is built (:func:`.partitioned.file_table` makes only the empty schema there),
    no row is given its file (no draw there larger than the companion's 512 cells, ordered there)
    and no output in pieces is written. With at most 6,000
    rows a file, the ~40,000 published rows come in 8 files ``microdata-partJJJJ.parquet``, each
    hashing as recorded (audit records, release.json), each holding ~1/8 of them (within 6
    sigma of Binomial(n, 1/8)), each in random order (the input is sorted by sex: a uniformly
    random order of a file's ~5,000 rows has about n/2 runs of sex; fewer than n/4 has
    probability below 1e-15 by McDiarmid's bound on the run count, a swap changing it by <= 4); together they are the
    published multiset: every true cell with a beta-sampled count (6-sigma bounds), equal to the
    companion's counts. The report and release.json say the output is 8 files."""
    import json

    from privrelease.files import sha256_file
    from privrelease.flows import outputs as flow_outputs
    from privrelease.mechanisms import partitioned
    from privrelease.mechanisms.results import Pieces

    data = work / "sorted.parquet"
    sorted_dataset(data, 400_000, 50_000)

    file_table = partitioned.file_table

    def no_rows_here(cells, which, counts):
        assert not counts.sum(), "the flow's process built published rows"
        return file_table(cells, which, counts)

    write_table = flow_outputs.write_table

    def flow_writes(table, *args):
        assert not isinstance(table, Pieces), "the flow's process wrote an output in pieces"
        return write_table(table, *args)

    random_uint64 = partitioned.randomness.random_uint64

    def no_draws_here(size):
        assert size <= 512, "the flow's process drew the published rows' files"  # the companion's <= 512 cells
        return random_uint64(size)

    monkeypatch.setattr(partitioned, "file_table", no_rows_here)
    monkeypatch.setattr(partitioned.randomness, "random_uint64", no_draws_here)
    monkeypatch.setattr(flow_outputs, "write_table", flow_writes)
    monkeypatch.setattr(partitioned, "ROWS_PER_FILE", 6_000)
    monkeypatch.setattr(partitioned, "ROWS_PER_PART", 6_000)
    monkeypatch.setattr(partitioned, "ROWS_PER_PART_MIN", 6_000)
    policy = policy_file(work, "sorted.parquet", engine=dask_engine(cluster, 50_000))
    published = release_plain(policy_path=str(policy), out_dir=str(work / "dask"))
    parts = sorted(
        (o for o in published.outputs if Path(o["path"]).name.startswith("microdata-part")), key=lambda o: o["path"]
    )
    assert [Path(o["path"]).name for o in parts] == [f"microdata-part{j:04d}.parquet" for j in range(8)]
    assert not (Path(parts[0]["path"]).parent / "microdata.parquet").exists()
    tables = []
    total = sum(o["rows"] for o in parts)
    for part in parts:
        assert sha256_file(Path(part["path"])) == part["sha256"]
        table = pq.read_table(part["path"])
        assert table.num_rows == part["rows"]
        assert abs(table.num_rows - total / 8) < 6 * (total * 7 / 64) ** 0.5
        assert runs_of(table.column("sex").to_pylist()) > table.num_rows / 4
        tables.append(table)
    whole = rows_of(pa.concat_tables([t.cast(tables[0].schema) for t in tables]))
    names = [*(f"c{i}" for i in range(WIDE_COLUMNS)), "sex"]
    sampled_within_binomial_bounds(whole, generalized(data, names), 0.1)
    folder = Path(published.release_dir)
    import pyarrow.dataset as ds

    assert rows_of(ds.dataset(sorted(folder.glob("microdata-part*.parquet"))).to_table()) == whole
    companion = pq.read_table(folder / "microdata.cells.parquet")
    assert dict(zip(rows_of(companion.select(names)), companion.column("count").to_pylist())) == whole
    (entry,) = [
        e for e in json.loads((folder / "release.json").read_text())["outputs"] if e["mechanism"] == "microdata"
    ]
    assert entry["files"] == 8
    assert [(t["file"], t["sha256"], t["rows"]) for t in entry["tables"]] == [
        (Path(o["path"]).name, o["sha256"], o["rows"]) for o in parts
    ]
    assert f"The output of microdata is 8 files, {total} rows together" in Path(published.report).read_text()
    verify_intact()


def test_output_changed_after_the_worker_wrote_it_is_not_published(cluster, work, monkeypatch):
    """The last of the microdata's files (at most 100 rows each: several) is changed between
    its worker's write and the flow's check: its hash differs from the worker's, the run fails,
    nothing is published, the reservation is released."""
    from privrelease.flows import engines
    from privrelease.flows import outputs as flow_outputs
    from privrelease.mechanisms import partitioned

    monkeypatch.setattr(partitioned, "ROWS_PER_FILE", 100)
    monkeypatch.setattr(partitioned, "ROWS_PER_PART", 100)
    monkeypatch.setattr(partitioned, "ROWS_PER_PART_MIN", 100)

    data = work / "wide.parquet"
    wide_dataset(data, 80_000, 20_000, seed=6)
    map_gather = engines.map_gather

    def write_then_change(run_id, function, items, **constants):
        results = map_gather(run_id, function, items, **constants)
        if function is flow_outputs.write_pieces_here:
            assert len(items) > 1 and items[-1][2].endswith(f"-part{len(items) - 1:04d}.parquet")
            with open(items[-1][2], "ab") as file:
                file.write(b"planted")
        return results

    monkeypatch.setattr(engines, "map_gather", write_then_change)
    policy = policy_file(work, "wide.parquet", engine=dask_engine(cluster, 20_000))
    with pytest.raises((UserError, DataStepError), match="changed after the Dask worker wrote it"):
        release_plain(policy_path=str(policy), out_dir=str(work / "out"))
    run, entries = latest_run()
    assert run.status == "failed" and [e.state for e in entries] == ["released"]
    assert not (work / "out").exists() or [p for p in (work / "out").iterdir() if not p.name.startswith(".")] == []


def test_parquet_folder_fingerprinted_file_by_file(cluster, work):
    """A folder of three files: the same combined fingerprint in-process and on Dask, which
    changes when a file is renamed; the release counts every file's rows once."""
    from privrelease.flows.opening import approval_binding
    from privrelease.flows.partitions import combined_sha256, scan_file
    from privrelease.policies import load_policy

    folder = work / "parts"
    folder.mkdir()
    for i in range(3):
        wide_dataset(folder / f"part-{i}.parquet", 5_000, 2_500, seed=i)
    in_process = release_plain(policy_path=str(policy_file(work, "parts")), out_dir=str(work / "a"))
    policy = policy_file(work, "parts", engine=dask_engine(cluster, 2_500))
    on_dask = release_plain(policy_path=str(policy), out_dir=str(work / "b"))
    first, _ = run_record(in_process.run_id)
    second, _ = run_record(on_dask.run_id)
    files = [scan_file(str(path)) for path in sorted(folder.iterdir())]
    assert first.dataset_fingerprint == second.dataset_fingerprint == combined_sha256(files)
    assert approval_binding(load_policy(policy)).sha256 == first.dataset_fingerprint  # what `policy approve` binds
    assert outputs(on_dask)["people-by-sex"].num_rows == outputs(in_process)["people-by-sex"].num_rows == 2
    assert "3 Parquet files" in Path(on_dask.report).read_text()
    again = release_plain(rerun_of=on_dask.run_id, out_dir=str(work / "c"))  # the engine comes from the manifest
    repeated, entries = run_record(again.run_id)
    assert repeated.kind == "rerun" and repeated.dataset_fingerprint == second.dataset_fingerprint
    assert [e.state for e in entries] == ["committed"] and "Dask, on the cluster at" in Path(again.report).read_text()
    from privrelease.reissuing import reissue

    handed = reissue(again.run_id)
    assert (
        handed.source_run_id == again.run_id and len([o for o in handed.outputs if o.rows is not None]) == 5
    )  # and the microdata's cells
    (folder / "part-2.parquet").rename(folder / "part-9.parquet")
    assert combined_sha256([scan_file(str(path)) for path in sorted(folder.iterdir())]) != first.dataset_fingerprint


def test_scheme_selection_on_dask(cluster, work):
    """``select_scheme`` between a scheme under which no cell reaches k (every c* kept: 100^8
    cells) and one with 512 large cells: the exponential mechanism (epsilon 1, sensitivity
    ~0.24, scores ~0 against ~20,000) chooses the coarse one; the realized event is the planned
    Composed(selection, SDGS) (run_mechanism asserts it) and the sample is the coarse one's."""
    data = work / "wide.parquet"
    wide_dataset(data, 200_000, 50_000, seed=7)
    coarse = BINS.replace("  c", "    c")
    fine = "\n".join(f"    c{i}: keep" for i in range(WIDE_COLUMNS))
    policy_file(
        work,
        "wide.parquet",
        engine=dask_engine(cluster, 50_000),
        generalization=f"{BINS}\n  sex: keep\ncandidate_schemes:\n  coarse:\n{coarse}\n  fine:\n{fine}",
        sdgs=", select_scheme: {epsilon: 1.0, candidates: [coarse, fine]}",
    )
    published = release_plain(policy_path=str(work / "wide.yaml"), out_dir=str(work / "out"))
    micro = outputs(published)["microdata"]
    assert 15_000 < micro.num_rows < 25_000 and set(micro.column("c0").cast(pa.string()).to_pylist()) == {
        "0-50",
        "50-100",
    }
    report = " ".join(Path(published.report).read_text().split())
    assert "coarse" in report
    # audit 10: part 1 no longer says everything in it was fixed before any data was read
    assert "but for which of its candidate schemes select_scheme chose: that choice was made from the data" in report


def test_the_prefect_flow_takes_the_engine_as_parameters(prefect_harness, cluster, work):
    """The ``release`` flow (a deployment's entry point) with ``dask_address`` and no engine
    section in the policy: one task per stage, the Dask engine in the report, recorded like
    any run (its flow run id on the audit record)."""
    from test_flow import flow_run_facts

    from privrelease.flows.release import release

    local, _ = cluster
    wide_dataset(work / "wide.parquet", 40_000, 10_000, seed=8)
    summary = release(policy_path=str(policy_file(work, "wide.parquet")), dask_address=local.scheduler_address)
    run, entries = run_record(summary["run_id"])
    assert run.status == "succeeded" and [e.state for e in entries] == ["committed"]
    state, tasks, markdown = flow_run_facts(run.flow_run_id)
    assert state == "COMPLETED" and tasks.count("read-data") == 1 and markdown is not None
    assert "Dask, on the cluster at" in Path(summary["report"]).read_text()


# --------------------------------------------------------------------------- faults


def test_bad_value_in_one_partition_publishes_nothing(cluster, work):
    """``sex = 'planted-X7'`` in the third partition: the run fails, the reservation is
    released, no folder is published; the operator's error names file and rows, and the
    recorded error quotes nothing."""
    data = work / "wide.parquet"
    wide_dataset(data, 8_000, 2_000, seed=2)
    table = pq.read_table(data)
    sex = table.column("sex").to_pylist()
    sex[4_321] = "planted-X7"
    pq.write_table(table.set_column(WIDE_COLUMNS, "sex", pa.array(sex)), data, row_group_size=2_000)
    policy = policy_file(work, "wide.parquet", engine=dask_engine(cluster, 2_000))
    with pytest.raises(DataStepError) as caught:
        release_plain(policy_path=str(policy), out_dir=str(work / "out"))
    assert "planted-X7" in caught.value.detail and "data rows 4001-6000" in caught.value.detail
    assert "wide.parquet" in caught.value.detail
    assert "planted-X7" not in str(caught.value)
    run, entries = latest_run()
    assert run.status == "failed" and "planted-X7" not in (run.error or "")
    assert [e.state for e in entries] == ["released"]
    persisted = [path for path in (work / "work").rglob("*") if path.is_file() and b"planted-X7" in path.read_bytes()]
    assert persisted == []  # the audit database, manifests, staging: the value is in none of them
    assert not (work / "out").exists() or [p for p in (work / "out").iterdir() if not p.name.startswith(".")] == []


def test_file_swapped_after_the_fingerprint_is_not_read(cluster, work, monkeypatch):
    """The file is rewritten between the fingerprint and the read: the workers' range hashes
    no longer match, nothing is read or published."""
    from privrelease.flows import steps

    data = work / "wide.parquet"
    wide_dataset(data, 8_000, 2_000, seed=3)
    policy = policy_file(work, "wide.parquet", engine=dask_engine(cluster, 2_000))
    original = steps.read_data

    def swap_then_read(run, dataset):
        wide_dataset(data, 8_000, 2_000, seed=4)
        return original(run, dataset)

    monkeypatch.setattr(steps, "read_data", swap_then_read)
    with pytest.raises(DataStepError) as caught:
        release_plain(policy_path=str(policy), out_dir=str(work / "out"))
    assert "changed after it was fingerprinted" in caught.value.detail
    run, entries = latest_run()
    assert run.status == "failed" and [e.state for e in entries] == ["released"]


def test_unreachable_scheduler_names_the_address(work, monkeypatch):
    """Nothing listens on the address: a UserError (exit 2) naming it, before any charge."""
    from privrelease.flows import engines

    monkeypatch.setattr(engines, "CONNECT_TIMEOUT_SECONDS", 1)
    policy = policy_file(work, "wide.parquet")
    wide_dataset(work / "wide.parquet", 1_000, 1_000, seed=5)
    start = time.monotonic()  # the run's Dask client waits its connect timeout (1 s here)
    with pytest.raises(UserError, match="tcp://127.0.0.1:9") as caught:
        release_plain(policy_path=str(policy), dask_address="tcp://127.0.0.1:9")
    baseline = time.monotonic() - start
    assert caught.value.exit_code == 2
    run, entries = latest_run()
    assert entries == [] and run.status == "failed"
    from privrelease.flows.preflight import preflight

    start = time.monotonic()  # `privrelease run` refuses before Prefect starts, without a Dask client
    with pytest.raises(UserError, match="cannot reach the Dask scheduler at tcp://127.0.0.1:9"):
        preflight(policy, dask_address="tcp://127.0.0.1:9")
    seconds = time.monotonic() - start
    assert seconds < baseline / 2, f"{seconds:.2f} s; the run's own attempt {baseline:.2f} s"
    with pytest.raises(UserError, match=r"workers must be an integer in \[1, 1024\]; got 0"):
        preflight(policy, engine="dask", workers=0)


def test_schema_mismatch_names_file_and_column(cluster, work):
    """One file of a folder lacks column ``c3``: refused at the fingerprint, naming both."""
    folder = work / "parts"
    folder.mkdir()
    wide_dataset(folder / "a.parquet", 1_000, 1_000, seed=6)
    pq.write_table(pq.read_table(folder / "a.parquet").drop(["c3"]), folder / "b.parquet")
    policy = policy_file(work, "parts", engine=dask_engine(cluster, 1_000))
    with pytest.raises(UserError, match=r"b\.parquet.*has no column 'c3'"):
        release_plain(policy_path=str(policy))
    _, entries = latest_run()
    assert entries == []


def test_splu_gen_and_a_utf16_csv_are_refused_on_dask(work):
    """SPLU-Gen runs in-process only; a CSV is accepted on Dask (:func:`.scaled.check_engine`)
    unless its encoding's newlines are not newline bytes (UTF-16)."""
    from privrelease.flows.engines import Engine
    from privrelease.flows.scaled import check_engine
    from privrelease.policies import load_policy

    policy = policy_file(
        work, "wide.parquet", extra="  - {name: s, type: splu_gen, sensitive: [sex], gamma: 2}", engine=""
    )
    with pytest.raises(UserError, match="runs in-process only"):
        release_plain(policy_path=str(policy), engine="dask")
    csv_policy = policy_file(work, "wide.csv").read_text().replace("format: parquet", "format: csv")
    (work / "wide.yaml").write_text(csv_policy)
    check_engine(load_policy(work / "wide.yaml"), Engine("dask"))  # no longer refused
    (work / "wide.yaml").write_text(csv_policy.replace("format: csv", "format: csv\n  csv: {encoding: utf-16}"))
    with pytest.raises(UserError, match="'utf-16': the Dask engine splits a CSV file at newline bytes"):
        release_plain(policy_path=str(work / "wide.yaml"), engine="dask")


# --------------------------------------------------------------------------- scale


def peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM)."""
    with open("/proc/self/status", encoding="ascii") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


@pytest.mark.system
def test_release_larger_than_the_workers_memory(cluster, work):
    """12 M rows x 9 columns (824 MiB as Arrow columns): more than the 2 x 400 MiB the workers may use as Arrow columns.
    Released, charged and verified through the audited flow in 48 partitions; every worker's
    peak RSS stays below its limit."""
    rows, row_group = 12_000_000, 250_000
    data = work / "wide.parquet"
    wide_dataset(data, rows, row_group)
    assert rows * (WIDE_COLUMNS + 1) * 8 > WORKERS * MEMORY_LIMIT
    policy = policy_file(work, "wide.parquet", engine=dask_engine(cluster, row_group))
    published = release_plain(policy_path=str(policy), out_dir=str(work / "out"))
    run, entries = run_record(published.run_id)
    assert run.status == "succeeded" and [e.state for e in entries] == ["committed"]
    found = outputs(published)  # 1.2 M published rows: one file per worker
    assert sorted(name for name in found if name.startswith("microdata")) == [
        "microdata-part0000",
        "microdata-part0001",
        "microdata.cells",
    ]
    micro = pa.concat_tables([found["microdata-part0000"], found["microdata-part0001"]], promote_options="permissive")
    assert 0 < micro.num_rows < rows * 0.2 and min(rows_of(micro).values()) >= 20
    assert "48 partitions on a cluster of 2 workers" in Path(published.report).read_text()
    verify_intact()
    _, client = cluster
    peaks = client.run(peak_rss_bytes)
    assert len(peaks) == WORKERS and max(peaks.values()) < MEMORY_LIMIT, peaks


def kill_a_worker_during_the_map(client) -> tuple[threading.Thread, dict]:
    """A thread that SIGKILLs a worker given its run of partitions (a task of
    :func:`.engines.map_runs`) once the runs are under way, before any is done."""
    pids = client.run(os.getpid)
    seen: dict = {}

    def states(dask_scheduler) -> dict[str, str]:
        return {str(task.key): task.state for task in dask_scheduler.tasks.values() if "partials-runs" in str(task.key)}

    earlier = set(client.run_on_scheduler(states))  # an earlier test's, still known to the scheduler

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            runs = [state for key, state in client.run_on_scheduler(states).items() if key not in earlier]
            busy = [address for address, tasks in client.processing().items() if tasks]
            if "processing" in runs and "memory" not in runs and busy:
                seen["runs"] = len(runs)
                os.kill(pids[busy[0]], signal.SIGKILL)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, seen


def _square_unless_negative(item: int, other: str, *, scale: int) -> tuple[int, str]:
    if item < 0:
        raise ValueError(f"item {item}")
    return item * item * scale, other


def test_a_map_over_partitions_runs_as_one_task_per_worker(cluster):
    """:func:`.engines.map_runs`: 11 items of unequal weights on 2 workers are 2 tasks (runs of
    about equal weight), the results in item order; an item's error ends its run and the map
    (the one raised: a run's first); one item per task when items are fewer than workers."""
    from privrelease.flows import engines

    local, client = cluster
    client.wait_for_workers(WORKERS, timeout=240)  # an earlier test may have had one killed
    engine = engines.Engine("dask", address=local.scheduler_address)
    items, others = list(range(11)), [f"x{i}" for i in range(11)]
    try:
        engines.connect("runs", engine)
        with dask_tasks(client) as keys:
            results = engines.map_runs("runs", _square_unless_negative, items, others, weights=items, scale=2)
        assert results == [(2 * i * i, f"x{i}") for i in items]
        assert len(keys) == WORKERS and all(key.startswith("_square_unless_negative-runs-") for key in keys)
        with pytest.raises(ValueError, match="item -(3|4)$"):
            engines.map_runs("runs", _square_unless_negative, [1, -3, -4, -5], "abcd", weights=[1] * 4, scale=1)
        deadline = time.monotonic() + 30  # the other run, cancelled, may still be ending
        while any(client.processing().values()) and time.monotonic() < deadline:
            time.sleep(0.01)
        with dask_tasks(client) as keys:
            assert engines.map_runs("runs", _square_unless_negative, [4], ["y"], weights=[9], scale=1) == [(16, "y")]
        assert len(keys) == 1
    finally:
        engines.release("runs")


@contextlib.contextmanager
def dask_tasks(client):
    """The keys of the tasks the cluster ran in the block."""
    from distributed import get_task_stream

    keys: list[str] = []
    with get_task_stream(client) as stream:
        yield keys
    keys.extend(str(task["key"]) for task in stream.data)


@pytest.mark.parametrize("allowed_failures", [3, 0], ids=["retried", "no-retries"])
def test_worker_lost_mid_map(cluster, work, allowed_failures):
    """Kill a worker while partitions are read. With Dask's retries the release is complete
    (every row counted once); with none the run fails, exit 1, the reservation released,
    nothing published. Never a partial release."""
    _, client = cluster
    rows, row_group = 2_400_000, 100_000
    data = work / "wide.parquet"
    wide_dataset(data, rows, row_group)
    policy = policy_file(work, "wide.parquet", engine=dask_engine(cluster, row_group))
    previous = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.allowed_failures)
    client.run_on_scheduler(lambda dask_scheduler, n=allowed_failures: setattr(dask_scheduler, "allowed_failures", n))
    thread, seen = kill_a_worker_during_the_map(client)
    try:
        published, failed = release_plain(policy_path=str(policy), out_dir=str(work / "out")), None
    except Exception as error:  # the run failed: allowed; a partial release is not
        published, failed = None, error
    finally:
        thread.join(timeout=130)
        client.run_on_scheduler(lambda dask_scheduler, n=previous: setattr(dask_scheduler, "allowed_failures", n))
        client.wait_for_workers(WORKERS, timeout=240)
    assert "runs" in seen, "the worker was not killed during the map"
    run, entries = latest_run()
    if failed is None:
        assert allowed_failures > 0, "with no retries allowed a lost task must fail the run"
        assert run.status == "succeeded" and [e.state for e in entries] == ["committed"]
        report = Path(published.report).read_text()
        assert f"{rows:,}" in report or str(rows) in report  # rows_in: every partition counted once
    else:
        assert isinstance(failed, (ClusterFailure, DataStepError)), repr(failed)
        assert getattr(failed, "exit_code", None) == 1
        assert run.status == "failed" and [e.state for e in entries] == ["released"]
        out = work / "out"
        assert not out.exists() or [p for p in out.iterdir() if not p.name.startswith(".")] == []


# --------------------------------------------------------------------------- CSV


def demo_policy(work: Path, cluster, rows_per_partition: int, *, name: str = "demo.yaml") -> Path:
    """The demo policy (``privrelease.demo``: its synthetic 50,000-row CSV) on Dask."""
    text = (work / "demo" / "demo.yaml").read_text()
    path = work / "demo" / name
    path.write_text(text + dask_engine(cluster, rows_per_partition) + "\n")
    return path


@pytest.fixture
def demo(demo_dir) -> Path:
    """The demo's CSV (conftest's seeded copy) and policy in ``work/demo``."""
    from privrelease.demo import DATA_FILE

    return demo_dir / DATA_FILE


def release_document(published) -> dict:
    import json

    return json.loads((Path(published.release_dir) / "release.json").read_text())


def test_csv_same_release_as_in_process(cluster, work, demo):
    """The demo policy (SDGS and a histogram at beta 0.1, a mean) on its 50,000-row CSV,
    in-process and on Dask in 5 partitions: the same fingerprint, rows and guarantees; every
    true histogram cell published with a beta-sampled count (6-sigma binomial bounds), the
    mean within its noise; the report names the engine and partitions."""
    import pyarrow.csv as pcsv

    truth_table = pcsv.read_csv(demo)
    hours = truth_table.column("hours-per-week").to_numpy()
    labels = np.array(["1-19", "20-34", "35-40", "41-59", "60-99"])[np.digitize(hours, [20, 35, 41, 60])]
    truth = Counter(zip(labels.tolist(), truth_table.column("sex").to_pylist(), strict=True))
    in_process = release_plain(policy_path=str(work / "demo" / "demo.yaml"), out_dir=str(work / "local"))
    on_dask = release_plain(policy_path=str(demo_policy(work, cluster, 10_000)), out_dir=str(work / "dask"))
    first, second = release_document(in_process), release_document(on_dask)
    assert first["guarantee"] == second["guarantee"] and first["policy"] == second["policy"]
    for a, b in zip(first["outputs"], second["outputs"], strict=True):
        assert (a["mechanism"], a["guarantees"], a["accuracy"]) == (b["mechanism"], b["guarantees"], b["accuracy"])
    local_run, _ = run_record(in_process.run_id)
    dask_run, entries = run_record(on_dask.run_id)
    assert local_run.dataset_fingerprint == dask_run.dataset_fingerprint
    assert dask_run.status == "succeeded" and [e.state for e in entries] == ["committed"]
    mean = float(hours.mean())
    for published in (in_process, on_dask):
        found = outputs(published)
        cells = Counter({(r["hours-per-week"], r["sex"]): r["count"] for r in found["hours-by-sex"].to_pylist()})
        assert set(cells) <= set(truth) and all(count >= 20 for count in cells.values())
        histogram = found["hours-by-sex"].to_pydict()  # each count's exact interval, on both engines
        intervals = count_intervals(histogram["count"], 20, 0.1, 0.95)
        assert (histogram["lower"], histogram["upper"]) == (intervals.lower.tolist(), intervals.upper.tolist())
        large = Counter(
            {cell: size for cell, size in truth.items() if size * 0.1 > 60}
        )  # each published but w.p. < 1e-7
        assert len(large) >= 5
        sampled_within_binomial_bounds(Counter({cell: cells[cell] for cell in large}), large, 0.1)
        assert abs(found["mean-hours"].column("value")[0].as_py() - mean) < 1.0
        assert found["microdata"].schema.names == ["age", "sex", "education", "salary-class"]
    report = Path(on_dask.report).read_text()
    assert "Dask, on the cluster at" in report and "5 partitions on a cluster of 2 workers" in report
    assert "50,000" in report or "50000" in report
    verify_intact()


def test_csv_histogram_counts_are_exact_at_beta_one(cluster, work, demo):
    """A histogram at beta = 1 (no sampling: a function of the data) of the demo CSV: its
    Dask job (7 partitions of the CSV, read from verified byte ranges) merged and finished
    publishes exactly the cells and counts of the in-process run on the whole file."""
    from privrelease.datasets import read_dataset
    from privrelease.flows import engines, partitions
    from privrelease.flows.context import csv_arguments
    from privrelease.flows.scaled import read_partials
    from privrelease.policies import load_policy

    text = (work / "demo" / "demo.yaml").read_text()
    exact = text[: text.index("mechanisms:")] + (
        "mechanisms:\n"
        "  - {name: hours-by-sex, type: histogram, columns: [hours-per-week, sex, race], k: 20, beta: 1.0, epsilon: 1.0}\n"
    )
    (work / "demo" / "exact.yaml").write_text(exact)
    loaded = load_policy(work / "demo" / "exact.yaml")
    (spec,) = loaded.policy.mechanisms
    dataset = loaded.policy.dataset
    local, _ = cluster
    engine = engines.Engine("dask", address=local.scheduler_address, rows_per_partition=7_500)
    file = partitions.scan_csv(str(demo), csv_arguments(dataset.csv), engine.rows_per_partition)
    try:
        engines.connect("exact-csv", engine)
        read = read_partials("exact-csv", loaded, [file], engine)
    finally:
        engines.release("exact-csv")
    assert read.partitions == 7 and read.rows_read == 50_000
    table = read_dataset(
        demo, format="csv", columns={n: c.type for n, c in dataset.columns.items()}, **csv_arguments(dataset.csv)
    ).table
    scaled, whole = spec.finish(loaded, read.partials[spec.name]).table, spec.run(loaded, table).table

    def cells(histogram: pa.Table) -> Counter:  # labels -> (count, estimate, lower, upper): all exact at beta = 1
        assert histogram.column_names[-4:] == ["count", "estimate", "lower", "upper"]
        return Counter({row[:-4]: row[-4:] for row in rows_of(histogram).keys()})

    assert cells(scaled) == cells(whole) and len(cells(whole)) > 10


def test_csv_bad_value_in_a_later_partition_names_its_row(cluster, work, demo):
    """``sex = 'planted-X7'`` on data row 37,123 of the demo CSV, read in partitions of
    10,000 rows: the run fails, nothing is charged or published, and the operator's error
    names the value's own row in the file and the partition's rows; the record quotes nothing."""
    lines = demo.read_bytes().split(b"\n")
    fields = lines[37_123].split(b",")  # line 0 is the header
    fields[1] = b"planted-X7"
    lines[37_123] = b",".join(fields)
    demo.write_bytes(b"\n".join(lines))
    with pytest.raises(DataStepError) as caught:
        release_plain(policy_path=str(demo_policy(work, cluster, 10_000)), out_dir=str(work / "out"))
    detail = caught.value.detail
    assert "planted-X7" in detail and "data row 37123:" in detail and "data rows 30001-40000" in detail
    assert "planted-X7" not in str(caught.value)
    run, entries = latest_run()
    assert run.status == "failed" and "planted-X7" not in (run.error or "")
    assert [e.state for e in entries] == ["released"]
    from privrelease.datasets import read_dataset

    with pytest.raises(UserError, match="data row 37123:"):  # the row the in-process reader names
        read_dataset(demo, format="csv", columns={"sex": "string"}, domains={"sex": ["Male", "Female"]})


def test_csv_changed_after_the_fingerprint_is_not_read(cluster, work, demo, monkeypatch):
    """One byte of a later block changes between the fingerprint and the read (same size):
    that partition's range no longer hashes as fingerprinted; nothing is published."""
    from privrelease.flows import steps

    original = steps.read_data

    def change_then_read(run, dataset):
        data = bytearray(demo.read_bytes())
        at = data.index(b"Female", len(data) // 2)
        data[at : at + 6] = b"Femal3"
        demo.write_bytes(bytes(data))
        return original(run, dataset)

    monkeypatch.setattr(steps, "read_data", change_then_read)
    with pytest.raises(DataStepError) as caught:
        release_plain(policy_path=str(demo_policy(work, cluster, 10_000)), out_dir=str(work / "out"))
    assert "changed after it was fingerprinted" in caught.value.detail and "Femal3" not in caught.value.detail
    run, entries = latest_run()
    assert run.status == "failed" and [e.state for e in entries] == ["released"]


CSV_LINES = [b"n,b", b"1,x", b"", b"2,y", b'3,"q""r"', b"\r", b"4,w", b"5,v", b"6,u"]
"""A header, six data rows, two blank lines (the second a lone CR before an LF: blank too)."""


def column_read_setup(work: Path, plant: dict[str, tuple[int, object]] | None = None):
    """The wide dataset (4,000 rows, row groups of 1,000; ``plant``: column -> (row, value)),
    its partitions, read spec and an SDGS and a histogram job of every column at beta = 1
    (their cells a function of the data)."""
    from privrelease.flows.partitions import ReadSpec, plan_partitions, scan_file
    from privrelease.flows.scaled import NamedJob
    from privrelease.mechanisms.kinds.sdgs import CellJob
    from privrelease.policies.loader import load_policy

    data = work / "wide.parquet"
    wide_dataset(data, 4_000, 1_000, seed=5)
    if plant:
        table = pq.read_table(data)
        for name, (row, value) in plant.items():
            values = table.column(name).to_pylist()
            values[row] = value
            table = table.set_column(
                table.column_names.index(name), name, pa.array(values, table.schema.field(name).type)
            )
        pq.write_table(table, data, row_group_size=1_000)
    loaded = load_policy(policy_file(work, "wide.parquet"))
    every = [*(f"c{i}" for i in range(WIDE_COLUMNS)), "sex"]
    jobs = tuple(
        NamedJob(name, f"mechanism {name!r}", CellJob(loaded.schemes(columns), 1.0))
        for name, columns in (("microdata", every), ("cells", ["c0", "sex"]))
    )
    return plan_partitions([scan_file(str(data))], 1_000), ReadSpec.of(loaded.policy.dataset), jobs


def assert_same_cells(got, want) -> None:
    """Two :class:`~privrelease.mechanisms.sdgs.CellCounts` are equal."""
    assert {name: labels.to_pylist() for name, labels in got.labels.items()} == {
        name: labels.to_pylist() for name, labels in want.labels.items()
    }
    assert all(np.array_equal(got.codes[name], want.codes[name]) for name in want.codes)
    assert np.array_equal(got.counts, want.counts) and (got.rows_in, got.rows_sampled) == (
        want.rows_in,
        want.rows_sampled,
    )


def test_a_partition_whose_jobs_take_columns_is_read_one_column_at_a_time(work, monkeypatch):
    """SDGS, histogram and scheme-selection jobs take a partition one column at a time (never
    read as a whole table): the same cells and rows as the whole read's partial results
    (beta = 1)."""
    from privrelease.flows import partitions
    from privrelease.flows.scaled import NamedJob
    from privrelease.mechanisms.kinds.sdgs import SelectionJob

    parts, spec, cell_jobs = column_read_setup(work)
    candidates = {"fine": cell_jobs[0].job.schemes, "coarse": cell_jobs[1].job.schemes}
    jobs = (*cell_jobs, NamedJob("selected", "mechanism 'selected'", SelectionJob(candidates, 1.0)))
    expected = [partitions.job_partials(partitions.read_partition(part, spec), jobs, "") for part in parts]
    monkeypatch.setattr(partitions, "read_partition", lambda *_: pytest.fail("read as a whole table"))
    for part, whole in zip(parts, expected, strict=True):
        result = partitions.partials(part, spec=spec, jobs=jobs)
        assert (result.rows_read, result.rows_dropped) == (whole.rows_read, whole.rows_dropped) == (1_000, 0)
        for job in cell_jobs:
            assert_same_cells(result.partials[job.name], whole.partials[job.name])
            assert result.partials[job.name].rows_sampled == 1_000
        for name in candidates:
            for got, want in zip(result.partials["selected"][name], whole.partials["selected"][name], strict=True):
                assert_same_cells(got, want)


def test_counts_sums_tables_and_statistics_take_a_partition_one_column_at_a_time(work, monkeypatch):
    """Noisy counts, sums and tables jobs (exact counts and clamped totals per cell) and the
    identifiable statistics' (exact per-group terms) take a partition one column at a time too:
    the same partial results as the whole read's."""
    from privrelease.flows import partitions
    from privrelease.flows.scaled import NamedJob, named_jobs
    from privrelease.mechanisms.kinds.noisy_counts import CountJob
    from privrelease.mechanisms.kinds.noisy_sums import SumJob
    from privrelease.mechanisms.kinds.noisy_tables import TablesJob
    from privrelease.policies.loader import load_policy

    parts, spec, _ = column_read_setup(work)
    loaded = load_policy(work / "wide.yaml")
    counts = CountJob(loaded.schemes(["c0", "sex"]), {"c0": ("0-50", "50-100"), "sex": ("F", "M")})
    sums = SumJob(CountJob.declared(loaded, ("sex",)), "c2", 10, 90, 1.0)
    statistics = tuple(job for job in named_jobs(loaded) if job.name in ("people-by-sex", "total-c2"))
    jobs = statistics + tuple(
        NamedJob(name, f"mechanism {name!r}", job)
        for name, job in (("counts", counts), ("sums", sums), ("tables", TablesJob((counts, None, sums))))
    )
    expected = [partitions.job_partials(partitions.read_partition(part, spec), jobs, "") for part in parts]
    monkeypatch.setattr(partitions, "read_partition", lambda *_: pytest.fail("read as a whole table"))
    for part, whole in zip(parts, expected, strict=True):
        got = partitions.partials(part, spec=spec, jobs=jobs).partials
        assert np.array_equal(got["counts"], whole.partials["counts"]) and got["counts"].sum() == 1_000
        assert np.array_equal(got["sums"], whole.partials["sums"]) and got["sums"][1].sum() > 0
        assert [a.tolist() for a in got["tables"]] == [a.tolist() for a in whole.partials["tables"]]
        assert got["people-by-sex"] == whole.partials["people-by-sex"] and got["people-by-sex"].rows == 1_000
        assert got["total-c2"] == whole.partials["total-c2"]


def test_a_partition_read_one_column_at_a_time_names_the_error_a_whole_read_names(work):
    """c0 = 150 (outside its bins, which the SDGS job finds in c0, the first column) and a
    missing sex (which the whole read's checks find first) in one partition: the error is the
    whole read's, naming sex's missing value and the partition's data rows."""
    from privrelease.flows import partitions

    parts, spec, jobs = column_read_setup(work, {"c0": (2_100, 150), "sex": (2_700, None)})
    with pytest.raises(partitions.PartitionError) as caught:
        partitions.partials(parts[2], spec=spec, jobs=jobs)
    assert caught.value.step == "reading the data"
    assert "column 'sex' has a missing value null at data row 701" in caught.value.detail
    assert "data rows 2001-3000 of 'wide.parquet'" in caught.value.detail


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize("header", [True, False], ids=["header", "no-header"])
def test_csv_blocks_read_as_the_whole_file(tmp_path, line_end, header):
    """Blank lines, CRLF, doubled quotes, with or without a header, no newline at the end:
    every way of cutting the file into blocks of lines reads the in-process table, and the
    fingerprint is the file's sha256 with the header hashed as its first piece."""
    from privrelease.datasets import read_dataset
    from privrelease.files import sha256_bytes
    from privrelease.flows.partitions import ReadSpec, plan_partitions, read_partition, scan_csv

    lines = [line for line in CSV_LINES[0 if header else 1 :] if line != b"\r" or line_end == b"\n"]
    data = line_end.join(lines)
    path = tmp_path / "small.csv"
    path.write_bytes(data)
    csv = {"delimiter": None, "quote": '"', "header": header, "encoding": "utf-8"}
    columns = {"n": "integer", "b": "string"}
    whole = read_dataset(path, format="csv", columns=columns, **csv).table
    for size in range(1, len(lines) + 1):
        file = scan_csv(str(path), csv, size)
        assert file.sha256 == sha256_bytes(data) and file.head_sha256 == sha256_bytes(data[: file.head_bytes])
        assert sum(file.row_groups) == 6 and file.ranges[-1][1] == len(data)
        spec = ReadSpec(columns, "reject", ("", "?"), {}, csv)
        parts = [read_partition(part, spec).table for part in plan_partitions([file], size)]
        assert pa.concat_tables(parts).to_pylist() == whole.to_pylist(), size


def test_csv_quoted_newline_is_refused_naming_its_row(tmp_path):
    """A quoted field holding a newline on data row 4 (read in-process as one value): refused
    on Dask, naming row 4, wherever the blocks are cut."""
    from privrelease.flows.partitions import ReadSpec, plan_partitions, read_partition, scan_csv

    path = tmp_path / "quoted.csv"
    path.write_bytes(b'n,b\n1,x\n2,y\n\n3,z\n4,"two\nlines"\n5,v\n6,u\n')
    csv = {"delimiter": None, "quote": '"', "header": True, "encoding": "utf-8"}
    spec = ReadSpec({"n": "integer", "b": "string"}, "reject", ("", "?"), {}, csv)
    for size in range(1, 9):
        file = scan_csv(str(path), csv, size)
        with pytest.raises(UserError, match="a quoted field spans a line end at data row 4;"):
            for part in plan_partitions([file], size):
                read_partition(part, spec)


@pytest.mark.parametrize(("setting", "changed"), [("65536", True), (None, False), (str(64 << 20), False)])
def test_a_worker_gets_glibcs_adaptive_malloc_thresholds_back(monkeypatch, setting, changed):
    """Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536, which pins glibc's mmap
    threshold at 128 KiB (each array of a partition a fresh mapping): the first partition sets
    both thresholds as glibc's adaptive ones settle, once; nothing without such a setting."""
    import ctypes

    from privrelease.flows import partitions

    calls: list[tuple[int, int]] = []

    class Libc:
        def mallopt(self, parameter: int, value: int) -> int:
            calls.append((parameter, value))
            return 1

    monkeypatch.setattr(ctypes, "CDLL", lambda name: Libc())
    if setting is None:
        monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    else:
        monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", setting)
    partitions._adaptive_malloc.cache_clear()
    try:
        partitions._adaptive_malloc()
        partitions._adaptive_malloc()
    finally:
        partitions._adaptive_malloc.cache_clear()
    assert calls == ([(-3, 16 << 20), (-1, 64 << 20)] if changed else [])


def test_a_partition_emptied_by_dropped_rows_is_no_error(cluster, work):
    """``missing: drop`` and every row of the second partition missing its sex: that partition
    adds nothing and the release goes on, in-process and on Dask alike, each reading the other
    rows (the counts by sex add up to 6,000); with every row missing, both refuse in one line."""
    data = work / "wide.parquet"
    wide_dataset(data, 8_000, 2_000, seed=3)
    table = pq.read_table(data)
    sex = table.column("sex").to_pylist()
    sex[2_000:4_000] = [None] * 2_000
    pq.write_table(table.set_column(WIDE_COLUMNS, "sex", pa.array(sex)), data, row_group_size=2_000)
    dropping = "format: parquet\n  missing: drop"
    for engine, out in (("", "local"), (dask_engine(cluster, 2_000), "dask")):
        policy = policy_file(work, "wide.parquet", engine=engine)
        policy.write_text(policy.read_text().replace("format: parquet", dropping))
        counted = outputs(release_plain(policy_path=str(policy), out_dir=str(work / out)))["people-by-sex"]
        assert abs(sum(counted.column("value").to_pylist()) - 6_000) < 200  # Laplace scale 2.5 per sex
    pq.write_table(table.set_column(WIDE_COLUMNS, "sex", pa.array([None] * 8_000, pa.string())), data)
    for engine in ("", dask_engine(cluster, 2_000)):
        policy = policy_file(work, "wide.parquet", engine=engine)
        policy.write_text(policy.read_text().replace("format: parquet", dropping))
        with pytest.raises(DataStepError) as caught:
            release_plain(policy_path=str(policy), out_dir=str(work / "none"))
        assert "has a missing value; nothing is left" in caught.value.detail


def test_a_run_builds_each_releases_privacy_loss_distribution_once(work, monkeypatch):
    """The per-run accounting that depends only on the policy and the ledger (each release's
    privacy loss distribution: the reservation's composition, the report's ledger curve and
    runway search) is computed once per run and shared, never again per step: in a second run
    (the ledger then composes two runs' releases), no event's PLD is built twice."""
    from privrelease.mechanisms import pld

    data = work / "wide.parquet"
    wide_dataset(data, 8_000, 2_000, seed=7)
    policy = policy_file(work, "wide.parquet")
    release_plain(policy_path=str(policy), out_dir=str(work / "first"))
    built: list[str] = []
    event_pld = pld._event_pld

    def counted(event, discretization):
        built.append(repr(event))
        return event_pld(event, discretization)

    monkeypatch.setattr(pld, "_event_pld", counted)
    pld._cached_pld.cache_clear()
    release_plain(policy_path=str(policy), out_dir=str(work / "second"))
    assert built and len(built) == len(set(built)), built


def test_a_local_cluster_s_workers_run_without_the_task_profiler(work):
    """The cluster a run starts gives its workers :data:`.engines.WORKER_CONFIG` (no statistical
    profiler, host metrics every 2 s, memory thresholds every 500 ms, the event loop's health
    every second) in their own processes; its scheduler and nannies, in this process, time their
    event loops every second too and the nannies check the memory limit every 100 ms; this
    process's settings and the rest of the workers' (the memory fractions) are unchanged."""
    import dask.config

    from privrelease.flows import engines

    keys = (
        "distributed.worker.profile.enabled",
        "distributed.admin.system-monitor.interval",
        "distributed.worker.memory.monitor-interval",
        "distributed.admin.tick.interval",
        "distributed.worker.memory.terminate",
    )
    before = tuple(dask.config.get(key) for key in keys)
    client = engines.connect("worker-config", engines.Engine("dask", workers=1))
    try:

        def settings():
            return tuple(dask.config.get(key) for key in keys)

        (found,) = client.run(settings).values()
        assert found == (False, "2s", "500ms", "1s", before[-1])
        assert tuple(dask.config.get(key) for key in keys) == before == (True, "500ms", "100ms", "20ms", 0.95)
        cluster = engines.held("worker-config").cluster
        nannies = list(cluster.workers.values())
        assert [server._tick_interval for server in (cluster.scheduler, *nannies)] == [1.0] * (1 + len(nannies))
        assert [nanny.memory_manager.memory_monitor_interval for nanny in nannies] == [0.1]
    finally:
        engines.release("worker-config")
