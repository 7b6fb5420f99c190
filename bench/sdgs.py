"""Benchmark: (k, beta)-SDGS on a bootstrap of the real Adult data, against DuckDB SQL.

    python bench/sdgs.py [--rows N] [--repeat R]

Bootstraps ``../shared/data/adult/adult.csv`` (rows resampled with replacement) to an N-row
Parquet file in a temporary directory, then, for beta = 0.1 and 0.5 with k = 20 and the
level-1 ARX hierarchies of 8 columns (sex, age, race, marital-status, education,
native-country, workclass, occupation), times end to end, each run in a fresh process:

- ours: the path of an in-process release of a Parquet file whose mechanisms all have a job:
  ``read_row_groups`` (the file's bytes read once, row groups decoded and checked one at a
  time) -> ``streamed_sdgs`` (per row group: Bernoulli sample, generalize, count cells; then
  the counts merged, cells below k suppressed, the rows in random pieces, each shuffled) ->
  ``write_table`` (the flow's writer: one Parquet file, a row group per piece, each written
  while the next is computed; dictionary-encoded columns);
- baseline: a hand-written DuckDB SQL script on the same file: Bernoulli sample, joins to the
  hierarchy tables, GROUP BY / HAVING count(*) >= k joined back, ORDER BY random(), COPY to
  Parquet (DuckDB with its default threads).

Runs alternate (ours, baseline, ours, ...) and the median of ``--repeat`` runs is reported,
with the spread: the fastest and slowest run of each side and the range of the ratios of the
alternated pairs (run i of ours / run i of the baseline; the machine is shared, so one pair
sees one load). Both outputs are checked: every published cell has at least k rows. Prints a
table and, as the last line, one JSON object: ``seconds`` (ours, median, at the slower beta),
``baseline_seconds`` (baseline at that beta), ``ratio`` (worst median ours / median baseline
over the betas; target <= TARGET_RATIO = 0.6, issue 18), ``peak_rss_mb`` (largest peak RSS of
our runs; target < 1536), and per-beta detail (``pair_ratios``: min, median, max).
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ADULT = REPO.parent / "shared" / "data" / "adult"
COLUMNS = {
    "sex": "string",
    "age": "integer",
    "race": "string",
    "marital-status": "string",
    "education": "string",
    "native-country": "string",
    "workclass": "string",
    "occupation": "string",
}
BETAS = (0.1, 0.5)
K = 20
EPSILON = 1.0
BOOTSTRAP_BATCH = 1_000_000
TARGET_RATIO = 0.6
"""Our end-to-end time over DuckDB's, at each beta (issue 18 item 8)."""


def hierarchy(column: str) -> list[tuple[str, str]]:
    """(leaf, level-1 label) pairs of ARX's hierarchy file for ``column``."""
    with open(ADULT / f"adult_hierarchy_{column}.csv", newline="", encoding="utf-8") as handle:
        return [(row[0], row[1]) for row in csv.reader(handle, delimiter=";") if row]


def bootstrap(rows: int, path: Path) -> None:
    """``rows`` rows drawn with replacement from adult.csv (bench data: numpy's default
    generator, not a mechanism), written as Parquet in row groups of 1 M rows."""
    import numpy as np
    import pyarrow.parquet as pq

    from privrelease.datasets import read_dataset

    source = read_dataset(ADULT / "adult.csv", format="csv", columns=COLUMNS, delimiter=";").table
    rng = np.random.default_rng()
    with pq.ParquetWriter(path, source.schema) as writer:
        for start in range(0, rows, BOOTSTRAP_BATCH):
            size = min(BOOTSTRAP_BATCH, rows - start)
            writer.write_table(source.take(rng.integers(0, source.num_rows, size)))


def run_ours(data: Path, out: Path, beta: float) -> int:
    from privrelease.datasets import read_row_groups
    from privrelease.flows.outputs import write_table
    from privrelease.mechanisms.partitioned import streamed_sdgs
    from privrelease.mechanisms.schemes import ValueMap

    schemes = {column: ValueMap(tuple(hierarchy(column))) for column in COLUMNS}
    tables = (read.table for read in read_row_groups(data, columns=COLUMNS))
    result = streamed_sdgs(tables, schemes, k=K, beta=beta, epsilon=EPSILON)
    return write_table(result.table, out, "parquet")


def baseline_sql(data: Path, out: Path, beta: float) -> str:
    columns = ", ".join(f'"{name}"' for name in COLUMNS)
    labels = ", ".join(f'"h_{name}".label AS "{name}"' for name in COLUMNS)
    joins = "\n".join(f'JOIN "h_{name}" ON s."{name}" = "h_{name}".leaf' for name in COLUMNS)
    return f"""
COPY (
  WITH s AS (SELECT * FROM read_parquet('{data}') USING SAMPLE {beta * 100}% (bernoulli)),
  g AS (SELECT {labels} FROM s
{joins}),
  big AS (SELECT {columns} FROM g GROUP BY {columns} HAVING count(*) >= {K})
  SELECT g.* FROM g JOIN big USING ({columns}) ORDER BY random()
) TO '{out}' (FORMAT parquet)"""


