"""Benchmark: the audited demo release on its CSV, in-process against the Dask engine.

    python bench/csv_dask.py [--rows N] [--repeats R] [--workers W]   # R <= 4: the CSV runs share one budget

Writes the demo (``privrelease.demo.write_demo``: N synthetic census rows as CSV, default
50,000, and its policy: SDGS, a histogram and a mean; the lifetime budget raised to 100 so that
the 25 CSV runs of the default 4 repeats fit) and the same rows as Parquet (row groups of 100,000), starts a ``LocalCluster``
of W worker processes (one thread each) before the clock, runs each configuration once to warm
up, then R times in turn, timing one whole audited release each
(:func:`privrelease.flows.steps.release_plain`: verify, fingerprint, plan, reserve, read,
mechanisms, report, publish, audit records):

- ``local``: the CSV in-process (the baseline);
- ``dask-csv-*``: the CSV on Dask, one partition, 100,000, 25,000 and 10,000 rows per partition;
- ``local-parquet`` and ``dask-parquet-100k``: the Parquet copy, for comparison.

Prints the median, minimum and maximum seconds of each and its median over the baseline's, and
as the last line one JSON object of the medians.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    arguments = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="csv-dask-"))
    os.environ.update(
        {
            "PRIVRELEASE_WORK_DIR": str(work / "work"),
            "PRIVRELEASE_AUTO_INIT": "true",
            "DASK_LOGGING__DISTRIBUTED": "error",
        }
    )
    os.environ.pop("PRIVRELEASE_DB_URL", None)
    import dp_accounting  # noqa: F401  (imported before the clock, as a running service has it)
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq
    from distributed import Client, LocalCluster

    import privrelease.flows.partitions  # noqa: F401
    import privrelease.flows.scaled  # noqa: F401
    from privrelease.demo import DATA_FILE, write_demo
    from privrelease.flows.steps import release_plain

    policy, data = write_demo(work / "demo", rows=arguments.rows, seed=3)
    text = policy.read_text().replace("lifetime_budget: {epsilon: 20,", "lifetime_budget: {epsilon: 100,")
    pq.write_table(pcsv.read_csv(data), work / "demo" / "demo.parquet", row_group_size=100_000)
    parquet = (  # other bytes: another dataset identity (and so another policy name)
        text.replace("name: demo-census", "name: demo-census-parquet")
        .replace("id: demo-census", "id: demo-census-parquet")
        .replace("format: csv", "format: parquet")
        .replace(DATA_FILE, "demo.parquet")
        .replace('  csv: {delimiter: ",", header: true, encoding: utf-8}\n', "")
    )
    logging.getLogger("distributed").setLevel(logging.ERROR)
    with (
        LocalCluster(
            n_workers=arguments.workers,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
            silence_logs=logging.CRITICAL,
        ) as cluster,
        Client(cluster) as client,
    ):
        client.run(lambda: __import__("privrelease.flows.partitions") and __import__("privrelease.mechanisms.sdgs"))
        address = cluster.scheduler_address

        def dask(rows: int | None) -> str:
            per = "" if rows is None else f", rows_per_partition: {rows}"
            return f"engine: {{name: dask, address: '{address}'{per}}}\n"

        configurations: dict[str, tuple[str, str]] = {
            "local": (text, ""),
            "dask-csv-1-partition": (text, dask(None)),
            "dask-csv-100k": (text, dask(100_000)),
            "dask-csv-25k": (text, dask(25_000)),
            "dask-csv-10k": (text, dask(10_000)),
            "local-parquet": (parquet, ""),
            "dask-parquet-100k": (parquet, dask(100_000)),
        }

        def run(name: str) -> float:
            body, engine = configurations[name]
            path = work / "demo" / f"{name}.yaml"
            path.write_text(body + engine)
            start = time.perf_counter()
            release_plain(policy_path=str(path), out_dir=str(work / "out" / f"{name}-{time.monotonic_ns()}"))
            return time.perf_counter() - start

        for name in configurations:  # warm-up: the workers' first task, the policies registered
            run(name)
        seconds: dict[str, list[float]] = {name: [] for name in configurations}
        for _ in range(arguments.repeats):
            for name in configurations:
                seconds[name].append(run(name))
    baseline = statistics.median(seconds["local"])
    medians: dict[str, Any] = {"rows": arguments.rows, "workers": arguments.workers}
    for name, times in seconds.items():
        median = statistics.median(times)
        medians[name] = round(median, 4)
        print(f"{name:22s} median {median:.3f} s  min {min(times):.3f}  max {max(times):.3f}  x{median / baseline:.2f}")
    print(json.dumps(medians))


if __name__ == "__main__":
    main()
