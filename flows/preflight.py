"""The checks a release would fail, made in about a second before Prefect starts.

``privrelease run`` and the Python API call :func:`preflight` while the temporary server
starts, so that a broken policy, a missed target, a missing approval, a missing or mismatched
data file, an unreachable audit database or an exhausted budget answers at once instead of
after the server's 20-30 s start. It settles dead runs as every run's start does, reads the
data file's header only, writes nothing else, contacts no Dask scheduler before every local
check (approval included) has passed, and raises the same :class:`UserError` /
:class:`TargetNotMet` the run would. The run itself checks everything again (under the audit
write lock for the budget): preflight is a fast answer, not the guarantee.
"""

from __future__ import annotations

from pathlib import Path

from privrelease.errors import UserError
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
        audit database exists: whatever this run's outcome), then check, in order: the policy (and
        ``dataset.id`` for a charged release), the output format, the data file (a Parquet folder:
        its first file) and its header, the plan's targets, the audit database (its chain, as every run checks it before
    spending: :func:`~privrelease.audit.witness.check_before_spending`), the approval
        (production mode), that its name@version is not registered with other content and that
        the release fits its dataset's lifetime budget (cheapest first); last, once every local check has passed, that the engine's Dask scheduler answers
        (no host a draft names is contacted before its approval). Returns the plan's warnings
        (:attr:`privrelease.planning.Plan.warnings`: cells unlikely to reach k, ...)."""
    from privrelease.audit import approvals, witness
    from privrelease.audit.database import exists, get_engine, open_database, session

    if exists(get_engine()):
        steps.settle_crashed_runs(mark_flow_runs=False)
    source = steps.PolicySource.from_file(policy_path)
    loaded = source.load()
    loaded.require_dataset_id()
    chosen = steps.engine_of(loaded, engine, dask_address, workers)
    check_output_format(output_format)
    data = loaded.data_file(data_path)
    first = data
    if data.is_dir():
        from privrelease.flows.partitions import dataset_files
        from privrelease.policies.loader import confine

        first = confine(dataset_files(data)[0], loaded.base_dir, what="dataset file")
    header = steps.header_names(first, loaded.policy.dataset)
    if header is not None:
        absent = [name for name in loaded.policy.dataset.columns if name not in header]
        if absent:
            raise UserError(  # the terminal only: preflight records nothing
                f"dataset file {str(first)!r} has no column {absent[0]!r} (declared in dataset.columns); "
                f"its columns are: {', '.join(map(repr, header))}"
            )
    plan = steps.plan_summary(source)
    require_targets(plan, f"{loaded.policy.name}@{loaded.policy.version}")
    with session(open_database()) as s:  # a tampered, cut-short or rolled-back database: before Prefect
        witness.check_before_spending(s)
    with session(open_database(), readonly=True) as s:
        facts = approvals.policy_facts(loaded)
        if production or get_settings().production or approvals.production_mode(s):
            approvals.require_approved(s, facts, loaded.policy.approval, data_path=str(data))
        clash = approvals.version_clash(s, facts)
        if clash is not None:
            raise UserError(clash.message)
        require_budget(s, loaded, plan)
    engines.check_reachable(chosen)
    return plan.warnings


def check_output_format(output_format: str) -> None:
    """:class:`UserError` unless ``output_format`` is one the flow writes."""
    if output_format not in steps.OUTPUT_FORMATS:
        raise UserError(f"output format must be one of {', '.join(steps.OUTPUT_FORMATS)}; got {output_format!r}")


def preflight_rerun(run_id: str, *, output_format: str = "parquet") -> None:
    """What a rerun of run ``run_id`` (id or unique prefix) would refuse before Prefect starts:
    the output format, an unknown run, and a stored policy whose hierarchy files changed
    (:func:`privrelease.flows.opening.rerun_source`)."""
    from privrelease.flows.opening import rerun_source

    check_output_format(output_format)
    rerun_source(run_id)
