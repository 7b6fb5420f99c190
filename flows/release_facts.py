"""What a release says about itself: ``release.json`` beside the published files, and the
operator's warnings about nearly empty outputs.

``release.json`` holds public facts only, all fixed by the policy or derivable from the
outputs: per output the mechanism, its file (or files, ``tables``, with ``reading``: how they
go together), its parameters, its guarantee under each accountant, the generalization of the
columns it publishes, and what a data user needs to read it: how to estimate
(sampled counts estimate population counts when multiplied by 1/beta) and the data-free
accuracy statements of :func:`privrelease.planning.mechanism_accuracy` (publication
probability, relative standard error, suppression bias and interval per cell size; a
statistic's noise half-width, and for a noisy table each cell's and all its cells' at once), and
for SDGS microdata its companion file ``cells`` (each published cell's count with its exact
interval), and the distribution and version that define each mechanism type it ran (``kinds``:
privrelease's own or a plugin's). Its ``release`` section says what the release is (approved or
a draft, the rows published, nothing published or far short of the plan, the plan's warnings:
:meth:`privrelease.reports.context.ReportContext.release_state`). It is published with the
outputs and checksummed in the audit database like them.

Warnings: an output with no rows, or a sampled output keeping less than ``LOW_SHARE`` of its
sample, is reported to the operator (terminal, internal report) with a pointer to
``privrelease calibrate`` and scheme selection. Such a release is still published: deciding to
publish from the data beyond what the mechanism itself does would make the decision a new
release of information about the data, which no guarantee here accounts for.
"""

from __future__ import annotations

import math
from typing import Any

from privrelease.reports.context import LOW_SHARE  # a sampled output keeping less of its sample is flagged

RELEASE_FILE = "release.json"


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _scheme(policy: Any, spec: Any, column: str, public: dict[str, Any]) -> str:
    """The generalization of ``column`` in words (the chosen candidate's, under scheme selection;
    else the mechanism's: :meth:`~privrelease.mechanisms.kinds.MechanismKind.column_scheme`)."""
    chosen = (policy.candidate_schemes or {}).get(public.get("chosen_scheme") or "", {})
    scheme = chosen.get(column) or spec.column_scheme(policy, column)
    return "kept as is" if scheme is None else str(scheme.in_words())


def _parameters(spec: Any, loaded: Any) -> dict[str, Any]:
    """The mechanism's parameters as they ran (:meth:`~privrelease.mechanisms.kinds.MechanismKind.resolved`),
    with ``chosen_by_plan`` naming those the policy left out and the plan chose (e.g. ``noise.sigma``)."""
    exclude = {"name", "type", "columns"}
    given = spec.model_dump(mode="json", exclude=exclude)
    used = spec.resolved(loaded).model_dump(mode="json", exclude=exclude)
    chosen = [
        f"{key}.{field}"
        for key, value in used.items()
        if isinstance(value, dict)
        for field, item in value.items()
        if item is not None and given[key].get(field) is None
    ]
    return {key: value for key, value in used.items() if value is not None} | (
        {"chosen_by_plan": chosen} if chosen else {}
    )


def _estimation(dataset: Any, spec: Any, beta: float) -> str:
    """How a sampled output's counts estimate the whole data's: of rows, or with a person
    column (a kind reading one random row of each person) of people."""
    scale = f"multiply counts by 1/beta = {1 / beta:g} to estimate"
    if dataset.size_unit == "rows" or dataset.rows_read(spec) > 1:
        return f"each row of the data was kept with probability beta = {beta:g}: {scale} counts of rows in the whole dataset"
    return (
        f"one random row of each person was read and kept with probability beta = {beta:g}: {scale} the number of "
        "people in a cell (each counted once, by the row drawn), not of rows"
    )


def describe(plan: Any, outputs: list[Any], state: dict[str, Any]) -> dict[str, Any]:
    """The ``release.json`` document of a release (``plan``: its :class:`~privrelease.planning.Plan`;
    ``outputs``: its staged :class:`~privrelease.flows.steps.OutputFacts`; ``state``: what the
    release is, :meth:`privrelease.reports.context.ReportContext.release_state`)."""
    policy = plan.loaded.policy
    mechanisms = {m.name: m for m in plan.mechanisms}
    files = []
    for output in outputs:
        spec, planned = policy.mechanism(output.mechanism), mechanisms[output.mechanism]
        summarized = {ref.column for ref in spec.column_refs() if ref.numeric}
        labelled = [column for column in spec.published_columns() if column not in summarized]
        entry: dict[str, Any] = {
            "mechanism": output.mechanism,
            "type": output.type,
            "parameters": _parameters(spec, plan.loaded),
            "guarantees": {
                notion: {"epsilon": _number(g.epsilon), "delta": g.delta, "detail": g.detail} if g.supported else None
                for notion, g in planned.guarantees.items()
            },
            "columns": list(spec.published_columns()),
            "generalization": {column: _scheme(policy, spec, column, output.public_facts) for column in labelled},
            "facts": output.public_facts,
            "accuracy": {} if (statement := plan.accuracy.get(output.mechanism)) is None else statement.as_dict(),
        }
        parts = [
            {"file": staged.file, "sha256": staged.sha256, "rows": staged.rows}
            for staged in (output.staged()[0], *output.more)
        ]
        if output.more:  # an output in several files: each with its rows, none standing for the others
            entry.update(tables=parts, files=len(parts))
        else:
            entry.update(parts[0])
        reading = spec.files_in_words([(part["file"], part["rows"]) for part in parts], output.public_facts)
        if reading is not None:
            entry["reading"] = reading
        if output.cells is not None:
            entry["cells"] = {"file": output.cells.file, "sha256": output.cells.sha256, "rows": output.cells.rows}
        beta = getattr(spec, "beta", None)
        if beta is not None and beta < 1:
            entry["estimation"] = _estimation(policy.dataset, spec, beta)
        files.append(entry)
    composed = plan.guarantee
    return {
        "policy": {"name": policy.name, "version": policy.version, "sha256": plan.loaded.sha256},
        "dataset": policy.dataset.id,
        "accounting": plan.notion,
        "unit_of_privacy": plan.unit_of_privacy,
        "kinds": plan.kinds,
        "guarantee": {"epsilon": _number(composed.epsilon), "delta": composed.delta, "detail": composed.detail}
        if composed.supported
        else None,
        "outputs": files,
        "release": state,
    }


def warnings(outputs: list[Any], unit: str) -> list[str]:
    """Every operator warning: :func:`declared_rows` and then :func:`nearly_empty`."""
    return declared_rows(outputs, unit) + nearly_empty(outputs)


def declared_rows(outputs: list[Any], unit: str) -> list[str]:
    """A statistic that read more or fewer ``unit`` (rows, or people with a person column:
    :attr:`~privrelease.policies.schema.Dataset.size_unit`) than ``dataset.rows`` declares
    (internal: the count describes the data)."""
    found = []
    for output in outputs:
        declared, counted = output.public_facts.get("rows"), output.internal_facts.get("rows_in")
        if declared is not None and counted is not None and declared != counted:
            query = output.public_facts.get("query", "statistic")
            use = (
                f"the mean divides by the declared {declared} (a public constant, so the release stays private)"
                if query == "mean"
                else f"the {query} does not use it, but the report states the declared size"
            )
            found.append(
                f"{output.mechanism}: the data has {counted} {unit} where dataset.rows declares {declared}; "
                f"{use}: correct dataset.rows in a new policy version"
            )
    return found


def nearly_empty(outputs: list[Any]) -> list[str]:
    """Outputs with no rows, or sampled outputs (SDGS microdata, histograms) whose published rows
    or cells hold less than :data:`LOW_SHARE` of their sample (internal: shares describe the data)."""
    found = []
    advice = "see `privrelease calibrate sdgs` (smaller k or larger beta) or a coarser generalization / select_scheme"
    for output in outputs:
        sampled, kept = output.internal_facts.get("rows_sampled"), output.public_facts.get("rows_published")
        if output.rows + sum(staged.rows for staged in output.more) == 0:
            found.append(f"{output.mechanism}: published no rows; {advice}")
        elif sampled and kept is not None and kept < LOW_SHARE * sampled:
            share = kept / sampled
            found.append(
                f"{output.mechanism}: published {share:.1%} of the sampled rows (below {LOW_SHARE:.0%}); {advice}"
            )
    return found
