"""Crash recovery: settle every run a crash caught between its start and its end.

The publishing order of :func:`privrelease.flows.steps.publish` makes one invariant hold at
every instant, whatever process dies when:

    a release folder is visible  =>  its charge is committed and its outputs are recorded.

1. one transaction commits the charge, records outputs, guarantees and report, and sets the
   run ``publishing``; the staged files are fsynced before it;
2. the staging folder is renamed to the release folder (atomic; the parent is fsynced);
3. a second transaction sets the run ``succeeded``; the chain head (naming that transaction's
   last record) is written beside the outputs just before it commits, so a head file that
   names a record the log lacks belongs to a run still ``publishing``, which recovery rewrites.

A reservation is only ever *released* for a run that never reached step 1, so no reservation
can expire or be given back while its outputs are visible. A run found dead is settled:

* ``pending``/``running`` (no charge committed, nothing visible): the reservation is released,
  the staging folder removed, the run recorded ``failed`` ("rolled back");
* ``publishing``: the charge stands. If the staged (or already renamed) files match the
  checksums recorded in step 1, the folder is made visible and the run ``succeeded`` ("rolled
  forward"); otherwise the run is ``failed`` with the charge kept (charged, never published:
  safe) and the staging folder removed.

Liveness: the ``run_started`` audit record names the process running the release (host, pid
and the process's start time, so a reused pid is not mistaken for it) and the release folder.
A run is dead when that process no longer exists on this host, or when it is this process and
the run is not among the ones it is running (:data:`ACTIVE`: a long-lived worker whose failure
could not be recorded, e.g. while the database was down); runs of another host are left
to their reservation's expiry, or settled explicitly (``privrelease audit recover --run ID``,
which the operator uses only for a run known to be dead). Every release start settles the dead
runs it finds; ``privrelease audit recover`` does the same on demand and also marks their
Prefect flow runs ``Crashed``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

from sqlmodel import col, select

from privrelease.audit import chain
from privrelease.files import fsync, sha256_file

STAGING_SUFFIX = ".partial"
CHAIN_HEAD_FILE = chain.RELEASE_HEAD_FILE
RUN_MARKER = ".privrelease-run"
UNSETTLED = ("pending", "running", "publishing")
ACTIVE: set[str] = set()  # the runs this process is running now (its other unfinished runs are dead)


def staging_dir(release_dir: Path) -> Path:
    """The hidden folder a release is staged in before it becomes ``release_dir``."""
    return release_dir.parent / f".{release_dir.name}{STAGING_SUFFIX}"


def _start_ticks(pid: int) -> int | None:
    """The start time of process ``pid`` in clock ticks since boot (Linux ``/proc``; None
    elsewhere or when there is no such process)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(text.rsplit(")", 1)[1].split()[19])


def process_owner() -> dict[str, Any]:
    """This process as a run's owner: host name, pid and start time."""
    pid = os.getpid()
    return {"host": socket.gethostname(), "pid": pid, "started": _start_ticks(pid)}


def owned_here(owner: dict[str, Any] | None) -> bool:
    """True when ``owner`` is this very process."""
    return bool(owner) and owner == process_owner()


