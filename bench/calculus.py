"""Benchmark of the SDGS calculus (not a test): Table 1, the 1,100-cell grid, k calibration and
the whole `privrelease guarantee sdgs` process, against a plain per-n scipy loop measured in
the same run. Last line: one JSON object of the figures."""

from __future__ import annotations

import json
import math
import resource
import subprocess
import sys
import time

import numpy as np
from scipy.stats import binom

from privrelease.mechanisms.sdgs_calibration import smallest_k
from privrelease.mechanisms.sdgs_math import exact_grid, theorem1_grid


def best_of(function, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def baseline_theorem1(k: int, beta: float, eps: float) -> float:
    """The straightforward loop: scipy's binom.sf per n until the Chernoff bound stops it."""
    gamma = (math.exp(eps) - 1 + beta) / math.exp(eps)
    kl = gamma * math.log(gamma / beta) + (1 - gamma) * math.log((1 - gamma) / (1 - beta))
    best, n = 0.0, math.ceil(k / gamma - 1)
    while best == 0.0 or -n * kl >= math.log(best):
        best = max(best, float(binom.sf(math.floor(gamma * n), n, beta)))
        n += 1
    return best


def main() -> None:
    table_beta, table_eps = (a.ravel() for a in np.meshgrid([0.05, 0.1, 0.2], [0.25, 0.5, 0.75, 1.0, 1.5, 2.0]))
    grid = [a.ravel() for a in np.meshgrid(np.arange(5, 51, 5), np.linspace(0.01, 0.36, 11), np.linspace(0.5, 3, 10))]

    table1 = best_of(lambda: (theorem1_grid(20, table_beta, table_eps), exact_grid(20, table_beta, table_eps)))
    grid_seconds = best_of(lambda: (theorem1_grid(*grid), exact_grid(*grid)), repeats=3)
    baseline_table1 = best_of(lambda: [baseline_theorem1(20, b, e) for b, e in zip(table_beta, table_eps)], repeats=3)
    baseline_grid = best_of(lambda: [baseline_theorem1(int(k), b, e) for k, b, e in zip(*grid)], repeats=1)

    calibrations = [(b, e, d) for b in (0.01, 0.1, 0.36) for e in (0.5, 1.0, 3.0) for d in (1e-6, 1e-30)]
    calibrate_worst = max(
        best_of(lambda b=b, e=e, d=d: smallest_k(b, e, d, "probabilistic"), repeats=3) for b, e, d in calibrations
    )

    args = [
        "guarantee",
        "sdgs",
        "--k",
        ",".join(str(int(k)) for k in range(5, 51, 5)),
        "--beta",
        ",".join(f"{b:.3f}" for b in np.linspace(0.01, 0.36, 11)),
        "--epsilon",
        ",".join(f"{e:.4f}" for e in np.linspace(0.5, 3, 10)),
        "--json",
    ]
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "privrelease", *args], check=True, capture_output=True)
    process_seconds = time.perf_counter() - start

    rows = [
        ("Table 1, both deltas (18 cells)", table1, baseline_table1, 0.005),
        ("grid k=5..50 x beta x eps, both deltas (1,100 cells)", grid_seconds, baseline_grid, 0.100),
        ("calibrate k, worst of 18 (eps, delta >= 1e-30, beta)", calibrate_worst, None, 0.020),
        ("`privrelease guarantee sdgs` process for the grid", process_seconds, None, 4.0),
    ]
    print(f"{'figure':58} {'ours':>10} {'baseline':>10} {'target':>8}")
    for name, ours, base, target in rows:
        base_text = f"{base * 1000:8.1f}ms" if base is not None else f"{'-':>10}"
        print(f"{name:58} {ours * 1000:8.1f}ms {base_text} {target * 1000:6.0f}ms")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps(
            {
                "seconds": grid_seconds,
                "baseline_seconds": baseline_grid,
                "ratio": grid_seconds / baseline_grid,
                "table1_seconds": table1,
                "table1_baseline_seconds": baseline_table1,
                "calibrate_k_worst_seconds": calibrate_worst,
                "process_seconds": process_seconds,
                "peak_rss_mb": peak,
            }
        )
    )


if __name__ == "__main__":
    main()
