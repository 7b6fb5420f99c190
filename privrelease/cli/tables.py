"""``calibrate noisy-tables``: what a policy's set of table accuracies costs in privacy, reads no
data (:mod:`privrelease.mechanisms.kinds.noisy_tables`): the least-cost sigmas meeting every
``targets.accuracy`` entry of its ``noisy_tables`` mechanism, the privacy they cost, each table's
"each cell" and "every cell at once" half-widths (with ``nonnegative``: of the unrounded estimate,
not the published integers), and the naive alternative's cost; with a ``total``, the same of the
totals (sigma_total chosen to meet ``statistic: total`` targets, else the policy's)."""

from __future__ import annotations

from typing import Any

import typer
from rich.table import Table

from privrelease.cli.output import console, print_json, say
from privrelease.errors import UserError

JSON = typer.Option(False, "--json", help="Print one JSON document instead of a table.")


def register(app: typer.Typer) -> None:
    from privrelease.cli.calculus import calibrate_app

    calibrate_app.command("noisy-tables")(calibrate_noisy_tables)


def calibrate_noisy_tables(
    policy: str = typer.Argument(..., help="Policy file with a noisy_tables mechanism and its accuracy targets."),
    mechanism: str | None = typer.Option(
        None, "--mechanism", help="The noisy_tables mechanism (default: the policy's only one)."
    ),
    json_out: bool = JSON,
) -> None:
    """The sigmas at the least privacy cost (below confidence 0.894: a local least) that meet
    every accuracy target of the policy's noisy_tables mechanism (whatever noise.sigma it sets), their privacy cost (zCDP rho and
    epsilon at targets.delta by the policy's accounting), per table each cell's and every cell
    at once's half-width, and the naive alternative (each table on its own, budget split
    equally) at the same targets; with a total column, the totals' sigmas and half-widths too."""
    document = calibration(policy, mechanism)
    if json_out:
        print_json(document)
        return
    title = f"noisy tables of {document['mechanism']} calibrated to the targets"
    _print_table(title, document["tables"], unrounded="rounding" in document)
    if "totals" in document:
        _print_table(f"totals of {document['total']} (its units)", document["totals"], unrounded=False)
    if "rounding" in document:
        say(document["rounding"])
    say(_cost_sentence("cost", document["cost"]))
    say(_cost_sentence("naive (each table on its own, budget split equally)", document["naive"]))
    sigmas = ", ".join(f"{row['sigma']:.6g}" for row in document["tables"])
    noise = f"sigma: [{sigmas}]"
    if "totals" in document:
        noise += ", sigma_total: [" + ", ".join(f"{row['sigma']:.6g}" for row in document["totals"]) + "]"
    say(f"policy: noise: {{distribution: gaussian, {noise}}} (or leave the sigmas out: plan chooses these)")


def _print_table(title: str, rows: list[dict[str, Any]], *, unrounded: bool) -> None:
    """One table of per-table statements (counts' or totals'; ``unrounded``: of the unrounded
    estimate, with ``nonnegative``)."""
    table = Table(title=title, title_justify="left")
    of = " (unrounded)" if unrounded else ""
    for column in (
        "table",
        "cells",
        "sigma",
        "standard error",
        f"each cell{of}",
        f"every cell at once{of}",
        "probability",
    ):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            row["table"],
            f"{row['cells']:,}",
            f"{row['sigma']:.6g}",
            f"{row['standard_error']:.4g}",
            f"+-{row['each_cell_half_width']:.4g}",
            f"+-{row['all_cells_half_width']:.4g}",
            f"{row['confidence']:g}",
        )
    console.print(table)


def _cost_sentence(what: str, cost: dict[str, Any]) -> str:
    text = f"{what}: zCDP rho {cost['zcdp_rho']:.4g}"
    if cost.get("epsilon") is not None:
        text += f", epsilon {cost['epsilon']:.4g} at delta {cost['delta']:g} ({cost['accounting']})"
    return text


def calibration(path: str, name: str | None) -> dict[str, Any]:
    """The document ``calibrate noisy-tables`` prints (module docstring)."""
    from privrelease.mechanisms.kinds import epsilon_at_target
    from privrelease.mechanisms.kinds.noisy_tables import NoisyTablesMechanism, TablesNoise
    from privrelease.policies import load_policy

    loaded = load_policy(path)
    found = [m for m in loaded.policy.mechanisms if isinstance(m, NoisyTablesMechanism)]
    names = [m.name for m in found]
    if name is not None:
        found = [m for m in found if m.name == name]
    if len(found) != 1:
        wanted = f"--mechanism {name!r} names none" if name is not None else f"it has {len(names)}: use --mechanism"
        raise UserError(
            f"calibrate noisy-tables needs one noisy_tables mechanism of policy {path}; {wanted} "
            f"(noisy_tables mechanisms: {', '.join(names) or 'none'})",
            field="--mechanism",
        )
    given = found[0]
    keep_totals = given.total is not None and all(limit is None for limit in given._limits(loaded, "total"))
    noise = TablesNoise(distribution="gaussian", sigma_total=given.noise.sigma_total if keep_totals else None)
    spec = given.model_copy(update={"noise": noise})
    if all(limit is None for limit in spec._limits(loaded)):
        raise UserError(
            f"mechanism {spec.name!r} has no accuracy target: add targets.accuracy entries (absolute_error, table)",
            field="targets.accuracy",
        )
    targets = loaded.policy.targets

    def cost(sigmas: tuple[float, ...], total_sigmas: tuple[float, ...] | None) -> dict[str, Any]:
        event = spec.event(loaded, sigmas, total_sigmas)
        found: dict[str, Any] = {"sigmas": list(sigmas), "zcdp_rho": event.cost}
        if total_sigmas is not None:
            found["sigma_totals"] = list(total_sigmas)
        if targets.delta is not None:
            found |= {
                "epsilon": epsilon_at_target(loaded, event),
                "delta": targets.delta,
                "accounting": targets.accounting,
            }
        return found

    sigmas = spec.sigmas(loaded)
    naive = spec.naive(loaded)
    assert naive is not None, "a target bounds it"
    totals: dict[str, Any] = {}
    taus = naive_taus = None
    if spec.total is not None:
        taus, naive_taus = spec.sigmas(loaded, "total"), spec.naive(loaded, "total")
        totals = {"total": spec.total.column, "totals": spec.statements(loaded, taus, "total")}
    return {
        "policy": str(path),
        "mechanism": spec.name,
        "tables": spec.statements(loaded, sigmas),
        **totals,
        **spec.statements_of(),
        "cost": cost(sigmas, taus),
        "naive": cost(naive, naive_taus),
    }
