"""The checks a release would fail, made in about a second before Prefect starts.

``privrelease run`` and ``rerun`` and the Python API call :func:`preflight` (or
:func:`preflight_rerun`) before Prefect starts, so that a broken policy, a missed target, a
missing approval, a missing or mismatched data file, an unreachable audit database or an
exhausted budget answers at once instead of after the server's 20-30 s start. It settles dead
runs as every run's start does, reads the data file's header only, writes nothing but the
``release_refused`` record of a refusal it makes (a missed target, approval, name@version,
budget; the policy, the data file and the database are refused on the terminal only),
contacts no Dask scheduler before every local
check (approval included) has passed, and raises the same :class:`UserError` /
:class:`TargetNotMet` the run would. The run itself checks everything again (under the audit
write lock for the budget): preflight is a fast answer, not the guarantee.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from privrelease.errors import TargetNotMet, UserError
from privrelease.flows import engines, steps
from privrelease.flows.data import require_budget, require_targets
from privrelease.settings import get_settings


def preflight(
    policy_path: str | Path,
    *,
    data_path: str | Path | None = None,
    output_format: str = "parquet",
    production: bool | None = None,
    engine: str | None = None,
    dask_address: str | None = None,
    workers: int | None = None,
) -> tuple[str, ...]:
    """Settle the runs a crash left unfinished (:func:`.steps.settle_crashed_runs`, when the
    audit database exists: whatever this run's outcome), then check the policy file
    (:func:`_check`). Returns the plan's warnings (:attr:`privrelease.planning.Plan.warnings`:
    cells unlikely to reach k, ...)."""
    _settle()
    source = steps.PolicySource.from_file(policy_path)
    choice = {"engine": engine, "dask_address": dask_address, "workers": workers}
    return _check(source, data_path, output_format, production, choice)


def preflight_rerun(
    run_id: str, *, data_path: str | Path | None = None, output_format: str = "parquet", **options: Any
) -> tuple[str, ...]:
    """What a rerun of run ``run_id`` (id or unique prefix) would refuse before Prefect starts:
    an unknown run, a stored policy whose hierarchy files changed
    (:func:`privrelease.flows.opening.rerun_source`), then what :func:`_check` checks of that
    stored policy and the data file the rerun reads. ``options``: ``production``, ``engine``,
    ``dask_address``, ``workers``, as for :func:`preflight`."""
    from privrelease.flows.opening import rerun_data, rerun_engine, rerun_source

    check_output_format(output_format)
    _settle()
    source, manifest_data, source_run, _ = rerun_source(run_id)
    data = rerun_data(source_run, None if data_path is None else str(data_path), manifest_data)
    production = options.pop("production", None)
    choice = rerun_engine(source_run, {"engine": None, "dask_address": None, "workers": None, **options})
    return _check(source, data, output_format, production, choice)


def _settle() -> None:
    """Settle the runs a crash left unfinished, when the audit database exists."""
    from privrelease.audit.database import exists, get_engine

    if exists(get_engine()):
        steps.settle_crashed_runs(mark_flow_runs=False)


def _check(
    source: steps.PolicySource,
    data_path: str | Path | None,
    output_format: str,
    production: bool | None,
    choice: dict[str, Any],
) -> tuple[str, ...]:
    """Check, in order: the policy (and ``dataset.id`` for a charged release), the output format,
    the data file (a Parquet folder: its first file) and its header, the plan's targets, the
    audit database (its chain, as every run checks it before spending:
    :func:`~privrelease.audit.witness.check_before_spending`), the approval (production mode),
    that its name@version is not registered with other content and that the release fits its
    dataset's lifetime budget; last, once every local check has passed, that the engine's Dask
    scheduler answers (no host a draft names is contacted before its approval). A refusal from
    the targets on leaves one ``release_refused`` audit record
    (:func:`~privrelease.flows.opening.record_refusal`), as a run refused at its start does."""
    from privrelease.audit import approvals, witness
    from privrelease.audit.database import open_database, session
    from privrelease.flows.opening import record_refusal

    loaded = source.load()
    loaded.require_dataset_id()
    chosen = steps.engine_of(loaded, **choice)
    check_output_format(output_format)
    data = loaded.data_file(None if data_path is None else str(data_path))
    first = data
    if data.is_dir():
        from privrelease.flows.partitions import dataset_files
        from privrelease.policies.loader import confine

        first = confine(dataset_files(data)[0], loaded.base_dir, what="dataset file")
    header = steps.header_names(first, loaded.policy.dataset)
    if header is not None:
        absent = [name for name in loaded.policy.dataset.columns if name not in header]
        if absent:
            raise UserError(  # the terminal only (a run started records it as a failed data check)
                f"dataset file {str(first)!r} has no column {absent[0]!r} (declared in dataset.columns); "
                f"its columns are: {', '.join(map(repr, header))}"
            )
    plan = steps.plan_summary(source)
    facts = approvals.policy_facts(loaded)
    refusal: UserError | TargetNotMet | None = None
    try:
        require_targets(plan, f"{facts.name}@{facts.version}")
    except TargetNotMet as error:
        refusal = error
    with session(open_database()) as s:  # a tampered, cut-short or rolled-back database: before Prefect
        witness.check_before_spending(s)
        refusal = refusal or _refusal(s, loaded, facts, plan, production, str(data))
        if refusal is not None:
            record_refusal(s, facts, refusal)
    if refusal is not None:
        raise refusal
    engines.check_reachable(chosen)
    return plan.warnings


def _refusal(
    session: Any, loaded: Any, facts: Any, plan: Any, production: bool | None, data: str
) -> UserError | TargetNotMet | None:
    """Why the run would refuse the release at its start: not approved (production mode), its
    name@version registered with other content, or a lifetime budget it would not fit."""
    from privrelease.audit import approvals

    try:
        if production or get_settings().production or approvals.production_mode(session):
            approvals.require_approved(session, facts, loaded.policy.approval, data_path=data)
        clash = approvals.version_clash(session, facts)
        if clash is not None:
            return UserError(clash.message)
        require_budget(session, loaded, plan)
    except (UserError, TargetNotMet) as error:
        return error
    return None


def check_output_format(output_format: str) -> None:
    """:class:`UserError` unless ``output_format`` is one the flow writes."""
    if output_format not in steps.OUTPUT_FORMATS:
        raise UserError(f"output format must be one of {', '.join(steps.OUTPUT_FORMATS)}; got {output_format!r}")
