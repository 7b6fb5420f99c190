"""Render a release's disclosure report: one self-contained HTML file (Jinja2, autoescaped,
inline CSS and SVG, no scripts, no external resources), readable offline and printable.

Two sections, clearly apart:

* **Public disclosure statement** — only facts derived from the policy and its plan (policy name,
  version, hash and approval time; mechanisms, parameters and generalization; guarantees per
  accountant and composed; pass/fail per target; charts; output files with checksums; the audit
  chain head; what the guarantees mean). Safe to publish with the data
  (``report_html(context, public_only=True)`` renders this part alone).
* **Internal review — not for publication** — run facts: rows read, sampled and suppressed,
  timings, the ledger before and after, the dataset fingerprint, the Prefect flow-run id, the
  code version, who approved.

>>> from privrelease.reports.context import example_context   # doctest: +SKIP
>>> html = report_html(example_context())                    # doctest: +SKIP
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
from markupsafe import Markup

from privrelease.mechanisms import accountants
from privrelease.mechanisms.accuracy import AccuracyStatement, PublishedCounts
from privrelease.mechanisms.events import Composed, is_dp, leaves
from privrelease.mechanisms.splu_scope import NO_UTILITY, UTILITY_SCOPE
from privrelease.reports.charts import all_charts, fmt, ledger_chart
from privrelease.reports.context import ReportContext
from privrelease.reports.html import jinja_environment, write_html
from privrelease.reports.labels import FACT_LABELS, composed, fact_label, fact_text, internal_fact_label

__all__ = [
    "ReportContext",
    "environment",
    "plan_charts_html",
    "report_html",
    "view",
    "write_html",
    "write_report",
]

TEMPLATE = "report.html.j2"

NOTION_NAMES = {
    "probabilistic": "probabilistic DP (the papers' notion; Theorem 1 for SDGS)",
    "approximate": "approximate (ε, δ)-DP (δ exact where the mechanism's curve is known, else a proven bound)",
}
# --- formatting filters ------------------------------------------------------------------


def _value(value: Any) -> str:
    """A fact or parameter in the report's words (:func:`fact_text`, numbers to 6 digits)."""
    return fact_text(value, fmt)


def _when(moment: datetime | None) -> str:
    if moment is None:
        return "not recorded"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _size(count: int | None) -> str:
    if count is None:
        return "n/a"
    value = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{count} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f} s"


@cache
def environment() -> jinja2.Environment:
    """The report's Jinja2 environment (see :func:`privrelease.reports.jinja_environment`)."""
    return jinja_environment(num=fmt, when=_when, size=_size, seconds=_seconds)


# --- the view of a context --------------------------------------------------------------


def _guarantee(guarantee: Any) -> dict[str, Any]:
    return {
        "notion": guarantee.notion,
        "notion_name": NOTION_NAMES.get(guarantee.notion, guarantee.notion),
        "supported": guarantee.supported,
        "epsilon": fmt(guarantee.epsilon) if guarantee.supported else "none",
        "delta": fmt(guarantee.delta) if guarantee.supported else "none",
        "factor": fmt(math.exp(guarantee.epsilon), 3) if guarantee.supported and guarantee.epsilon < 700 else None,
        "detail": guarantee.detail,
    }


def _parameters(spec: Any) -> list[tuple[str, str]]:
    dumped = spec.model_dump(exclude_none=True, exclude={"name", "type"})
    return [(key, _value(value)) for key, value in dumped.items() if value not in ((), [], {})]


def _composition(result: dict[str, Any]) -> str:
    """A composition's answer in words: the method used and every method's (ε, δ)."""
    methods = "; ".join(
        f"{name}: ε = {fmt(point['epsilon'])}, δ = {fmt(point['delta'])}"
        for name, point in result["candidates"].items()
    )
    return f"{result['method']} of {composed(result)}, the tightest; compared: {methods}"


