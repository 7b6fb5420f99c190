"""``estimate``: count estimates from a table published by SPLU-Gen (Fu et al. 2014), and the
function behind ``calibrate splu``. Reads only the published table; never imports Prefect."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.table import Table

from privrelease.cli.output import console, print_json, say
from privrelease.errors import UserError

if TYPE_CHECKING:
    from privrelease.mechanisms.reconstruction import CountEstimate, CountQuery

JSON_LINE_SUFFIXES = {".jsonl", ".ndjson", ".json"}

QUERIES_HELP = (
    "A file of queries, answered in one batch. JSON lines (.jsonl, .ndjson, .json): one object per "
    'line, {"where": {"age": "30-39"}, "sensitive": {"occupation": "Sales"}, "id": "q1"} ("id" '
    "optional). Any other suffix is read as CSV with a header row and the columns 'where' and "
    "'sensitive' (and an optional 'id'), each cell 'column=value' conditions joined by ';', e.g. "
    "'age=30-39;sex=Male'. Not combined with --where/--sensitive."
)


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate)


def parse_condition(text: str, option: str) -> tuple[str, str]:
    """``column=value`` -> ``(column, value)`` (split at the first '='; the value may be empty
    only if the column is named)."""
    column, separator, value = text.partition("=")
    if not separator or not column.strip():
        raise UserError(f"{option} must be COLUMN=VALUE (e.g. age=30-39); got {text!r}")
    return column.strip(), value


def _conditions(texts: list[str], option: str) -> list[tuple[str, str]]:
    return [parse_condition(text, option) for text in texts]


def _cell_conditions(cell: str | None, field: str, where: str) -> list[tuple[str, str]]:
    parts = [part for part in (cell or "").split(";") if part.strip()]
    return [parse_condition(part.strip(), f"{field} in {where}") for part in parts]


def read_queries(path: Path) -> tuple[list[CountQuery], list[Any]]:
    """Queries and their ids (None when not given) from a JSON-lines or CSV file (see
    ``--queries``)."""
    from privrelease.mechanisms.reconstruction import CountQuery

    if not path.is_file():
        raise UserError(f"queries file not found: {path}")
    queries: list[CountQuery] = []
    ids: list[Any] = []
    if path.suffix.lower() in JSON_LINE_SUFFIXES:
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except json.JSONDecodeError as error:
                    raise UserError(f"{path} line {number}: not a JSON object ({error.msg})") from None
                if not isinstance(item, dict) or not isinstance(item.get("sensitive", {}), dict):
                    raise UserError(
                        f"{path} line {number}: expected an object with 'where' and 'sensitive' "
                        "objects of column: value"
                    )
                where = item.get("where", {})
                if not isinstance(where, dict):
                    raise UserError(f"{path} line {number}: 'where' must be an object of column: value")
                unknown = set(item) - {"where", "sensitive", "id"}
                if unknown:
                    raise UserError(f"{path} line {number}: unknown keys {sorted(unknown)}")
                queries.append(CountQuery.of(where, item.get("sensitive", {})))
                ids.append(item.get("id"))
    else:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            fields = set(reader.fieldnames or [])
            if "sensitive" not in fields or not fields <= {"where", "sensitive", "id"}:
                raise UserError(
                    f"{path}: a CSV queries file needs a header with the columns 'where' and "
                    f"'sensitive' (and optionally 'id'); got {sorted(fields)}"
                )
            for number, row in enumerate(reader, start=2):
                where = _cell_conditions(row.get("where"), "where", f"{path} line {number}")
                sensitive = _cell_conditions(row.get("sensitive"), "sensitive", f"{path} line {number}")
                queries.append(CountQuery.of(where, sensitive))
                ids.append(row.get("id"))
    if not queries:
        raise UserError(f"queries file {path} has no queries")
    return queries, ids


def _document(estimate: CountEstimate, query_id: Any = None) -> dict[str, Any]:
    document = estimate.as_dict()
    if query_id is not None:
        document = {"id": query_id, **document}
    return document


def _print_estimates(estimates: list[CountEstimate], ids: list[Any], rows: int, gamma: int) -> None:
    """The estimates as a table, and which of them large-sum utility covers."""
    from privrelease.mechanisms.splu_scope import NO_UTILITY, UTILITY_SCOPE

    table = Table(title=f"SPLU-Gen count estimates (gamma = {gamma}, {rows} published rows)")
    with_ids = any(query_id is not None for query_id in ids)
    if with_ids:
        table.add_column("id")
    confidence = next((e.confidence for e in estimates if e.confidence is not None), None)
    interval_column = f"{confidence * 100:g}% interval" if confidence is not None else "interval"
    for column in ("query", "observed", "estimate", interval_column, "iterations", "converged"):
        table.add_column(column, justify="left" if column == "query" else "right")
    for estimate, query_id in zip(estimates, ids, strict=True):
        interval = "-" if estimate.interval is None else f"{estimate.interval[0]} to {estimate.interval[1]}"
        cells = [estimate.query.describe(), str(estimate.observed), f"{estimate.estimate:.1f}", interval]
        cells += [str(estimate.iterations), "yes" if estimate.converged else "NO"]
        table.add_row(*([str(query_id)] if with_ids else []), *cells)
    console.print(table)
    say("Estimates of true counts. Small counts are inaccurate by design (small-sum privacy).")
    if any(estimate.interval is not None for estimate in estimates):  # one sensitive value alone
        say(
            f"Large-sum utility (accurate from the release's T_f on) covers {UTILITY_SCOPE}: the rows with an interval."
        )
    if any(estimate.interval is None for estimate in estimates):
        say(NO_UTILITY)
    say("Not differential privacy.")


def estimate(
    published: Annotated[Path, typer.Argument(help="The published table: CSV with a header row, or Parquet.")],
    gamma: Annotated[int, typer.Option("--gamma", help="The gamma the table was published with (>= 2).")],
    where: Annotated[
        list[str] | None,
        typer.Option("--where", help="Condition on a non-sensitive column, COLUMN=VALUE (repeatable)."),
    ] = None,
    sensitive: Annotated[
        list[str] | None,
        typer.Option("--sensitive", help="Condition on a sensitive (randomized) column, COLUMN=VALUE (repeatable)."),
    ] = None,
    queries: Annotated[Path | None, typer.Option("--queries", help=QUERIES_HELP)] = None,
    delimiter: Annotated[str, typer.Option("--delimiter", help="Field separator of a CSV published table.")] = ",",
    confidence: Annotated[
        float,
        typer.Option("--confidence", help="Confidence of the exact interval of a lone value's count, in [0.5, 1)."),
    ] = 0.95,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON (an object, or a list for --queries).")] = False,
) -> None:
    """Estimate the true count of rows matching non-sensitive and sensitive conditions.

    One sensitive value alone: its published count (the MLE, Fu et al. Theorem 2), with an
    exact confidence interval (the published count is Binomial(gamma f, 1/gamma)).

    More conditions: iterative Bayesian reconstruction (Fu et al. Eq. 13-14).
    """
    from privrelease.mechanisms.confidence import check_confidence
    from privrelease.mechanisms.reconstruction import CountQuery, PublishedTable

    where, sensitive = where or [], sensitive or []
    if queries is not None and (where or sensitive):
        raise UserError("give either --queries or --where/--sensitive, not both")
    if queries is None and not sensitive:
        raise UserError("give at least one --sensitive COLUMN=VALUE (or a --queries file)")
    check_confidence(confidence, "--confidence")
    if len(delimiter) != 1:
        raise UserError(f"--delimiter must be one character; got {delimiter!r}")
    if queries is not None:
        batch, ids = read_queries(queries)
    else:
        batch = [CountQuery.of(_conditions(where, "--where"), _conditions(sensitive, "--sensitive"))]
        ids = [None]
    table = PublishedTable.read(published, gamma, delimiter=delimiter)
    estimates = table.estimate_many(batch, confidence=confidence)
    if json_out:
        documents = [_document(e, query_id) for e, query_id in zip(estimates, ids, strict=True)]
        if queries is None:
            print_json({**documents[0], "gamma": table.gamma, "rows": table.rows})
        else:
            print_json(documents)
    else:
        _print_estimates(estimates, ids, table.rows, table.gamma)


def calibrate_splu_command(gamma: int, eps: float, alpha: int, t_e: float | None, json_out: bool) -> None:
    """Print SPLU-Gen's small-sum privacy T_p (Theorem 4) and, given T_E, its large-sum utility
    threshold T_f (exact in the binomial model of the estimate; the paper's Lemma 1 formula is
    wrong, see :mod:`privrelease.mechanisms.splu_guarantees`): JSON ``{"t_p", "argmin_f", "gamma", "eps", "alpha"[, "t_e", "t_f"]}``
    or a table with the probability for every count up to alpha (at most 20 shown)."""
    from privrelease.mechanisms.splu_guarantees import calibrate, privacy_curve
    from privrelease.mechanisms.splu_scope import UTILITY_SCOPE
    from privrelease.policies.fields import Alpha, Gamma, SpluEpsilon, check_options

    check_options(("--gamma", Gamma, gamma), ("--eps", SpluEpsilon, eps), ("--alpha", Alpha, alpha))
    result = calibrate(gamma, eps, alpha, t_e)
    if json_out:
        print_json(result.as_dict())
        return
    table = Table(title=f"SPLU-Gen, gamma = {result.gamma}: small-sum privacy / large-sum utility")
    table.add_column("guarantee")
    table.add_column("value", justify="right")
    table.add_column("meaning")
    table.add_row(
        "T_p",
        f"{result.t_p:.4f}",
        f"every count <= {result.alpha} is estimated with relative error > {result.eps:g} "
        f"with probability >= T_p (attained at f = {result.argmin_f})",
    )
    if result.t_f is not None:
        table.add_row(
            "T_f",
            f"{result.t_f}",
            f"{UTILITY_SCOPE}, if >= T_f, has relative error >= {result.eps:g} with probability <= {result.t_e:g}",
        )
    console.print(table)
    shown = min(result.alpha, 20)
    counts, probability = privacy_curve(result.gamma, result.eps, shown)
    curve = Table(title=f"P(relative error > {result.eps:g}) for a true count f")
    curve.add_column("f", justify="right")
    curve.add_column("probability", justify="right")
    for f, value in zip(counts.tolist(), probability.tolist(), strict=True):
        curve.add_row(str(f), f"{value:.4f}")
    console.print(curve)
    say("SPLU is not differential privacy: it bounds the accuracy of counts.")
