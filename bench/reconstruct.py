"""Benchmark: count estimation on a table published by SPLU-Gen (Fu et al. 2014).

    python bench/reconstruct.py [--rows N] [--queries Q] [--baseline-queries B] [--repeat R]

Publishes a bootstrap of ``../shared/data/adult/adult.csv`` (N rows, default 100,000; age in
decades, 7 more non-sensitive columns, occupation sensitive, gamma = 5) with ``splu_gen``, draws
Q queries (default 5,000) like the paper's query pool (Section 6.1): 1 to 3 non-sensitive
conditions, their values taken from a random published row, and a random occupation. Times:

- ours: ``PublishedTable`` (encode the table once) + ``estimate_many`` (all queries in one
  batch), median of R runs, each on a fresh ``PublishedTable``;
- baseline: a naive per-query filter: for each query, boolean masks over the columns for each of
  the 4 sub-conjunctions it needs, then its own reconstruction (the same ``reconstruct``, one
  query at a time); run on the first B queries (default 1,000) and scaled to Q.

The baseline's observed counts and estimates must equal ours. Prints a table and, as the last
line, one JSON object: ``seconds`` (ours, median; target < 1), ``baseline_seconds`` (scaled to Q
queries), ``baseline_measured_seconds``, ``ratio`` (seconds / baseline_seconds),
``peak_rss_mb``, and the mean relative error by selectivity.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))

from splu import load_bootstrap  # noqa: E402  (the bootstrap of bench/splu.py)

from privrelease.mechanisms import randomness  # noqa: E402
from privrelease.mechanisms.reconstruction import CountQuery, PublishedTable, reconstruct  # noqa: E402
from privrelease.mechanisms.splu import splu_gen  # noqa: E402

GAMMA = 5
SENSITIVE = "occupation"


def draw_queries(table: pa.Table, count: int) -> list[CountQuery]:
    non_sensitive = [name for name in table.column_names if name != SENSITIVE]
    columns = {name: table[name].cast(pa.string()).to_pylist() for name in table.column_names}
    occupations = sorted(set(columns[SENSITIVE]))
    rows = randomness.uniform_below(count, table.num_rows).tolist()
    widths = (1 + randomness.uniform_below(count, 3)).tolist()
    picks = randomness.uniform_below(count * 3, len(non_sensitive)).reshape(count, 3).tolist()
    values = randomness.uniform_below(count, len(occupations)).tolist()
    queries = []
    for row, width, pick, value in zip(rows, widths, picks, values, strict=True):
        chosen = list(dict.fromkeys(non_sensitive[p] for p in pick))[:width]
        queries.append(CountQuery.of({c: columns[c][row] for c in chosen}, {SENSITIVE: occupations[value]}))
    return queries


def naive(table: pa.Table, queries: list[CountQuery]) -> list[tuple[int, float]]:
    """Per query: filter the rows with a mask per condition, count the four sub-conjunctions,
    reconstruct that one query."""
    codes, lookup = {}, {}
    for name in table.column_names:
        encoded = pc.dictionary_encode(table[name].cast(pa.string())).combine_chunks()
        codes[name] = encoded.indices.to_numpy()
        lookup[name] = {value: code for code, value in enumerate(encoded.dictionary.to_pylist())}
    answers = []
    for query in queries:
        p = np.ones(table.num_rows, dtype=bool)
        for column, value in query.where:
            p &= codes[column] == lookup[column][value]
        ((column, value),) = query.sensitive
        s = codes[column] == lookup[column][value]
        both = int(np.count_nonzero(p & s))
        y = np.array([table.num_rows - p.sum() - s.sum() + both, s.sum() - both, p.sum() - both, both], dtype=float)
        answers.append((both, float(reconstruct(y, GAMMA, table.num_rows).x[-1])))
    return answers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=5_000)
    parser.add_argument("--baseline-queries", type=int, default=1_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    original = load_bootstrap(args.rows)
    published = splu_gen(original, SENSITIVE, GAMMA).table
    queries = draw_queries(published, args.queries)

    def ours() -> list:
        return PublishedTable(published, GAMMA).estimate_many(queries)

    ours()  # warm-up
    times = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        estimates = ours()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    encode_start = time.perf_counter()
    PublishedTable(published, GAMMA)
    encode_seconds = time.perf_counter() - encode_start

    subset = queries[: args.baseline_queries]
    start = time.perf_counter()
    answers = naive(published, subset)
    measured = time.perf_counter() - start
    baseline_seconds = measured * len(queries) / len(subset)
    for estimate, (observed, value) in zip(estimates, answers, strict=False):
        assert estimate.observed == observed, "baseline and ours disagree on a count"
        assert abs(estimate.estimate - value) <= 1e-6 * max(1.0, abs(value)), "baseline and ours disagree"

    truth = np.array([e.observed for e in PublishedTable(original, GAMMA).estimate_many(queries)], dtype=float)
    estimate = np.array([e.estimate for e in estimates])
    relative = np.abs(estimate - truth) / np.maximum(truth, 1)
    bands = {}
    for low, high in ((0.02, 1.0), (0.01, 0.02), (0.005, 0.01)):
        band = (truth >= low * args.rows) & (truth < high * args.rows)
        bands[f"{low:g}-{high:g}"] = {
            "queries": int(band.sum()),
            "mean_relative_error": round(float(relative[band].mean()), 4) if band.any() else None,
        }
    small = (truth >= 1) & (truth <= 10)
    bands["count 1-10"] = {"queries": int(small.sum()), "mean_relative_error": round(float(relative[small].mean()), 4)}
    iterations = np.array([e.iterations for e in estimates])
    converged = sum(e.converged for e in estimates)

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"Count estimation, {args.rows:,} published rows (gamma = {GAMMA}), {len(queries):,} queries "
          f"(1-3 non-sensitive conditions + occupation)")  # fmt: skip
    print(f"{'run':60} {'seconds':>9}")
    print(f"{'ours: encode + estimate_many, median (target < 1 s)':60} {seconds:9.3f}")
    print(f"{'   of which encoding the table':60} {encode_seconds:9.3f}")
    print(f"{f'baseline: per-query filter + reconstruct, {len(subset):,} queries':60} {measured:9.3f}")
    print(f"{f'baseline scaled to {len(queries):,} queries':60} {baseline_seconds:9.3f}")
    print(f"ratio ours / baseline: {seconds / baseline_seconds:.4f}; converged {converged}/{len(queries)}; "
          f"iterations median {np.median(iterations):.0f}, max {iterations.max()}; peak RSS {peak:.0f} MB")  # fmt: skip
    for name, band in bands.items():
        print(f"  selectivity {name}: {band['queries']} queries, mean relative error {band['mean_relative_error']}")
    print(
        json.dumps(
            {
                "rows": args.rows,
                "queries": len(queries),
                "seconds": round(seconds, 4),
                "encode_seconds": round(encode_seconds, 4),
                "baseline_seconds": round(baseline_seconds, 4),
                "baseline_measured_seconds": round(measured, 4),
                "baseline_queries": len(subset),
                "ratio": round(seconds / baseline_seconds, 5),
                "peak_rss_mb": round(peak),
                "relative_error": bands,
            }
        )
    )


if __name__ == "__main__":
    main()
