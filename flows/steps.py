"""The steps of a release, as plain functions (the Prefect tasks in :mod:`.release` wrap them;
tests call them directly, without Prefect).

A release, in order (each step's result is a small, picklable summary; no step returns data):

1. :func:`verify_policy` - load the policy (a file, or for a rerun the stored canonical policy),
   register it, and in production mode refuse it unless its exact hash is approved; start the
   run (audit status ``pending``).
2. :func:`prepare_outputs` - create the hidden staging folder ``OUT/.<release>.partial`` (an
   unwritable output folder fails here, before any budget is touched) and remove staging
   folders of crashed runs.
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
8. :func:`render_report` - the disclosure report and the public disclosure statement, into the
   staging folder.
9. :func:`publish` - in one transaction commit the budget and record outputs, guarantees and
   report (run ``publishing``); then rename the staging folder into view and record the run's
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

import csv
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.csv as pcsv

import privrelease
from privrelease.errors import TargetNotMet, UserError
from privrelease.flows import recovery, release_facts
from privrelease.settings import get_settings

OUTPUT_FORMATS = ("parquet", "csv")
REPORT_FILE = "report.html"
STATEMENT_FILE = "disclosure-statement.html"
CHAIN_HEAD_FILE = recovery.CHAIN_HEAD_FILE
RUN_MARKER = recovery.RUN_MARKER
MANIFESTS_DIR = "runs"
_log = logging.getLogger("privrelease.flows")
_PUBLISHING: set[str] = set()  # runs of this process whose publishing transaction has begun
_CHUNK = 1 << 20


# --------------------------------------------------------------------------- progress


class ProgressSink(Protocol):
    """Where a step's progress goes: the CLI shows it with Rich; under Prefect the flow logs."""

    def start(self, step: str, description: str) -> None: ...

    def done(self, step: str, seconds: float, note: str = "") -> None: ...


_progress: ProgressSink | None = None


def set_progress(sink: ProgressSink | None) -> None:
    """Install (or remove, with None) the progress sink of this process."""
    global _progress
    _progress = sink


def get_progress() -> ProgressSink | None:
    return _progress


# --------------------------------------------------------------------------- errors


class DataStepError(Exception):
    """A failure while the data is in hand. ``str()`` names the step and the error type only
    (safe for logs and the audit database); ``detail`` is the original message and
    ``original`` the original exception, for the operator's terminal. Pickled (as Prefect does
    for states and results) it keeps neither."""

    def __init__(self, step: str, original: BaseException | None, *, kind: str = "", exit_code: int | None = None):
        self.step = step
        self.original = original
        self.detail = str(original) if original is not None else "(withheld)"
        self.kind = kind or type(original).__name__
        self.exit_code: int | None = getattr(original, "exit_code", exit_code)
        super().__init__(
            f"{step} failed: {self.kind} (details withheld from logs and the "
            "audit database because they may quote the data; shown on the operator's terminal)"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_withheld, (self.step, self.kind, self.exit_code))


def _withheld(step: str, kind: str, exit_code: int | None) -> DataStepError:
    """A :class:`DataStepError` as unpickled: the safe text only."""
    return DataStepError(step, None, kind=kind, exit_code=exit_code)


@contextmanager
def _withholding(step: str) -> Iterator[None]:
    try:
        yield
    except DataStepError:
        raise
    except Exception as error:
        raise DataStepError(step, error) from None


def _write_error(path: Path, error: OSError) -> UserError:
    reason = error.strerror or str(error)
    return UserError(f"cannot write {str(path)!r}: {reason}")


# --------------------------------------------------------------------------- small values


@dataclass(frozen=True)
class PolicySource:
    """A policy as text (YAML or the canonical JSON) with the folder its relative paths resolve
    against. Picklable; :meth:`load` is memoized."""

    text: str
    base_dir: str
    source: str
    path: str | None = None

    def load(self) -> Any:
        return _load_policy(self.text, self.base_dir, self.source)

    @classmethod
    def from_file(cls, path: str | Path) -> PolicySource:
        path = Path(path).expanduser().resolve()
        from privrelease.policies import load_policy

        load_policy(path)  # the loader's messages for missing, unreadable, non-UTF-8 files
        return cls(path.read_text(encoding="utf-8"), str(path.parent), str(path), str(path))


@functools.lru_cache(maxsize=16)
def _load_policy(text: str, base_dir: str, source: str) -> Any:
    from privrelease.policies import load_policy_text

    return load_policy_text(text, base_dir, source=source)


@functools.lru_cache(maxsize=16)
def _plan(text: str, base_dir: str, source: str) -> Any:
    from privrelease.planning import plan_policy

    return plan_policy(_load_policy(text, base_dir, source))


def plan_of(policy: PolicySource) -> Any:
    """The (memoized) :class:`privrelease.planning.Plan` of ``policy``."""
    return _plan(policy.text, policy.base_dir, policy.source)