def _facts(facts: dict[str, Any], shown: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """Facts as (label, text), leaving out empty ones and those ``shown`` already (parameters)."""
    rows = []
    for key, value in facts.items():
        if value is None or value == "" or (shown and shown.get(key) == _value(value)):
            continue
        if key == "composition":
            rows.append((FACT_LABELS[key], _composition(value)))
            continue
        rows.append((fact_label(key), _value(value)))
    return rows


def _accuracy(statement: AccuracyStatement | None) -> dict[str, Any] | None:
    """A mechanism's accuracy statement (its kind's accuracy map) as table rows."""
    if statement is None:
        return None
    view: dict[str, Any] = {"estimate": statement.estimate, "counted": statement.counted}
    view["interval_level"] = f"{statement.cells[0].confidence * 100:g}%" if statement.cells else None
    view["cells"] = [
        (
            f"{cell.count:,}",
            fmt(cell.publish_probability, 4),
            f"{cell.relative_standard_error:.1%}",
            "-" if cell.suppression_bias is None else f"{cell.suppression_bias:+.1%}",
            "never published" if cell.interval is None else f"{cell.interval[0]:,.0f} to {cell.interval[1]:,.0f}",
        )
        for cell in statement.cells
    ]
    noise = statement.noise
    together = bool(noise and noise.all_cells_half_width and noise.cells > 1)  # one cell: nothing "at once"
    view["half_width"] = (
        [
            (f"{c:.0%}", fmt(h, 4), *((fmt(noise.all_cells_half_width[c], 4),) if together else ()))
            for c, h in noise.half_width.items()
        ]
        if noise
        else []
    )
    view["all_cells"] = f"{noise.cells:,}" if noise and together else None
    view["unit"] = noise.unit if noise else None
    view["interval_columns"] = (
        f"{noise.interval_confidence * 100:g}%" if noise and noise.interval_confidence is not None else None
    )
    view["clamping"] = noise.clamping if noise else None
    gap = statement.selection_gap
    view["selection_gap"] = (fmt(gap.rows, 4), f"{(1 - gap.failure) * 100:g}%") if gap else None
    large = statement.large_sum
    view["large_sum"] = (
        {
            "t_f": large.t_f,
            "epsilon": fmt(large.epsilon),
            "t_e": fmt(large.t_e),
            "covers": UTILITY_SCOPE,
            "not_covered": NO_UTILITY,
        }
        if large
        else None
    )
    view["published_counts"] = _published_counts(statement.published_counts)
    view["stated"] = [(own.caption, own.columns, own.rows) for own in statement.stated]
    return view


def _published_counts(counts: PublishedCounts | None) -> str | None:
    """How to read the after-the-data interval of each published count, in one sentence."""
    if counts is None:
        return None
    level = f"{counts.confidence * 100:g}%"
    exact = (
        f"an exact {level} confidence interval for the people in the cell, given that it was published "
        "(the binomial sample conditioned on reaching k, its two one-sided tests inverted). "
        "Near k it lies lower than the estimate suggests: a small cell is published only when its sample was lucky. "
        "It is computed from the published count and the public k, β and confidence alone: no privacy cost."
    )
    if not counts.command:
        return (
            "After the data: each published cell's count c comes with the columns estimate (c/β, the people in "
            f"the cell estimated) and lower and upper: {exact}"
        )
    return (
        "After the data: the companion file (this output's name with .cells) lists each published cell, the "
        "published rows grouped by their generalized values, with its count c and the columns estimate (c/β, the "
        f"people in the cell estimated) and lower and upper: {exact} For other groupings of the rows, the command "
        f"“{counts.command}” gives the same."
    )


def _dp_only(all_leaves: list[Any], notion: str) -> dict[str, Any] | None:
    """When a release mixes releases that are not DP (SPLU-Gen) with DP releases: the
    guarantee of the DP releases alone, composed, under each accountant (``notion`` first)."""
    dp = tuple(leaf for leaf in all_leaves if is_dp(leaf))
    if not dp or len(dp) == len(all_leaves):
        return None
    tree = Composed(events=dp)
    rows = [_guarantee(accountants.account(tree, n)) for n in accountants.NOTIONS]
    return {"rows": rows, "notion": next(r for r in rows if r["notion"] == notion)}


def _explanations(policy: Any) -> list[Markup]:
    """Each kind's paragraphs for "What these guarantees mean", once each, rendered with the
    policy's ``targets`` (:meth:`~privrelease.mechanisms.kinds.MechanismKind.explanations`)."""
    sources = dict.fromkeys(text for spec in policy.mechanisms for text in spec.explanations())
    return [Markup(environment().from_string(source).render(targets=policy.targets)) for source in sources]


def _ledger_rows(context: ReportContext) -> list[tuple[str, str, str]]:
    """The ledger table: the lifetime budget, spent before and after this release and what is
    left, as the ledger computes them. Under approximate DP spent and left are epsilons at the
    lifetime delta: their delta cell names that delta (the budget's, also before anything was
    spent), never an amount spent or left."""
    if not (context.budget or context.ledger_before or context.ledger_after):
        return []
    at = " (smallest ε at the lifetime δ)" if context.ledger_at_lifetime_delta else ""
    rows = [("lifetime budget", context.budget or {})]
    rows += [(f"spent before this release{at}", context.ledger_before or {})]
    rows += [(f"spent after this release{at}", context.ledger_after or {})]
    if context.ledger_remaining:
        left = "ε left at the lifetime δ" if context.ledger_at_lifetime_delta else "remaining"
        rows.append((left, context.ledger_remaining))
    lifetime = f"at the lifetime δ {fmt((context.budget or {}).get('delta'))}"
    return [
        (
            label,
            fmt(amounts.get("epsilon")),
            lifetime if context.ledger_at_lifetime_delta and index else fmt(amounts.get("delta")),
        )
        for index, (label, amounts) in enumerate(rows)
    ]


def _candidate(candidate: str, chosen: dict[str, str]) -> str:
    """A candidate scheme's name, marked ``used by`` the mechanisms that chose it (``not used``
    when others were chosen; unmarked when the run chose none, e.g. a failed run)."""
    users = [mechanism for mechanism, name in chosen.items() if name == candidate]
    if users:
        return f"{candidate} (used by {', '.join(users)})"
    return f"{candidate} (not used)" if chosen else candidate


def view(context: ReportContext) -> dict[str, Any]:
    """Everything the template shows, formatted (numbers to 6 significant digits)."""
    plan = context.plan
    policy = plan.loaded.policy
    specs = {spec.name: spec for spec in policy.mechanisms}
    all_leaves = leaves(plan.event)
    mechanisms = []
    for mechanism in plan.mechanisms:
        parameters = _parameters(specs[mechanism.name].resolved(plan.loaded))
        guarantee = mechanism.guarantees[plan.notion]
        mechanisms.append(
            {
                "name": mechanism.name,
                "type": mechanism.type,
                "kind": specs[mechanism.name].label or mechanism.type,
                "parameters": parameters,
                "guarantees": [_guarantee(g) for g in mechanism.guarantees.values()],
                "facts": _facts(mechanism.facts, dict(parameters)),
                "accuracy": _accuracy(plan.accuracy.get(mechanism.name)),
                "not_dp": None if guarantee.supported else guarantee.detail,
            }
        )
    generalization = [(column, "fixed", scheme.in_words()) for column, scheme in policy.generalization.items()]
    for candidate, schemes in (policy.candidate_schemes or {}).items():
        label = _candidate(candidate, context.chosen_schemes)
        generalization += [(column, label, scheme.in_words()) for column, scheme in schemes.items()]
    approval = context.approval or {}
    outputs = [
        {
            "mechanism": output.get("mechanism") or "",
            "name": str(output.get("path", "")),
            "sha256": output.get("sha256", ""),
            "rows": output.get("rows"),
            "bytes": output.get("bytes"),
        }
        for output in context.outputs
    ]
    reading = [
        text
        for name, files in context.files_by_output().items()
        if all(output.get("rows") is not None for output in files)
        and (
            text := specs[name].files_in_words(
                [(str(output.get("path", "")), output["rows"]) for output in files], context.public_facts.get(name, {})
            )
        )
    ]
    internal_facts = [
        (
            name,
            [
                (
                    internal_fact_label(str(key)),
                    f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else _value(value),
                )
                for key, value in facts.items()
            ],
        )
        for name, facts in context.internal_facts.items()
    ]
    return {
        "policy": {
            "name": policy.name,
            "version": policy.version,
            "sha256": plan.loaded.sha256,
            "description": policy.description,
            "accounting": plan.notion,
            "accounting_name": NOTION_NAMES.get(plan.notion, plan.notion),
            "dataset_rows": policy.dataset.rows,
            "dataset_unit": policy.dataset.size_unit,
            "target_delta": policy.targets.delta,
            "lifetime_delta": None if policy.targets.lifetime_budget is None else policy.targets.lifetime_budget.delta,
        },
        "published_columns": [(spec.name, spec.published_columns()) for spec in policy.mechanisms],
        "unit_of_privacy": plan.unit_of_privacy,
        "state": context.release_state(),
        "signed": bool((context.chain_head or {}).get("public_key")),
        "status": context.status,
        "generated_at": context.generated_at,
        "approved_at": approval.get("approved_at"),
        "approval": approval,
        "data_read_at": context.data_read_at,
        "fixed_before_data_access": context.fixed_before_data_access,
        "mechanisms": mechanisms,
        "generalization": generalization,
        "chosen_schemes": list(context.chosen_schemes.items()),
        "composed": [_guarantee(g) for g in plan.composed.values()],
        "composed_notion": _guarantee(plan.guarantee),
        "dp_only": _dp_only(all_leaves, plan.notion),
        "composed_facts": _facts(plan.facts),
        "checks": plan.checks,
        "passed": plan.passed,
        "charts": all_charts(plan) if context.charts is None else context.charts,
        "outputs": outputs,
        "files_in_words": reading,
        "chain_head": context.chain_head,
        "explain_dp": any(is_dp(leaf) for leaf in all_leaves),
        "explanations": _explanations(policy),
        "internal": {
            "run_id": context.run_id,
            "flow_run_id": context.flow_run_id,
            "rerun_of": context.rerun_of,
            "code_version": context.code_version,
            "kinds": [(tag, f"{source['distribution']} {source['version']}") for tag, source in plan.kinds.items()],
            "dataset": context.dataset,
            "ledger": _ledger_rows(context),
            "ledger_at_lifetime_delta": context.ledger_at_lifetime_delta,
            "ledger_chart": None if context.ledger_curve is None else ledger_chart(context.ledger_curve),
            "warnings": list(context.warnings),
            "nearly_empty": list(context.nearly_empty),
            "timings": list(context.timings.items()),
            "total_seconds": sum(context.timings.values()) if context.timings else None,
            "facts": internal_facts,
        },
    }


# --- rendering and writing ----------------------------------------------------------------


def report_html(context: ReportContext, *, public_only: bool = False) -> str:
    """The report as one HTML document (``public_only``: the public disclosure statement alone,
    for publication with the data). Deterministic: the same context gives the same text."""
    return _page(view(context), public_only)


def report_pages(context: ReportContext) -> tuple[str, str]:
    """The full report and the public disclosure statement, from one view of ``context`` (its
    charts and figures computed once for both)."""
    shown = view(context)
    return _page(shown, False), _page(shown, True)


def _page(shown: dict[str, Any], public_only: bool) -> str:
    return environment().get_template(TEMPLATE).render(**shown, public_only=public_only)


def plan_charts_html(plan: Any) -> str:
    """Every chart of a plan (:func:`~privrelease.reports.charts.all_charts`: the report's
    charts section, privacy-accuracy frontiers included) as one self-contained HTML page, for
    ``privrelease plan --chart``. Deterministic."""
    policy = plan.loaded.policy
    return (
        environment()
        .get_template("plan_charts.html.j2")
        .render(
            name=policy.name,
            version=policy.version,
            sha256=plan.loaded.sha256,
            accounting=NOTION_NAMES.get(plan.notion, plan.notion),
            charts=all_charts(plan),
        )
    )


def write_report(context: ReportContext, path: str | Path, *, public_only: bool = False) -> str:
    """Render the report and write it atomically to ``path``; returns the sha256 of the bytes
    written (equal to :func:`.files.sha256_text` of :func:`report_html`'s text)."""
    return write_html(report_html(context, public_only=public_only), path)
