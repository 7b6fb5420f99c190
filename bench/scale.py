"""Benchmark: the audited release flow in-process against the same flow on the Dask engine, on
a bootstrap of Adult.

    python bench/scale.py [--rows N] [--files F] [--beta B] [--workers W] [--repeat R]
                          [--rows-per-partition P] [--memory-limit BYTES] [--no-inprocess]
                          [--profile DIR] [--worker-steps] [--served-workers]

Bootstraps ``../shared/data/adult/adult.csv`` to N rows of Parquet (default 20,000,000; row
groups of 1 M rows; F files in a folder when F > 1, generated chunk by chunk, so no process
holds the data) with bench/sdgs.py's 8 columns, and writes a policy releasing them with
(k = 20, beta)-SDGS over level-1 ARX hierarchies. Then times, each in a fresh process with
imports done and the audit database created (``privrelease audit init``, as a deployment's
exists) before the clock, one whole audited release (verify, fingerprint, plan, reserve, read,
mechanism, report, publish, audit records, ledger; :func:`privrelease.flows.steps.release_plain`,
the flow's steps without the constant Prefect task wrapping):

- in-process: ``--engine local`` (the baseline, same run, same machine);
- Dask: ``--engine dask`` on a ``LocalCluster`` of W worker processes, one thread each, with
  the given memory limit, started before the clock as a production cluster would be, with the
  worker settings privrelease gives its own local clusters and advises for a site's
  (:data:`privrelease.flows.engines.WORKER_CONFIG`); fresh workers, or with
  ``--served-workers`` workers that have served the same release before the clock, run by
  another process with a ledger of its own, then idled SERVED_IDLE seconds (a site cluster
  between releases; the flow's process stays as cold as in-process).

The two alternate (in-process, Dask, in-process, ...) ``--repeat`` times (default 1); the
medians are reported (each step's too; ``--profile DIR`` writes each run's cProfile statistics
to DIR), with the spread (fastest, slowest, and the range of the ratios of the
alternated pairs: the machine is shared, so one pair sees one load).
Prints the figures and, as the last line, one JSON object: ``seconds`` (Dask run, median),
``baseline_seconds`` (in-process run, median, null with --no-inprocess), ``ratio`` (of the
medians; target <= TARGET_RATIO = 0.6, issue 18), ``cpu_seconds`` and ``baseline_cpu_seconds``
(median CPU seconds of a run: the flow's process and, on Dask, the workers; on a shared machine
a steadier figure than the time), ``cpu_ratio`` (the Dask run's CPU over the in-process run's; target
<= TARGET_CPU_RATIO; ``worker_steps``: whether ``--worker-steps`` read the workers' CPU at every
step, which costs them CPU of its own), ``flow_cpu_seconds`` and ``worker_cpu_seconds`` (a Dask run's, apart; the bench's
LocalCluster scheduler runs in the flow process), ``flow_cpu_beyond_fixed_seconds`` (the flow
process's CPU on Dask less the in-process run's FIXED_STEPS and BACKGROUND arithmetic; target
<= TARGET_FLOW_CPU_BEYOND),
``cores`` (this machine's), ``cpu_floor_seconds`` (the Dask
run's CPU seconds over the cores: no schedule finishes sooner) and ``floor_ratio`` (that floor
over the in-process median: the least ratio this machine allows the Dask run), ``pair_ratios`` (min, median, max), ``peak_rss_mb``
(largest peak RSS of a Dask worker), ``flow_peak_rss_mb`` (the flow process on Dask),
``inprocess_peak_rss_mb``, ``data_mb`` (the least a one-table read holds: the declared
columns as Arrow plus the largest file's bytes; a Parquet file released row group by row group
in-process, as this policy's is, holds a row group at a time), ``memory_limit_mb``,
``fits_one_worker`` (data_mb below one worker's limit: false means one process could not hold
the whole table there),
``partitions``, ``rows_published`` for both runs and the set-up times.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import sdgs as bench_sdgs  # noqa: E402  (bench/sdgs.py: Adult columns, hierarchies, bootstrap source)

K = bench_sdgs.K
COLUMNS = bench_sdgs.COLUMNS
ROW_GROUP = 1_000_000
SERVED_IDLE = 2.0
"""Seconds a served cluster idles before the clock (``--served-workers``): more than mimalloc's
1 s purge delay, so freed memory has gone back to the kernel as between a site's releases."""
TARGET_RATIO = 0.6
"""The audited Dask run's time over the in-process run's (issue 18 item 8)."""
WARM = (
    "dp_accounting",  # 1.8 s to import: paid by every accounted run, whatever the engine
    "privrelease.flows.steps",
    "privrelease.flows.scaled",
    "privrelease.flows.partitions",
    "privrelease.datasets",
    "privrelease.mechanisms.sdgs",
    "privrelease.mechanisms.generalization",
)
"""Imported before the clock, in the flow process and on the workers (a running cluster's
workers have them loaded after its first run)."""
QUIET = {"DASK_LOGGING__DISTRIBUTED": "error"}
BACKGROUND = "report arithmetic"
"""The report's arithmetic computed in a background thread while the data steps run (the plan's
charts, the ledger's curve and runway: :func:`privrelease.flows.reporting.prepare_report`), in
that thread's own CPU seconds (:class:`Background`)."""
FIXED_STEPS = ("verify policy", "prepare outputs", "fingerprint", "plan", "reserve budget", "report", "publish")
"""The steps whose work does not grow with the data's rows (all but the read and the mechanisms);
with BACKGROUND, the in-process run's fixed CPU (each step's CPU is counted without the
background thread's, which runs alongside the read in-process and the wait for the workers on
Dask)."""
TARGET_CPU_RATIO = 1.25
"""The Dask run's total CPU over the in-process run's (issue 28)."""
TARGET_FLOW_CPU_BEYOND = 0.6
"""The flow process's CPU seconds on a Dask run beyond the in-process run's fixed steps (issue 28)."""


