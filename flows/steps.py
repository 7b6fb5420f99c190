"""The steps of a release, as plain functions, and their orchestration (:func:`execute`). The
Prefect tasks in :mod:`.release` wrap them; tests call them directly, without Prefect. Each
stage is a module of its own: :mod:`.opening` (1-2), :mod:`.data` (3-6), :mod:`.outputs` (7,
through the mechanism :mod:`.registry`), :mod:`.reporting` (8), :mod:`.publishing` (9 and
failure), sharing the value types of :mod:`.context`; this module names them all. The engine
(:mod:`.engines`: in-process or Dask) is part of the run's context; only the read and the
mechanisms depend on it (:mod:`.scaled`).

A release, in order (each step's result is a small, picklable summary; no step returns data):

1. :func:`open_run` - settle the runs a crash left unfinished; load the policy (a file, or for a rerun the stored canonical policy),
   in production mode refuse it unless its exact hash is approved; start the run (audit status
   ``pending``) on its registered version or, for a draft, a draft row that claims no
   name@version (a draft is registered by an approval or in step 9's transaction, never by a
   refusal).
2. :func:`prepare_outputs` - create the hidden staging folder ``OUT/.<release>.partial`` (an
   unwritable output folder fails here, before any budget is touched) and remove staging
   folders of runs no longer live.
3. :func:`fingerprint_dataset` - sha256 and size of the file's bytes and its row count (no
   contents), checked against the policy's declared ``rows`` and columns (header only), and
   for a rerun against the repeated run's fingerprint.
4. :func:`plan_release` - every guarantee from the policy alone; refuses (TargetNotMet) when a
   target is missed.
5. :func:`reserve_budget` - register the dataset identity (``dataset.id``, required when the
   release charges a budget) with its lifetime budget and the file as its vintage, and reserve
   the release's event tree in one transaction (TargetNotMet when the budget would be exceeded).
6. :func:`read_data` - record the data-read time (after the approval and the reservation),
   then read and check the declared columns.
7. :func:`run_mechanism` - one policy mechanism on the data, its output written to the staging
   folder (Parquet or CSV, rows in random order: every mechanism shuffles).
8. :func:`stage_reports` - the disclosure report and the public disclosure statement, into the
   staging folder (its data-free parts started after step 5: :func:`prepare_report`).
9. :func:`publish` - in one transaction register the policy version, commit the budget and
   record outputs, guarantees and report (run ``publishing``); then rename the staging folder into view and record the run's
   end (crash-consistent: see :mod:`.recovery`); the chain head is written beside the outputs.

Any failure before publishing: :func:`record_failure` removes the staging folder, releases the
reservation and records the run as failed with an error text that quotes no data. Errors
raised while the data is in hand (:func:`read_data`, :func:`run_mechanism`) may quote values
(a bad cell, a too-frequent value); they are wrapped in :class:`DataStepError`, whose text
names only the step and the error type; the full message stays on the exception
(``detail``) for the operator's terminal and never reaches logs or the audit database.

The SPLU-Gen part of a release is not differential privacy, so no DP ledger can account it:
the budget is reserved for the DP part of the event tree only (nothing when there is none),
and the report says the release as a whole has no DP guarantee.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from privrelease.flows.context import (
    CHAIN_HEAD_FILE,
    OUTPUT_FORMATS,
    REPORT_FILE,
    STATEMENT_FILE,
    DatasetFacts,
    DataStepError,
    OutputFacts,
    PlanSummary,
    PolicySource,
    Published,
    ReadFacts,
    ReportFacts,
    ReservationFacts,
    RunContext,
    _log,
    code_version,
    get_progress,
    logger,
    safe_name,
    seconds_since,
    set_progress,
)
from privrelease.flows.data import (
    fingerprint_dataset,
    forget_data,
    header_names,
    plan_release,
    plan_summary,
    read_data,
    reserve_budget,
)
from privrelease.flows.opening import (
    approval_binding,
    engine_of,
    open_run,
    prepare_outputs,
    settle_crashed_runs,
)
from privrelease.flows.outputs import run_mechanism, write_table
from privrelease.flows.publishing import publish, record_failure
from privrelease.flows.reporting import prepare_report, stage_reports

__all__ = [
    "CHAIN_HEAD_FILE",
    "OUTPUT_FORMATS",
    "REPORT_FILE",
    "STATEMENT_FILE",
    "DataStepError",
    "DatasetFacts",
    "OutputFacts",
    "PlanSummary",
    "PolicySource",
    "Published",
    "ReadFacts",
    "ReportFacts",
    "ReservationFacts",
    "RunContext",
    "approval_binding",
    "call_plain",
    "code_version",
    "engine_of",
    "execute",
    "fingerprint_dataset",
    "forget_data",
    "header_names",
    "logger",
    "open_run",
    "plan_release",
    "plan_summary",
    "prepare_outputs",
    "prepare_report",
    "publish",
    "read_data",
    "record_failure",
    "release_plain",
    "stage_reports",
    "reserve_budget",
    "run_mechanism",
    "safe_name",
    "settle_crashed_runs",
    "set_progress",
    "write_table",
]


# --------------------------------------------------------------------------- orchestration


Caller = Callable[..., Any]
"""``call(function, label, *args, **kwargs)``: run one step."""


def call_plain(function: Callable[..., Any], label: str, *args: Any, **kwargs: Any) -> Any:
    return function(*args, **kwargs)


def execute(call: Caller = call_plain, **parameters: Any) -> Published:
    """Run a release step by step with ``call``; ``parameters`` are those of
    :func:`.open_run`. On any failure nothing is published, the reservation is released
    and the run is recorded as failed (:func:`.record_failure`); the error is re-raised."""
    timings: dict[str, float] = {}
    sink = get_progress()
    run: RunContext | None = None
    reservation: ReservationFacts | None = None

    def step(key: str, description: str, function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if sink is not None:
            sink.start(key, description)
        start = time.perf_counter()
        result = call(function, key, *args, **kwargs)
        timings[key] = seconds_since(start)
        if sink is not None:
            sink.done(key, timings[key])
        else:
            logger().info("%s: done in %.2f s", description, timings[key])
        return result

    try:
        run = step("verify policy", "loading and verifying the policy", open_run, **parameters)
        step("prepare outputs", "preparing the output folder", prepare_outputs, run)
        dataset = step("fingerprint", "fingerprinting the dataset", fingerprint_dataset, run)
        plan = step("plan", "planning the guarantees", plan_release, run)
        reservation = step(
            "reserve budget",
            "reserving the privacy budget",
            reserve_budget,
            run,
            dataset,
            plan,
        )
        prepare_report(run, reservation)  # the report's data-free parts, computed while the data steps run
        read = step("read data", f"reading the data ({run.engine.describe()})", read_data, run, dataset)
        outputs = [
            step(
                spec.name,
                f"running {spec.type} {spec.name!r}",
                run_mechanism,
                run,
                spec.name,
            )
            for spec in run.loaded().policy.mechanisms
        ]
        facts = {
            "dataset": dataset,
            "reservation": reservation,
            "read": read,
            "outputs": outputs,
        }
        report = step(
            "report",
            "rendering the disclosure report",
            stage_reports,
            run,
            timings=dict(timings),
            **facts,
        )
        published = step(
            "publish",
            "publishing and committing the audit records",
            publish,
            run,
            plan=plan,
            reservation=reservation,
            outputs=outputs,
            report=report,
            timings=dict(timings),
        )
    except BaseException as error:
        try:
            text = record_failure(run, error, reservation=reservation, timings=timings)
            if sink is None:  # the command line reports the error itself
                logger().warning("release failed: %s", text)
        except Exception:  # the database itself may be the problem
            _log.exception("could not record the failure of run %s", run and run.run_id)
        raise
    return published


def release_plain(**parameters: Any) -> Published:
    """The release without Prefect (same steps, same audit records; no flow run)."""
    return execute(call_plain, **parameters)