@dataclass(frozen=True)
class RunContext:
    """What every step after :func:`verify_policy` needs: the run, the policy, where the data
    is and where the outputs go."""

    run_id: str
    policy: PolicySource
    sha256: str
    name: str
    version: str
    production: bool
    approval: dict[str, Any] | None
    data_path: str
    out_root: str
    release_name: str
    output_format: str
    kind: str = "release"
    source_run_id: str | None = None
    expected_fingerprint: str | None = None
    flow_run_id: str | None = None
    code_version: str = ""

    @property
    def staging_dir(self) -> Path:
        return recovery.staging_dir(self.release_dir)

    @property
    def release_dir(self) -> Path:
        return Path(self.out_root) / self.release_name

    def loaded(self) -> Any:
        return self.policy.load()


@dataclass(frozen=True)
class DatasetFacts:
    """A dataset's fingerprint: never its contents."""

    path: str
    sha256: str
    size_bytes: int
    rows: int


@dataclass(frozen=True)
class PlanSummary:
    passed: bool
    notion: str
    event_json: str
    charged_event_json: str | None
    """The DP part of the event tree (what the ledger is charged); None: nothing to charge."""
    checks: list[dict[str, Any]]


@dataclass(frozen=True)
class ReservationFacts:
    entry_id: int
    dataset: str
    notion: str
    budget: dict[str, float]
    before: dict[str, float]
    after: dict[str, float]
    this_release: dict[str, float]


@dataclass(frozen=True)
class ReadFacts:
    rows_read: int
    rows_dropped: int
    data_read_at: datetime


@dataclass(frozen=True)
class OutputFacts:
    """One staged output: the mechanism, its file (name inside the release folder), checksum,
    size and row count, the realized event and the facts split by audience."""

    mechanism: str
    type: str
    file: str
    sha256: str
    rows: int
    bytes: int
    event_json: str
    public_facts: dict[str, Any] = field(default_factory=dict)
    internal_facts: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ReportFacts:
    file: str
    sha256: str
    statement_file: str
    statement_sha256: str
    statement_bytes: int
    release_file: str = ""
    release_sha256: str = ""


@dataclass(frozen=True)
class Published:
    run_id: str
    release_dir: str
    report: str
    statement: str
    chain_head: dict[str, Any]
    outputs: list[dict[str, Any]]
    ledger_after: dict[str, float] | None
    warnings: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- helpers


def _engine() -> Any:
    from privrelease.audit.database import open_database

    return open_database()


@contextmanager
def _session() -> Iterator[Any]:
    from privrelease.audit.database import session

    with session(_engine()) as s:
        yield s


@functools.cache
def code_version() -> str:
    """``privrelease <version>`` plus the git commit of the source tree when it is one."""
    version = f"privrelease {privrelease.__version__}"
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        return version
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return version
    return f"{version} (git {commit})" if commit else version


def safe_name(text: str) -> str:
    """``text`` as a file-name part: letters, digits, ``.``, ``_``, ``-`` (others become ``_``)."""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")
    return cleaned[:80] or "x"


def _budget_dict(budget: Any) -> dict[str, float]:
    return {"epsilon": float(budget.epsilon), "delta": float(budget.delta)}


def manifest_path(run_id: str) -> Path:
    """Where a run's manifest (policy file, hierarchy files, data and output paths) is kept:
    ``<work_dir>/runs/<run_id>.json``. It locates files for a rerun; it holds no data."""
    return get_settings().work_dir / MANIFESTS_DIR / f"{run_id}.json"


def _hierarchy_paths(loaded: Any) -> dict[str, str]:
    return {
        column: str(loaded.resolve(scheme.hierarchy))
        for _loc, column, scheme in loaded.policy.scheme_locations()
        if getattr(scheme, "type", None) == "hierarchy"
    }


