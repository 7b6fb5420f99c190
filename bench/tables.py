"""Benchmark: tables that add up (mechanisms/tables.py) on a census-like workload of 10^6 cells.

    python bench/tables.py [--counties N] [--states S] [--confidence C] [--seed K]

The domain: N counties (default 3,000) in S states (default 50) of unequal sizes (1 to about
250 counties, a power law as real states are) x age 20 x sex 2 x race 8. Four tables with
simultaneous ("every cell at once") accuracy targets at C (default 0.95): [county, age, sex,
race] (N x 320 cells, +-25), [county] (+-30), [state, sex] (+-20) and the total (+-40). Times,
in this process:

- plan: :func:`allocate` (the sigmas of least privacy cost meeting the targets as plan checks
  them: Sidak's product over each table's real cell variances) and :func:`cell_variances`;
- reconstruct: :func:`reconstruct` of one simulated release (Poisson counts, Gaussian noise);
- integer: :func:`nonnegative_integer` of it.

Prints the figures and, as the last line, one JSON object: ``cells`` (of the four tables),
``plan_seconds``, ``reconstruct_seconds``, ``integer_seconds``, ``seconds`` (plan +
reconstruct; target <= 10), ``peak_rss_mb`` (target <= 2,048), ``sigmas``, ``rho`` (zCDP, one
row per person), ``naive_rho`` (each table on its own, one sigma for all, meeting the same
targets) and ``rho_ratio``; at the SAME privacy cost as ours, the naive strategy's simultaneous
half-width per table (``naive_half_widths``) against ours (``half_widths``) and their ratios
(``ratios``: ours / naive), the naive strategy's sigmas reconstructed (``reconstructed_half_widths``,
``reconstruction_ratios``: GLS / each table on its own, the gain of consistency alone, < 1), and
the largest error of the simulated release per table (``max_errors``; ``integer_max_errors``
for the non-negative integer tables, and ``integer_departures``, their largest distance from the
linear estimate: what their accuracy bound adds to the half-width).
"""

from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np

from privrelease.mechanisms.tables import (
    Domain,
    Geography,
    Table,
    allocate,
    cell_variances,
    naive_sigmas,
    nonnegative_integer,
    privacy_cost,
    reconstruct,
    simultaneous_half_width,
    variance_limit,
)

TARGETS = (25.0, 30.0, 20.0, 40.0)
"""Simultaneous half-widths of the four tables: detail, county, state x sex, total."""


def workload(counties: int, states: int) -> tuple[Domain, list[Table]]:
    """Counties per state ~ 1 / rank (at least 1 each), sorted by state."""
    weights = 1 / np.arange(1, states + 1)
    sizes = 1 + np.floor(weights / weights.sum() * (counties - states)).astype(int)
    sizes[0] += counties - sizes.sum()
    geography = Geography("county", ("county", "state"), (counties, states), (np.repeat(np.arange(states), sizes),))
    domain = Domain((("age", 20), ("sex", 2), ("race", 8)), geography)
    tables = [Table(("age", "sex", "race"), 0), Table((), 0), Table(("sex",), 1), Table(())]
    return domain, tables


