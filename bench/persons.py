"""Benchmark: an in-process release of a Parquet file with a person column, streamed row group by
row group (two passes, :func:`privrelease.flows.scaled.stream_partials`) against the same release
read as one table (the baseline, in the same run).

    python bench/persons.py [--rows N] [--persons P] [--repeat R]

Writes N rows (default 10,000,000; row groups of 1 M rows) of P persons (default 2,000,000:
about 5 rows each) with integer ids, a county (50 values), a diagnosis (5) and charges, twice:
``spread`` (each row's person drawn at random, so a person's rows sit in several row groups) and
``clustered`` (sorted by person, as a file exported per patient is). The policy: noisy counts by
county x diagnosis and noisy sums of charges by county, ``person: {column: patient_id, max_rows:
3}``. Each release runs in a fresh process with imports done and the audit database created
before the clock (:func:`privrelease.flows.steps.release_plain`); the one-table baseline is the
same release with the streamed read switched off. The two alternate ``--repeat`` times (default
1) and the medians are printed, with, as the last line, one JSON object: per layout
``seconds``, ``cpu_seconds`` and ``peak_rss_mb`` of each read (``streamed``, ``one_table``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH))

import scale  # noqa: E402  (bench/scale.py: a release in a fresh process)

ROW_GROUP = 1_000_000
COUNTIES = [f"c{i:02d}" for i in range(50)]
DIAGNOSES = ["a", "b", "c", "d", "e"]


def write_data(folder: Path, rows: int, persons: int, clustered: bool) -> Path:
    """The file (bench data: numpy's generator, not a mechanism) and its policy beside it."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(1)
    person = rng.integers(0, persons, rows)
    if clustered:
        person.sort()
    counties, diagnoses = np.array(COUNTIES), np.array(DIAGNOSES)
    folder.mkdir(parents=True)
    schema = pa.schema(
        [("patient_id", pa.int64()), ("county", pa.string()), ("diagnosis", pa.string()), ("charges", pa.int64())]
    )
    with pq.ParquetWriter(folder / "visits.parquet", schema) as writer:
        for start in range(0, rows, ROW_GROUP):
            size = min(ROW_GROUP, rows - start)
            columns = [
                person[start : start + size],
                counties[rng.integers(0, len(COUNTIES), size)],
                diagnoses[rng.integers(0, len(DIAGNOSES), size)],
                rng.integers(0, 50_000, size),
            ]
            writer.write_table(pa.table(columns, schema=schema))
    policy = folder / "visits.yaml"
    policy.write_text(
        f"""name: bench-persons
version: "1"
dataset:
  id: bench-persons
  path: visits.parquet
  person: {{column: patient_id, max_rows: 3}}
  columns:
    patient_id: {{type: integer}}
    county: {{type: string, values: [{", ".join(COUNTIES)}]}}
    diagnosis: {{type: string, values: [{", ".join(DIAGNOSES)}]}}
    charges: {{type: integer}}
generalization:
  county: keep
  diagnosis: keep
mechanisms:
  - {{name: counts, type: noisy_counts, columns: [county, diagnosis], noise: {{distribution: gaussian, sigma: 30}}}}
  - name: charges
    type: noisy_sums
    column: charges
    bounds: [0, 50000]
    by: [county]
    noise: {{distribution: gaussian, sigma_total: 200000, sigma_count: 30}}
targets:
  accounting: approximate
  delta: 1.0e-6
  lifetime_budget: {{epsilon: 100, delta: 1.0e-5}}
"""
    )
    return policy


def run_once(policy: Path, read: str) -> dict:
    """One release in this process: ``streamed`` as privrelease runs it, or ``one_table``."""
    import resource

    import dp_accounting  # noqa: F401  (imported before the clock, as in bench/scale.py)

    from privrelease.flows import data, outputs
    from privrelease.flows.steps import release_plain

    if read == "one_table":
        data.streams = outputs.streams = lambda run: False
    cpu, start = time.process_time(), time.perf_counter()
    release_plain(policy_path=str(policy))
    return {
        "seconds": time.perf_counter() - start,
        "cpu_seconds": time.process_time() - cpu,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def spawn(policy: Path, read: str, work: Path) -> dict:
    env = {**os.environ, **scale.QUIET, "PRIVRELEASE_WORK_DIR": str(work), "PRIVRELEASE_DATA_ROOTS": str(policy.parent)}
    return scale.fresh_run([sys.executable, __file__, "--run", read, str(policy)], env, read)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--persons", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--run", choices=["streamed", "one_table"], help=argparse.SUPPRESS)
    parser.add_argument("policy", nargs="?", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run:
        print(json.dumps(run_once(args.policy, args.run)))
        return
    figures: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-persons-") as tmp:
        for layout in ("spread", "clustered"):
            policy = write_data(Path(tmp) / layout, args.rows, args.persons, layout == "clustered")
            runs: dict[str, list[dict]] = {"streamed": [], "one_table": []}
            for index in range(args.repeat):
                for read in ("one_table", "streamed"):
                    runs[read].append(spawn(policy, read, Path(tmp) / f"work-{layout}-{read}-{index}"))
            figures[layout] = {
                read: {key: round(statistics.median(run[key] for run in done), 2) for key in done[0]}
                for read, done in runs.items()
            }
            for read, median in figures[layout].items():
                print(
                    f"{layout}, {read}: {median['seconds']:.2f} s, CPU {median['cpu_seconds']:.2f} s, "
                    f"peak RSS {median['peak_rss_mb']:.0f} MB (median of {args.repeat})",
                    flush=True,
                )
    print(json.dumps({"rows": args.rows, "persons": args.persons, "repeat": args.repeat, **figures}))


if __name__ == "__main__":
    main()
