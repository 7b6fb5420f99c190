"""The release flow: a policy goes in; a checked, audited release and its disclosure report
come out (the steps are in :mod:`.steps`, which holds the logic; the tasks here only wrap it).

Every task is ``@task(cache_policy=NO_CACHE, persist_result=False)``: a randomized mechanism
must never be skipped as "Cached", and Prefect must never write a result holding data to its
storage. Tasks pass paths and small summaries (dataclasses of names, counts and checksums),
never tables: the data is read inside :func:`.steps.read_data` and kept in the process.

:func:`.steps.execute` is the orchestration (order, timings, progress, cleanup on failure)
with a pluggable way of calling each step: the flow passes :func:`call_task` (each step as its
Prefect task); :func:`.steps.release_plain` calls the plain functions (the same release without
Prefect, for tests and for a crash test in a subprocess that must not start a server).

Run it with ``privrelease run POLICY.yaml`` (which also sets Prefect's logging and start-up
defaults), or as a deployment: entrypoint ``flows/release.py:release``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from prefect import Flow, task
from prefect.cache_policies import NO_CACHE

from privrelease.flows import steps

TASK_OPTIONS: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}


@task(name="verify-policy", **TASK_OPTIONS)
def verify_policy_task(**parameters: Any) -> steps.RunContext:
    return steps.open_run(**parameters)


@task(name="prepare-outputs", **TASK_OPTIONS)
def prepare_outputs_task(run: steps.RunContext) -> str:
    return steps.prepare_outputs(run)


@task(name="fingerprint-dataset", **TASK_OPTIONS)
def fingerprint_task(run: steps.RunContext) -> steps.DatasetFacts:
    return steps.fingerprint_dataset(run)


@task(name="plan-release", **TASK_OPTIONS)
def plan_task(run: steps.RunContext) -> steps.PlanSummary:
    return steps.plan_release(run)


@task(name="reserve-budget", **TASK_OPTIONS)
def reserve_task(
    run: steps.RunContext, dataset: steps.DatasetFacts, plan: steps.PlanSummary
) -> steps.ReservationFacts | None:
    return steps.reserve_budget(run, dataset, plan)


@task(name="read-data", **TASK_OPTIONS)
def read_task(run: steps.RunContext, dataset: steps.DatasetFacts) -> steps.ReadFacts:
    return steps.read_data(run, dataset)


@task(name="run-mechanism", **TASK_OPTIONS)
def mechanism_task(run: steps.RunContext, name: str) -> steps.OutputFacts:
    return steps.run_mechanism(run, name)


@task(name="render-report", **TASK_OPTIONS)
def report_task(run: steps.RunContext, **facts: Any) -> steps.ReportFacts:
    return steps.stage_reports(run, **facts)


@task(name="publish", **TASK_OPTIONS)
def publish_task(run: steps.RunContext, **facts: Any) -> steps.Published:
    return steps.publish(run, **facts)


TASKS: dict[Callable[..., Any], Any] = {
    steps.open_run: verify_policy_task,
    steps.prepare_outputs: prepare_outputs_task,
    steps.fingerprint_dataset: fingerprint_task,
    steps.plan_release: plan_task,
    steps.reserve_budget: reserve_task,
    steps.read_data: read_task,
    steps.run_mechanism: mechanism_task,
    steps.stage_reports: report_task,
    steps.publish: publish_task,
}


def call_task(function: Callable[..., Any], label: str, *args: Any, **kwargs: Any) -> Any:
    """Run step ``function`` as its Prefect task (a mechanism's task run is named after it)."""
    wrapped = TASKS[function]
    if function is steps.run_mechanism:
        wrapped = wrapped.with_options(task_run_name=f"mechanism-{steps.safe_name(label)}")
    return wrapped(*args, **kwargs)


def _link_report(published: steps.Published) -> None:
    """A markdown artifact on the flow run linking the report (paths and checksums only)."""
    from prefect.artifacts import create_markdown_artifact

    report = Path(published.report)
    lines = [
        f"# Disclosure report of run `{published.run_id}`",
        "",
        f"[Open the report]({report.as_uri()}) - public statement: "
        f"[{Path(published.statement).name}]({Path(published.statement).as_uri()})",
        "",
        f"Release folder: `{published.release_dir}`",
        f"Audit chain head: seq {published.chain_head['seq']}, `{published.chain_head['hash']}`",
        "",
        "| output | rows | sha256 |",
        "|---|---|---|",
        *(f"| {Path(o['path']).name} | {o['rows']} | `{o['sha256'][:16]}` |" for o in published.outputs),
    ]
    try:
        create_markdown_artifact(
            markdown="\n".join(lines),
            key="disclosure-report",
            description=f"Disclosure report of run {published.run_id}",
        )
    except Exception as error:  # the release is committed; a missing link must not undo it
        steps.logger().warning("could not link the report as an artifact: %s", error)


class JsonParametersFlow(Flow[..., Any]):
    """A flow whose parameters, when they are all JSON scalars, are sent to the API as they are:
    Prefect's own encoder is FastAPI's, and importing it costs each run about 0.3 s."""

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        if all(value is None or isinstance(value, str | int | float | bool) for value in parameters.values()):
            return dict(parameters)
        return super().serialize_parameters(parameters)


@functools.partial(JsonParametersFlow, name="release", persist_result=False, log_prints=False)
def release(
    policy_path: str | None = None,
    data_path: str | None = None,
    out_dir: str | None = None,
    output_format: str = "parquet",
    production: bool | None = None,
    rerun_of: str | None = None,
    engine: str | None = None,
    dask_address: str | None = None,
    workers: int | None = None,
) -> dict[str, Any]:
    """Release what the policy at ``policy_path`` says (or repeat run ``rerun_of`` with fresh
    randomness and a new budget charge); returns paths, checksums and the chain head.
    ``engine`` (``local`` or ``dask``), ``dask_address`` and ``workers`` choose where the data
    work runs (default: the policy's ``engine:`` section, else in-process)."""
    from prefect.runtime import flow_run

    published = steps.execute(
        call_task,
        policy_path=policy_path,
        rerun_of=rerun_of,
        data_path=data_path,
        out_dir=out_dir,
        output_format=output_format,
        production=production,
        flow_run_id=str(flow_run.id) if flow_run.id else None,
        engine=engine,
        dask_address=dask_address,
        workers=workers,
    )
    _link_report(published)
    return asdict(published)