def margins(domain: Domain, tables: list[Table], detail: np.ndarray) -> list[np.ndarray]:
    """The four true tables from the detail counts (county x age x sex x race)."""
    parent = domain.geography.parents[0]  # type: ignore[union-attr]
    by_state = np.zeros((domain.nodes(1), 2))
    np.add.at(by_state, parent, detail.sum(axis=(1, 3)))
    return [detail, detail.sum(axis=(1, 2, 3)), by_state, np.asarray(detail.sum())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--counties", type=int, default=3000)
    parser.add_argument("--states", type=int, default=50)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=26)
    args = parser.parse_args()
    domain, tables = workload(args.counties, args.states)
    cells = [int(np.prod(t.shape(domain))) for t in tables]
    limits = [variance_limit(w, args.confidence, n) for w, n in zip(TARGETS, cells, strict=True)]

    start = time.perf_counter()
    sigmas = allocate(domain, tables, [None] * len(tables), [[(w, args.confidence)] for w in TARGETS])
    variances = cell_variances(domain, tables, sigmas)
    plan_seconds = time.perf_counter() - start

    rng = np.random.default_rng(args.seed)
    truth = margins(domain, tables, rng.poisson(3.0, tables[0].shape(domain)).astype(float))
    measured = [t + rng.normal(0, s, t.shape) for t, s in zip(truth, sigmas, strict=True)]
    start = time.perf_counter()
    estimates = reconstruct(domain, tables, sigmas, measured)
    reconstruct_seconds = time.perf_counter() - start
    start = time.perf_counter()
    integers = nonnegative_integer(domain, tables, estimates)
    integer_seconds = time.perf_counter() - start
    peak_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    rho = privacy_cost(sigmas)
    naive_rho = privacy_cost(naive_sigmas(domain, tables, limits))
    same_cost_sigma = (len(tables) / (2 * rho)) ** 0.5  # one sigma for all, the same rho as ours
    ours = [simultaneous_half_width(v, args.confidence) for v in variances]
    naive = [simultaneous_half_width(np.full(n, same_cost_sigma**2), args.confidence) for n in cells]
    equal = cell_variances(domain, tables, [same_cost_sigma] * len(tables))  # the same sigmas, reconstructed
    reconstructed = [simultaneous_half_width(v, args.confidence) for v in equal]
    errors = [float(np.abs(e - t).max()) for e, t in zip(estimates, truth, strict=True)]
    integer_errors = [float(np.abs(i - t).max()) for i, t in zip(integers, truth, strict=True)]
    departures = [float(np.abs(i - e).max()) for i, e in zip(integers, estimates, strict=True)]

    names = ["county x age x sex x race", "county", "state x sex", "total"]
    print(f"domain: {args.counties} counties in {args.states} states x 20 x 2 x 8; cells {cells} ({sum(cells):,})")
    print(f"plan {plan_seconds:.2f} s, reconstruct {reconstruct_seconds:.2f} s, integer {integer_seconds:.2f} s, ")
    print(f"peak RSS {peak_rss_mb:.0f} MB")
    print(f"rho {rho:.5g} (naive at the same targets {naive_rho:.5g}: ours is {rho / naive_rho:.3f} of it)")
    print(f"simultaneous half-widths at {args.confidence}; naive: one sigma {same_cost_sigma:.3f}, the same rho")
    print(
        f"{'table':26} {'sigma':>7} {'target':>6} {'ours':>6} {'naive':>6} {'ratio':>6} "
        f"{'naive+GLS':>9} {'ratio':>6} {'error':>6} {'integer':>7} {'departs':>7}"
    )
    for k, name in enumerate(names):
        print(
            f"{name:26} {sigmas[k]:7.3f} {TARGETS[k]:6.1f} {ours[k]:6.2f} {naive[k]:6.2f} {ours[k] / naive[k]:6.3f} "
            f"{reconstructed[k]:9.2f} {reconstructed[k] / naive[k]:6.3f} {errors[k]:6.2f} {integer_errors[k]:7.2f} {departures[k]:7.2f}"
        )
    print(
        json.dumps(
            {
                "cells": sum(cells),
                "plan_seconds": plan_seconds,
                "reconstruct_seconds": reconstruct_seconds,
                "integer_seconds": integer_seconds,
                "seconds": plan_seconds + reconstruct_seconds,
                "peak_rss_mb": peak_rss_mb,
                "sigmas": sigmas,
                "rho": rho,
                "naive_rho": naive_rho,
                "rho_ratio": rho / naive_rho,
                "half_widths": ours,
                "naive_half_widths": naive,
                "ratios": [o / n for o, n in zip(ours, naive, strict=True)],
                "reconstructed_half_widths": reconstructed,
                "reconstruction_ratios": [r / n for r, n in zip(reconstructed, naive, strict=True)],
                "max_errors": errors,
                "integer_max_errors": integer_errors,
                "integer_departures": departures,
            }
        )
    )


if __name__ == "__main__":
    main()
