"""Benchmark: ``privrelease demo`` end to end, and the release flow's own cost beyond Prefect's start.

    python bench/flow.py [--repeat R]

1. **Fresh machine**: ``privrelease demo --json`` in a new process with an empty ``PREFECT_HOME``
   and an empty work dir (so Prefect creates its database, as on a fresh machine): wall time,
   peak RSS (the largest of the process tree), and the command's own timings (when Prefect's
   temporary server answered, how long the command waited for it, the flow call).
2. **Second run** of the same command on the same ``PREFECT_HOME`` (Prefect's database exists).
3. **Flow overhead**, in one worker process with the server up and the imports warm (what
   ``privrelease run`` does while the server starts): the ``release`` flow on the 50,000-row
   demo data, ``--repeat`` times, against the same steps called without Prefect (baseline,
   measured in the same process): the difference is Prefect's orchestration of the 11 tasks.

Prints the figures and, as the last line, one JSON object: ``seconds`` (the fresh demo, wall;
target < 45), ``peak_rss_mb``, ``prefect_start_seconds`` (the fresh server's start, part of
``seconds``), ``flow_overhead_seconds`` (median flow call with the server up; target < 3),
and the detail.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_demo(folder: Path, prefect_home: Path) -> dict:
    """``privrelease demo --json`` in a fresh process; wall seconds, peak RSS, its timings."""
    work = folder / "work"
    environment = {
        **os.environ,
        "PREFECT_HOME": str(prefect_home),
        "PRIVRELEASE_WORK_DIR": str(work),
    }
    for name in ("PREFECT_API_URL", "PRIVRELEASE_DB_URL", "PRIVRELEASE_PRODUCTION"):
        environment.pop(name, None)
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    done = subprocess.run(
        [sys.executable, "-m", "privrelease", "demo", "--json"],
        cwd=folder,
        env=environment,
        capture_output=True,
        text=True,
        timeout=600,
    )
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        raise SystemExit(f"privrelease demo failed with exit code {done.returncode}")
    summary = json.loads(done.stdout)
    return {
        "seconds": seconds,
        "peak_rss_mb": max(peak, before) / 1024,
        "timings": summary["timings"],
        "outputs": len(summary["outputs"]),
    }


def worker(repeat: int) -> None:
    """With the server up and warm imports: the flow ``repeat`` times, then the plain steps."""
    from privrelease import running
    from privrelease import server as prefect_server

    folder = Path(tempfile.mkdtemp(prefix="bench-flow-worker-"))
    os.environ["PRIVRELEASE_WORK_DIR"] = str(folder / "flow-work")
    os.environ["PRIVRELEASE_AUTO_INIT"] = "true"  # throwaway audit databases
    server = prefect_server.connect(reuse=False)
    started = time.perf_counter()
    running.warm_up()
    warm_up = time.perf_counter() - started
    if server is not None:
        server.wait(prefect_server.startup_timeout())
    from privrelease import demo
    from privrelease.flows import steps
    from privrelease.flows.release import release

    policy, _ = demo.write_demo(folder / "demo", seed=1)
    flow_times = []
    for _ in range(repeat):
        start = time.perf_counter()
        release(policy_path=str(policy))
        flow_times.append(time.perf_counter() - start)
    os.environ["PRIVRELEASE_WORK_DIR"] = str(folder / "plain-work")  # its own ledger
    plain_times = []
    for _ in range(repeat):
        start = time.perf_counter()
        steps.release_plain(policy_path=str(policy))
        plain_times.append(time.perf_counter() - start)
    print(
        json.dumps(
            {
                "prefect_start_seconds": None if server is None else server.ready_after,
                "warm_up_seconds": warm_up,
                "flow_seconds": flow_times,
                "plain_seconds": plain_times,
            }
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="flow runs in the worker (default 3)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.repeat)
        return

    with tempfile.TemporaryDirectory(prefix="bench-flow-") as temp:
        root = Path(temp)
        home = root / "prefect-home"
        fresh = run_demo(root / "fresh", home)
        second = run_demo(root / "second", home)
        done = subprocess.run(
            [sys.executable, __file__, "--worker", "--repeat", str(args.repeat)],
            env={**os.environ, "PREFECT_HOME": str(home), "PRIVRELEASE_WORK_DIR": str(root / "w")},
            cwd=root,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            raise SystemExit("the flow worker failed")
        measured = json.loads(done.stdout.strip().splitlines()[-1])

    flow = statistics.median(measured["flow_seconds"])
    plain = statistics.median(measured["plain_seconds"])
    timings = fresh["timings"]
    print("privrelease demo, 50,000 synthetic rows, 3 mechanisms (SDGS, histogram, rho-mean)")
    print(f"  fresh machine (empty PREFECT_HOME):  {fresh['seconds']:6.1f} s wall   (target < 45 s)")
    print(f"    Prefect's temporary server ready:   {timings['prefect_start']:6.1f} s after the command began it")
    print(f"    of which the command waited:        {timings['prefect_wait']:6.1f} s (warm-up ran meanwhile)")
    print(f"    flow call, server up:               {timings['flow']:6.2f} s")
    print(f"    peak RSS of the process tree:       {fresh['peak_rss_mb']:6.0f} MB")
    print(f"  second run (Prefect database exists): {second['seconds']:6.1f} s wall")
    print(f"    server ready:                       {second['timings']['prefect_start']:6.1f} s")
    print(f"  flow with the server up (median of {args.repeat}, warm imports):")
    print(f"    release flow (11 Prefect tasks):    {flow:6.2f} s   (target < 3 s)")
    print(f"    same steps without Prefect:         {plain:6.2f} s   (baseline)")
    print(f"    Prefect's orchestration:            {flow - plain:6.2f} s")
    print(f"    each flow run: {', '.join(f'{s:.2f}' for s in measured['flow_seconds'])} s")
    print(
        json.dumps(
            {
                "seconds": round(fresh["seconds"], 2),
                "peak_rss_mb": round(fresh["peak_rss_mb"], 1),
                "prefect_start_seconds": round(timings["prefect_start"], 2),
                "flow_overhead_seconds": round(flow, 2),
                "demo_flow_call_seconds": round(timings["flow"], 2),
                "demo_prefect_wait_seconds": round(timings["prefect_wait"], 2),
                "second_demo_seconds": round(second["seconds"], 2),
                "plain_steps_seconds": round(plain, 2),
                "prefect_orchestration_seconds": round(flow - plain, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
