"""What the release steps share: their value types (the small, picklable summaries a step
returns; no step returns data), the policy source, errors that may hold data
(:class:`DataStepError`), progress, the audit-database session, and run manifests."""

from __future__ import annotations

import functools
import json
import logging
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from privrelease.errors import UserError
from privrelease.files import private_folder, write_atomic
from privrelease.flows import recovery
from privrelease.flows.engines import Engine
from privrelease.settings import get_settings
from privrelease.version import VERSION

if TYPE_CHECKING:
    from privrelease.planning import Plan
    from privrelease.policies.loader import LoadedPolicy


OUTPUT_FORMATS = ("parquet", "csv")
REPORT_FILE = "report.html"
STATEMENT_FILE = "disclosure-statement.html"
CHAIN_HEAD_FILE = recovery.CHAIN_HEAD_FILE
RUN_MARKER = recovery.RUN_MARKER
MANIFESTS_DIR = "runs"
_log = logging.getLogger("privrelease.flows")
_CHUNK = 1 << 20


# --------------------------------------------------------------------------- progress


class ProgressSink(Protocol):
    """Where a step's progress goes: the CLI shows it with Rich; under Prefect the flow logs."""

    def start(self, step: str, description: str) -> None: ...

    def done(self, step: str, seconds: float, note: str = "") -> None: ...

    def close(self) -> None:
        """End what :meth:`start` began showing (the release is over or failed)."""


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
def withholding(step: str, error_type: type[DataStepError] = DataStepError) -> Iterator[None]:
    """Any error but a :class:`DataStepError` raised inside becomes one (``error_type``)."""
    try:
        yield
    except DataStepError:
        raise
    except Exception as error:
        raise error_type(step, error) from None


def mechanism_step(spec: Any) -> str:
    """How errors and progress name a policy mechanism's step: ``mechanism 'name' (type)``."""
    return f"mechanism {spec.name!r} ({spec.type})"


def _write_error(path: Path, error: OSError) -> UserError:
    reason = error.strerror or str(error)
    return UserError(f"cannot write {str(path)!r}: {reason}")


# --------------------------------------------------------------------------- small values


@dataclass(frozen=True)
class PolicySource:
    """A policy as text (YAML or the canonical JSON) with the folder its relative paths resolve
    against. Picklable; :meth:`load` is memoized, so a process parses a policy once (the
    pre-flight, the flow's steps and the plan share it)."""

    text: str
    base_dir: str
    source: str
    path: str | None = None

    def load(self) -> LoadedPolicy:
        """The validated policy (parsed once per process)."""
        return _load_policy(self)

    @classmethod
    def from_file(cls, path: str | Path) -> PolicySource:
        """The policy file at ``path`` (the loader's messages for a missing, unreadable or
        non-UTF-8 file), read once; it is parsed on the first :meth:`load`."""
        from privrelease.policies.loader import read_policy_file

        text, real = read_policy_file(Path(path).expanduser())
        return cls(text, str(real.parent), str(real), str(real))


@functools.lru_cache(maxsize=16)
def _load_policy(policy: PolicySource) -> LoadedPolicy:
    from privrelease.policies import load_policy_text

    return load_policy_text(policy.text, policy.base_dir, source=policy.source, path=policy.path)


@functools.lru_cache(maxsize=16)
def plan_of(policy: PolicySource) -> Plan:
    """The (memoized) :class:`privrelease.planning.Plan` of ``policy``, planned once per process."""
    from privrelease.planning import plan_policy

    return plan_policy(policy.load())


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
    engine: Engine = Engine()

    @property
    def staging_dir(self) -> Path:
        return recovery.staging_dir(self.release_dir)

    @property
    def release_dir(self) -> Path:
        return Path(self.out_root) / self.release_name

    def loaded(self) -> LoadedPolicy:
        return self.policy.load()


def csv_arguments(options: Any) -> dict[str, Any]:
    """:func:`privrelease.datasets.read_dataset`'s CSV arguments (delimiter, quote, header, encoding) of a
    policy's ``dataset.csv`` (None: the defaults, delimiter sniffed)."""
    if options is None:
        return {"delimiter": None, "quote": '"', "header": True, "encoding": "utf-8"}
    return {
        "delimiter": options.delimiter,
        "quote": options.quote,
        "header": options.header,
        "encoding": options.encoding,
    }