def _write_manifest(run: RunContext) -> None:
    path = manifest_path(run.run_id)
    document = {
        "run_id": run.run_id,
        "policy_path": run.policy.path,
        "base_dir": run.policy.base_dir,
        "hierarchies": _hierarchy_paths(run.loaded()),
        "data_path": run.data_path,
        "out_root": run.out_root,
        "release_dir": str(run.release_dir),
        "output_format": run.output_format,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    except OSError as error:
        raise _write_error(path, error) from None


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
    manifest: dict[str, Any] = {}
    path = manifest_path(run.id)
    if path.is_file():
        manifest = json.loads(path.read_text(encoding="utf-8"))
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


def open_run(
    *,
    policy_path: str | None = None,
    rerun_of: str | None = None,
    data_path: str | None = None,
    out_dir: str | None = None,
    output_format: str = "parquet",
    production: bool | None = None,
    flow_run_id: str | None = None,
) -> RunContext:
    """Step 1 from the flow's parameters: the policy file, or (``rerun_of``) the stored policy
    of an earlier run, repeated on the same data (its fingerprint must match)."""
    if (policy_path is None) == (rerun_of is None):
        raise UserError("give either a policy file or the id of a run to repeat")
    if rerun_of is not None:
        source, manifest_data, source_run, fingerprint = rerun_source(rerun_of)
        if data_path is None and manifest_data is None:
            raise UserError(f"run {source_run} has no manifest naming its data file; give --data")
        return verify_policy(
            source,
            data_path=data_path or manifest_data,
            out_dir=out_dir,
            output_format=output_format,
            production=production,
            kind="rerun",
            source_run_id=source_run,
            expected_fingerprint=fingerprint,
            flow_run_id=flow_run_id,
        )
    assert policy_path is not None
    return verify_policy(
        PolicySource.from_file(policy_path),
        data_path=data_path,
        out_dir=out_dir,
        output_format=output_format,
        production=production,
        flow_run_id=flow_run_id,
    )


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
) -> RunContext:
    """Load and validate the policy, register its version, and start the run.

    In production mode (the audit database's mode, the ``PRIVRELEASE_PRODUCTION`` setting or
    ``production=True``; nothing here switches it off) the policy's exact hash must be approved (:func:`privrelease.audit.approvals.require_approved`);
    a refused policy that can be registered gets a failed run recording the refusal."""
    from privrelease.audit import approvals, records

    if output_format not in OUTPUT_FORMATS:
        raise UserError(f"output format must be one of {', '.join(OUTPUT_FORMATS)}; got {output_format!r}")
    loaded = policy.load()
    loaded.require_dataset_id()  # refused before anything is recorded or read
    facts = approvals.policy_facts(loaded)
    settings = get_settings()
    data = str(loaded.data_file(data_path))
    out_root = Path(out_dir).expanduser() if out_dir else settings.work_dir / "releases"
    run_id = uuid.uuid4().hex
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    release_name = f"{safe_name(facts.name)}-v{safe_name(facts.version)}-{stamp}-{run_id[:8]}"
    version = code_version()
    refusal: UserError | None = None
    with _session() as s:
        approval = None
        production = bool(production) or settings.production or approvals.production_mode(s)
        if production:
            try:
                approval = approvals.require_approved(s, facts, loaded.policy.approval)
                require_approved_data(loaded, data)
            except UserError as error:
                refusal = error
        else:
            found = approvals.current_approvals(s, facts.sha256)
            approval = found[0] if found else None
        shown = approvals.describe(s, facts, approval)  # approvers, keys, signatures: for the report
        if refusal is not None and not _registrable(s, facts):
            raise refusal
        approvals.register_policy(s, facts)
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
    )
    _write_manifest(run)
    return run


def require_approved_data(loaded: Any, data: str) -> None:
    """Production mode: the file read must be one the approval saw. The approved policy names
    it (``dataset.path``), or pins its content (``dataset.sha256``, checked when it is
    fingerprinted), which any path may then hold; ``--data`` naming another file is refused."""
    if loaded.policy.dataset.sha256 is None and Path(data).resolve() != loaded.dataset_path.resolve():
        raise UserError(
            f"production mode: --data {data!r} is not the file the approved policy names "
            f"(dataset.path {str(loaded.dataset_path)!r}); approve a policy naming it, or pinning its "
            "content (dataset.sha256)",
            field="--data",
        )


def _registrable(session: Any, facts: Any) -> bool:
    """True when ``facts`` can be registered (no other hash under its name@version)."""
    from sqlmodel import select

    from privrelease.audit.models import PolicyVersion

    clash = session.exec(
        select(PolicyVersion).where(
            PolicyVersion.name == facts.name,
            PolicyVersion.version == facts.version,
            PolicyVersion.sha256 != facts.sha256,
        )
    ).first()
    return clash is None


# --------------------------------------------------------------------------- 2. outputs


def prepare_outputs(run: RunContext) -> str:
    """Settle runs a crash left unfinished (:mod:`.recovery`), create the staging folder (with
    a marker naming the run) and remove staging folders of runs no longer live. Returns its path."""
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
    settle_crashed_runs()
    with _session() as s:
        ledger.reap_expired(s)
    remove_stale_staging(root, keep=run.run_id)
    return str(staging)


def settle_crashed_runs() -> list[recovery.Settled]:
    """Settle the runs whose process died (:func:`.recovery.recover`); inside a Prefect flow,
    also mark their flow runs crashed."""
    settled = recovery.recover(_engine())
    for done in settled:
        logger().warning("settled run %s left %s by a crash: %s (%s)", done.run_id, done.was, done.action, done.detail)
    if settled and "prefect" in sys.modules:
        try:
            recovery.crash_flow_runs(settled)
        except Exception as error:  # the release goes on; `privrelease audit recover` can retry
            logger().warning("could not mark the crashed runs' flow runs: %s", error)
    return settled


def remove_stale_staging(root: Path, *, keep: str | None = None) -> list[Path]:
    """Remove ``root/.*.partial`` folders whose run (named in their marker) is finished or
    unknown: leftovers of crashed runs. Live runs' folders stay. Returns what was removed."""
    from privrelease.audit.database import session
    from privrelease.audit.models import Run

    removed = []
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


# --------------------------------------------------------------------------- 3. fingerprint


def _scan(path: Path, *, whole: bool) -> tuple[str, int, int, bytes]:
    """One pass over a file: its sha256, size, number of lines (a last line without a newline
    counts) and its first line (``whole``: all its bytes). Every fact of the fingerprint comes
    from the bytes hashed, so no swap of the file between two reads can split them."""
    digest = hashlib.sha256()
    size = lines = 0
    last = b"\n"
    kept = bytearray()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
            lines += chunk.count(b"\n")
            last = chunk[-1:]
            if whole or b"\n" not in kept:
                kept += chunk
    if last != b"\n":
        lines += 1
    return digest.hexdigest(), size, lines, bytes(kept) if whole else bytes(kept).split(b"\n", 1)[0]


