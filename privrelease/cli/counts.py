"""``calibrate noisy-counts`` and ``guarantee accuracy noisy-counts``: the discrete noise of a
noisy-counts table for a privacy target, and what it costs in accuracy; reads no data
(:mod:`privrelease.mechanisms.kinds.noisy_counts`)."""

from __future__ import annotations

import math
from typing import Any

import typer
from rich.table import Table

from privrelease.cli.output import cells_sentence, console, print_json, say
from privrelease.errors import TargetNotMet, UserError
from privrelease.mechanisms.confidence import check_confidence
from privrelease.policies.fields import MAX_EPSILON, Delta, PositiveEpsilon, check_option

JSON = typer.Option(False, "--json", help="Print one JSON document instead of a table.")
SMALL_EPSILON = 1e-4
"""Below it, the sigma found could exceed the largest a policy allows: checked first (one exact
delta at that sigma, about 1.5 s), rather than searched for (its sums cost O(sigma))."""
CONFIDENCE = typer.Option(0.95, "--confidence", help="Confidence level C in [0.5, 1) of the stated half-widths.")
CELLS = typer.Option(
    None,
    "--cells",
    help="Cells N of the table: also the half-width that holds for all N cells at once (simultaneous) "
    "with probability >= C.",
)


def register(app: typer.Typer) -> None:
    from privrelease.cli.accuracy import accuracy_app
    from privrelease.cli.calculus import calibrate_app

    calibrate_app.command("noisy-counts")(calibrate_noisy_counts)
    accuracy_app.command("noisy-counts")(accuracy_noisy_counts)


def _require(option: str, value: float, allowed: str, holds: bool) -> None:
    """One line naming the option when ``value`` is not what ``option`` allows (exit 2)."""
    if not holds:
        raise UserError(f"{option} must be {allowed}; got {value:g}", field=option, allowed=allowed)


def _round_up(value: float, digits: int = 10) -> float:
    """``value`` to ``digits`` significant digits, never below it (a sigma or scale printed for a
    policy must still meet the target)."""
    shown = float(f"{value:.{digits}g}")
    step = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    return shown if shown >= value else float(f"{shown + step:.{digits}g}")


def _check_cells(cells: int | None) -> None:
    """``--cells`` is an integer in [1, MAX_CELLS] (the largest table a policy may declare)."""
    from privrelease.mechanisms.kinds.noisy_counts import MAX_CELLS

    if cells is not None:
        _require("--cells", cells, f"an integer in [1, {MAX_CELLS:,}]", 1 <= cells <= MAX_CELLS)


def _noise(distribution: str, parameter: float) -> dict[str, Any]:
    """The policy's ``noise`` section for these parameters."""
    return {"distribution": distribution, "sigma" if distribution == "gaussian" else "scale": parameter}


