"""Steps 1-2 of a release: open the run (settle the runs a crash left behind, then load and
verify the policy, approval in production mode, the engine, the run record and manifest) and
prepare the staging folder."""

from __future__ import annotations

import json
import shutil
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from privrelease.audit import bindings
from privrelease.errors import TargetNotMet, UserError
from privrelease.flows import recovery
from privrelease.flows.context import (
    OUTPUT_FORMATS,
    RUN_MARKER,
    PolicySource,
    RunContext,
    _engine,
    _manifest,
    _session,
    _write_manifest,
    code_version,
    logger,
    manifest_path,
    safe_name,
)
from privrelease.flows.engines import Engine
from privrelease.settings import get_settings

# --------------------------------------------------------------------------- 1. policy


def rerun_source(run_id: str) -> tuple[PolicySource, str | None, str, str | None]:
    """The stored policy version of run ``run_id`` as a :class:`PolicySource` (its canonical
    JSON, with hierarchy references replaced by the files the run's manifest names; the
    result must hash to the recorded sha256, so changed files are refused), the data path the run read (from its manifest, or None),
    the run's full id and its dataset fingerprint."""
    from sqlmodel import select

    from privrelease.audit.database import session
    from privrelease.audit.models import PolicyVersion
    from privrelease.audit.records import find_run

    with session(_engine(), readonly=True) as s:
        run = find_run(s, run_id)
        version = s.exec(select(PolicyVersion).where(PolicyVersion.sha256 == run.policy_sha256)).one()
    if run.kind == "reissue":
        raise UserError(f"run {run.id} is a reissue; rerun the release it handed back ({run.source_run_id})")
    path = manifest_path(run.id)
    manifest = _manifest(run.id)
    body = json.loads(version.canonical_json)["policy"]
    schemes = list(body.get("generalization", {}).items())
    for candidate in body.get("candidate_schemes", {}).values():
        schemes.extend(candidate.items())
    for column, scheme in schemes:
        if scheme.get("type") != "hierarchy":
            continue
        file = manifest.get("hierarchies", {}).get(column)
        if file is None:
            raise UserError(
                f"run {run.id}: the policy's hierarchy for column {column!r} is known only by "
                f"its sha256, and no manifest ({path}) names its file; rerun from the policy "
                "file with `privrelease run`"
            )
        scheme["hierarchy"] = file
    base_dir = manifest.get("base_dir") or str(Path.cwd())
    source = PolicySource(
        json.dumps(body, ensure_ascii=False),
        base_dir,
        f"{version.name}@{version.version} (stored policy of run {run.id})",
        manifest.get("policy_path"),
    )
    if source.load().sha256 != version.sha256:
        files = ", ".join(manifest.get("hierarchies", {}).values())
        raise UserError(
            f"the policy of run {run.id} no longer hashes to its approved sha256 "
            f"{version.sha256[:12]}: its hierarchy files ({files}) changed since"
        )
    return source, manifest.get("data_path"), run.id, run.dataset_fingerprint


def rerun_data(source_run: str, data_path: str | None, manifest_data: str | None) -> str:
    """The data file a rerun of ``source_run`` reads: ``data_path``, else the one its manifest names."""
    if data_path is None and manifest_data is None:
        raise UserError(f"run {source_run} has no manifest naming its data file; give --data")
    return str(data_path or manifest_data)


def rerun_engine(source_run: str, choice: dict[str, Any]) -> dict[str, Any]:
    """A rerun's engine parameters: ``choice`` (engine, dask_address, workers), by default the
    engine ``source_run`` used."""
    if choice.get("engine") is not None:
        return choice
    return {**_manifest(source_run).get("engine", {}), **{k: v for k, v in choice.items() if v is not None}}


def record_refusal(
    session: Any, facts: Any, refusal: Exception, flow_run: str | None = None, rerun_of: str | None = None
) -> None:
    """Append the ``release_refused`` record of a release of ``facts`` refused before its run
    started: the policy, its sha256, the reason and, for a rerun, the run it repeats (``rerun_of``)."""
    from privrelease.audit import chain

    chain.append(
        session,
        "release_refused",
        policy=f"{facts.name}@{facts.version}",
        policy_sha256=facts.sha256,
        refusal=type(refusal).__name__,
        reason=str(refusal)[:2000],
        flow_run=flow_run,
        rerun_of=rerun_of,
    )