def header_names(path: Path, dataset: Any) -> list[str] | None:
    """The column names in a data file's CSV header or Parquet schema, read from the file (for
    a quick check; None: a CSV without a header)."""
    if dataset.format == "parquet":
        import pyarrow.parquet as pq

        try:
            return list(pq.read_schema(path).names)
        except (pa.ArrowInvalid, OSError) as error:
            raise UserError(f"dataset file {str(path)!r} is not a readable Parquet file: {error}") from None
    try:
        with open(path, "rb") as handle:
            first_line = handle.readline()
    except OSError as error:
        raise UserError(f"cannot read dataset file {str(path)!r}: {error.strerror or error}") from None
    return csv_header(first_line, path, dataset)


def csv_header(first_line: bytes, path: Path, dataset: Any) -> list[str] | None:
    """The column names of a CSV header line (None: a CSV without a header)."""
    options = dataset.csv
    if options is not None and not options.header:
        return None
    encoding = options.encoding if options is not None else "utf-8"
    try:
        first = first_line.decode(encoding).removeprefix("\ufeff")
    except (UnicodeDecodeError, LookupError):
        raise UserError(f"dataset file {str(path)!r} is not {encoding} text (its header cannot be decoded)") from None
    delimiter = options.delimiter if options is not None else None
    if delimiter is None:
        counts = {d: first.count(d) for d in ",;\t|"}
        delimiter = max(counts, key=counts.__getitem__) if any(counts.values()) else ","
    quote = options.quote if options is not None else '"'
    return next(csv.reader([first.rstrip("\r\n")], delimiter=delimiter, quotechar=quote))


def _parquet_facts(data: bytes, path: Path) -> tuple[list[str], int]:
    """Column names and row count from a Parquet file's footer."""
    import pyarrow.parquet as pq

    try:
        metadata = pq.ParquetFile(pa.BufferReader(data)).metadata
    except (pa.ArrowInvalid, OSError) as error:
        raise UserError(f"dataset file {str(path)!r} is not a readable Parquet file: {error}") from None
    return list(metadata.schema.to_arrow_schema().names), metadata.num_rows


def fingerprint_dataset(run: RunContext) -> DatasetFacts:
    """sha256, size and row count of the dataset file (no contents), checked against the
    policy's declared row count and columns and, for a rerun, the repeated run's fingerprint."""
    loaded = run.loaded()
    dataset = loaded.policy.dataset
    path = Path(run.data_path)
    if not path.is_file():
        raise UserError(f"dataset file {str(path)!r} does not exist or is not a file")
    parquet = dataset.format == "parquet"
    try:
        sha256, size, lines, kept = _scan(path, whole=parquet)
    except OSError as error:
        raise UserError(f"cannot read dataset file {str(path)!r}: {error.strerror or error}") from None
    if parquet:
        header, rows = _parquet_facts(kept, path)
    else:
        header = csv_header(kept, path, dataset)
        rows = lines - (1 if header is not None else 0)
    pinned = dataset.sha256
    if pinned is not None and sha256 != pinned:
        raise UserError(
            f"dataset file {str(path)!r} has sha256 {sha256[:12]}, but the policy pins dataset.sha256 "
            f"{pinned[:12]} (the vintage it was approved for): use that file or a policy for this one"
        )
    if run.expected_fingerprint is not None and sha256 != run.expected_fingerprint:
        raise UserError(
            f"dataset file {str(path)!r} has sha256 {sha256[:12]}, but run "
            f"{run.source_run_id} released from {run.expected_fingerprint[:12]}: a rerun "
            "repeats a release on the same data"
        )
    if header is not None:
        absent = [name for name in dataset.columns if name not in header]
        if absent:
            raise UserError(
                f"dataset file {str(path)!r} has no column {absent[0]!r} (declared in the policy) "
                f"among its {len(header)} columns (their names are part of the data: not recorded; "
                "`privrelease run` lists them on the terminal before it starts)"
            )
    if dataset.rows is not None and rows != dataset.rows:
        raise UserError(
            f"dataset file {str(path)!r} has {rows} data rows; the policy declares "
            f"dataset.rows: {dataset.rows} (a public fact of the release): use the declared "
            "file or correct the policy"
        )
    return DatasetFacts(str(path), sha256, size, rows)


# --------------------------------------------------------------------------- 4. plan


def plan_summary(policy: PolicySource) -> PlanSummary:
    """The plan of ``policy`` as a small summary (no exception when a target is missed)."""
    from privrelease.mechanisms.events import SPLUGen, event_to_json, leaves

    plan = plan_of(policy)
    charged = [m.event for m in plan.mechanisms if not any(isinstance(leaf, SPLUGen) for leaf in leaves(m.event))]
    from privrelease.mechanisms.events import Composed

    return PlanSummary(
        passed=plan.passed,
        notion=plan.notion,
        event_json=event_to_json(plan.event),
        charged_event_json=event_to_json(Composed(events=tuple(charged))) if charged else None,
        checks=[
            {key: getattr(check, key) for key in ("target", "required", "achieved", "passed")} for check in plan.checks
        ],
    )


