"""Reissue: hand back the outputs of an earlier run without recomputing them (no new charge),
after checking each against its recorded sha256; optionally copied to a new folder. Recorded as
a run of kind ``reissue``. Needs no flow and never imports Prefect."""

from __future__ import annotations

import functools
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from privrelease.errors import UserError
from privrelease.files import sha256_file, write_atomic

__all__ = ["HandedOutput", "Reissued", "reissue"]


@dataclass(frozen=True)
class HandedOutput:
    """An output handed back: its path (the copy's with ``out``), recorded sha256 and rows."""

    path: str
    sha256: str
    rows: int | None


@dataclass(frozen=True)
class Reissued:
    """A reissue: its own run id, the run it handed back, the outputs (checked against their
    recorded sha256), the report's path (None: the source has no report file), the folder the
    copies went to (None without ``out``), the audit chain head after it (``seq``, ``hash``) and,
    for a production release whose approval was revoked since, when (``approval_revoked``:
    :func:`privrelease.audit.approvals.revoked_since`)."""

    run_id: str
    source_run_id: str
    outputs: list[HandedOutput]
    report: str | None
    folder: str | None
    chain_head: dict[str, Any]
    approval_revoked: str | None = None

    @property
    def published_nothing(self) -> bool:
        """Whether every file handed back has no row (the release published nothing)."""
        rows = [output.rows for output in self.outputs if output.rows is not None]
        return bool(rows) and not any(rows)

    def as_dict(self) -> dict[str, Any]:
        """As ``privrelease reissue --json`` prints it."""
        return {**asdict(self), "published_nothing": self.published_nothing}


def reissue(run_ref: str, out: Path | None = None) -> Reissued:
    """Verify and hand back the outputs of run ``run_ref``; with ``out``, copy them (and the
    report) into a new folder under ``out``. Recorded as a ``reissue`` run, with the source run's
    ``kinds`` (the code of each mechanism type that made the outputs); nothing charged."""
    from sqlmodel import col, select

    from privrelease.audit import approvals, chain, records
    from privrelease.audit.database import open_database, session
    from privrelease.audit.models import Output, Report
    from privrelease.flows.recovery import started_facts
    from privrelease.flows.steps import CHAIN_HEAD_FILE, code_version, safe_name

    with session(open_database(), readonly=True) as s:
        source = records.find_run(s, run_ref)
        started = started_facts(s, source.id)
        kinds = started.get("kinds")  # the code that made what is handed back
        outputs = list(s.exec(select(Output).where(Output.run_id == source.id).order_by(col(Output.id))))
        report = s.exec(select(Report).where(Report.run_id == source.id)).first()
        revoked = approvals.revoked_since(s, source) if started.get("production") else None
    if source.status != "succeeded" or source.kind == "reissue":
        raise UserError(
            f"run {source.id} is a {source.kind} that {source.status}; only a succeeded release "
            "or rerun can be reissued"
        )
    files = [(Path(o.path), o.sha256, o.rows) for o in outputs]
    if report is not None and report.path:
        files.append((Path(report.path), report.sha256, None))
    for path, expected, _rows in files:
        try:
            actual = sha256_file(path)
        except OSError:
            raise UserError(
                f"output {path} of run {source.id} is missing; it cannot be reissued "
                "(`privrelease audit verify` lists what changed)"
            ) from None
        if actual != expected:
            raise UserError(
                f"output {path} of run {source.id} was edited (sha256 {actual[:16]} on disk, "
                f"{expected[:16]} recorded); it cannot be reissued"
            )
    handed: list[HandedOutput] = []
    target = None
    if out is not None:
        name = Path(files[0][0]).parent.name if files else safe_name(source.id)
        target = out.expanduser().resolve() / f"{name}-reissue-{time.strftime('%Y%m%dT%H%M%S')}"
        try:
            target.mkdir(parents=True)
        except OSError as error:
            raise UserError(f"cannot create {str(target)!r}: {error.strerror or error}") from None
    with session(open_database()) as s:
        run = records.start_run(
            s,
            policy_sha256=source.policy_sha256,
            code_version=code_version(),
            dataset_fingerprint=source.dataset_fingerprint,
            kind="reissue",
            source_run_id=source.id,
            kinds=kinds,
        )
        report_path = None
        for path, expected, rows in files:
            final = path
            if target is not None:
                final = target / path.name
                write_atomic(final, functools.partial(shutil.copyfile, path), durable=False)
                if sha256_file(final) != expected:
                    raise UserError(f"copy {final} does not match its source's sha256")
            if report is not None and str(path) == report.path:
                report_path = str(final)
                if target is not None:
                    records.record_output(s, run, final, sha256=expected)
                continue
            if target is not None:
                records.record_output(s, run, final, sha256=expected, rows=rows)
            handed.append(HandedOutput(str(final), expected, rows))
        records.finish_run(s, run, "succeeded")
        head = chain.head(s)
        if target is not None:
            chain.write_head(target / CHAIN_HEAD_FILE, head)
    return Reissued(
        run_id=run.id,
        source_run_id=source.id,
        outputs=handed,
        report=report_path,
        folder=None if target is None else str(target),
        chain_head={"seq": head.seq, "hash": head.hash},
        approval_revoked=revoked,
    )