def open_run(
    *,
    policy_path: str | None = None,
    rerun_of: str | None = None,
    data_path: str | None = None,
    out_dir: str | None = None,
    output_format: str = "parquet",
    production: bool | None = None,
    flow_run_id: str | None = None,
    engine: str | None = None,
    dask_address: str | None = None,
    workers: int | None = None,
) -> RunContext:
    """Step 1 from the flow's parameters: the policy file, or (``rerun_of``) the stored policy
    of an earlier run, repeated on the same data (its fingerprint must match). ``engine``,
    ``dask_address`` and ``workers`` override the policy's ``engine:`` section (a rerun's
    default is the engine its run used). Dead runs are settled first, whatever this run's
    outcome (:func:`settle_crashed_runs`)."""
    settle_crashed_runs()
    choice: dict[str, Any] = {"engine": engine, "dask_address": dask_address, "workers": workers}
    if (policy_path is None) == (rerun_of is None):
        raise UserError("give either a policy file or the id of a run to repeat")
    if rerun_of is not None:
        source, manifest_data, source_run, fingerprint = rerun_source(rerun_of)
        data_path = rerun_data(source_run, data_path, manifest_data)
        choice = rerun_engine(source_run, choice)
        return verify_policy(
            source,
            data_path=data_path,
            out_dir=out_dir,
            output_format=output_format,
            production=production,
            kind="rerun",
            source_run_id=source_run,
            expected_fingerprint=fingerprint,
            flow_run_id=flow_run_id,
            **choice,
        )
    assert policy_path is not None
    return verify_policy(
        PolicySource.from_file(policy_path),
        data_path=data_path,
        out_dir=out_dir,
        output_format=output_format,
        production=production,
        flow_run_id=flow_run_id,
        **choice,
    )


def engine_of(loaded: Any, engine: str | None, dask_address: str | None, workers: int | None) -> Engine:
    """The run's engine: the flow's parameters over the policy's ``engine:`` section; refused
    (:class:`UserError`) when the policy cannot run on it (:func:`.scaled.check_engine`)."""
    from privrelease.flows.scaled import check_engine

    section = loaded.policy.engine
    name = engine or ("dask" if dask_address else section.name)
    chosen = Engine(
        name=name,
        address=dask_address or (section.address if name == section.name else None),
        workers=workers
        if workers is not None
        else (section.workers if name == section.name else None) or Engine.workers,
        rows_per_partition=section.rows_per_partition or Engine.rows_per_partition,
    )
    check_engine(loaded, chosen)
    return chosen