def median_run(runs: list[dict]) -> dict:
    """The run with the median time (the lower middle one of an even number), its figures as
    measured, and the largest peak RSS figures of all the runs."""
    chosen = dict(sorted(runs, key=lambda run: run["seconds"])[(len(runs) - 1) // 2])
    chosen["seconds"] = statistics.median(run["seconds"] for run in runs)
    for key in ("peak_rss_mb", "worker_peak_rss_mb"):
        if key in chosen:
            chosen[key] = max(run[key] for run in runs)
    return chosen


def median_cpu(runs: list[dict]) -> float:
    """The median CPU seconds of ``runs``: the flow's process and, on Dask, the workers."""
    return statistics.median(run["cpu_seconds"] + run.get("worker_cpu_seconds", 0.0) for run in runs)


def peak_mb() -> float:
    """This process's peak RSS in MB (VmHWM: getrusage's ru_maxrss survives exec on Linux)."""
    with open("/proc/self/status", encoding="ascii") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024


def bootstrap(rows: int, folder: Path, files: int) -> Path:
    """``rows`` rows drawn with replacement from adult.csv (bench data: numpy's generator, not
    a mechanism) in row groups of ROW_GROUP rows: one file, or ``files`` files in ``folder``."""
    import numpy as np
    import pyarrow.parquet as pq

    from privrelease.datasets import read_dataset

    source = read_dataset(bench_sdgs.ADULT / "adult.csv", format="csv", columns=COLUMNS, delimiter=";").table
    rng = np.random.default_rng()
    target = folder / ("adult.parquet" if files == 1 else "adult")
    paths = [target] if files == 1 else [target / f"part-{i:03d}.parquet" for i in range(files)]
    target.parent.mkdir(parents=True, exist_ok=True)
    if files > 1:
        target.mkdir()
    per_file = -(-rows // files)
    for index, path in enumerate(paths):
        count = min(per_file, rows - index * per_file)
        with pq.ParquetWriter(path, source.schema) as writer:
            for start in range(0, count, ROW_GROUP):
                writer.write_table(source.take(rng.integers(0, source.num_rows, min(ROW_GROUP, count - start))))
    return target


def inprocess_floor_mb(data: Path) -> float:
    """The least a one-table read holds at once, in MB: the declared columns of every row as
    Arrow (text dictionary-encoded; bytes per row measured on the first row group) plus the
    bytes of the largest file (read whole, so that what is parsed is what was hashed)."""
    import pyarrow.parquet as pq

    files = sorted(data.glob("*.parquet")) if data.is_dir() else [data]
    text = [name for name, kind in COLUMNS.items() if kind == "string"]
    first = pq.ParquetFile(files[0], read_dictionary=text).read_row_group(0, columns=list(COLUMNS))
    rows = sum(pq.read_metadata(path).num_rows for path in files)
    return (first.nbytes / first.num_rows * rows + max(path.stat().st_size for path in files)) / 2**20


def write_policy(folder: Path, data: Path, beta: float, rows_per_partition: int) -> Path:
    schemes = "\n".join(
        f"  {column}: {{hierarchy: {bench_sdgs.ADULT / f'adult_hierarchy_{column}.csv'}, level: 1}}"
        for column in COLUMNS
    )
    columns = "\n".join(f"    {column}: {{type: {kind}}}" for column, kind in COLUMNS.items())
    path = folder / "bench-scale.yaml"
    path.write_text(
        f"""name: bench-scale
version: "1"
dataset:
  id: bench-adult-bootstrap
  path: {data}
  format: parquet
  columns:
{columns}
generalization:
{schemes}
mechanisms:
  - {{name: microdata, type: sdgs, columns: [{", ".join(COLUMNS)}], beta: {beta}, k: {K}, epsilon: 1.0}}
targets:
  accounting: approximate
  delta: 1.0e-6
  lifetime_budget: {{epsilon: 10, delta: 1.0e-6}}
engine: {{rows_per_partition: {rows_per_partition}}}
"""
    )
    return path


class Background:
    """The CPU seconds of the threads that run the report's arithmetic while the data steps run
    (:func:`privrelease.flows.reporting.prepare_report`: the plan's charts, the ledger's curve
    and runway), read from each thread's own CPU clock at any moment (:meth:`seconds`)."""

    def __init__(self) -> None:
        import threading

        from privrelease.audit import ledger
        from privrelease.reports import charts

        self._last: dict[int, float] = {}

        def timed(function: Any) -> Any:
            def run(*args: Any, **kwargs: Any) -> Any:
                if threading.current_thread() is threading.main_thread():
                    return function(*args, **kwargs)
                self._last.setdefault(threading.get_ident(), 0.0)
                try:
                    return function(*args, **kwargs)
                finally:
                    self._last[threading.get_ident()] = time.thread_time()

            return run

        charts.all_charts = timed(charts.all_charts)
        ledger.curve_of = timed(ledger.curve_of)

    def seconds(self) -> float:
        for ident in self._last:
            try:
                self._last[ident] = time.clock_gettime(time.pthread_getcpuclockid(ident))
            except (OSError, OverflowError):
                pass  # the thread ended: its last reading is its total
        return sum(self._last.values())


class StepTimes:
    """A progress sink (:class:`privrelease.flows.context.ProgressSink`) keeping each step's
    seconds and this process's CPU seconds in it (all its threads but the report's background
    arithmetic, which is kept apart as ``cpu[BACKGROUND]``; a Dask worker's are not)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.worker_cpu: dict[str, float] = {}
        self._cpu_start = self._workers_start = 0.0
        self.background = Background()
        self.workers: Any = None
        """With ``--worker-steps`` on Dask: a callable giving the workers' CPU seconds so far."""

    def _cpu(self) -> float:
        return time.process_time() - self.background.seconds()

    def start(self, step: str, description: str) -> None:
        self._cpu_start = self._cpu()
        if self.workers is not None:
            self._workers_start = self.workers()

    def done(self, step: str, seconds: float, note: str = "") -> None:
        self.seconds[step] = round(seconds, 3)
        self.cpu[step] = round(self._cpu() - self._cpu_start, 3)
        self.cpu[BACKGROUND] = round(self.background.seconds(), 3)
        if self.workers is not None:
            self.worker_cpu[step] = round(self.workers() - self._workers_start, 3)

    def close(self) -> None:
        pass


def run_once(
    kind: str,
    policy: Path,
    work: Path,
    workers: int,
    memory_limit: int,
    profile: Path | None,
    worker_steps: bool,
    served: bool,
) -> dict:
    """One audited release in this process (``kind``: local or dask), with each step's seconds;
    with ``profile``, under cProfile, its statistics written to ``profile``."""
    import cProfile
    import logging

    os.environ["PRIVRELEASE_WORK_DIR"] = str(work / kind)
    os.environ["PRIVRELEASE_DATA_ROOTS"] = str(bench_sdgs.ADULT)
    for module in WARM:
        importlib.import_module(module)
    from privrelease.flows.steps import release_plain, set_progress

    steps = StepTimes()
    set_progress(steps)
    profiler = cProfile.Profile() if profile else None

    def release(**parameters: object) -> Any:
        if profiler is None:
            return release_plain(**parameters)
        try:
            return profiler.runcall(release_plain, **parameters)
        finally:
            assert profile is not None
            profiler.dump_stats(profile)

    facts: dict = {}
    cpu = time.process_time()
    if kind == "local":
        start = time.perf_counter()
        published = release(policy_path=str(policy))
        seconds = time.perf_counter() - start
    else:
        from distributed import Client

        from privrelease.flows import engines

        logging.getLogger("distributed").setLevel(logging.ERROR)
        start = time.perf_counter()
        # the cluster a run starts (its workers' settings are those a site's are advised to run with)
        with engines.local_cluster(workers, memory_limit) as cluster, Client(cluster) as client:
            client.run(lambda: [importlib.import_module(module) for module in WARM])
            facts["cluster_seconds"] = time.perf_counter() - start
            if served:
                serve_a_release(policy, work, cluster.scheduler_address)

            def workers_cpu() -> float:
                return sum(client.run(time.process_time).values())

            worker_cpu = workers_cpu()
            if worker_steps:
                steps.workers = workers_cpu
            cpu, start = time.process_time(), time.perf_counter()
            published = release(policy_path=str(policy), dask_address=cluster.scheduler_address)
            seconds = time.perf_counter() - start
            facts["worker_cpu_seconds"] = workers_cpu() - worker_cpu
            facts["worker_peak_rss_mb"] = max(client.run(peak_mb).values())
    found = re.search(
        r"(\d+) partitions? on a cluster of \d+ workers?", Path(published.report).read_text(encoding="utf-8")
    )
    partitions = int(found.group(1)) if found else None
    return {
        "seconds": seconds,
        "cpu_seconds": time.process_time() - cpu,
        "peak_rss_mb": peak_mb(),
        "rows_published": sum(output["rows"] for output in published.outputs),
        "partitions": partitions,
        "steps": steps.seconds,
        "steps_cpu": steps.cpu,
        "steps_worker_cpu": steps.worker_cpu,
        **facts,
    }


def serve_a_release(policy: Path, work: Path, address: str) -> None:
    """Before the clock (``--served-workers``): the same release on the cluster at ``address``,
    run by another process with a work folder (ledger) of its own, so that the workers have
    served a release (read, computed and written their parts) and this process stays as cold as
    the in-process run's; then SERVED_IDLE seconds idle, as a site's workers are between
    releases (their allocators return what they freed)."""
    import subprocess

    env = {**os.environ, **QUIET, "PRIVRELEASE_WORK_DIR": str(work / "served")}
    init = [sys.executable, "-m", "privrelease", "audit", "init"]
    subprocess.run(init, check=True, capture_output=True, env=env)
    code = "import sys; from privrelease.flows.steps import release_plain; release_plain(policy_path=sys.argv[1], dask_address=sys.argv[2])"
    subprocess.run([sys.executable, "-c", code, str(policy), address], check=True, capture_output=True, env=env)
    time.sleep(SERVED_IDLE)


def spawn(kind: str, args: argparse.Namespace, policy: Path, work: Path) -> dict:
    command = [sys.executable, __file__, "--run", kind, "--policy", str(policy), "--work", str(work)]
    command += ["--workers", str(args.workers), "--memory-limit", str(args.memory_limit)]
    command += ["--worker-steps"] * args.worker_steps + ["--served-workers"] * args.served_workers
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
        command += ["--profile", str(args.profile / f"{kind}-{work.name}.prof")]
    return fresh_run(command, {**os.environ, **QUIET, "PRIVRELEASE_WORK_DIR": str(work / kind)}, kind)


def fresh_run(command: list[str], env: dict[str, str], what: str) -> dict:
    """``command`` (a release in a fresh process, printing its figures as its last line, one
    JSON object) run with ``env``, after ``privrelease audit init`` there: the audit database
    exists before the clock, as a deployment's does (creating it is no release's work)."""
    import subprocess

    subprocess.run([sys.executable, "-m", "privrelease", "audit", "init"], check=True, capture_output=True, env=env)
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        sys.exit(f"{what} run failed:\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=20_000_000)
    parser.add_argument("--files", type=int, default=1)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rows-per-partition", type=int, default=ROW_GROUP)
    parser.add_argument("--memory-limit", type=int, default=2**30, help="bytes per Dask worker (default 1 GiB)")
    parser.add_argument("--no-inprocess", action="store_true", help="skip the in-process baseline")
    parser.add_argument("--repeat", type=int, default=1, help="alternated runs of each engine (default 1)")
    parser.add_argument("--profile", type=Path, help="write each run's cProfile statistics to this folder")
    parser.add_argument(
        "--worker-steps",
        action="store_true",
        help="on Dask, also read the workers' CPU at each step's start and end: each reading is a broadcast to every"
        " worker (18 readings of 8 idle workers: 0.044 CPU s of theirs), so the CPU figures are higher with it;"
        " take cpu_ratio from a run without it",
    )
    parser.add_argument(
        "--served-workers",
        action="store_true",
        help="before the clock, the Dask workers serve the same release (another process, its own ledger), then idle 2 s",
    )
    parser.add_argument("--run", choices=["local", "dask"], help=argparse.SUPPRESS)
    parser.add_argument("--policy", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        run = run_once(
            args.run,
            args.policy,
            args.work,
            args.workers,
            args.memory_limit,
            args.profile,
            args.worker_steps,
            args.served_workers,
        )
        print(json.dumps(run))
        return
    if not (bench_sdgs.ADULT / "adult.csv").is_file():
        sys.exit(f"Adult data not found at {bench_sdgs.ADULT}")
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        folder = Path(tmp)
        start = time.perf_counter()
        data = bootstrap(args.rows, folder, args.files)
        data_mb = inprocess_floor_mb(data)
        print(
            f"bootstrap: {args.rows:,} rows in {args.files} file(s) (a one-table read holds >= {data_mb:,.0f} MB),"
            f" in {time.perf_counter() - start:.1f} s; k={K}, beta={args.beta}, {len(COLUMNS)} columns",
            flush=True,
        )
        policy = write_policy(folder, data, args.beta, args.rows_per_partition)
        local_runs: list[dict] = []
        dask_runs: list[dict] = []
        for index in range(args.repeat):
            work = folder / f"work-{index}"
            if not args.no_inprocess:
                local_runs.append(spawn("local", args, policy, work))
                print(
                    f"in-process audited run: {local_runs[-1]['seconds']:.2f} s,"
                    f" peak RSS {local_runs[-1]['peak_rss_mb']:.0f} MB",
                    flush=True,
                )
            dask_runs.append(spawn("dask", args, policy, work))
            print(f"Dask audited run: {dask_runs[-1]['seconds']:.2f} s", flush=True)
    inprocess = median_run(local_runs) if local_runs else None
    dask = median_run(dask_runs)
    pairs = sorted(d["seconds"] / i["seconds"] for d, i in zip(dask_runs, local_runs))
    for name, runs in (("in-process", local_runs), ("Dask", dask_runs)):
        if runs:
            print(f"{name} CPU seconds (median, the flow's process and the workers): {median_cpu(runs):.2f}")
            for key, what in (
                ("steps", "s"),
                ("steps_cpu", "CPU s of this process"),
                ("steps_worker_cpu", "CPU s of the workers"),
            ):
                if not runs[0][key]:
                    continue
                steps = {step: statistics.median(run[key][step] for run in runs) for step in runs[0][key]}
                print(f"{name} {key} (median {what}): " + ", ".join(f"{step} {sec:.2f}" for step, sec in steps.items()))
    print(
        f"Dask audited run ({args.workers} workers x 1 thread, {args.memory_limit / 2**20:.0f} MB each, cluster up in"
        f" {dask['cluster_seconds']:.1f} s): {dask['seconds']:.2f} s over {dask['partitions']} partitions; worker"
        f" peak RSS {dask['worker_peak_rss_mb']:.0f} MB, flow process {dask['peak_rss_mb']:.0f} MB"
    )
    flow_cpu = statistics.median(run["cpu_seconds"] for run in dask_runs)
    worker_cpu = statistics.median(run["worker_cpu_seconds"] for run in dask_runs)
    fixed_cpu = statistics.median(
        sum(run["steps_cpu"][step] for step in (*FIXED_STEPS, BACKGROUND)) for run in local_runs or dask_runs
    )
    cpu_ratio = median_cpu(dask_runs) / median_cpu(local_runs) if local_runs else None
    print(
        f"Dask run CPU (median): flow process {flow_cpu:.2f} s (the bench's LocalCluster scheduler runs in it), "
        f"workers {worker_cpu:.2f} s; the flow process beyond the in-process fixed steps ({fixed_cpu:.2f} CPU s): "
        f"{flow_cpu - fixed_cpu:.2f} s (target <= {TARGET_FLOW_CPU_BEYOND})"
        + (
            ""
            if cpu_ratio is None
            else f"; total CPU over the in-process run's {cpu_ratio:.2f} (target <= {TARGET_CPU_RATIO})"
        )
    )
    cores = os.cpu_count() or 1
    floor = median_cpu(dask_runs) / cores
    if inprocess is not None:
        print(
            f"on {cores} cores the Dask run takes at least its CPU seconds / {cores} = {floor:.2f} s: a ratio of at"
            f" least {floor / inprocess['seconds']:.2f} against this in-process run (target {TARGET_RATIO})"
        )
    memory_limit_mb = args.memory_limit / 2**20
    summary = {
        "rows": args.rows,
        "files": args.files,
        "beta": args.beta,
        "k": K,
        "workers": args.workers,
        "partitions": dask["partitions"],
        "seconds": round(dask["seconds"], 3),
        "baseline_seconds": None if inprocess is None else round(inprocess["seconds"], 3),
        "ratio": None if inprocess is None else round(dask["seconds"] / inprocess["seconds"], 3),
        "cpu_seconds": round(median_cpu(dask_runs), 3),
        "baseline_cpu_seconds": round(median_cpu(local_runs), 3) if local_runs else None,
        "cpu_ratio": None if cpu_ratio is None else round(cpu_ratio, 3),
        "flow_cpu_seconds": round(flow_cpu, 3),
        "worker_cpu_seconds": round(worker_cpu, 3),
        "fixed_steps_cpu_seconds": round(fixed_cpu, 3),
        "flow_cpu_beyond_fixed_seconds": round(flow_cpu - fixed_cpu, 3),
        "target_ratio": TARGET_RATIO,
        "cores": cores,
        "cpu_floor_seconds": round(floor, 3),
        "floor_ratio": None if inprocess is None else round(floor / inprocess["seconds"], 3),
        "repeat": args.repeat,
        "worker_steps": args.worker_steps,
        "pair_ratios": [round(pairs[0], 3), round(statistics.median(pairs), 3), round(pairs[-1], 3)] if pairs else None,
        "dask_seconds_range": [
            round(min(r["seconds"] for r in dask_runs), 3),
            round(max(r["seconds"] for r in dask_runs), 3),
        ],
        "inprocess_seconds_range": [
            round(min(r["seconds"] for r in local_runs), 3),
            round(max(r["seconds"] for r in local_runs), 3),
        ]
        if local_runs
        else None,
        "peak_rss_mb": round(dask["worker_peak_rss_mb"]),
        "flow_peak_rss_mb": round(dask["peak_rss_mb"]),
        "inprocess_peak_rss_mb": None if inprocess is None else round(inprocess["peak_rss_mb"]),
        "data_mb": round(data_mb),
        "memory_limit_mb": round(memory_limit_mb),
        "fits_one_worker": data_mb < memory_limit_mb,
        "rows_published": dask["rows_published"],
        "rows_published_inprocess": None if inprocess is None else inprocess["rows_published"],
        "cluster_seconds": round(dask["cluster_seconds"], 2),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
