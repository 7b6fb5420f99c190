"""Benchmark: SPLU-Gen (Fu et al. 2014) on a bootstrap of the real Adult data.

    python bench/splu.py [--rows N] [--gamma G] [--repeat R]

Bootstraps ``../shared/data/adult/adult.csv`` (30,162 rows, rows resampled with replacement by
the OS CSPRNG) to N rows (default 1,000,000): age in decades and 7 more non-sensitive columns,
dictionary-encoded as generalized categorical data is (Parquet and CSV readers give these), and
occupation as the sensitive column. Times, in this process:

- ours: ``splu_gen`` (eligibility, random drop to a multiple of gamma, decoy partition,
  randomization, shuffled output table), median of R runs; also with plain string columns;
- baseline: a straightforward implementation, Anatomy's group creation as written (a heap of
  buckets; one Python iteration per decoy group takes a row from each of the gamma largest
  buckets), then the same vectorized randomization and shuffle; one run;
- floor: shuffling the table alone (one CSPRNG permutation and a take).

Every output is checked (row count; each group of the baseline holds gamma distinct values).
Prints a table and, as the last line, one JSON object: ``seconds`` (ours, median, dictionary
columns; target < 0.5), ``baseline_seconds``, ``ratio`` (seconds / baseline_seconds),
``string_columns_seconds``, ``shuffle_only_seconds``, ``peak_rss_mb``.
"""

from __future__ import annotations

import argparse
import heapq
import json
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from privrelease.mechanisms import randomness
from privrelease.mechanisms.splu import encode_column, splu_gen

T = TypeVar("T")

REPO = Path(__file__).resolve().parents[1]
ADULT = REPO.parent / "shared" / "data" / "adult" / "adult.csv"
SENSITIVE = "occupation"


def load_bootstrap(rows: int) -> pa.Table:
    """N rows resampled from ARX's Adult extract; age generalized to decades; every column
    dictionary-encoded."""
    if not ADULT.is_file():
        sys.exit(f"Adult data not found at {ADULT}")
    source = pacsv.read_csv(
        ADULT,
        parse_options=pacsv.ParseOptions(delimiter=";"),
        convert_options=pacsv.ConvertOptions(column_types={"age": pa.int64()}),
    )
    decade = pc.multiply(pc.divide(source["age"], 10), 10)
    age = pc.binary_join_element_wise(pc.cast(decade, pa.string()), pc.cast(pc.add(decade, 9), pa.string()), "-")
    source = source.set_column(source.column_names.index("age"), "age", age)
    sample = pa.array(randomness.uniform_below(rows, source.num_rows))
    return pa.table({name: pc.dictionary_encode(source[name].take(sample)) for name in source.column_names})


def as_strings(table: pa.Table) -> pa.Table:
    return pa.table({name: table[name].cast(pa.string()) for name in table.column_names})