def calibrate_noisy_counts(
    epsilon: float = typer.Option(..., "--epsilon", help="Target epsilon > 0 of the table."),
    delta: float | None = typer.Option(
        None, "--delta", help="Target delta in (0, 1): discrete Gaussian noise (omit: discrete Laplace, pure DP)."
    ),
    confidence: float = CONFIDENCE,
    cells: int | None = CELLS,
    max_rows: int = typer.Option(
        1,
        "--max-rows",
        help="Rows one person may have in the table (the policy's dataset.person.max_rows; 1: one row a person): "
        "the table's sensitivity m.",
    ),
    json_out: bool = JSON,
) -> None:
    """The noise of a noisy-counts table of sensitivity m (one person's rows, --max-rows; default
    1) for a target: with --delta the smallest discrete Gaussian sigma whose delta at EPSILON is
    at most DELTA (exact for m = 1, by zCDP for m > 1, as a policy's plan), without it the
    discrete Laplace scale m/EPSILON; and what it costs in accuracy: each cell within +-w of its
    true count with probability >= C (cell by cell), and with --cells N all N cells at once
    within +-w_N."""
    from privrelease.mechanisms.kinds import noisy_counts as nc
    from privrelease.policies.schema import MAX_ROWS_PER_PERSON

    check_option("--epsilon", PositiveEpsilon, epsilon)
    if delta is not None:
        check_option("--delta", Delta, delta)
    check_confidence(confidence, "--confidence")
    _check_cells(cells)
    _require("--max-rows", max_rows, f"an integer in [1, {MAX_ROWS_PER_PERSON}]", 1 <= max_rows <= MAX_ROWS_PER_PERSON)
    if delta is None:
        allowed = (
            f"in [{max_rows / nc.MAX_NOISE:g}, {MAX_EPSILON:g}] for discrete Laplace noise of sensitivity {max_rows} "
            f"(its scale {max_rows}/epsilon at most "
        )
        _require(
            "--epsilon",
            epsilon,
            allowed + f"{nc.MAX_NOISE:g}, the largest a policy allows)",
            nc.MAX_NOISE * epsilon >= max_rows,
        )
        distribution, parameter = "laplace", nc.calibrate_scale(epsilon, max_rows)
        achieved = 0.0
    else:
        closed = nc.zero_epsilon_sigma(epsilon, delta) if max_rows == 1 else None
        beyond = (
            closed > nc.MAX_NOISE
            if closed is not None
            else (epsilon < SMALL_EPSILON or max_rows > 1)
            and nc.approximate_delta("gaussian", nc.MAX_NOISE, epsilon, max_rows) > delta
        )
        if beyond:
            raise TargetNotMet(
                f"no discrete Gaussian sigma up to {nc.MAX_NOISE:g} (the largest a policy allows) reaches "
                f"delta {delta:g} at epsilon {epsilon:g} for sensitivity {max_rows}"
            )
        distribution, parameter = "gaussian", nc.calibrate_sigma(epsilon, delta, max_rows)
        achieved = nc.approximate_delta("gaussian", parameter, epsilon, max_rows)
    rounded = _round_up(parameter)
    widths = _widths(distribution, parameter, confidence, cells)
    name = "sigma" if distribution == "gaussian" else "scale"
    document = {
        "distribution": distribution,
        name: parameter,
        "sensitivity": max_rows,
        "epsilon": epsilon,
        "delta": delta,
        "delta_achieved": achieved,
        "confidence": confidence,
        **widths,
        "noise": _noise(distribution, rounded),
    }
    if json_out:
        print_json(document)
        return
    if distribution == "laplace":
        title = "discrete Laplace, pure DP"
    else:
        title = "discrete Gaussian, exact delta" if max_rows == 1 else "discrete Gaussian, delta by zCDP"
    if max_rows > 1:
        title += f", sensitivity {max_rows}: a person's rows"
    table = Table(title=f"noisy counts calibrated ({title})", title_justify="left")
    headers = ["epsilon", "delta target", "delta achieved", name, f"{confidence:.0%} half-width, each cell"]
    if cells is not None:
        headers.append(f"{confidence:.0%} half-width, all {cells:,} cells at once")
    for column in headers:
        table.add_column(column, justify="right")
    table.add_row(
        f"{epsilon:g}",
        "-" if delta is None else f"{delta:g}",
        f"{achieved:.4g}",
        f"{rounded:.10g}",
        *(f"+-{widths[key]}" for key in ("half_width", "all_cells_half_width") if key in widths),
    )
    console.print(table)
    snippet = f"noise: {{distribution: {distribution}, {name}: {rounded:.10g}}}"
    if max_rows > 1:
        snippet += f" (with dataset.person max_rows: {max_rows})"
    say(f"policy: {snippet}; {_widths_sentence(widths, confidence, cells)}")


def _widths(distribution: str, parameter: float, confidence: float, cells: int | None) -> dict[str, int]:
    """``half_width`` (each cell) and, with ``cells``, ``all_cells_half_width`` (all at once)."""
    from privrelease.mechanisms.kinds import noisy_counts as nc

    widths = {"half_width": nc.half_width(distribution, parameter, confidence)}  # type: ignore[arg-type]
    if cells is not None:
        widths["all_cells_half_width"] = nc.all_cells_half_width(distribution, parameter, confidence, cells)  # type: ignore[arg-type]
    return widths


def _widths_sentence(widths: dict[str, int], confidence: float, cells: int | None) -> str:
    sentence = cells_sentence(widths["half_width"], confidence, cells, widths.get("all_cells_half_width"))
    return sentence if cells is not None else f"{sentence}; all cells at once need more (--cells N)"


def accuracy_noisy_counts(
    distribution: str = typer.Option(..., "--distribution", help="gaussian or laplace."),
    sigma: float | None = typer.Option(None, "--sigma", help="Discrete Gaussian sigma > 0 (--distribution gaussian)."),
    scale: float | None = typer.Option(None, "--scale", help="Discrete Laplace scale > 0 (--distribution laplace)."),
    confidence: float = CONFIDENCE,
    cells: int | None = CELLS,
    json_out: bool = JSON,
) -> None:
    """For noisy-counts tables: the exact half-width w of the discrete noise, each published
    count within +-w of its true count with probability >= C (cell by cell); with --cells N,
    also w_N: all N counts within +-w_N at once with probability >= C."""
    from privrelease.mechanisms.kinds import noisy_counts as nc

    if distribution not in nc.DISTRIBUTIONS:
        raise UserError(
            f"--distribution must be gaussian or laplace; got {distribution!r}",
            field="--distribution",
            allowed="gaussian, laplace",
        )
    option, value, other = (
        ("--sigma", sigma, "--scale") if distribution == "gaussian" else ("--scale", scale, "--sigma")
    )
    if (scale if distribution == "gaussian" else sigma) is not None:
        raise UserError(f"{other} is not a parameter of {distribution} noise: give {option}", field=other)
    if value is None:
        raise UserError(f"{option} is required for {distribution} noise", field=option)
    check_option(option, nc.Sigma if distribution == "gaussian" else nc.Scale, value)
    check_confidence(confidence, "--confidence")
    _check_cells(cells)
    widths = _widths(distribution, value, confidence, cells)
    if json_out:
        print_json({**_noise(distribution, value), "confidence": confidence, **widths})
        return
    say(
        f"discrete {distribution.capitalize()} noise of {option[2:]} {value:g}: "
        f"{_widths_sentence(widths, confidence, cells)}"
    )
