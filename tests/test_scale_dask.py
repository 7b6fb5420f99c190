"""The Dask scale-out flow (flows/scale.py) on a real LocalCluster of two worker processes with
a memory limit, under Prefect's test harness (the session's ``prefect_harness`` fixture: the
workers reach its API through the flow's settings, so none starts a temporary server).

- the same release as in-process on the same sample (beta = 1), rows not in input order;
- a task error (a value outside the scheme's domain) publishes nothing and quotes no data;
- a dataset larger than the memory of all workers together is released;
- a worker killed during the map: the task is retried (a complete, correct release) or the
  run fails with nothing left in the output folder; with retries disabled it must fail so.
"""

from __future__ import annotations

import json
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

pytest.importorskip("prefect_dask", reason="the dask extra is not installed: pip install -e '.[dask]'")

from privrelease.datasets import fingerprint  # noqa: E402
from privrelease.mechanisms.schemes import Bins, Keep, ValueMap  # noqa: E402
from privrelease.mechanisms.sdgs import sdgs  # noqa: E402

pytestmark = pytest.mark.timeout(300)

WORKERS = 2
MEMORY_LIMIT = 400 * 2**20
"""Per worker. A worker process with Prefect imported already holds about 210 MiB; 200 MiB
would not even start a task (the nanny restarts the worker at 95% of its limit)."""
WIDE_COLUMNS = 12


@pytest.fixture(scope="module")
def cluster(prefect_harness):
    """Two worker processes, one thread each, MEMORY_LIMIT each; a client to inspect them."""
    os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")  # the worker processes
    logging.getLogger("distributed").setLevel(logging.WARNING)
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=WORKERS, threads_per_worker=1, memory_limit=MEMORY_LIMIT, processes=True, dashboard_address=None
        ) as local,
        Client(local) as client,
    ):
        yield local, client


def peak_rss_bytes() -> int:
    """This process's peak resident set (VmHWM). Not getrusage's ru_maxrss: Linux keeps that
    across exec, so a worker spawned by a large process would report its parent's size."""
    with open("/proc/self/status", encoding="ascii") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def write_parquet(path: Path, columns: dict[str, np.ndarray], row_group: int) -> None:
    pq.write_table(pa.table(columns), path, row_group_size=row_group)


def wide_dataset(path: Path, rows: int, row_group: int) -> None:
    """``rows`` rows of WIDE_COLUMNS int64 columns (0..99), written row group by row group."""
    rng = np.random.default_rng()  # test data, not a mechanism
    schema = pa.schema([(f"c{i}", pa.int64()) for i in range(WIDE_COLUMNS)])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, row_group):
            size = min(row_group, rows - start)
            writer.write_table(
                pa.table({f"c{i}": rng.integers(0, 100, size) for i in range(WIDE_COLUMNS)}, schema=schema)
            )


def wide_spec(k: int = 20, beta: float = 0.1):
    from privrelease.flows.scale import ScaleSpec

    return ScaleSpec(
        columns={f"c{i}": "integer" for i in range(WIDE_COLUMNS)},
        schemes={f"c{i}": Bins(edges=(0, 50, 100)) for i in range(WIDE_COLUMNS)},
        k=k,
        beta=beta,
        epsilon=1.0,
    )


def published_rows(result: dict) -> list[tuple]:
    rows: list[tuple] = []
    for entry in result["files"]:
        table = pq.read_table(entry["path"])
        rows.extend(zip(*[table.column(name).cast(pa.string()).to_pylist() for name in table.column_names]))
    return rows


def check_release(result: dict, out: Path, name: str, k: int) -> list[tuple]:
    """The release folder holds exactly the manifest and the listed files, with their
    checksums; nothing else is left in ``out``; every published cell has >= k rows."""
    final = out / name
    assert sorted(os.listdir(out)) == [name]
    manifest = json.loads((final / "release.json").read_text())
    assert sorted(os.listdir(final)) == sorted(["release.json", *(f["file"] for f in manifest["files"])])
    assert set(manifest) == {"mechanism", "event", "public_facts", "files"}  # no internal facts
    for entry in result["files"]:
        assert fingerprint(entry["path"]) == (entry["sha256"], entry["bytes"])
        assert pq.read_metadata(entry["path"]).num_rows == entry["rows"]
    rows = published_rows(result)
    assert len(rows) == result["public_facts"]["rows_published"]
    assert min(Counter(rows).values(), default=k) >= k
    return rows