def anatomy_baseline(table: pa.Table, column: str, gamma: int) -> pa.Table:
    """Anatomy's group creation (Xiao & Tao 2006, as adopted by Fu et al. 6.1), straightforwardly:
    one Python iteration per group pops the gamma largest buckets from a heap and takes the row
    with the smallest id from each; then each row draws a decoy and the rows are shuffled."""
    codes, dictionary = encode_column(table.column(column), column)
    n = codes.size - codes.size % gamma
    codes = codes[:n]
    order = np.argsort(codes, kind="stable")
    counts = np.bincount(codes)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    next_row = starts.copy()
    heap = [(-int(count), int(value)) for value, count in enumerate(counts) if count]
    heapq.heapify(heap)
    groups = np.empty((n // gamma, gamma), dtype=np.int64)
    for group in range(n // gamma):
        largest = [heapq.heappop(heap) for _ in range(gamma)]
        for slot, (_, value) in enumerate(largest):
            groups[group, slot] = order[next_row[value]]
            next_row[value] += 1
        for negative, value in largest:
            if negative + 1 < 0:
                heapq.heappush(heap, (negative + 1, value))
    members = codes[groups]
    assert np.all(np.diff(np.sort(members, axis=1), axis=1) > 0), "baseline: repeated value in a group"
    chosen = members[np.arange(members.shape[0])[:, None], randomness.uniform_below(n, gamma).reshape(-1, gamma)]
    new_codes = np.empty(n, dtype=codes.dtype)
    new_codes[groups.ravel()] = chosen.ravel()
    shuffle = randomness.permutation(n)
    output = table.slice(0, n).take(pa.array(shuffle))
    published = dictionary.take(pa.array(new_codes[shuffle]))
    if pa.types.is_dictionary(table.column(column).type):
        published = pc.dictionary_encode(published)
    return output.set_column(output.column_names.index(column), column, published)


def timed(function: Callable[[], T], repeat: int) -> tuple[float, float, T]:
    assert repeat >= 1, f"repeat must be >= 1; got {repeat}"
    times, results = [], []
    for _ in range(repeat):
        start = time.perf_counter()
        results.append(function())
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times), results[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--gamma", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    table = load_bootstrap(args.rows)
    strings = as_strings(table)
    expected_rows = args.rows - args.rows % args.gamma

    splu_gen(table, SENSITIVE, args.gamma)  # warm-up (imports, first-touch allocations)
    seconds, best, result = timed(lambda: splu_gen(table, SENSITIVE, args.gamma), args.repeat)
    assert isinstance(result.table, pa.Table) and result.table.num_rows == expected_rows
    string_seconds, string_best, string_result = timed(lambda: splu_gen(strings, SENSITIVE, args.gamma), args.repeat)
    assert isinstance(string_result.table, pa.Table) and string_result.table.num_rows == expected_rows
    shuffle_seconds, _, _ = timed(lambda: table.take(pa.array(randomness.permutation(table.num_rows))), args.repeat)
    baseline_seconds, _, baseline = timed(lambda: anatomy_baseline(table, SENSITIVE, args.gamma), 1)
    assert baseline.num_rows == expected_rows

    truth = {d["values"]: d["counts"] for d in pc.value_counts(table[SENSITIVE].cast(pa.string())).to_pylist()}
    published = {
        d["values"]: d["counts"] for d in pc.value_counts(result.table[SENSITIVE].cast(pa.string())).to_pylist()
    }
    worst = max(abs(published.get(v, 0) - c) / c for v, c in truth.items() if c >= 0.01 * args.rows)

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"SPLU-Gen, {args.rows:,} rows, gamma = {args.gamma}, sensitive = {SENSITIVE}, "
          f"{len(table.column_names) - 1} non-sensitive columns")  # fmt: skip
    print(f"{'run':58} {'median':>9} {'best':>9}")
    print(f"{'ours, dictionary columns (target < 0.5 s)':58} {seconds:8.3f}s {best:8.3f}s")
    print(f"{'ours, plain string columns':58} {string_seconds:8.3f}s {string_best:8.3f}s")
    print(f"{'floor: shuffle the table only':58} {shuffle_seconds:8.3f}s")
    print(f"{'baseline: Anatomy group creation, a loop per group':58} {baseline_seconds:8.3f}s")
    print(f"ratio ours / baseline: {seconds / baseline_seconds:.3f}; largest relative error of a published "
          f"count with selectivity >= 1%: {worst:.4f}; peak RSS {peak:.0f} MB")  # fmt: skip
    print(
        json.dumps(
            {
                "rows": args.rows,
                "gamma": args.gamma,
                "seconds": round(seconds, 4),
                "baseline_seconds": round(baseline_seconds, 4),
                "ratio": round(seconds / baseline_seconds, 4),
                "string_columns_seconds": round(string_seconds, 4),
                "shuffle_only_seconds": round(shuffle_seconds, 4),
                "peak_rss_mb": round(peak),
            }
        )
    )


if __name__ == "__main__":
    main()
