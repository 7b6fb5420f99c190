"""``guarantee accuracy``: what a published number is worth, for given parameters; reads no data
(:mod:`privrelease.mechanisms.accuracy`)."""

from __future__ import annotations

import typer
from rich.table import Table

from privrelease.cli.output import console, print_json, say
from privrelease.mechanisms.limits import MIN_BETA

accuracy_app = typer.Typer(
    help="Accuracy of published numbers for given parameters (reads no data).", no_args_is_help=True
)

JSON = typer.Option(False, "--json", help="Print one JSON document instead of a table.")
CONFIDENCE = typer.Option(0.95, "--confidence", help="Confidence level C in [0.5, 1).")
MAX_SCALE = 1e300
"""The largest Laplace scale ``guarantee accuracy laplace`` takes: its half-width, at most
``-ln(2^-53) b < 37 b`` for a confidence below 1, stays a finite double."""


def register(app: typer.Typer) -> None:
    from privrelease.cli.calculus import calibrate_app, guarantee_app

    guarantee_app.add_typer(accuracy_app, name="accuracy")
    calibrate_app.command("accuracy")(calibrate_accuracy)


@accuracy_app.command("sdgs")
def accuracy_sdgs(
    k: int = typer.Option(..., "--k", help="Suppression threshold k >= 1."),
    beta: float = typer.Option(..., "--beta", help=f"Sampling probability beta in [{MIN_BETA:g}, 1]."),
    count: str | None = typer.Option(
        None, "--count", help="People in a cell, or a comma-separated list (before the data)."
    ),
    observed: str | None = typer.Option(
        None,
        "--observed",
        help="Published counts c >= k, comma-separated (after the data): the people behind each, "
        "estimated, with an exact interval at --confidence.",
    ),
    confidence: float = CONFIDENCE,
    relative_error: float | None = typer.Option(
        None, "--relative-error", help="Also the probability of 'published and within +-r of the count'."
    ),
    json_out: bool = JSON,
) -> None:
    """For SDGS microdata and crowd-blending histograms. With --count (before the data): per
    cell size, the probability that the cell is published, the relative standard error and
    suppression bias of its estimate count/beta, and the interval holding the published estimate
    with probability >= C. With --observed (after the data): per published count c, the
    estimate c/beta of the people N behind it and an exact interval holding N with probability
    >= C given publication (post-processing: no privacy cost)."""
    from privrelease.cli.calculus import _check_sdgs, _numbers
    from privrelease.errors import UserError
    from privrelease.mechanisms.accuracy import count_accuracy
    from privrelease.policies.fields import Count, RelativeError, check_option, check_options

    _check_sdgs(k, beta, None)
    check_options(("--relative-error", RelativeError, relative_error))
    if (count is None) == (observed is None):
        raise UserError(
            "give exactly one of --count (people in a cell: accuracy before the data) or "
            "--observed (published counts: an interval for the people behind each)"
        )
    if observed is not None:
        if relative_error is not None:
            raise UserError("--relative-error goes with --count, not with --observed")
        _observed(k, beta, observed, confidence, json_out)
        return
    assert count is not None
    rows = [
        count_accuracy(k, beta, check_option("--count", Count, n), confidence=confidence, relative_error=relative_error)
        for n in _numbers(count, "count", int)
    ]
    if json_out:
        print_json({"k": k, "beta": beta, "confidence": confidence, "rows": [row.as_dict() for row in rows]})
        return
    table = Table(title=f"(k={k}, beta={beta:g})-SDGS: accuracy of a cell's estimate count/beta", title_justify="left")
    columns = ["people", "P(published)", "RSE", "bias", f"{confidence * 100:g}% interval"]
    if relative_error is not None:
        columns.append(f"P(pub., +-{relative_error:.0%})")
    for column in columns:
        table.add_column(column, justify="right")
    for row in rows:
        cells = [
            str(row.count),
            f"{row.publish_probability:.4g}",
            f"{row.relative_standard_error:.2%}",
            "-" if row.suppression_bias is None else f"{row.suppression_bias:+.2%}",
            "never published" if row.interval is None else f"{row.interval[0]:.0f}-{row.interval[1]:.0f}",
        ]
        if row.within is not None:
            cells.append(f"{row.within:.4g}")
        table.add_row(*cells)
    console.print(table)
    say(
        "RSE: relative standard error of count/beta; bias: of a published estimate, added by suppressing "
        "cells below k; interval: holds a published estimate with at least the stated probability."
    )


