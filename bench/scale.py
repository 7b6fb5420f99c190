"""Benchmark: (k, beta)-SDGS in-process against the Dask scale-out flow, on a bootstrap of Adult.

    python bench/scale.py [--rows N] [--beta B] [--workers W] [--rows-per-partition P]

Bootstraps ``../shared/data/adult/adult.csv`` to an N-row Parquet file (default 50,000,000
rows, row groups of 1 M rows; as bench/sdgs.py: 8 columns, level-1 ARX hierarchies, k = 20)
in a temporary folder, then times, each in a fresh process, imports done before the clock:

- in-process: ``read_dataset`` (the whole file) -> ``sdgs`` -> one Parquet file
  (bench/sdgs.py's ``run_ours``);
- Dask: the ``sdgs-scale-out`` flow (flows/scale.py) on a ``LocalCluster`` of W worker
  processes, one thread each, started before the clock (production passes ``address=`` of a
  running cluster); the flow run itself is timed, Prefect's per-task overhead included.

The Dask run needs a Prefect server: the one at ``PREFECT_API_URL`` when set, else one started
here on 127.0.0.1 with a temporary ``PREFECT_HOME`` (its start-up is reported, not timed).
Both outputs are checked: every published cell has at least k rows.

Prints the figures and, as the last line, one JSON object: ``seconds`` (Dask flow run),
``baseline_seconds`` (in-process), ``ratio`` (seconds / baseline_seconds),
``rows_per_second_inprocess``, ``rows_per_second_dask``, ``peak_rss_mb`` (largest peak RSS of
a Dask worker process: what one machine of a cluster needs), ``peak_rss_mb_inprocess``, and
the set-up times.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import sdgs as bench_sdgs  # noqa: E402  (bench/sdgs.py: bootstrap, hierarchies, in-process run)

K = bench_sdgs.K
EPSILON = bench_sdgs.EPSILON
COLUMNS = bench_sdgs.COLUMNS
QUIET = {
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_TASKS_DEFAULT_NO_CACHE": "true",
    "DASK_LOGGING__DISTRIBUTED": "error",
}


def peak_mb() -> float:
    """This process's peak RSS in MB: VmHWM (getrusage's ru_maxrss survives exec on Linux, so
    a worker spawned by a larger process would report the parent's size)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_inprocess(data: Path, out: Path, beta: float) -> dict:
    for module in ("privrelease.datasets", "privrelease.mechanisms.sdgs"):
        importlib.import_module(module)
    start = time.perf_counter()
    rows_out = bench_sdgs.run_ours(data, out / "inprocess.parquet", beta)
    return {"seconds": time.perf_counter() - start, "peak_rss_mb": peak_mb(), "rows_out": rows_out}


