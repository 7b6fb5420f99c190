"""``plan``, ``guarantee`` and ``calibrate``: the privacy calculus, without reading any data."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.table import Table

from privrelease.cli.output import cells_sentence, console, print_json, say, styled
from privrelease.errors import TargetNotMet, UserError
from privrelease.mechanisms.limits import MIN_BETA
from privrelease.reports.labels import composed, fact_label, fact_text

if TYPE_CHECKING:
    from privrelease.mechanisms.sdgs_calibration import Notion

guarantee_app = typer.Typer(help="Guarantees of a mechanism for given parameters.", no_args_is_help=True)
calibrate_app = typer.Typer(help="Find the parameter that meets a target.", no_args_is_help=True)

JSON = typer.Option(False, "--json", help="Print one JSON document instead of tables.")
ACCOUNTING = typer.Option(
    "probabilistic",
    "--accounting",
    help="probabilistic (the papers' notion: Theorem 1's delta for SDGS) or approximate (the standard (eps, delta)-DP: the exact hockey-stick delta where the mechanism's curve is known, else a proven bound).",
)


def accounting_notion(accounting: str) -> Notion:
    """The ``--accounting`` value as a notion; UserError for any other value."""
    from privrelease.mechanisms.composition import as_notion

    try:
        return as_notion(accounting)
    except ValueError:
        raise UserError(f"--accounting must be probabilistic or approximate; got {accounting!r}") from None


def register(app: typer.Typer) -> None:
    app.command("plan")(plan)
    app.add_typer(guarantee_app, name="guarantee")
    app.add_typer(calibrate_app, name="calibrate")


def _numbers(text: str, name: str, kind: type) -> list:
    try:
        values = [kind(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UserError(f"--{name} must be a comma-separated list of {kind.__name__} values; got {text!r}") from None
    if not values:
        raise UserError(f"--{name} needs at least one value")
    return values


def _check_sdgs(
    k: int | None, beta: float | None, epsilon: float | None, delta: float | None = None, beta_option: str = "--beta"
) -> None:
    """The given ones of (k, beta, epsilon, delta) are what a policy allows (a missing one is
    being solved for); ``beta_option`` names beta as the user gave it."""
    from privrelease.policies.fields import Beta, Delta, Epsilon, K, check_options

    check_options(("--k", K, k), (beta_option, Beta, beta), ("--epsilon", Epsilon, epsilon), ("--delta", Delta, delta))


def _fmt(value: float | None, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return "inf"
    return f"{value:.{digits}g}"


def _delta_text(delta: float | None, log10_delta: float | None) -> str:
    """A delta for the table: below the smallest normal float its exact power of ten (the float
    is then only the smallest positive double, a bound, not the value)."""
    if delta is not None and delta < 1e-300 and log10_delta is not None and math.isfinite(log10_delta):
        return f"10^{log10_delta:.2f}"
    return _fmt(delta, 3)


# --- plan ----------------------------------------------------------------------------------------


def plan(
    policy: Path = typer.Argument(..., help="The release policy (YAML)."),
    json_out: bool = JSON,
    chart: Path | None = typer.Option(
        None,
        "--chart",
        help="Also write the plan's charts (the report's: privacy curves, publication curves, "
        "privacy-accuracy frontiers) to this HTML file.",
    ),
) -> None:
    """Validate a policy and list every guarantee and target check. Reads no data. Warns when
    the audit database has its name@version registered with other content, or its dataset's
    ledger refuses the release (`run` refuses either)."""
    from privrelease.planning import plan_policy
    from privrelease.policies import load_policy

    result = plan_policy(load_policy(policy))
    if chart is not None:
        from privrelease.reports.html import write_html
        from privrelease.reports.render import plan_charts_html

        write_html(plan_charts_html(result), chart)
    checked, clash = _version_clash(result.loaded)
    here = [warning for warning in (_ledger_warning(result), clash.message if clash else None) if warning]
    if json_out:
        conflict = None if clash is None else clash.as_dict()
        document = result.as_dict()
        document["warnings"] += here
        print_json({**document, "version_checked": checked, "version_conflict": conflict})
    else:
        _print_plan(result, here)
        if chart is not None:
            say(f"charts written to {chart}")
    if not result.passed:
        raise typer.Exit(TargetNotMet.exit_code)


def _ledger_warning(result) -> str | None:
    """Why `run` refuses the release for its dataset's lifetime budget, else None: none stated
    (nor a ``default_lifetime_budget`` setting), another budget or accountant than the dataset
    has registered (:func:`~privrelease.audit.ledger.policy_status`), or too little left. Reads
    the audit database when there is one (plan creates none; one it cannot reach: no warning)."""
    from privrelease.audit.registered import dataset_registered
    from privrelease.settings import NO_LIFETIME_BUDGET, get_settings

    charged, loaded = result.charged_event, result.loaded
    refuses = "`run` refuses this policy"
    if charged is None:
        return None
    dataset = loaded.policy.dataset.id
    if dataset is None or dataset_registered(get_settings().db_url, dataset) is False:  # no ledger to read
        missing = loaded.policy.targets.lifetime_budget is None and get_settings().default_lifetime_budget is None
        return f"{NO_LIFETIME_BUDGET}: {refuses}" if missing else None

    from sqlalchemy.exc import OperationalError

    from privrelease.audit import ledger  # composing a ledger imports the PLDs (about 1 s)
    from privrelease.audit.database import exists, get_engine, open_database, session

    try:
        if not exists(get_engine()):
            return None
        with session(open_database(), readonly=True) as s:
            status = ledger.policy_status(s, loaded, result.notion)
    except UserError as error:
        return f"{error}: {refuses}"
    except OperationalError:
        return None
    try:
        if status.counting:
            ledger.check_fits(status, charged)
    except TargetNotMet:
        left = status.shown(status.remaining)
        return (
            f"the ledger of {status.dataset.id} has too little left for this release ({left} remains): "
            f"{refuses} (`privrelease ledger runway`)"
        )
    return None


def _version_clash(loaded) -> tuple[bool, Any]:
    """Whether the audit database was read, and the :class:`~privrelease.audit.approvals.VersionClash`
    when it has the policy's name@version registered (approved or published) with other
    content, else None. Without an audit database (plan creates none) or when it cannot be
    reached, nothing is checked: a warning, never a failed plan (the run checks again)."""
    from privrelease.audit.registered import peek
    from privrelease.settings import get_settings

    policy = loaded.policy
    quick = peek(get_settings().db_url, str(policy.name), str(policy.version))
    if quick is not None and quick.sha256 in (None, loaded.sha256):
        return quick.database, None

    from sqlalchemy.exc import OperationalError

    from privrelease.audit import approvals
    from privrelease.audit.database import exists, get_engine, open_database, session

    try:
        if not exists(get_engine()):
            return False, None
        with session(open_database(), readonly=True) as s:
            return True, approvals.version_clash(s, approvals.policy_facts(loaded))
    except OperationalError:
        return False, None


def _print_plan(result, here: list[str]) -> None:
    """The plan as text; ``here``: warnings about this environment (audit database, settings)."""
    policy = result.loaded.policy
    say(
        styled(
            "[bold]{}[/] version {}  sha256 {}…  accounting: [bold]{}[/]",
            policy.name,
            policy.version,
            result.loaded.sha256[:16],
            result.notion,
        )
    )
    unit = result.unit_of_privacy
    neighbours = (
        f"neighbours {unit['neighbours']}"
        if result.charged_event is not None
        else "not differentially private: no neighbouring relation applies"
    )
    lines = [f"unit of privacy: {unit['statement']}; {neighbours}"]
    lines += [f"  {name}: {rule}" for name, rule in unit["rules"].items()]
    for line in lines:  # wrapped at the terminal's width, as the tables are
        console.print(line, highlight=False, markup=False)
    table = Table(title="Mechanisms (no data read)", title_justify="left")
    for column in ("mechanism", "event", "probabilistic (eps, delta)", "approximate (eps, delta)", "also"):
        table.add_column(column, overflow="fold")
    for m in result.mechanisms:
        cells = []
        for notion in ("probabilistic", "approximate"):
            g = m.guarantees[notion]
            cells.append(f"({_fmt(g.epsilon)}, {_fmt(g.delta, 3)})" if g.supported else f"none: {g.detail}")
        table.add_row(styled("{} [dim]{}[/]", m.name, m.type), _event_text(m.event), *cells, _facts_text(m.facts))
    console.print(table)
    table = Table(title="Composed over the release", title_justify="left")
    for column in ("accounting", "epsilon", "delta", "how"):
        table.add_column(column, overflow="fold")
    for notion, g in result.composed.items():
        table.add_row(notion, _fmt(g.epsilon), _fmt(g.delta, 3) if g.supported else "none", g.detail)
    console.print(table)
    for key, value in result.facts.items():
        if key == "composition":
            say(
                f"  approximate composition of {composed(value)}: epsilon {_fmt(value['epsilon'])} "
                f"at delta {_fmt(value['delta'], 3)} by {value['method']}; "
                + ", ".join(f"{name} {_fmt(c['epsilon'])}" for name, c in value["candidates"].items())
            )
            continue
        say(f"  {fact_label(key)}: {fact_text(value, _fmt)}")
    _print_noise_accuracy(result)
    _print_stated_accuracy(result)
    checks = Table(title="Targets", title_justify="left")
    for column in ("target", "required", "achieved", "result"):
        checks.add_column(column, overflow="fold")
    for check in result.checks:
        checks.add_row(
            check.target, check.required, check.achieved, styled("[green]pass[/]" if check.passed else "[red]FAIL[/]")
        )
    console.print(checks)
    warnings = [*result.warnings, *here]
    for warning in warnings:
        say(styled("[yellow]warning:[/] {}", warning))
    console.print(
        styled(
            "[green]all targets met[/]" if result.passed else "[red]targets not met: this policy would be refused[/]"
        )
        + (styled(" [yellow](but see the {} warning(s) above)[/]", len(warnings)) if warnings else "")
    )


def _print_noise_accuracy(result) -> None:
    """With a person column, which rows each mechanism's true values are of; each noisy table's
    (or grouped statistic's) half-width, cell by cell and for all its cells at once, an
    ungrouped statistic's for its one value; a kind's own statements (``stated``) row by row."""
    for name, statement in result.accuracy.items():
        if statement is not None and statement.counted is not None:
            _say_accuracy(name, statement.counted)
        stated = statement.stated if statement is not None else ()
        for own in stated:  # several statements (noisy tables' counts and totals): each line says whose
            label = name if len(stated) == 1 else f"{name} ({own.key})"
            for row in own.rows:
                _say_accuracy(label, ", ".join(f"{c} {v}" for c, v in zip(own.columns, row, strict=True)))
        noise = statement.noise if statement is not None else None
        if noise is None:
            continue
        for confidence, each in noise.half_width.items():
            if noise.all_cells_half_width:
                together = noise.all_cells_half_width[confidence]
                _say_accuracy(name, cells_sentence(each, confidence, noise.cells, together, noise.unit))
            else:  # one value (an ungrouped statistic)
                _say_accuracy(
                    name,
                    f"{statement.estimate} is within +-{each:.4g} of the true one with probability >= {confidence:g}",
                )


def _say_accuracy(name: str, text: str) -> None:
    """One ``accuracy of NAME: ...`` line, as written, wrapped at the terminal's width as the
    tables are."""
    console.print(f"  accuracy of {name}: {text}", highlight=False, markup=False)


def _print_stated_accuracy(result) -> None:
    """A kind's own accuracy statements (e.g. noisy tables: per table each cell's and every
    cell at once's half-width), each a table under its caption."""
    for name, statement in result.accuracy.items():
        for own in statement.stated if statement is not None else ():
            table = Table(
                title=f"Accuracy of {name}", title_justify="left", caption=own.caption, caption_justify="left"
            )
            for column in own.columns:
                table.add_column(column, overflow="fold")
            for row in own.rows:
                table.add_row(*row)
            console.print(table)


def _event_text(event) -> str:
    body = event.model_dump()
    kind = body.pop("kind")
    if kind == "composed":
        return " + ".join(_event_text(child) for child in event.events)
    return (
        f"{kind}("
        + ", ".join(f"{k}={_fmt(v) if isinstance(v, float) else v}" for k, v in body.items() if v not in (None, ()))
        + ")"
    )


def _facts_text(facts: dict) -> str:
    """One fact per line (``k-anonymity: 20``, labelled as the report labels it), never a raw
    Python dict."""
    return "\n".join(
        f"{fact_label(key)}: {fact_text(value, _fmt)}"
        for key, value in facts.items()
        if key != "reason" and value is not None
    )


# --- guarantee sdgs -----------------------------------------------------------------------------


@guarantee_app.command("sdgs")
def guarantee_sdgs(
    k: str = typer.Option(..., "--k", help="k, or a comma-separated list."),
    beta: str = typer.Option(..., "--beta", help=f"Sampling probability beta in [{MIN_BETA:g}, 1], or a list."),
    epsilon: str = typer.Option(..., "--epsilon", help="epsilon >= 0, or a list."),
    json_out: bool = JSON,
) -> None:
    """delta of (k, beta)-SDGS under Theorem 1 and exact (hockey-stick), with the argmax n."""
    import numpy as np

    from privrelease.mechanisms.sdgs_math import exact_grid, theorem1_grid

    ks, betas, epsilons = _numbers(k, "k", int), _numbers(beta, "beta", float), _numbers(epsilon, "epsilon", float)
    for value in ks:
        _check_sdgs(value, None, None)
    for value in betas:
        _check_sdgs(None, value, None)
    for value in epsilons:
        _check_sdgs(None, None, value)
    grid_k, grid_beta, grid_eps = (a.ravel() for a in np.meshgrid(ks, betas, epsilons, indexing="ij"))
    theorem1 = theorem1_grid(grid_k, grid_beta, grid_eps)
    exact = exact_grid(grid_k, grid_beta, grid_eps)
    rows: list[dict[str, Any]] = [
        {
            "k": int(kk),
            "beta": float(bb),
            "epsilon": float(ee),
            "delta_theorem1": t.delta,
            "delta_exact": x.delta,
            "argmax_n": t.argmax_n,
            "argmax_n_exact": x.argmax_n,
            "log10_delta_theorem1": t.log10_delta,
            "log10_delta_exact": x.log10_delta,
            "note": t.reason or x.reason,
        }
        for kk, bb, ee, t, x in zip(grid_k, grid_beta, grid_eps, theorem1, exact)
    ]
    if json_out:
        print_json(rows)
        return
    table = Table(title="(k, beta)-SDGS: delta at epsilon", title_justify="left")
    for column in ("k", "beta", "epsilon", "delta (Theorem 1)", "argmax n", "delta (exact)", "argmax n", "note"):
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(
            str(row["k"]),
            _fmt(row["beta"]),
            _fmt(row["epsilon"]),
            _delta_text(row["delta_theorem1"], row["log10_delta_theorem1"]),
            str(row["argmax_n"] or "-"),
            _delta_text(row["delta_exact"], row["log10_delta_exact"]),
            str(row["argmax_n_exact"] or "-"),
            row["note"],
        )
    console.print(table)


# --- calibrate ----------------------------------------------------------------------------------


@calibrate_app.command("sdgs")
def calibrate_sdgs(
    k: int | None = typer.Option(None, "--k", help="k (omit to find the smallest)."),
    beta: str | None = typer.Option(
        None, "--beta", help=f"beta in [{MIN_BETA:g}, 1], or 'auto' for 1 - e^-eps (omit to find the largest)."
    ),
    epsilon: float | None = typer.Option(None, "--epsilon", help="epsilon (omit to find the smallest)."),
    delta: float | None = typer.Option(None, "--delta", help="target delta (omit to compute it)."),
    accounting: str = ACCOUNTING,
    json_out: bool = JSON,
) -> None:
    """Given three of (k, beta, epsilon, delta), the best fourth: smallest k, smallest epsilon,
    largest beta, or the delta achieved."""
    from privrelease.mechanisms import sdgs_calibration as cal

    notion = accounting_notion(accounting)
    auto = beta is not None and beta.strip().lower() == "auto"
    beta_value: float | None = None
    if auto:
        if epsilon is None:
            raise UserError("--beta auto means beta = 1 - e^-epsilon: give --epsilon too")
        beta_value = cal.auto_beta(epsilon)
    elif beta is not None:
        try:
            beta_value = float(beta)
        except ValueError:
            raise UserError(
                f"--beta takes one number in [{MIN_BETA:g}, 1] or 'auto'; got {beta!r} "
                "(for several, `privrelease guarantee sdgs --beta` takes a comma-separated list)",
                field="beta",
            ) from None
    _check_sdgs(k, beta_value, epsilon, delta, beta_option="--beta auto (1 - e^-epsilon)" if auto else "--beta")
    missing = [
        name
        for name, value in (("k", k), ("beta", beta_value), ("epsilon", epsilon), ("delta", delta))
        if value is None
    ]
    if len(missing) != 1:
        raise UserError(
            f"give exactly three of --k, --beta, --epsilon, --delta; missing: {', '.join(missing) or 'none'}"
        )
    try:
        if k is None:
            assert beta_value is not None and epsilon is not None and delta is not None, "one is missing"
            result = cal.smallest_k(beta_value, epsilon, delta, notion)
        elif epsilon is None:
            assert beta_value is not None and delta is not None, "one is missing"
            result = cal.smallest_epsilon(k, beta_value, delta, notion)
        elif beta_value is None:
            assert delta is not None, "one is missing"
            result = cal.largest_beta(k, epsilon, delta, notion)
        else:
            achieved = cal.sdgs_delta(k, beta_value, epsilon, notion)
            if achieved is None:
                raise cal.CalibrationError(f"Theorem 1 gives no delta for epsilon {epsilon:g} < -ln(1 - beta)")
            result = cal.Calibrated(k, beta_value, epsilon, achieved, notion)
    except cal.CalibrationError as error:
        raise TargetNotMet(str(error)) from None
    document = {
        "k": result.k,
        "beta": result.beta,
        "epsilon": result.epsilon,
        "delta": result.delta,
        "accounting": result.notion,
        "solved_for": missing[0],
        "target_delta": delta,
    }
    if json_out:
        print_json(document)
        return
    table = Table(title=f"(k, beta)-SDGS calibrated ({accounting})", title_justify="left")
    for column in ("k", "beta", "epsilon", "delta achieved", "solved for"):
        table.add_column(column)
    table.add_row(str(result.k), f"{result.beta:.10g}", f"{result.epsilon:.10g}", _fmt(result.delta, 4), missing[0])
    console.print(table)


@calibrate_app.command("identifiability")
def calibrate_identifiability(
    rho: float = typer.Option(..., "--rho", help="Target rho in (0, 1)."),
    lower: float = typer.Option(..., "--lower", help="Declared lower bound of the column."),
    upper: float = typer.Option(..., "--upper", help="Declared upper bound of the column."),
    query: str = typer.Option("mean", "--query", help="count, sum or mean."),
    rows: int | None = typer.Option(None, "--rows", help="Declared public row count (needed for a mean)."),
    groups: int = typer.Option(1, "--groups", help="Number of groups of a grouped statistic (a count needs >= 2)."),
    real: bool = typer.Option(False, "--real", help="The column is real-valued (default: integer)."),
    json_out: bool = JSON,
) -> None:
    """Laplace scale lambda for rho-differential identifiability, and the equivalent epsilon."""
    from privrelease.mechanisms.identifiability import calibrate

    if query not in ("count", "sum", "mean"):
        raise UserError(f"--query must be count, sum or mean; got {query!r}")
    result = calibrate(query, lower, upper, rho, rows=rows, integer=not real, groups=groups)
    document = {
        "feasible": result.feasible,
        "lambda": result.lambda_,
        "epsilon": result.epsilon,
        "epsilon_add_remove": result.epsilon_add_remove,
        "universe_size": result.universe_size,
        "sensitive_range": result.sensitive_range,
        "rho": rho,
        "query": query,
        "reason": result.reason,
    }
    if json_out:
        print_json(document)
    else:
        table = Table(title="rho-differential identifiability (Lee & Clifton)", title_justify="left")
        for column in ("query", "rho", "m", "S(f)", "lambda", "epsilon", "epsilon (add/remove)"):
            table.add_column(column)
        table.add_row(
            query,
            _fmt(rho),
            str(result.universe_size),
            _fmt(result.sensitive_range, 6),
            _fmt(result.lambda_, 6) if result.feasible else "infeasible",
            _fmt(result.epsilon, 6),
            _fmt(result.epsilon_add_remove, 6),
        )
        console.print(table)
        if not result.feasible:
            say(styled("[red]infeasible:[/] {}", result.reason))
    if not result.feasible:
        raise typer.Exit(TargetNotMet.exit_code)


@calibrate_app.command("splu")
def calibrate_splu(
    gamma: int = typer.Option(..., "--gamma", help="Decoy group size gamma >= 2."),
    eps: float = typer.Option(..., "--eps", help="Relative error bound eps."),
    alpha: int = typer.Option(..., "--alpha", help="Small counts: up to alpha."),
    t_e: float | None = typer.Option(None, "--t-e", help="Utility error probability T_E (gives T_f)."),
    json_out: bool = JSON,
) -> None:
    """SPLU-Gen small-sum privacy T_p (Theorem 4) and, with --t-e, large-sum utility T_f (Lemma 1)."""
    from privrelease.cli.splu import calibrate_splu_command

    calibrate_splu_command(gamma, eps, alpha, t_e, json_out)
