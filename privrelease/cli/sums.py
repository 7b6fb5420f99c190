"""``calibrate noisy-sums``: the discrete Gaussian noise of a noisy-sums release for a privacy
target, and what it costs in accuracy; reads no data (:mod:`privrelease.mechanisms.kinds.noisy_sums`)."""

from __future__ import annotations

import typer
from rich.table import Table

from privrelease.cli.counts import CONFIDENCE, JSON, _require, _round_up
from privrelease.cli.output import console, print_json
from privrelease.mechanisms.confidence import check_confidence
from privrelease.policies.fields import Delta, PositiveEpsilon, check_option


def register(app: typer.Typer) -> None:
    from privrelease.cli.calculus import calibrate_app

    calibrate_app.command("noisy-sums")(calibrate_noisy_sums)


def calibrate_noisy_sums(
    epsilon: float = typer.Option(..., "--epsilon", help="Target epsilon > 0 of the release."),
    delta: float = typer.Option(..., "--delta", help="Target delta in (0, 1)."),
    bound: float = typer.Option(..., "--bound", help="max(|lo|, |hi|) of the bounds, in the column's units (> 0)."),
    max_rows: int = typer.Option(1, "--max-rows", help="Rows m one person may have (dataset.person's max_rows)."),
    resolution: float = typer.Option(1.0, "--resolution", help="The values' unit (the mechanism's resolution)."),
    count_share: float = typer.Option(0.25, "--count-share", help="Share in (0, 1) of rho spent on the counts."),
    confidence: float = CONFIDENCE,
    json_out: bool = JSON,
) -> None:
    """sigma_total and sigma_count of a noisy-sums release for a target: the largest zCDP rho whose
    (epsilon, delta) conversion reaches DELTA at EPSILON (CKS Proposition 12), COUNT_SHARE of it on
    the counts (sigma_count = m / sqrt(2 s rho)), the rest on the totals (sigma_total = m B /
    sqrt(2 (1 - s) rho)); and each cell's half-width of the total and the count at C."""
    from privrelease.mechanisms import zcdp
    from privrelease.mechanisms.kinds import noisy_sums as ns
    from privrelease.mechanisms.kinds.noisy_sums import MAX_NOISE, MIN_NOISE, half_width
    from privrelease.policies.schema import MAX_ROWS_PER_PERSON

    check_option("--epsilon", PositiveEpsilon, epsilon)
    check_option("--delta", Delta, delta)
    check_confidence(confidence, "--confidence")
    _require("--bound", bound, "a number > 0", bound > 0)
    _require("--resolution", resolution, "a number > 0", resolution > 0)
    _require("--max-rows", max_rows, f"an integer in [1, {MAX_ROWS_PER_PERSON}]", 1 <= max_rows <= MAX_ROWS_PER_PERSON)
    _require("--count-share", count_share, "in (0, 1)", 0 < count_share < 1)
    sigma_total, sigma_count = ns.calibrate(epsilon, delta, max_rows, bound, count_share)
    sigma_total, sigma_count = _round_up(sigma_total), _round_up(sigma_count)
    units = sigma_total / resolution
    _require(
        "--resolution",
        resolution,
        f"such that sigma_total / resolution ({sigma_total:g} / resolution) is in [{MIN_NOISE:g}, {MAX_NOISE:g}]",
        MIN_NOISE <= units <= MAX_NOISE and MIN_NOISE <= sigma_count <= MAX_NOISE,
    )
    rho = ns.zcdp_rho(sigma_count, units, max_rows, max_rows * round(bound / resolution))
    document = {
        "sigma_total": sigma_total,
        "sigma_count": sigma_count,
        "rho": rho,
        "epsilon": epsilon,
        "delta": delta,
        "delta_achieved": zcdp.approximate_delta(rho, epsilon),
        "confidence": confidence,
        "total_half_width": half_width("gaussian", units, confidence) * resolution,
        "count_half_width": half_width("gaussian", sigma_count, confidence),
        "noise": {"distribution": "gaussian", "sigma_total": sigma_total, "sigma_count": sigma_count},
    }
    if json_out:
        print_json(document)
        return
    table = Table(title="noisy sums calibrated (discrete Gaussian, zCDP)", title_justify="left")
    headers = ["epsilon", "delta target", "delta achieved", "sigma_total", "sigma_count"]
    headers += [f"{confidence:.0%} half-width, each total", f"{confidence:.0%} half-width, each count"]
    for column in headers:
        table.add_column(column, justify="right")
    table.add_row(
        f"{epsilon:g}",
        f"{delta:g}",
        f"{document['delta_achieved']:.4g}",
        f"{sigma_total:.10g}",
        f"{sigma_count:.10g}",
        f"+-{document['total_half_width']:g}",
        f"+-{document['count_half_width']}",
    )
    console.print(table)