def plan_release(run: RunContext) -> PlanSummary:
    """Every guarantee of the release from the policy alone; :class:`TargetNotMet` naming the
    missed targets when a check fails."""
    summary = plan_summary(run.policy)
    if not summary.passed:
        missed = [
            f"{check['target']}: required {check['required']}, achieved {check['achieved']}"
            for check in summary.checks
            if not check["passed"]
        ]
        raise TargetNotMet(f"policy {run.name}@{run.version} does not meet its targets: " + "; ".join(missed))
    return summary


# --------------------------------------------------------------------------- 5. budget


def reserve_budget(run: RunContext, dataset: DatasetFacts, plan: PlanSummary) -> ReservationFacts | None:
    """In one transaction, committed before the data is read: register the dataset identity
    ``dataset.id`` (first time: with the policy's lifetime budget, else the
    ``default_lifetime_budget`` setting; a different budget than registered is refused) and the
    file as its vintage, attach the file to the run, and reserve the DP part of the release's
    event tree against the identity's budget. None when nothing is charged (then the dataset is
    registered only when its id and a lifetime budget are known)."""
    from privrelease.audit import ledger, records

    policy = run.loaded().policy
    targets, dataset_id = policy.targets, policy.dataset.id
    with _session() as s:
        try:
            budget = ledger.resolve_lifetime_budget(targets.lifetime_budget)
        except UserError:
            if plan.charged_event_json is not None:
                raise
            budget = None
        if budget is not None and dataset_id is not None:
            records.register_dataset(
                s,
                dataset.sha256,
                identity=dataset_id,
                size_bytes=dataset.size_bytes,
                row_count=dataset.rows,
                lifetime_epsilon=budget.epsilon,
                lifetime_delta=budget.delta,
                notion=targets.accounting,
                label=Path(dataset.path).name,
            )
            records.attach_dataset(s, run.run_id, dataset.sha256)
        if plan.charged_event_json is None:
            return None
        assert dataset_id is not None, "verify_policy refuses a charged release without dataset.id"
        reservation = ledger.reserve(s, dataset_id, run.run_id, plan.charged_event_json, plan.notion)
    return ReservationFacts(
        entry_id=reservation.entry_id,
        dataset=reservation.dataset,
        notion=reservation.notion,
        budget=_budget_dict(reservation.budget),
        before=_budget_dict(reservation.spent_before),
        after=_budget_dict(reservation.total_after),
        this_release=_budget_dict(reservation.this_release),
    )


# --------------------------------------------------------------------------- 6. read


_tables: dict[str, pa.Table] = {}
"""Run id -> the checked table, kept in this process between the read and the mechanisms (it
never passes through Prefect); a mechanism in another process reads the file again."""


def _read(run: RunContext, expected_sha256: str) -> Any:
    """The declared columns of the data, parsed from bytes that hash to ``expected_sha256``."""
    from privrelease.datasets import read_dataset

    dataset = run.loaded().policy.dataset
    options = dataset.csv
    return read_dataset(
        run.data_path,
        format=dataset.format,
        columns={name: spec.type for name, spec in dataset.columns.items()},
        delimiter=options.delimiter if options else None,
        quote=options.quote if options else '"',
        header=options.header if options else True,
        encoding=options.encoding if options else "utf-8",
        missing=dataset.missing,
        missing_values=tuple(dataset.missing_values),
        domains={name: spec.values for name, spec in dataset.columns.items() if spec.values},
        expected_sha256=expected_sha256,
    )


def read_data(run: RunContext, dataset: DatasetFacts) -> ReadFacts:
    """Record the data-read time (status ``running``; after the approval and the reservation
    are committed), then read and check the declared columns. What is read must be the file
    fingerprinted: its bytes are read once and must hash to the fingerprint."""
    from privrelease.audit import records

    with _session() as s:
        record = records.record_data_read(s, run.run_id)
        read_at = record.data_read_at
    with _withholding("reading the data"):
        result = _read(run, dataset.sha256)
    _tables[run.run_id] = result.table
    return ReadFacts(result.rows_read, result.rows_dropped, read_at)


def _table(run: RunContext) -> pa.Table:
    """The run's table: read by :func:`read_data` in this process, or read again here (a task
    in another process), from bytes that hash to the run's recorded fingerprint."""
    table = _tables.get(run.run_id)
    if table is None:
        from privrelease.audit.models import Run

        with _session() as s:
            fingerprint = s.get(Run, run.run_id).dataset_fingerprint
        table = _read(run, fingerprint).table
        _tables[run.run_id] = table
    return table


def forget_data(run_id: str) -> None:
    """Drop the run's table from this process."""
    _tables.pop(run_id, None)


# --------------------------------------------------------------------------- 7. mechanisms