def owner_alive(owner: dict[str, Any] | None) -> bool | None:
    """True/False when the owner's liveness can be told from this host, None when it cannot
    (another host, or no owner recorded)."""
    if not owner or owner.get("host") != socket.gethostname():
        return None
    pid = int(owner["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    started = owner.get("started")
    return started is None or _start_ticks(pid) in (None, started)


def started_facts(session: Any, run_id: str) -> dict[str, Any]:
    """The facts of the run's ``run_started`` record (``owner``, ``release_dir``; {} for runs
    started before they were recorded)."""
    from privrelease.audit.models import AuditEvent

    statement = select(AuditEvent).where(
        AuditEvent.kind == "run_started", col(AuditEvent.payload_json).contains(f'"run":"{run_id}"')
    )
    for record in session.exec(statement):
        payload = json.loads(record.payload_json)
        if payload.get("run") == run_id:
            return payload
    return {}


@dataclass(frozen=True)
class Settled:
    """What recovery did with one run."""

    run_id: str
    was: str
    action: str
    detail: str
    flow_run_id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def make_visible(staging: Path, release: Path) -> None:
    """Remove the staging folder's run marker and rename it to the release folder, durably
    (the parent is fsynced)."""
    (staging / RUN_MARKER).unlink(missing_ok=True)
    os.rename(staging, release)
    fsync(release.parent)


def _matches(folder: Path, expected: Iterable[tuple[str, str]]) -> bool:
    """True when every (file name, sha256) is in ``folder`` with those bytes."""
    try:
        return all(sha256_file(folder / name) == digest for name, digest in expected)
    except OSError:
        return False


def _expected_files(session: Any, run_id: str) -> list[tuple[str, str]]:
    from privrelease.audit import records

    files = [(Path(o.path).name, o.sha256) for o in records.outputs_of(session, run_id)]
    files += [(Path(r.path).name, r.sha256) for r in records.reports_of(session, run_id) if r.path]
    return files


def _reservations(session: Any, run_id: str) -> list[Any]:
    from privrelease.audit.models import LedgerEntry

    return list(session.exec(select(LedgerEntry).where(LedgerEntry.run_id == run_id)))


def _settle_publishing(session: Any, run: Any, release: Path | None) -> tuple[str, str]:
    from privrelease.audit import records

    expected = _expected_files(session, run.id)
    if release is not None:
        staging = staging_dir(release)
        if not release.exists() and staging.exists() and _matches(staging, expected):
            make_visible(staging, release)
        if release.exists() and _matches(release, expected):
            for leftover in release.glob(".*.tmp"):  # of a chain-head write cut short
                leftover.unlink()
            records.finish_run(session, run, "succeeded")
            binding = records.release_binding(session, run, release)
            chain.write_head(release / CHAIN_HEAD_FILE, chain.head(session), files=dict(expected), release=binding)
            return "rolled forward", f"published {release.name} (the charge was already committed)"
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    records.finish_run(
        session,
        run,
        "failed",
        error="publishing was interrupted and the staged outputs are incomplete; the charge stands",
    )
    return "failed, charge kept", "staged outputs incomplete: nothing published; the committed charge stands"


def _settle_unpublished(session: Any, run: Any, release: Path | None) -> tuple[str, str]:
    from privrelease.audit import ledger, records

    if release is not None and release.exists():
        # Only a run of an older version (which made the folder visible before committing)
        # gets here: its outputs may have been seen, so its charge is never given back.
        for entry in _reservations(session, run.id):
            if entry.state == "reserved":
                try:
                    ledger.commit(session, entry.id)
                except ledger.LedgerStateError:
                    pass
        records.finish_run(session, run, "failed", error="crashed after its folder became visible; the charge stands")
        return "failed, charge kept", f"{release.name} is visible but was never recorded: check it by hand"
    for entry in _reservations(session, run.id):
        if entry.state == "reserved":
            ledger.release(session, entry.id, reason="run crashed before publishing (recovered)")
    records.finish_run(session, run, "failed", error="crashed before publishing (recovered): nothing was published")
    if release is not None:
        shutil.rmtree(staging_dir(release), ignore_errors=True)
    return "rolled back", "nothing was published; the reservation was released"


def settle(session: Any, run_id: str) -> Settled | None:
    """Settle run ``run_id`` if it is unsettled (the caller vouches it is dead). Call inside a
    writing session; the chain lock serializes it with every other writer. The database is
    checked first (:func:`.witness.check_before_spending`, and the run's row against its newest
    record): a settlement trusts the rows it changes, and the records it appends would make an
    insider's edit of them (a published run set back to running, a committed charge to
    reserved) look legitimate. A tampered database is refused (:class:`AuditRefused`)."""
    from privrelease.audit import witness
    from privrelease.audit.models import Run
    from privrelease.errors import AuditRefused

    chain.lock(session)
    run = session.get(Run, run_id, populate_existing=True)
    if run is None or run.status not in UNSETTLED:
        return None
    witness.check_before_spending(session)  # its ledger entries as their records say, the chain intact
    problem = witness.recorded(session, mentioning=run.id).problem(run)
    if problem is not None:  # e.g. a published run set back to running: never rolled back
        raise AuditRefused(
            f"run {run_id} is not settled: {problem.message}; nothing was changed "
            "(`privrelease audit verify` names every problem)"
        )
    facts = started_facts(session, run.id)
    release = Path(facts["release_dir"]) if facts.get("release_dir") else None
    was = run.status
    if was == "publishing":
        action, detail = _settle_publishing(session, run, release)
    else:
        action, detail = _settle_unpublished(session, run, release)
    return Settled(run.id, was, action, detail, run.flow_run_id)


def dead_runs(session: Any, *, force: Iterable[str] = ()) -> list[str]:
    """Ids of unsettled runs whose process is known to be gone, plus those in ``force``."""
    from privrelease.audit.models import Run

    forced = set(force)
    unsettled = session.exec(select(Run).where(col(Run.status).in_(UNSETTLED)).order_by(col(Run.started_at)))
    dead = []
    for run in unsettled:
        owner = started_facts(session, run.id).get("owner")
        if run.id in forced or owner_alive(owner) is False or (owned_here(owner) and run.id not in ACTIVE):
            dead.append(run.id)
    return dead


def recover(engine: Any, *, force: Iterable[str] = ()) -> list[Settled]:
    """Settle every dead run (and the runs in ``force``), one transaction per run. An OSError
    (a rename or fsync the system refuses) names the run; settling again resumes it."""
    from privrelease.audit.database import session

    with session(engine, readonly=True) as s:
        candidates = dead_runs(s, force=force)
    settled = []
    for run_id in candidates:
        try:
            with session(engine) as s:
                done = settle(s, run_id)
        except OSError as error:
            raise OSError(
                error.errno,
                f"cannot settle run {run_id}, left unfinished by a crash ({error.strerror or error}); "
                "`privrelease audit recover` tries again",
            ) from error
        if done is not None:
            settled.append(done)
    return settled


def crash_flow_runs(settled: Iterable[Settled]) -> list[str]:
    """Mark the Prefect flow runs of settled runs ``Crashed`` where Prefect still has them
    unfinished. Returns the ids changed. Needs a reachable Prefect API (or an ephemeral one)."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Crashed

    changed = []
    with get_client(sync_client=True) as client:
        for done in settled:
            if not done.flow_run_id:
                continue
            try:
                flow_run = client.read_flow_run(UUID(str(done.flow_run_id)))
            except ObjectNotFound:
                continue
            if flow_run.state is not None and flow_run.state.is_final():
                continue
            client.set_flow_run_state(
                done.flow_run_id, Crashed(message=f"settled by privrelease recovery: {done.action}"), force=True
            )
            changed.append(done.flow_run_id)
    return changed


def release_roots(session: Any, *, output_root: Path | None = None) -> set[Path]:
    """Every folder releases were published into (the parents of recorded release folders)."""
    from privrelease.audit.models import Output

    base = (output_root or Path.cwd()).resolve()
    return {(base / path).parent.parent.resolve() for path in session.exec(select(Output.path))}


def release_folder_problems(session: Any, root: Path, *, output_root: Path | None = None) -> list[str]:
    """What is visible under the release folder ``root`` without a committed, recorded release:
    a folder no succeeded run published (e.g. copied in by hand, or left by a run that failed
    after it became visible), and a file inside a published folder that is not one of its
    recorded outputs. Hidden (staging) folders are not published and are not checked."""
    from privrelease.audit.models import Output, Report, Run

    if not root.is_dir():
        return []
    base = (output_root or Path.cwd()).resolve()
    root = root.resolve()
    status = {run.id: run.status for run in session.exec(select(Run))}
    recorded: dict[str, dict[str, set[str]]] = {}  # folder name -> run id -> file names
    for run_id, path in [
        *session.exec(select(Output.run_id, Output.path)),
        *session.exec(select(Report.run_id, Report.path)),
    ]:
        if not path:
            continue
        full = base / path
        if full.parent.parent.resolve() == root:
            recorded.setdefault(full.parent.name, {}).setdefault(run_id, set()).add(full.name)
    problems = []
    for folder in sorted(p for p in root.iterdir() if not p.name.startswith(".")):
        runs = recorded.get(folder.name, {})
        owners = {status.get(run_id, "unknown"): run_id for run_id in runs}
        if not folder.is_dir() or "succeeded" not in owners:
            problems.append(_unsettled(session, folder, owners))
            continue
        succeeded = (files for run_id, files in runs.items() if status.get(run_id) == "succeeded")
        expected = set().union(*succeeded, {CHAIN_HEAD_FILE})
        for extra in sorted(p.name for p in folder.iterdir() if p.name not in expected):
            problems.append(
                f"{str(folder / extra)!r} is in a published release folder but is not one of its recorded outputs"
            )
    return problems


def _unsettled(session: Any, folder: Path, owners: dict[str, str]) -> str:
    """Why ``folder``, visible in a release folder, is not a recorded release, from the runs
    whose outputs it holds (``owners``: run status -> run id)."""
    name = str(folder)
    if list(owners) == ["publishing"]:
        run = owners["publishing"]
        state, fix = {
            True: ("is still under way", "check again once it has finished"),
            False: ("was interrupted", "`privrelease audit recover` settles it"),
            None: ("was interrupted, or is under way on another host", "`privrelease audit recover` settles it"),
        }[owner_alive(started_facts(session, run).get("owner"))]
        return (
            f"release folder {name!r} belongs to run {run[:12]} whose publishing {state} (charge committed, "
            f"outputs recorded): {fix}"
        )
    if list(owners) == ["failed"]:
        what = "recorded only for a run that failed"
    elif owners:
        what = "recorded only for runs that did not succeed: " + ", ".join(
            f"{run[:12]} ({status})" for status, run in sorted(owners.items())
        )
    else:
        what = "published by no succeeded run"
    return f"release folder {name!r} is visible but {what}: not a recorded release"