def _observed(k: int, beta: float, observed: str, confidence: float, json_out: bool) -> None:
    """``accuracy sdgs --observed``: rows {observed, estimate, lower, upper, confidence}."""
    from privrelease.cli.calculus import _numbers
    from privrelease.errors import UserError
    from privrelease.mechanisms.confidence import check_confidence
    from privrelease.mechanisms.count_intervals import count_intervals
    from privrelease.policies.fields import Count, check_option

    check_confidence(confidence, "--confidence")
    values = [check_option("--observed", Count, value) for value in _numbers(observed, "observed", int)]
    below = [value for value in values if value < k]
    if below:
        raise UserError(
            f"--observed must be published counts, integers >= k = {k} (smaller cells are suppressed); got {below[0]}"
        )
    intervals = count_intervals(values, k, beta, confidence)
    rows = intervals.rows()
    if json_out:
        print_json({"k": k, "beta": beta, "confidence": confidence, "rows": rows})
        return
    table = Table(title=f"(k={k}, beta={beta:g})-SDGS: the people N behind a published count c", title_justify="left")
    for column in ("observed c", "estimate c/beta", f"{confidence:g} lower", f"{confidence:g} upper"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(str(row["observed"]), f"{row['estimate']:.6g}", str(row["lower"]), str(row["upper"]))
    console.print(table)
    say(
        f"[lower, upper] holds N with probability >= {confidence:g} given that the cell was published (at least "
        f"k of its people sampled): the exact conditional binomial interval, from the published count and the "
        "public k, beta, C alone (post-processing: no privacy cost)."
    )


@accuracy_app.command("laplace")
def accuracy_laplace(
    scale: float = typer.Option(..., "--scale", help="Laplace scale b > 0 (lambda in the report)."),
    confidence: float = CONFIDENCE,
    json_out: bool = JSON,
) -> None:
    """For rho-identifiable statistics: the noise is within +-b ln(1/(1-C)) with probability C."""
    from privrelease.errors import UserError
    from privrelease.mechanisms.accuracy import laplace_half_width

    allowed = f"a number in (0, {MAX_SCALE:g}]"
    if not 0 < scale <= MAX_SCALE:
        raise UserError(f"--scale must be {allowed}; got {scale:g}", field="--scale", allowed=allowed)
    half_width = laplace_half_width(scale, confidence)
    if json_out:
        print_json({"scale": scale, "confidence": confidence, "half_width": half_width})
        return
    say(f"Laplace noise of scale {scale:g} is within +-{half_width:.6g} with probability {confidence:g}")


@accuracy_app.command("selection")
def accuracy_selection(
    k: int = typer.Option(..., "--k", help="The SDGS k the candidates are scored for."),
    beta: float = typer.Option(..., "--beta", help="The SDGS beta the candidates are scored for."),
    epsilon: float = typer.Option(..., "--epsilon", help="The selection's epsilon > 0."),
    candidates: int = typer.Option(..., "--candidates", help="How many candidate schemes."),
    failure: float = typer.Option(0.05, "--failure", help="Probability t that the gap is exceeded, in (0, 1)."),
    json_out: bool = JSON,
) -> None:
    """For scheme selection: the chosen scheme's score (expected published rows) is within the
    gap of the best candidate's with probability at least 1 - t."""
    from privrelease.errors import UserError
    from privrelease.mechanisms.accuracy import selection_gap
    from privrelease.mechanisms.selection import sensitivity

    if not epsilon > 0:
        raise UserError(f"--epsilon must be a number > 0; got {epsilon:g}")
    bound = sensitivity(k, beta)
    gap = selection_gap(bound, epsilon, candidates, failure)
    if json_out:
        print_json({"sensitivity": bound, "epsilon": epsilon, "candidates": candidates, "failure": failure, "gap": gap})
        return
    say(
        f"the chosen scheme publishes, in expectation, at most {gap:.4g} rows fewer than the best of "
        f"{candidates} candidate{'s' if candidates != 1 else ''}, with probability >= {1 - failure:g} (score sensitivity {bound:.4g})"
    )


def calibrate_accuracy(
    k: int = typer.Option(..., "--k", help="Suppression threshold k >= 1."),
    count: int = typer.Option(..., "--count", help="People in the cells that must be accurate."),
    relative_error: float = typer.Option(..., "--relative-error", help="Allowed relative error r > 0."),
    confidence: float = CONFIDENCE,
    delta: float = typer.Option(1e-9, "--delta", help="The delta at which the privacy cost is stated, in (0, 1)."),
    accounting: str = typer.Option("approximate", "--accounting", help="probabilistic or approximate."),
    json_out: bool = JSON,
) -> None:
    """The smallest beta (to 1e-4) at which a cell of COUNT people is published and within
    +-r with probability >= C, and what it costs in privacy: the smallest epsilon at DELTA."""
    from privrelease.cli.calculus import accounting_notion
    from privrelease.errors import TargetNotMet
    from privrelease.mechanisms import sdgs_calibration as cal
    from privrelease.mechanisms.accuracy import count_accuracy, smallest_beta
    from privrelease.policies.fields import Count, Delta, K, RelativeError, check_options

    notion = accounting_notion(accounting)
    check_options(
        ("--k", K, k),
        ("--count", Count, count),
        ("--relative-error", RelativeError, relative_error),
        ("--delta", Delta, delta),
    )
    beta = smallest_beta(k, count, relative_error, confidence)
    if beta is None:
        raise TargetNotMet(
            f"no beta reaches it: even without sampling a cell of {count} people is published and within "
            f"+-{relative_error:g} with probability {count_accuracy(k, 1.0, count, relative_error=relative_error).within:.4g}"
            f" < {confidence:g} (a smaller k or a larger error)"
        )
    statement = count_accuracy(k, beta, count, confidence=confidence, relative_error=relative_error)
    try:
        epsilon = None if beta >= 1 else cal.smallest_epsilon(k, beta, delta, notion).epsilon
    except cal.CalibrationError as error:
        raise TargetNotMet(f"beta = {beta:g} meets the accuracy, but {error}") from None
    document = {
        "k": k,
        "beta": beta,
        "count": count,
        "relative_error": relative_error,
        "confidence": confidence,
        "within": statement.within,
        "epsilon": epsilon,
        "delta": delta,
        "accounting": accounting,
    }
    if json_out:
        print_json(document)
        return
    cost = (
        "no (epsilon, delta)-DP without sampling"
        if epsilon is None
        else f"epsilon {epsilon:.4g} at delta {delta:g} ({accounting})"
    )
    say(
        f"beta = {beta:g}: a cell of {count} people is published and within +-{relative_error:.0%} "
        f"(+-{relative_error * count:g} people) with probability "
        f"{statement.within:.4g} (>= {confidence:g}); privacy cost with k = {k}: {cost}"
    )