def _execute(loaded: Any, spec: Any, table: pa.Table) -> tuple[Any, Any, dict, dict]:
    """Run one policy mechanism: (output table, realized event, public facts, internal facts)."""
    from privrelease.mechanisms.events import Composed

    kind = spec.type
    if kind == "sdgs":
        from privrelease.mechanisms.sdgs import sdgs

        epsilon = spec.epsilon or 0.0
        if spec.select_scheme is None:
            result = sdgs(
                table,
                loaded.schemes(spec.columns),
                k=spec.k,
                beta=spec.beta,
                epsilon=epsilon,
            )
            return (
                result.table,
                result.event,
                result.public_facts,
                result.internal_facts,
            )
        from privrelease.mechanisms.selection import select_scheme

        candidates = {name: loaded.schemes(spec.columns, candidate=name) for name in spec.select_scheme.candidates}
        selection = select_scheme(
            table,
            candidates,
            k=spec.k,
            beta=spec.beta,
            epsilon=spec.select_scheme.epsilon,
        )
        result = sdgs(table, selection.scheme, k=spec.k, beta=spec.beta, epsilon=epsilon)
        public = {**result.public_facts, "chosen_scheme": selection.name}
        internal = {**result.internal_facts, "selection": selection.internal_facts}
        event = Composed(events=(selection.event, result.event))
        return result.table, event, public, internal
    if kind == "histogram":
        from privrelease.mechanisms.histogram import crowd_blending_histogram

        result = crowd_blending_histogram(
            table,
            loaded.schemes(spec.columns),
            k=spec.k,
            beta=spec.beta,
            epsilon=spec.epsilon,
        )
        return result.table, result.event, result.public_facts, result.internal_facts
    if kind == "identifiable_statistic":
        return _statistic(loaded, spec, table)
    if kind == "splu_gen":
        from privrelease.mechanisms.generalization import generalize
        from privrelease.mechanisms.splu import splu_gen

        columns = {name: table.column(name) for name in spec.sensitive}
        if spec.columns:
            generalized = generalize(table, loaded.schemes(spec.columns))
            columns.update({name: generalized.column(name) for name in spec.columns})
        result = splu_gen(pa.table(columns), list(spec.sensitive), spec.gamma)
        return result.table, result.event, result.public_facts, result.internal_facts
    raise AssertionError(f"unknown mechanism type {kind!r}")


_COUNT_COLUMN = "__privrelease_rows__"


def _statistic(loaded: Any, spec: Any, table: pa.Table) -> tuple[Any, Any, dict, dict]:
    import numpy as np

    from privrelease.mechanisms.generalization import generalize
    from privrelease.mechanisms.schemes import Keep
    from privrelease.mechanisms.statistics import noisy_statistic
    from privrelease.planning import _statistic_calibration, group_domain

    calibration = _statistic_calibration(loaded, spec)
    column = spec.column
    columns: dict[str, Any] = {}
    if column is None:  # a count needs no values: a constant column stands in
        column = _COUNT_COLUMN
        columns[column] = pa.array(np.zeros(table.num_rows, dtype=np.int64))
    else:
        columns[column] = table.column(column)
    domain = None
    if spec.by:
        schemes = {
            name: loaded.scheme(name) if loaded.policy.scheme_for(name) is not None else Keep() for name in spec.by
        }
        generalized = generalize(table, schemes)
        columns.update({name: generalized.column(name) for name in spec.by})
        domain = group_domain(loaded, tuple(spec.by))
    result = noisy_statistic(pa.table(columns), column, calibration, group_domain=domain)
    return result.table, result.event, result.public_facts, result.internal_facts


def _plain_columns(table: pa.Table) -> pa.Table:
    """Dictionary columns decoded (for CSV)."""
    return pa.table(
        {
            name: column.cast(column.type.value_type) if pa.types.is_dictionary(column.type) else column
            for name, column in zip(table.column_names, table.columns, strict=True)
        }
    )


def write_table(table: pa.Table, path: Path, output_format: str) -> None:
    """Write ``table`` to ``path`` (Parquet or CSV) through a temp file in the same folder and
    ``os.replace``; the temp file is removed on any error."""
    from privrelease.datasets import write_parquet

    temp = path.with_name(f".{path.name}.tmp")
    try:
        if output_format == "parquet":
            write_parquet(table, temp)
        else:
            try:
                pcsv.write_csv(
                    _plain_columns(table),
                    temp,
                    pcsv.WriteOptions(quoting_style="needed"),
                )
            except OSError as error:
                raise _write_error(path, error) from None
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def run_mechanism(run: RunContext, name: str) -> OutputFacts:
    """Run the policy mechanism ``name`` on the run's data and write its output to the staging
    folder. The realized event must be the planned one (what was reserved)."""
    from privrelease.audit.chain import file_sha256
    from privrelease.mechanisms.events import event_to_json

    loaded = run.loaded()
    spec = loaded.policy.mechanism(name)
    with _withholding(f"mechanism {name!r} ({spec.type})"):
        table, event, public, internal = _execute(loaded, spec, _table(run))
    planned = {m.name: m.event for m in plan_of(run.policy).mechanisms}
    assert event == planned[name], (
        f"mechanism {name!r} realized {event!r}, but the plan (and the reservation) has {planned[name]!r}"
    )
    file = f"{safe_name(name)}.{run.output_format}"
    path = run.staging_dir / file
    write_table(table, path, run.output_format)
    return OutputFacts(
        mechanism=name,
        type=spec.type,
        file=file,
        sha256=file_sha256(path),
        rows=table.num_rows,
        bytes=path.stat().st_size,
        event_json=event_to_json(event),
        public_facts=_jsonable(public),
        internal_facts=_jsonable(internal),
    )


def _jsonable(value: Any) -> Any:
    """Facts as plain JSON values (numpy scalars to Python, tuples to lists)."""
    return json.loads(json.dumps(value, default=_plain))


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)


