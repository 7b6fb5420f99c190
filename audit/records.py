"""Audit writes for datasets, runs, outputs, guarantees and reports.

Each function writes its row and appends the hash-chain record describing it
(:func:`privrelease.audit.chain.append`) in the caller's session; leaving the
``with session():`` block commits both. Nothing here stores data: dataset files are known by
fingerprint, outputs by path and sha256, errors by message.

Run lifecycle: :func:`start_run` (``pending``) -> :func:`attach_dataset` (fingerprint known) ->
budget reserved (:mod:`privrelease.audit.ledger`) -> :func:`record_data_read` (``running``: the
audit order shows the approval and the reservation precede the first read of the data) ->
:func:`record_output` / :func:`record_guarantee` / :func:`store_report` with the charge and
:func:`start_publishing` (``publishing``, one transaction, before the folder is visible) ->
:func:`finish_run` (``succeeded`` or ``failed``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, select

from privrelease.audit import chain, identities
from privrelease.audit.models import (
    AuditEvent,
    Dataset,
    Guarantee,
    Output,
    PolicyVersion,
    Report,
    Run,
    utcnow,
)
from privrelease.errors import UserError
from privrelease.files import sha256_file, sha256_text

__all__ = [
    "attach_dataset",
    "find_dataset",
    "find_run",
    "finish_run",
    "guarantees_of",
    "list_datasets",
    "list_runs",
    "outputs_of",
    "record_data_read",
    "record_guarantee",
    "record_output",
    "register_dataset",
    "release_binding",
    "reports_of",
    "start_publishing",
    "start_run",
    "store_report",
]


def register_dataset(
    session: Session,
    fingerprint: str,
    *,
    identity: str,
    size_bytes: int,
    row_count: int,
    lifetime_epsilon: float,
    lifetime_delta: float,
    notion: str,
    label: str | None = None,
) -> Dataset:
    """Register the dataset identity ``identity`` with its lifetime budget (fixed at first
    registration: another budget or notion raises :class:`UserError`) and the file
    ``fingerprint`` as a vintage of it; returns the vintage
    (:mod:`privrelease.audit.identities`)."""
    identities.register_identity(
        session,
        identity,
        lifetime_epsilon=lifetime_epsilon,
        lifetime_delta=lifetime_delta,
        notion=notion,
    )
    return identities.register_vintage(
        session, identity, fingerprint, size_bytes=size_bytes, row_count=row_count, label=label
    )


def list_datasets(session: Session) -> list[Dataset]:
    """Every registered vintage (file), oldest first."""
    statement = select(Dataset).order_by(col(Dataset.registered_at))
    return list(session.exec(statement).all())


def find_dataset(session: Session, ref: str) -> Dataset:
    """A vintage (file) by full fingerprint, unique fingerprint prefix, or label."""
    ref = ref.strip()
    exact = session.get(Dataset, ref.lower())
    if exact is not None:
        return exact
    matches = list(
        session.exec(
            select(Dataset).where(col(Dataset.fingerprint).startswith(ref.lower()) | (col(Dataset.label) == ref))
        ).all()
    )
    if not matches:
        raise UserError(f"no dataset with fingerprint or label {ref!r} in the audit database")
    if len(matches) > 1:
        names = ", ".join(d.fingerprint[:12] for d in matches)
        raise UserError(f"dataset {ref!r} is ambiguous: it matches {names}")
    return matches[0]


def start_run(
    session: Session,
    *,
    policy_sha256: str,
    code_version: str,
    dataset_fingerprint: str | None = None,
    flow_run_id: str | None = None,
    kind: str = "release",
    source_run_id: str | None = None,
    run_id: str | None = None,
    owner: Mapping[str, Any] | None = None,
    release_dir: str | None = None,
    production: bool | None = None,
    kinds: Mapping[str, Any] | None = None,
) -> Run:
    """Create a run (status ``pending``) of the policy content ``policy_sha256``: a registered
    version, or a draft (:func:`.approvals.record_draft`), registered only as it publishes.
    ``kind`` is ``release``, ``rerun`` or ``reissue`` (then ``source_run_id`` names the run
    repeated or handed back). ``owner`` (the process running it) and ``release_dir`` (where
    it will publish) go into the ``run_started`` record, for crash recovery, and so do the
    mode it runs in (``production``) and the code of each mechanism type it runs (``kinds``:
    type -> distribution and version, :func:`privrelease.planning.kind_sources`)."""
    if session.exec(select(PolicyVersion).where(PolicyVersion.sha256 == policy_sha256)).first() is None:
        raise UserError(
            f"policy sha256 {policy_sha256[:12]} is not recorded: approve it, or record it (approvals.record_draft) first"
        )
    run = Run(
        id=run_id or uuid.uuid4().hex,
        policy_sha256=policy_sha256,
        code_version=code_version,
        dataset_fingerprint=dataset_fingerprint,
        flow_run_id=flow_run_id,
        kind=kind,
        source_run_id=source_run_id,
    )
    located: dict[str, Any] = {"owner": dict(owner), "release_dir": release_dir} if owner is not None else {}
    if production is not None:
        located["production"] = production
    if kinds is not None:
        located["kinds"] = dict(kinds)
    chain.append(session, "run_started", run, run=run.id, policy_sha256=policy_sha256, **located)
    return run


def find_run(session: Session, ref: str) -> Run:
    """A run by id or unique id prefix."""
    ref = ref.strip().lower()
    exact = session.get(Run, ref)
    if exact is not None:
        return exact
    matches = list(session.exec(select(Run).where(col(Run.id).startswith(ref))).all()) if ref else []
    if not matches:
        raise UserError(f"no run with id {ref!r} in the audit database")
    if len(matches) > 1:
        raise UserError(f"run id {ref!r} is ambiguous: it matches {len(matches)} runs")
    return matches[0]


def _run(session: Session, run: Run | str) -> Run:
    if isinstance(run, Run):
        return run
    found = session.get(Run, run)
    if found is None:
        raise UserError(f"no run with id {run!r} in the audit database")
    return found


def release_binding(session: Session, run: Run | str, folder: Path | str) -> dict[str, str]:
    """What a release folder's signed head binds it to: the folder's name, the run id and the
    policy (``name@version`` and sha256), so a folder renamed or swapped on the share fails
    ``audit verify-release``."""
    run = _run(session, run)
    version = session.exec(select(PolicyVersion).where(PolicyVersion.sha256 == run.policy_sha256)).one()
    return {
        "folder": Path(folder).name,
        "run": run.id,
        "policy": f"{version.name}@{version.version}",
        "policy_sha256": run.policy_sha256,
    }


def attach_dataset(session: Session, run: Run | str, fingerprint: str) -> Run:
    """Record which (registered) dataset the run releases from."""
    run = _run(session, run)
    if run.dataset_fingerprint == fingerprint:
        return run
    assert run.dataset_fingerprint is None, f"run {run.id} already has a dataset"
    if session.get(Dataset, fingerprint) is None:
        raise UserError(f"dataset {fingerprint[:12]} is not registered: register_dataset first")
    run.dataset_fingerprint = fingerprint
    chain.append(session, "run_dataset", run, run=run.id, dataset=fingerprint)
    return run


def record_data_read(session: Session, run: Run | str) -> Run:
    """Mark the moment the run starts reading the data (status ``running``). Call it after the
    approval check and the budget reservation are committed: the audit order is the proof."""
    run = _run(session, run)
    assert run.status == "pending", f"run {run.id} is {run.status}, not pending"
    run.status, run.data_read_at = "running", utcnow()
    chain.append(session, "data_read", run, run=run.id, dataset=run.dataset_fingerprint)
    return run


def finish_run(
    session: Session,
    run: Run | str,
    status: str,
    *,
    timings: Mapping[str, float] | None = None,
    error: str | None = None,
    fingerprinted: str | None = None,
) -> Run:
    """Close a run as ``succeeded`` or ``failed`` with its step timings (seconds) and, for a
    failure, the error message (never data) and the fingerprint of the data it read before it
    failed (``fingerprinted``; recorded when no dataset is attached to the run, e.g. a run
    refused by its lifetime budget: :func:`fingerprints_of_failed_runs`). Failing a failed run
    is a no-op; any other change of a finished run is refused."""
    assert status in ("succeeded", "failed"), f"status must be succeeded or failed; got {status}"
    run = _run(session, run)
    if run.status == "failed" and status == "failed":
        return run  # already failed (e.g. its reservation expired): keep the first reason
    assert run.status in ("pending", "running", "publishing"), f"run {run.id} is already {run.status}"
    run.status, run.finished_at = status, utcnow()
    run.timings_json = chain.canonical_json(dict(timings or {}))
    run.error = error
    unattached = {"dataset": fingerprinted} if fingerprinted and run.dataset_fingerprint is None else {}
    chain.append(session, "run_finished", run, run=run.id, status=status, **unattached)
    return run


def fingerprints_of_failed_runs(session: Session) -> dict[str, str]:
    """Run id -> the fingerprint of the data a failed run read with no dataset attached (its
    ``run_finished`` record's ``dataset``, :func:`finish_run`)."""
    finished = session.exec(
        select(AuditEvent).where(AuditEvent.kind == "run_finished", col(AuditEvent.payload_json).contains('"dataset":'))
    )
    payloads = [json.loads(record.payload_json) for record in finished]
    return {payload["run"]: payload["dataset"] for payload in payloads if payload.get("dataset")}


def start_publishing(session: Session, run: Run | str) -> Run:
    """Mark a running run ``publishing``: its charge is committed and its outputs recorded in
    this transaction; its folder becomes visible only after it commits."""
    run = _run(session, run)
    assert run.status == "running", f"run {run.id} is {run.status}, not running"
    run.status = "publishing"
    chain.append(session, "run_publishing", run, run=run.id)
    return run


def record_output(
    session: Session,
    run: Run | str,
    path: Path | str,
    *,
    sha256: str | None = None,
    rows: int | None = None,
    size: int | None = None,
) -> Output:
    """Record a published file. The sha256 and size are read from the file unless given (a
    release records them from its staged copy before the file is renamed to ``path``);
    ``path`` is stored as given (absolute paths recommended; relative ones are resolved
    against ``verify(output_root=...)``)."""
    run = _run(session, run)
    file = Path(path)
    digest = sha256 or sha256_file(file)
    output = Output(
        run_id=run.id,
        path=str(path),
        sha256=digest,
        rows=rows,
        bytes=file.stat().st_size if size is None else size,
    )
    chain.append(session, "output_recorded", output, run=run.id, sha256=digest)
    return output


def record_guarantee(
    session: Session,
    run: Run | str,
    *,
    notion: str,
    event_json: str,
    epsilon: float | None = None,
    delta: float | None = None,
    rho: float | None = None,
    details: Mapping[str, Any] | None = None,
) -> Guarantee:
    """Record a guarantee of a run under one accountant (``notion``) with the event tree it was
    computed from (``privrelease.mechanisms.events.event_to_json``)."""
    run = _run(session, run)
    guarantee = Guarantee(
        run_id=run.id,
        notion=notion,
        epsilon=epsilon,
        delta=delta,
        rho=rho,
        details_json=chain.canonical_json(dict(details or {})),
        event_json=event_json,
    )
    chain.append(session, "guarantee_recorded", guarantee, run=run.id, notion=notion)
    return guarantee


def store_report(session: Session, run: Run | str, html: str, *, path: Path | str | None = None) -> Report:
    """Store a run's HTML report and its sha256 (of the UTF-8 bytes, as written to ``path``)."""
    run = _run(session, run)
    digest = sha256_text(html)
    report = Report(
        run_id=run.id,
        html=html,
        sha256=digest,
        path=None if path is None else str(path),
    )
    chain.append(session, "report_stored", report, run=run.id, sha256=digest)
    return report


def list_runs(session: Session, *, limit: int | None = None) -> list[Run]:
    """Runs, newest first."""
    statement = select(Run).order_by(col(Run.started_at).desc()).limit(limit)
    return list(session.exec(statement).all())


def outputs_of(session: Session, run: Run | str) -> list[Output]:
    """A run's recorded output files, in the order recorded."""
    run_id = run.id if isinstance(run, Run) else run
    statement = select(Output).where(Output.run_id == run_id).order_by(col(Output.id))
    return list(session.exec(statement).all())


def guarantees_of(session: Session, run: Run | str) -> list[Guarantee]:
    """A run's recorded guarantees, in the order recorded."""
    run_id = run.id if isinstance(run, Run) else run
    statement = select(Guarantee).where(Guarantee.run_id == run_id).order_by(col(Guarantee.id))
    return list(session.exec(statement).all())


def reports_of(session: Session, run: Run | str) -> list[Report]:
    """A run's stored reports, oldest first (normally one)."""
    run_id = run.id if isinstance(run, Run) else run
    statement = select(Report).where(Report.run_id == run_id).order_by(col(Report.id))
    return list(session.exec(statement).all())