def run(cluster, data: Path, out: Path, spec, **options) -> dict:
    from privrelease.flows.scale import run_scale_release

    local, _ = cluster
    return run_scale_release(data, out, spec, address=local.scheduler_address, **options)


# --------------------------------------------------------------------------- same release


def test_same_release_as_in_process_on_the_same_sample(cluster, tmp_path):
    """beta = 1: the multiset of published rows equals in-process SDGS on the whole table
    (Keep labels differ between row groups); the rows do not follow the (sorted) input."""
    rng = np.random.default_rng()
    size = 40_000
    zone = np.sort(rng.integers(0, 30, size))  # input sorted by a published column
    columns = {
        "job": rng.choice(list("abcdz"), size).astype(object),
        "age": rng.integers(0, 41, size),
        "zone": zone,
        "ignored": rng.integers(0, 10, size),
    }
    data = tmp_path / "data.parquet"
    write_parquet(data, columns, row_group=4_000)
    from privrelease.flows.scale import ScaleSpec

    schemes = {
        "job": ValueMap(mapping=(("a", "A"), ("b", "A"), ("c", "C")), default="other"),
        "age": Bins(edges=(0, 20, 41)),
        "zone": Keep(),
    }
    spec = ScaleSpec(columns={"job": "string", "age": "integer", "zone": "integer"}, schemes=schemes, k=120, beta=1.0)
    result = run(
        cluster, data, tmp_path / "out", spec, release_name="r", rows_per_partition=8_000, rows_per_file=20_000
    )

    from privrelease.datasets import read_dataset

    table = read_dataset(data, format="parquet", columns=spec.columns).table
    reference = sdgs(table, schemes, k=120, beta=1.0, epsilon=0.0)
    rows = check_release(result, tmp_path / "out", "r", k=120)
    expected = list(zip(*[reference.table.column(n).cast(pa.string()).to_pylist() for n in schemes]))
    assert Counter(rows) == Counter(expected)
    assert result["public_facts"] == reference.public_facts
    assert result["internal_facts"]["rows_in"] == size and result["internal_facts"]["partitions"] == 5
    assert len(result["files"]) == 2  # 36,000-odd rows, <= 20,000 per file: the next power of two
    zones = [int(row[2]) for row in rows]
    assert sum(a > b for a, b in zip(zones, zones[1:])) > len(zones) // 4  # sorted: 0 descents
    _, client = cluster  # the workers used the harness's API: none started a server of its own
    assert client.run(lambda: len(__import__("psutil").Process().children(recursive=True))) == {
        address: 0 for address in client.scheduler_info()["workers"]
    }


def test_refuses_to_run_without_a_prefect_server(prefect_harness, tmp_path):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from privrelease.errors import UserError
    from privrelease.flows.scale import run_scale_release

    with temporary_settings(updates={PREFECT_API_URL: ""}), pytest.raises(UserError, match="PREFECT_API_URL"):
        run_scale_release(tmp_path / "none.parquet", tmp_path / "out", wide_spec())
    assert not (tmp_path / "out").exists()


def test_task_error_publishes_nothing_and_quotes_no_data(cluster, tmp_path):
    """A value outside the bins in the fourth row group: the run fails, the output folder is
    empty, the error's text names the step and the type only; the detail (for the operator)
    names the value and its data row."""
    from privrelease.flows.scale import ScaleSpec

    values = np.arange(10_000) % 50
    values[7_000] = 987_654
    data = tmp_path / "data.parquet"
    write_parquet(data, {"v": values}, row_group=2_000)
    spec = ScaleSpec(columns={"v": "integer"}, schemes={"v": Bins(edges=(0, 25, 50))}, k=2, beta=0.5)
    out = tmp_path / "out"
    with pytest.raises(Exception) as caught:
        run(cluster, data, out, spec, release_name="r", rows_per_partition=2_000)
    assert "987654" not in str(caught.value) and "partition 3" in str(caught.value)
    assert "987654" in caught.value.detail and "data rows 6001-8000" in caught.value.detail
    assert os.listdir(out) == []