def verify_policy(
    policy: PolicySource,
    *,
    data_path: str | None = None,
    out_dir: str | None = None,
    output_format: str = "parquet",
    production: bool | None = None,
    kind: str = "release",
    source_run_id: str | None = None,
    expected_fingerprint: str | None = None,
    flow_run_id: str | None = None,
    engine: str | None = None,
    dask_address: str | None = None,
    workers: int | None = None,
) -> RunContext:
    """Load and validate the policy, and start the run on its registered version or its draft.

    In production mode (the audit database's mode, the ``PRIVRELEASE_PRODUCTION`` setting or
    ``production=True``; nothing here switches it off) the policy's exact hash must be approved
    for the data the run reads (:func:`privrelease.audit.approvals.require_approved`: here its
    path; the bytes when step 3 fingerprints them). Nothing here registers a version (freezes
    its content under name@version): an approval does, or the transaction that publishes the
    release (:func:`.publishing.publish`). A draft (a hash not registered yet) that is refused
    here (unapproved in production, a missed target, a budget it would not fit, a name@version
    registered with other content) leaves a ``release_refused`` audit record and nothing else;
    one that passes starts its run on a draft row of its content
    (:func:`privrelease.audit.approvals.record_draft`), which claims no name@version, so a run
    refused later (a data check) leaves it a draft, to be edited under the same version. A
    registered version that is refused here gets a failed run recording the refusal."""
    from privrelease.audit import approvals, records, witness
    from privrelease.planning import kind_sources

    if output_format not in OUTPUT_FORMATS:
        raise UserError(f"output format must be one of {', '.join(OUTPUT_FORMATS)}; got {output_format!r}")
    loaded = policy.load()
    loaded.require_dataset_id()  # refused before anything is recorded or read
    chosen = engine_of(loaded, engine, dask_address, workers)
    facts = approvals.policy_facts(loaded)
    settings = get_settings()
    data = str(loaded.data_file(data_path))
    out_root = Path(out_dir).expanduser() if out_dir else settings.work_dir / "releases"
    run_id = uuid.uuid4().hex
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    release_name = f"{safe_name(facts.name)}-v{safe_name(facts.version)}-{stamp}-{run_id[:8]}"
    version = code_version()
    refusal: UserError | TargetNotMet | None = None
    with _session() as s:
        witness.check_before_spending(s, out_root)  # the approvals and revocations read next are the chain's
        approval = None
        production = bool(production) or settings.production or approvals.production_mode(s)
        if production:
            try:
                approval = approvals.require_approved(s, facts, loaded.policy.approval, data_path=data)
            except UserError as error:
                refusal = error
        else:
            found = approvals.current_approvals(s, facts.sha256)
            approval = found[0] if found else None
        shown = approvals.describe(s, facts, approval)  # approvers, keys, signatures: for the report
        draft = not _registered(s, facts)
        if draft and refusal is None:
            refusal = _draft_refusal(s, loaded, policy, facts)
        if refusal is not None and draft:
            record_refusal(s, facts, refusal, flow_run_id, rerun_of=source_run_id)
    if refusal is not None and draft:
        raise refusal
    with _session() as s:
        approvals.record_draft(s, facts)  # its registered version, or its draft
        recovery.ACTIVE.add(run_id)  # before the run exists: no recovery in this process takes it for dead
        records.start_run(
            s,
            policy_sha256=facts.sha256,
            code_version=version,
            flow_run_id=flow_run_id,
            kind=kind,
            source_run_id=source_run_id,
            run_id=run_id,
            owner=recovery.process_owner(),
            release_dir=str(out_root.resolve() / release_name),
            production=production,
            kinds=kind_sources(loaded.policy),
        )
        if refusal is not None:
            records.finish_run(s, run_id, "failed", error=f"refused: {refusal}")
    if refusal is not None:
        recovery.ACTIVE.discard(run_id)
        raise refusal
    run = RunContext(
        run_id=run_id,
        policy=policy,
        sha256=facts.sha256,
        name=facts.name,
        version=facts.version,
        production=production,
        approval=shown,
        data_path=data,
        out_root=str(out_root.resolve()),
        release_name=release_name,
        output_format=output_format,
        kind=kind,
        source_run_id=source_run_id,
        expected_fingerprint=expected_fingerprint,
        flow_run_id=flow_run_id,
        code_version=version,
        engine=chosen,
    )
    _write_manifest(run)
    return run


def approval_binding(loaded: Any, binds: str = bindings.DATA) -> bindings.Binding:
    """What an approval of ``loaded`` binds (``binds``: :data:`.bindings.DATA` or
    :data:`.bindings.PATH`): its ``dataset.path`` resolved here against the policy's folder, and
    the fingerprint of the data there (:func:`.data.dataset_sha256`) when it can be read (inside
    the policy's folder or a data root) or, binding the data, the vintage ``dataset.sha256``
    pins. Binding the data without either is refused (:class:`UserError`)."""
    from privrelease.flows.data import dataset_sha256

    if binds not in bindings.KINDS:
        raise UserError(f"--binds must be one of {', '.join(bindings.KINDS)}; got {binds!r}", field="--binds")
    path = str(loaded.dataset_path.resolve())
    pinned = loaded.policy.dataset.sha256
    if binds == bindings.DATA and pinned is not None:
        return bindings.Binding(binds, path, pinned)
    try:
        sha256 = dataset_sha256(loaded, Path(path))
    except UserError as error:
        if binds == bindings.DATA:
            raise UserError(
                f"cannot bind the approval to the data: {error}; make the data readable here, pin it in the "
                "policy (dataset.sha256) or approve with --binds path (whatever is at that path)",
                field="--binds",
            ) from None
        sha256 = None
    return bindings.Binding(binds, path, sha256)