def run_baseline(data: Path, out: Path, beta: float) -> int:
    import duckdb

    con = duckdb.connect()
    for name, kind in COLUMNS.items():
        leaf_type = "BIGINT" if kind == "integer" else "VARCHAR"
        con.execute(
            f'CREATE TEMP TABLE "h_{name}" AS SELECT CAST(column0 AS {leaf_type}) AS leaf,'
            f" column1 AS label FROM read_csv('{ADULT / f'adult_hierarchy_{name}.csv'}',"
            " delim=';', header=false, all_varchar=true)"
        )
    con.execute(baseline_sql(data, out, beta))
    row = con.execute(f"SELECT count(*) FROM read_parquet('{out}')").fetchone()
    assert row is not None, "count(*) returns one row"
    return row[0]


def worker(kind: str, data: Path, out: Path, beta: float) -> None:
    """One timed run in this (fresh) process, imports done before the clock starts; prints
    one JSON line."""
    modules = ("privrelease.flows.outputs", "privrelease.mechanisms.partitioned") if kind == "ours" else ("duckdb",)
    for module in modules:
        importlib.import_module(module)
    start = time.perf_counter()
    rows_out = (run_ours if kind == "ours" else run_baseline)(data, out, beta)
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "peak_rss_mb": peak_mb, "rows_out": rows_out}))


def spawn(kind: str, data: Path, out: Path, beta: float) -> dict:
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
        str(beta),
    ]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def smallest_cell(path: Path) -> int:
    import duckdb

    columns = ", ".join(f'"{name}"' for name in COLUMNS)
    query = f"SELECT min(n) FROM (SELECT count(*) AS n FROM read_parquet('{path}') GROUP BY {columns})"
    row = duckdb.connect().execute(query).fetchone()
    assert row is not None, "min() returns one row"
    return row[0] or 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--worker", choices=["ours", "baseline"], help=argparse.SUPPRESS)
    parser.add_argument("--data", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--beta", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.data, args.out, args.beta)
        return
    if not (ADULT / "adult.csv").is_file():
        sys.exit(f"Adult data not found at {ADULT}")

    with tempfile.TemporaryDirectory(prefix="bench-sdgs-") as tmp:
        data = Path(tmp) / "adult_bootstrap.parquet"
        start = time.perf_counter()
        bootstrap(args.rows, data)
        print(
            f"bootstrap: {args.rows:,} rows, {data.stat().st_size / 2**20:.1f} MiB Parquet"
            f" in {time.perf_counter() - start:.1f} s; k={K}, {len(COLUMNS)} columns (level-1 ARX hierarchies)"
        )
        results = {}
        spreads: dict[float, tuple[float, float, float]] = {}
        for beta in BETAS:
            runs: dict[str, list[dict]] = {"ours": [], "baseline": []}
            for _ in range(args.repeat):
                for kind, kind_runs in runs.items():
                    kind_runs.append(spawn(kind, data, Path(tmp) / f"{kind}.parquet", beta))
            pairs = sorted(o["seconds"] / b["seconds"] for o, b in zip(runs["ours"], runs["baseline"]))
            results[beta] = {
                kind: {
                    "seconds": statistics.median(run["seconds"] for run in kind_runs),
                    "fastest": min(run["seconds"] for run in kind_runs),
                    "slowest": max(run["seconds"] for run in kind_runs),
                    "peak_rss_mb": max(run["peak_rss_mb"] for run in kind_runs),
                    "rows_out": kind_runs[-1]["rows_out"],
                    "smallest_cell": smallest_cell(Path(tmp) / f"{kind}.parquet"),
                }
                for kind, kind_runs in runs.items()
            }
            spreads[beta] = (pairs[0], statistics.median(pairs), pairs[-1])

    print(
        f"\n{'beta':>5} {'ours s':>8} {'(min-max)':>13} {'duckdb s':>9} {'(min-max)':>13} {'ratio':>6}"
        f" {'pairs min-max':>13} {'ours rows':>10} {'duckdb rows':>11} {'min cell':>9} {'ours MB':>8} {'duckdb MB':>9}"
    )
    for beta, result in results.items():
        ours, base = result["ours"], result["baseline"]
        low, _, high = spreads[beta]
        print(
            f"{beta:>5} {ours['seconds']:>8.3f} {ours['fastest']:>6.3f}-{ours['slowest']:<6.3f}"
            f" {base['seconds']:>9.3f} {base['fastest']:>6.3f}-{base['slowest']:<6.3f}"
            f" {ours['seconds'] / base['seconds']:>6.2f} {low:>6.2f}-{high:<6.2f} {ours['rows_out']:>10,} {base['rows_out']:>11,} {min(ours['smallest_cell'], base['smallest_cell']):>9}"
            f" {ours['peak_rss_mb']:>8.0f} {base['peak_rss_mb']:>9.0f}"
        )
    assert all(r[kind]["smallest_cell"] >= K or r[kind]["rows_out"] == 0 for r in results.values() for kind in r)
    slowest = max(BETAS, key=lambda beta: results[beta]["ours"]["seconds"])
    summary = {
        "rows": args.rows,
        "k": K,
        "repeat": args.repeat,
        "seconds": round(results[slowest]["ours"]["seconds"], 3),
        "baseline_seconds": round(results[slowest]["baseline"]["seconds"], 3),
        "ratio": round(
            max(r["ours"]["seconds"] / r["baseline"]["seconds"] for r in results.values()),
            3,
        ),
        "target_ratio": TARGET_RATIO,
        "peak_rss_mb": round(max(r["ours"]["peak_rss_mb"] for r in results.values())),
        "per_beta": {
            str(beta): {
                **{kind: {key: round(value, 3) for key, value in r[kind].items()} for kind in r},
                "pair_ratios": [round(value, 3) for value in spreads[beta]],
            }
            for beta, r in results.items()
        },
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