# --------------------------------------------------------------------------- larger than memory


def test_release_larger_than_the_workers_memory(cluster, tmp_path):
    """9 M rows x 12 int64 columns: 824 MiB as Arrow columns, more than the 2 x 400 MiB the
    workers may use (the nanny kills a worker at 95% of its limit). Released in 36 partitions;
    every worker's peak RSS stays below its limit."""
    rows, row_group = 9_000_000, 250_000
    assert rows * WIDE_COLUMNS * 8 > WORKERS * MEMORY_LIMIT
    data = tmp_path / "wide.parquet"
    wide_dataset(data, rows, row_group)
    assert pq.read_metadata(data).num_row_groups == 36
    spec = wide_spec()
    result = run(
        cluster, data, tmp_path / "out", spec, release_name="big", rows_per_partition=row_group, rows_per_file=250_000
    )
    check_release(result, tmp_path / "out", "big", k=spec.k)
    internal = result["internal_facts"]
    assert internal["rows_in"] == rows and internal["partitions"] == 36
    assert 0 < result["public_facts"]["rows_published"] <= internal["rows_sampled"]
    _, client = cluster
    peaks = client.run(peak_rss_bytes)
    assert len(peaks) == WORKERS and max(peaks.values()) < MEMORY_LIMIT, peaks


# --------------------------------------------------------------------------- a worker lost


def kill_a_worker_when(client, scratch: Path, started: int) -> tuple[threading.Thread, dict]:
    """A thread that, once ``started`` partial count files exist (the map is under way),
    SIGKILLs a worker process the scheduler has given a task, noting how many files existed."""
    pids = client.run(os.getpid)
    seen: dict = {}

    def watch() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            done = len(list(scratch.glob("count-*.arrow"))) if scratch.exists() else 0
            busy = [address for address, tasks in client.processing().items() if tasks] if done >= started else []
            if busy:
                seen["counted_before_kill"] = done
                os.kill(pids[busy[0]], signal.SIGKILL)
                return
            time.sleep(0.02)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread, seen


@pytest.mark.parametrize("allowed_failures", [3, 0], ids=["retried", "no-retries"])
def test_worker_lost_mid_map(cluster, tmp_path, allowed_failures):
    """Kill a worker while the partitions are being counted. Dask re-runs the lost worker's
    task (allowed failures 3, its default): the release must then be complete and exact in
    its row accounting (every partition counted once). With no retries allowed the run must
    fail and leave nothing. Never a partial release."""
    local, client = cluster
    rows, row_group = 1_200_000, 100_000
    data = tmp_path / "wide.parquet"
    wide_dataset(data, rows, row_group)
    spec = wide_spec()
    out = tmp_path / "out"
    scratch = out / ".lost.scale-work" / "scratch"
    previous = client.run_on_scheduler(lambda dask_scheduler: dask_scheduler.allowed_failures)
    client.run_on_scheduler(lambda dask_scheduler, n=allowed_failures: setattr(dask_scheduler, "allowed_failures", n))
    thread, seen = kill_a_worker_when(client, scratch, started=3)
    try:
        result = run(cluster, data, out, spec, release_name="lost", rows_per_partition=row_group)
        failed = None
    except Exception as error:  # the run failed: that is allowed, a partial release is not
        result, failed = None, error
    finally:
        thread.join(timeout=130)
        client.run_on_scheduler(lambda dask_scheduler, n=previous: setattr(dask_scheduler, "allowed_failures", n))
        client.wait_for_workers(WORKERS, timeout=240)  # a restart under load can be slow
    assert seen.get("counted_before_kill", 0) >= 3, "the worker was not killed during the map"
    assert seen["counted_before_kill"] < rows // row_group, "the map had ended before the kill"
    if failed is None:
        assert allowed_failures > 0, "with no retries allowed a lost task must fail the run"
        check_release(result, out, "lost", k=spec.k)
        assert result["internal_facts"]["rows_in"] == rows  # each partition counted exactly once
        assert result["internal_facts"]["partitions"] == rows // row_group
    else:
        time.sleep(1)  # a task still running on the surviving worker must not write afterwards
        assert not out.exists() or os.listdir(out) == []