def _registered(session: Any, facts: Any) -> bool:
    """True when the policy's exact hash is registered already (approved or published)."""
    from privrelease.audit.approvals import registered_version

    found = registered_version(session, facts.name, facts.version)
    return found is not None and found.sha256 == facts.sha256


def _draft_refusal(session: Any, loaded: Any, policy: PolicySource, facts: Any) -> UserError | TargetNotMet | None:
    """Why a draft would be refused later in the run, found before anything is recorded: its
    name@version registered with other content (it could never publish), a missed target, or a
    lifetime budget it would not fit (previewed; the reservation decides)."""
    from privrelease.audit.approvals import version_clash
    from privrelease.flows.data import plan_summary, require_budget, require_targets

    clash = version_clash(session, facts)
    if clash is not None:
        return UserError(clash.message)
    summary = plan_summary(policy)
    try:
        require_targets(summary, f"{facts.name}@{facts.version}")
        require_budget(session, loaded, summary)
    except (UserError, TargetNotMet) as error:
        return error
    return None


# --------------------------------------------------------------------------- 2. outputs


def prepare_outputs(run: RunContext) -> str:
    """Create the staging folder (with a marker naming the run) and remove staging folders of
    runs no longer live (:func:`open_run` settled the dead ones). Returns its path."""
    from privrelease.audit import ledger

    root = Path(run.out_root)
    staging = run.staging_dir
    try:
        root.mkdir(parents=True, exist_ok=True)
        staging.mkdir()
        (staging / RUN_MARKER).write_text(run.run_id + "\n", encoding="utf-8")
    except PermissionError:
        raise UserError(
            f"output folder {str(root)!r} is not writable (permission denied); choose "
            "another --out or fix its permissions"
        ) from None
    except FileExistsError:
        raise UserError(f"staging folder {str(staging)!r} already exists") from None
    except OSError as error:
        raise UserError(f"cannot create the staging folder in {str(root)!r}: {error.strerror or error}") from None
    with _session() as s:
        ledger.reap_expired(s)
    remove_stale_staging(root, keep=run.run_id)
    return str(staging)


_unmarked: list[recovery.Settled] = []
"""Runs settled in this process whose Prefect flow runs are not marked crashed yet."""


def settle_crashed_runs(*, mark_flow_runs: bool = True) -> list[recovery.Settled]:
    """Settle the runs whose process died (:func:`.recovery.recover`). With ``mark_flow_runs``,
    inside a Prefect flow, also mark their flow runs crashed, and those of runs settled earlier
    in this process without it (the pre-flight contacts no server)."""
    settled = recovery.recover(_engine())
    for done in settled:
        logger().warning("settled run %s left %s by a crash: %s (%s)", done.run_id, done.was, done.action, done.detail)
    _unmarked.extend(settled)
    if mark_flow_runs and _unmarked and "prefect" in sys.modules:
        try:
            recovery.crash_flow_runs(_unmarked)
            _unmarked.clear()
        except Exception as error:  # the release goes on; `privrelease audit recover` can retry
            logger().warning("could not mark the crashed runs' flow runs: %s", error)
    return settled


def remove_stale_staging(root: Path, *, keep: str | None = None) -> list[Path]:
    """Remove ``root/.*.partial`` folders whose run (named in their marker) is finished or
    unknown: leftovers of crashed runs. Live runs' folders stay. Returns what was removed."""
    from privrelease.audit.database import session
    from privrelease.audit.models import Run

    removed: list[Path] = []
    candidates = []
    for folder in root.glob(f".*{recovery.STAGING_SUFFIX}"):
        marker = folder / RUN_MARKER
        try:
            run_id = marker.read_text(encoding="utf-8").strip()
        except OSError:
            continue  # not ours, or being created
        if run_id != keep:
            candidates.append((folder, run_id))
    if not candidates:
        return removed
    with session(_engine(), readonly=True) as s:
        live = {
            run_id
            for _, run_id in candidates
            if (found := s.get(Run, run_id)) is not None and found.status in recovery.UNSETTLED
        }
    for folder, run_id in candidates:
        if run_id not in live:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed
