"""The mechanisms a policy can name, one registry entry per ``type``: the glue between the
policy's schema class (:mod:`privrelease.policies.schema`) and the mechanism's module in
:mod:`privrelease.mechanisms`, for each engine.

An entry holds how the flow runs the mechanism in one process over the whole table (``run``)
and, when it scales out, its Dask job (``job``: what a worker computes on one partition) and
``finish`` (what the flow computes once from the merged partial results: :mod:`.scaled`).
Adding a mechanism is its schema class, its ``mechanisms/`` module and one entry here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from privrelease.flows import scaled


@dataclass(frozen=True)
class Mechanism:
    """How the release flow runs one mechanism type."""

    run: Callable[[Any, Any, pa.Table], Any]
    """(loaded policy, mechanism spec, table) -> its
    :class:`~privrelease.mechanisms.results.MechanismResult`, in this process."""
    job: Callable[[Any, Any], Any] | None = None
    """(loaded policy, spec) -> its per-partition job on Dask (None: in-process only)."""
    finish: Callable[..., scaled.Finished] | None = None
    """(loaded policy, spec, merged partials, output path, format) -> its result on Dask."""
    in_process_only: str = ""
    """Why it cannot run on Dask, when ``job`` is None."""


def _sdgs(loaded: Any, spec: Any, table: pa.Table) -> Any:
    """(k, beta)-SDGS microdata over the policy's scheme, or over the scheme the exponential
    mechanism selects among the candidates (``select_scheme``; the events compose)."""
    from privrelease.mechanisms.sdgs import sdgs

    epsilon = spec.epsilon or 0.0
    if spec.select_scheme is None:
        return sdgs(table, loaded.schemes(spec.columns), k=spec.k, beta=spec.beta, epsilon=epsilon)
    from privrelease.mechanisms.events import Composed
    from privrelease.mechanisms.results import MechanismResult
    from privrelease.mechanisms.selection import select_scheme

    candidates = {name: loaded.schemes(spec.columns, candidate=name) for name in spec.select_scheme.candidates}
    selection = select_scheme(table, candidates, k=spec.k, beta=spec.beta, epsilon=spec.select_scheme.epsilon)
    result = sdgs(table, selection.scheme, k=spec.k, beta=spec.beta, epsilon=epsilon)
    return MechanismResult(
        result.table,
        Composed(events=(selection.event, result.event)),
        {**result.public_facts, "chosen_scheme": selection.name},
        {**result.internal_facts, "selection": selection.internal_facts},
    )


def _histogram(loaded: Any, spec: Any, table: pa.Table) -> Any:
    from privrelease.mechanisms.histogram import crowd_blending_histogram

    return crowd_blending_histogram(table, loaded.schemes(spec.columns), k=spec.k, beta=spec.beta, epsilon=spec.epsilon)


def _statistic(loaded: Any, spec: Any, table: pa.Table) -> Any:
    from privrelease.mechanisms.statistics import noisy_statistic

    job = scaled.statistic_job(loaded, spec)
    prepared, column = scaled.statistic_table(table, job.column, job.by)
    return noisy_statistic(prepared, column, job.calibration, group_domain=job.domain)


def _splu_gen(loaded: Any, spec: Any, table: pa.Table) -> Any:
    from privrelease.mechanisms.generalization import generalize
    from privrelease.mechanisms.splu import splu_gen

    columns = {name: table.column(name) for name in spec.sensitive}
    if spec.columns:
        generalized = generalize(table, loaded.schemes(spec.columns))
        columns.update({name: generalized.column(name) for name in spec.columns})
    return splu_gen(pa.table(columns), list(spec.sensitive), spec.gamma)


MECHANISMS: dict[str, Mechanism] = {
    "sdgs": Mechanism(_sdgs, scaled.cell_job, scaled.finish_sdgs),
    "histogram": Mechanism(_histogram, scaled.cell_job, scaled.finish_histogram),
    "identifiable_statistic": Mechanism(_statistic, scaled.statistic_job, scaled.finish_statistic),
    "splu_gen": Mechanism(
        _splu_gen,
        in_process_only="its decoy groups of gamma rows must be drawn over the whole table, not per partition",
    ),
}


def run(loaded: Any, spec: Any, table: pa.Table) -> Any:
    """Run the policy mechanism ``spec`` in this process over ``table``."""
    return MECHANISMS[spec.type].run(loaded, spec, table)


def refusal(spec: Any) -> str | None:
    """Why the policy mechanism ``spec`` cannot run on the Dask engine (None: it can)."""
    entry = MECHANISMS[spec.type]
    if entry.job is not None:
        return None
    return (
        f"mechanism {spec.name!r} ({spec.type}) runs in-process only: {entry.in_process_only}; "
        "run this policy with --engine local"
    )