@dataclass(frozen=True)
class DataFile:
    """One data file as fingerprinted, all from one read of its bytes: path, sha256 and size;
    its column names. Parquet (``format``): per row group its rows, byte range (all its column
    chunks) and that range's sha256; and the sha256 of the footer (the last ``footer_bytes``).
    CSV: per block of whole lines its data rows (blank lines, which the reader skips, not
    counted), byte range and that range's sha256; the first line (the header, or the first
    data row: the dialect is decided from it) is the first ``head_bytes``, with its sha256;
    ``line_rows``: the rows the fingerprint reports (lines, less the header, as in-process)."""

    path: str
    sha256: str
    bytes: int
    columns: tuple[str, ...]
    row_groups: tuple[int, ...]
    ranges: tuple[tuple[int, int], ...]
    range_sha256: tuple[str, ...]
    footer_bytes: int
    footer_sha256: str
    format: Literal["parquet", "csv"] = "parquet"
    head_bytes: int = 0
    head_sha256: str = ""
    line_rows: int | None = None

    @property
    def rows(self) -> int:
        return sum(self.row_groups) if self.line_rows is None else self.line_rows


@dataclass(frozen=True)
class DatasetFacts:
    """A dataset's fingerprint: never its contents."""

    path: str
    sha256: str
    size_bytes: int
    rows: int
    files: tuple[DataFile, ...] = ()
    """The Parquet files of a folder dataset or of a Dask run, each fingerprinted."""


@dataclass(frozen=True)
class PlanSummary:
    passed: bool
    notion: str
    event_json: str
    charged_event_json: str | None
    """The DP part of the event tree (what the ledger is charged); None: nothing to charge."""
    checks: list[dict[str, Any]]
    warnings: tuple[str, ...] = ()
    """The plan's warnings (:attr:`privrelease.planning.Plan.warnings`), from the policy alone."""


@dataclass(frozen=True)
class ReservationFacts:
    entry_id: int
    dataset: str
    notion: str
    budget: dict[str, float]
    before: dict[str, float]
    after: dict[str, float]
    this_release: dict[str, float]
    remaining: dict[str, float]
    at_lifetime_delta: bool


@dataclass(frozen=True)
class ReadFacts:
    rows_read: int
    rows_dropped: int
    data_read_at: datetime
    engine: dict[str, Any] = field(default_factory=lambda: {"description": "in-process"})
    """How the data was read: ``description``, and on Dask ``partitions`` and ``workers``."""
    rows_over_person_bound: int | None = None
    """Rows dropped by ``dataset.person``'s ``max_rows`` (None: no person column)."""


@dataclass(frozen=True)
class StagedFile:
    """A staged file: its name inside the release folder, checksum, row count and size."""

    file: str
    sha256: str
    rows: int
    bytes: int


@dataclass(frozen=True)
class OutputFacts:
    """One staged output: the mechanism, its file (name inside the release folder), checksum,
    size and row count, the realized event and the facts split by audience; ``cells``: its
    companion file, when the mechanism publishes one (SDGS microdata's published cells with
    their count intervals); ``more``: the further files of an output in several (a release of
    several tables, ``noisy_tables``, one file each; SDGS microdata written on Dask, one file
    per worker: :func:`.outputs.write_remote`); ``file`` is the first."""

    mechanism: str
    type: str
    file: str
    sha256: str
    rows: int
    bytes: int
    event_json: str
    public_facts: dict[str, Any] = field(default_factory=dict)
    internal_facts: dict[str, Any] = field(default_factory=dict)
    cells: StagedFile | None = None
    more: tuple[StagedFile, ...] = ()

    def staged(self) -> list[StagedFile]:
        """Every file this output published: its own, its further tables', then its companion's."""
        own = StagedFile(self.file, self.sha256, self.rows, self.bytes)
        return [own, *self.more, *([self.cells] if self.cells else [])]


@dataclass(frozen=True)
class ReportFacts:
    file: str
    sha256: str
    statement_file: str
    statement_sha256: str
    statement_bytes: int
    state: dict[str, Any]
    """What the release is (:meth:`privrelease.reports.context.ReportContext.release_state`)."""
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
    version = f"privrelease {VERSION}"
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


def manifest_path(run_id: str) -> Path:
    """Where a run's manifest (policy file, hierarchy files, data and output paths) is kept:
    ``<work_dir>/runs/<run_id>.json`` (``0600`` in a ``0700`` folder). It locates files for a
    rerun; it holds no data."""
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
        "engine": {"engine": run.engine.name, "dask_address": run.engine.address, "workers": run.engine.workers},
    }
    try:  # private (0700 folder, 0600 file): it names the data files and where releases went
        write_atomic(
            private_folder(path.parent) / path.name, json.dumps(document, indent=2) + "\n", durable=False, mode=0o600
        )
    except OSError as error:
        raise _write_error(path, error) from None


def _manifest(run_id: str) -> dict[str, Any]:
    """The manifest of run ``run_id`` ({} when it has none)."""
    path = manifest_path(run_id)
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def seconds_since(start: float) -> float:
    return round(time.perf_counter() - start, 4)


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