# --------------------------------------------------------------------------- 8. report


def report_context(
    run: RunContext,
    *,
    dataset: DatasetFacts,
    reservation: ReservationFacts | None,
    read: ReadFacts,
    outputs: list[OutputFacts],
    timings: dict[str, float],
    status: str = "succeeded",
) -> Any:
    """The :class:`privrelease.reports.context.ReportContext` of a run."""
    from privrelease.audit import chain, ledger
    from privrelease.audit.database import session
    from privrelease.reports.context import ReportContext

    with session(_engine(), readonly=True) as s:
        head = chain.head(s)
        curve = None if reservation is None else ledger.history_curve(s, reservation.dataset, run.run_id)
    internal: dict[str, dict[str, Any]] = {o.mechanism: dict(o.internal_facts) for o in outputs}
    internal["dataset"] = {"rows_read": read.rows_read, "rows_dropped": read.rows_dropped}
    return ReportContext(
        plan=plan_of(run.policy),
        run_id=run.run_id,
        flow_run_id=run.flow_run_id,
        code_version=run.code_version,
        status=status,
        generated_at=datetime.now(UTC),
        approval=run.approval,
        data_read_at=read.data_read_at,
        dataset={
            "sha256": dataset.sha256,
            "size_bytes": dataset.size_bytes,
            "rows": dataset.rows,
        },
        budget=None if reservation is None else reservation.budget,
        ledger_before=None if reservation is None else reservation.before,
        ledger_after=None if reservation is None else reservation.after,
        ledger_curve=curve,
        warnings=release_facts.warnings(outputs),
        outputs=[
            {
                "mechanism": o.mechanism,
                "path": o.file,
                "sha256": o.sha256,
                "rows": o.rows,
                "bytes": o.bytes,
            }
            for o in outputs
        ],
        timings=dict(timings),
        internal_facts=internal,
        chain_head={"seq": head.seq, "hash": head.hash, "public_key": _signing_public_key()},
    )


def _signing_public_key() -> str | None:
    """The public key of the configured signing key (None: records are not signed)."""
    from privrelease.audit import signing

    key = signing.signing_key()
    return None if key is None else signing.public_text(key)


def render_report(run: RunContext, **facts: Any) -> ReportFacts:
    """Render the disclosure report (full, internal) and the public disclosure statement into
    the staging folder; ``facts``: the keyword arguments of :func:`report_context`."""
    from privrelease.reports import write_html
    from privrelease.reports.render import render_report as render

    context = report_context(run, **facts)
    described = json.dumps(release_facts.describe(context.plan, facts["outputs"]), indent=2, sort_keys=True) + "\n"
    files = {}
    for name, public_only in ((REPORT_FILE, False), (STATEMENT_FILE, True), (release_facts.RELEASE_FILE, None)):
        text = described if public_only is None else render(context, public_only=public_only)
        path = run.staging_dir / name
        try:
            sha256 = write_html(text, path)  # the atomic text writer (fsync, rename)
        except OSError as error:
            raise _write_error(path, error) from None
        files[name] = (sha256, len(text.encode("utf-8")))
    return ReportFacts(
        file=REPORT_FILE,
        sha256=files[REPORT_FILE][0],
        statement_file=STATEMENT_FILE,
        statement_sha256=files[STATEMENT_FILE][0],
        statement_bytes=files[STATEMENT_FILE][1],
        release_file=release_facts.RELEASE_FILE,
        release_sha256=files[release_facts.RELEASE_FILE][0],
    )


# --------------------------------------------------------------------------- 9. publish


def _fsync_files(folder: Path) -> None:
    """Flush every file of ``folder`` to disk (they are renamed into view after the commit)."""
    for path in folder.iterdir():
        if path.is_file():
            recovery.fsync(path)


