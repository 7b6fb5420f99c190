"""Benchmark of the after-the-data count intervals (not a test): 10^5 published cells, with
realistic repeated counts and in the worst case of 10^5 distinct counts, at several beta. Last
line: one JSON object of the figures (seconds, best of 3)."""

from __future__ import annotations

import json
import time

import numpy as np

from privrelease.mechanisms.count_intervals import count_intervals

CELLS = 100_000


def best_of(counts: np.ndarray, k: int, beta: float, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        count_intervals(counts, k, beta)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    rng = np.random.default_rng()
    figures: dict[str, float] = {}
    k = 20
    for beta in (0.05, 0.1, 0.3, 0.9):
        realistic = k + rng.geometric(0.02, CELLS)  # many small cells, a long tail
        distinct = np.arange(k, k + CELLS)
        figures[f"repeated_beta_{beta:g}"] = best_of(realistic, k, beta)
        figures[f"distinct_beta_{beta:g}"] = best_of(distinct, k, beta)
        print(
            f"beta {beta:g}: {CELLS:,} cells, repeated counts {figures[f'repeated_beta_{beta:g}']:.3f} s, "
            f"all distinct {figures[f'distinct_beta_{beta:g}']:.3f} s"
        )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