def run_dask(data: Path, out: Path, beta: float, workers: int, rows_per_partition: int, rows_per_file: int) -> dict:
    import logging

    from distributed import Client, LocalCluster

    from privrelease.flows.scale import ScaleSpec, run_scale_release
    from privrelease.mechanisms.schemes import ValueMap

    logging.getLogger("distributed").setLevel(logging.ERROR)
    spec = ScaleSpec(
        columns=COLUMNS,
        schemes={column: ValueMap(tuple(bench_sdgs.hierarchy(column))) for column in COLUMNS},
        k=K,
        beta=beta,
        epsilon=EPSILON,
    )
    start = time.perf_counter()
    with (
        LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        client.run(lambda: importlib.import_module("privrelease.flows.scale"))
        cluster_seconds = time.perf_counter() - start
        start = time.perf_counter()
        result = run_scale_release(
            data,
            out,
            spec,
            address=cluster.scheduler_address,
            release_name="dask",
            rows_per_partition=rows_per_partition,
            rows_per_file=rows_per_file,
        )
        seconds = time.perf_counter() - start
        worker_peaks = client.run(peak_mb)
    return {
        "seconds": seconds,
        "cluster_seconds": cluster_seconds,
        "peak_rss_mb": max(worker_peaks.values()),
        "client_peak_rss_mb": peak_mb(),
        "rows_out": result["public_facts"]["rows_published"],
        "files": len(result["files"]),
        "partitions": result["internal_facts"]["partitions"],
        "timings": result["timings"],
    }


def spawn(kind: str, args: argparse.Namespace, data: Path, out: Path, env: dict[str, str]) -> dict:
    command = [
        sys.executable,
        __file__,
        "--worker",
        kind,
        "--data",
        str(data),
        "--out",
        str(out),
        "--beta",
        str(args.beta),
        "--workers",
        str(args.workers),
        "--rows-per-partition",
        str(args.rows_per_partition),
        "--rows-per-file",
        str(args.rows_per_file),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        sys.exit(f"{kind} run failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_prefect_server(home: Path) -> tuple[subprocess.Popen, str, float]:
    """``prefect server start`` on 127.0.0.1 (its own session, so its process group can be
    stopped), the API URL once healthy, and the seconds that took."""
    port = free_port()
    env = {**os.environ, **QUIET, "PREFECT_HOME": str(home)}
    env.pop("PREFECT_API_URL", None)
    start = time.perf_counter()
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "prefect"),
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-ui",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    while time.perf_counter() - start < 180:
        if server.poll() is not None:
            sys.exit("the Prefect server exited during start-up")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return server, url, time.perf_counter() - start
        except OSError:
            time.sleep(0.5)
    stop(server)
    sys.exit("the Prefect server did not become healthy in 180 s")


def stop(server: subprocess.Popen) -> None:
    try:
        os.killpg(server.pid, signal.SIGTERM)  # the server's own process group (started above)
        server.wait(timeout=30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(server.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=50_000_000)
    parser.add_argument("--beta", type=float, default=0.5)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rows-per-partition", type=int, default=2_000_000)
    parser.add_argument("--rows-per-file", type=int, default=2_000_000)
    parser.add_argument("--worker", choices=["inprocess", "dask"], help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "inprocess":
        print(json.dumps(run_inprocess(args.data, args.out, args.beta)))
        return
    if args.worker == "dask":
        print(
            json.dumps(
                run_dask(args.data, args.out, args.beta, args.workers, args.rows_per_partition, args.rows_per_file)
            )
        )
        return
    if not (bench_sdgs.ADULT / "adult.csv").is_file():
        sys.exit(f"Adult data not found at {bench_sdgs.ADULT}")

    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        tmp_path = Path(tmp)
        data, out = tmp_path / "adult_bootstrap.parquet", tmp_path / "out"
        out.mkdir()
        start = time.perf_counter()
        bench_sdgs.bootstrap(args.rows, data)
        print(
            f"bootstrap: {args.rows:,} rows, {data.stat().st_size / 2**20:.1f} MiB Parquet"
            f" (row groups of {bench_sdgs.BOOTSTRAP_BATCH:,}) in {time.perf_counter() - start:.1f} s;"
            f" k={K}, beta={args.beta}, {len(COLUMNS)} columns (level-1 ARX hierarchies)",
            flush=True,
        )
        env = {**os.environ, **QUIET}
        server = None
        server_seconds = 0.0
        if not os.environ.get("PREFECT_API_URL"):
            server, env["PREFECT_API_URL"], server_seconds = start_prefect_server(tmp_path / "prefect-home")
            print(f"Prefect server on {env['PREFECT_API_URL']}: healthy after {server_seconds:.1f} s", flush=True)
        try:
            inprocess = spawn("inprocess", args, data, out, env)
            print(f"in-process: {inprocess['seconds']:.2f} s, peak RSS {inprocess['peak_rss_mb']:.0f} MB", flush=True)
            dask = spawn("dask", args, data, out, env)
        finally:
            if server is not None:
                stop(server)
        print(
            f"Dask ({args.workers} workers x 1 thread, cluster up in {dask['cluster_seconds']:.1f} s):"
            f" {dask['seconds']:.2f} s for {dask['partitions']} partitions and {dask['files']} files,"
            f" worker peak RSS {dask['peak_rss_mb']:.0f} MB, flow process {dask['client_peak_rss_mb']:.0f} MB;"
            f" stages (s): {dask['timings']}"
        )
        cells = {
            "inprocess": bench_sdgs.smallest_cell(out / "inprocess.parquet"),
            "dask": bench_sdgs.smallest_cell(out / "dask" / "part-*.parquet"),
        }

    assert all(value >= K for value in cells.values()), cells
    rows_per_s_in = args.rows / inprocess["seconds"]
    rows_per_s_dask = args.rows / dask["seconds"]
    print(f"\n{'':12} {'seconds':>8} {'rows/s':>12} {'rows out':>12} {'min cell':>9} {'peak MB':>8}")
    for name, run, rate in (("in-process", inprocess, rows_per_s_in), ("dask", dask, rows_per_s_dask)):
        key = "inprocess" if name == "in-process" else "dask"
        print(
            f"{name:12} {run['seconds']:>8.2f} {rate:>12,.0f} {run['rows_out']:>12,} {cells[key]:>9}"
            f" {run['peak_rss_mb']:>8.0f}"
        )
    summary = {
        "rows": args.rows,
        "beta": args.beta,
        "k": K,
        "workers": args.workers,
        "partitions": dask["partitions"],
        "files": dask["files"],
        "seconds": round(dask["seconds"], 3),
        "baseline_seconds": round(inprocess["seconds"], 3),
        "ratio": round(dask["seconds"] / inprocess["seconds"], 3),
        "rows_per_second_inprocess": round(rows_per_s_in),
        "rows_per_second_dask": round(rows_per_s_dask),
        "peak_rss_mb": round(dask["peak_rss_mb"]),
        "peak_rss_mb_inprocess": round(inprocess["peak_rss_mb"]),
        "cluster_start_seconds": round(dask["cluster_seconds"], 2),
        "prefect_server_start_seconds": round(server_seconds, 2),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