def publish(
    run: RunContext,
    *,
    plan: PlanSummary,
    reservation: ReservationFacts | None,
    outputs: list[OutputFacts],
    report: ReportFacts,
    timings: dict[str, float],
) -> Published:
    """Publish crash-consistently (:mod:`.recovery`): fsync the staged files; in one
    transaction commit the charge and record the outputs (checksums as staged), the guarantees
    with the event tree, the report and the run as ``publishing``; only then rename the staging
    folder into view; then record the run's end and write the chain head beside the outputs.
    A crash anywhere leaves: nothing visible and no charge, or a committed charge that the
    next start rolls forward."""
    from privrelease.audit import chain, ledger, records

    staging, final = run.staging_dir, run.release_dir
    try:
        _fsync_files(staging)
    except OSError as error:
        raise _write_error(staging, error) from None
    recorded = [
        {
            "mechanism": output.mechanism,
            "path": str(final / output.file),
            "sha256": output.sha256,
            "rows": output.rows,
            "bytes": output.bytes,
        }
        for output in outputs
    ]
    _PUBLISHING.add(run.run_id)  # from here a failure keeps the staged files (recovery may need them)
    with _session() as s:
        if reservation is not None:
            ledger.commit(s, reservation.entry_id)
        for output in outputs:
            records.record_output(
                s, run.run_id, final / output.file, sha256=output.sha256, rows=output.rows, size=output.bytes
            )
        for name, digest in (
            (report.statement_file, report.statement_sha256),
            (report.release_file, report.release_sha256),
        ):
            if name:
                size = (staging / name).stat().st_size
                records.record_output(s, run.run_id, final / name, sha256=digest, size=size)
        _record_guarantees(s, run, plan)
        html = (staging / report.file).read_text(encoding="utf-8")
        records.store_report(s, run.run_id, html, path=final / report.file)
        records.start_publishing(s, run.run_id)
    try:
        recovery.make_visible(staging, final)
    except OSError as error:
        raise UserError(f"cannot publish {str(final)!r}: {error.strerror or error}") from None
    forget_data(run.run_id)
    with _session() as s:
        records.finish_run(s, run.run_id, "succeeded", timings=timings)
        head = chain.head(s)
        files = {output.file: output.sha256 for output in outputs}
        files |= {report.file: report.sha256, report.statement_file: report.statement_sha256}
        if report.release_file:
            files[report.release_file] = report.release_sha256
        chain.write_head(final / CHAIN_HEAD_FILE, head, files=files)  # before the commit: see .recovery
    _PUBLISHING.discard(run.run_id)
    recovery.ACTIVE.discard(run.run_id)
    return Published(
        run_id=run.run_id,
        release_dir=str(final),
        report=str(final / report.file),
        statement=str(final / report.statement_file),
        chain_head={"seq": head.seq, "hash": head.hash},
        outputs=recorded,
        ledger_after=None if reservation is None else reservation.after,
        warnings=release_facts.warnings(outputs),
    )


def _record_guarantees(session: Any, run: RunContext, plan: PlanSummary) -> None:
    from privrelease.audit import records

    full = plan_of(run.policy)
    for notion, guarantee in full.composed.items():
        records.record_guarantee(
            session,
            run.run_id,
            notion=notion,
            event_json=plan.event_json,
            epsilon=guarantee.epsilon if guarantee.supported else None,
            delta=guarantee.delta if guarantee.supported else None,
            rho=full.facts.get("rho_composed_statistics"),
            details={
                "supported": guarantee.supported,
                "detail": guarantee.detail,
                "policy_notion": notion == full.notion,
                "checks": plan.checks,
                "charged_event_json": plan.charged_event_json,
            },
        )


# --------------------------------------------------------------------------- failure


def record_failure(
    run: RunContext | None,
    error: BaseException,
    *,
    reservation: ReservationFacts | None = None,
    timings: dict[str, float] | None = None,
) -> str:
    """After a failure: a run already ``publishing`` (its charge committed) is settled by
    :func:`.recovery.settle` (rolled forward when its staged files are whole). Any other run:
    remove the staging folder (nothing is visible), release the reservation and record the run
    as failed. Returns the error text recorded (for a :class:`DataStepError`, its safe text).
    Never raises for cleanup problems."""
    text = f"{type(error).__name__}: {error}" if not isinstance(error, DataStepError) else str(error)
    if run is None:
        return text
    forget_data(run.run_id)
    if run.run_id not in _PUBLISHING:  # nothing committed: nothing of it may ever become visible
        shutil.rmtree(run.staging_dir, ignore_errors=True)
    try:
        _settle_failed(run, text, reservation, timings)
    finally:  # an unrecorded failure is settled by the next release in this process (or after it)
        _PUBLISHING.discard(run.run_id)
        recovery.ACTIVE.discard(run.run_id)
    return text


def _settle_failed(
    run: RunContext, text: str, reservation: ReservationFacts | None, timings: dict[str, float] | None
) -> None:
    """Record the failure: a ``publishing`` run is settled by recovery; any other unfinished
    run has its staging folder removed, its reservation released and is recorded failed."""
    from privrelease.audit import ledger, records
    from privrelease.audit.models import Run

    with _session() as s:
        found = s.get(Run, run.run_id)
        if found is not None and found.status == "succeeded":
            return  # the failure came after the run's end: the release stands
        if found is not None and found.status == "publishing":
            recovery.settle(s, run.run_id)
            return
        shutil.rmtree(run.staging_dir, ignore_errors=True)
        if reservation is not None:
            try:
                ledger.release(s, reservation.entry_id, reason=f"run failed: {text[:500]}")
            except ledger.LedgerStateError:
                pass  # already released or expired
        if found is not None and found.status in ("pending", "running", "failed"):
            records.finish_run(s, run.run_id, "failed", timings=timings, error=text)


def seconds_since(start: float) -> float:
    return round(time.perf_counter() - start, 4)


# --------------------------------------------------------------------------- orchestration


Caller = Callable[..., Any]
"""``call(function, label, *args, **kwargs)``: run one step."""


def call_plain(function: Callable[..., Any], label: str, *args: Any, **kwargs: Any) -> Any:
    return function(*args, **kwargs)


def logger() -> Any:
    """Prefect's run logger inside a flow or task run, else this package's logger (Prefect is
    never imported here: the plain release must not pay for it)."""
    if "prefect" in sys.modules:
        try:
            from prefect import get_run_logger

            return get_run_logger()
        except Exception:  # outside a flow or task run
            pass
    return _log


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
        read = step("read data", "reading the data", read_data, run, dataset)
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
            render_report,
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
