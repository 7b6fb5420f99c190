"""The checks a release would fail, made in about a second before Prefect starts.

``privrelease run`` and the Python API call :func:`preflight` while the temporary server
starts, so that a broken policy, a missed target, a missing approval, a missing or mismatched
data file, an unreachable audit database or an exhausted budget answers at once instead of
after the server's 20-30 s start. It reads the data file's header only, writes nothing, and
raises the same :class:`UserError` / :class:`TargetNotMet` the run would. The run itself checks
everything again (under the audit write lock for the budget): preflight is a fast answer, not
the guarantee.
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
) -> None:
    """Check, in order: the policy (and ``dataset.id`` for a charged release), the engine (and
    that its scheduler answers), the
    output format, the data file (a Parquet folder: its first file) and its header, the plan's
    targets, the audit database, the approval (production mode) and that the release fits its
    dataset's lifetime budget (cheapest first)."""
    source = steps.PolicySource.from_file(policy_path)
    loaded = source.load()
    loaded.require_dataset_id()
    engines.check_reachable(steps.engine_of(loaded, engine, dask_address, workers))
    if output_format not in steps.OUTPUT_FORMATS:
        raise UserError(f"output format must be one of {', '.join(steps.OUTPUT_FORMATS)}; got {output_format!r}")
    data = loaded.data_file(data_path)
    first = data
    if data.is_dir():
        from privrelease.flows.partitions import dataset_files

        first = dataset_files(data)[0]
    if not first.is_file():
        raise UserError(f"dataset file {str(first)!r} does not exist or is not a file")
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
    from privrelease.audit import approvals
    from privrelease.audit.database import open_database, session

    with session(open_database(), readonly=True) as s:
        if production or get_settings().production or approvals.production_mode(s):
            approvals.require_approved(s, approvals.policy_facts(loaded), loaded.policy.approval, data_path=str(data))
        require_budget(s, loaded, plan)
