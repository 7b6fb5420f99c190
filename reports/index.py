"""The compliance index: one static HTML page listing every run in the audit database.

:func:`write_index` reads the audit database (policy versions, approvals, runs, guarantees,
reports), writes each run's stored report into the output folder as ``<run id>.html`` when that
file is missing or no longer matches the recorded sha256 (from the database's copy, whose own
sha256 is checked first), and writes ``index.html`` beside them: one row per run, newest first,
with the policy, its hash, the dataset fingerprint, the status, the recorded guarantees against
the policy's targets and a *relative* link to the run's report. The folder can be copied to a
file share and read without a server: Jinja2 autoescaped, inline CSS, no script, no external
resource.

The verdicts are the checks stored with each run, never recomputed here: a run records its
plan's checks (``target``, ``required``, ``achieved``, ``passed``) in the details of the
guarantee it stores under the policy's accounting notion (``flows.publishing``), and the index
shows them. The targets shown beside the values come from the policy version's canonical JSON
(``targets.max_epsilon``, ``delta``, ``rho``, stated under ``targets.accounting``); whether each
was met is the stored check of that target (``max_epsilon (<notion>)``, ``delta (<notion>)``,
``rho (statistics composed)`` or else every ``<mechanism>: rho``). A run that stored no checks
(older runs) shows "not recorded", never a verdict computed now. What the release is, stored
beside the checks (:meth:`privrelease.reports.context.ReportContext.release_state`, as its
report's first screen says it), stands in the verdict's place when it published no rows or far
fewer than planned. A succeeded reissue stores none of these: its row shows (and says it shows)
the guarantees, verdict and report of the run it handed back. ``rho`` is the recorded
composed identifiability of the statistics (Lee & Clifton, rho-differential identifiability).
That the stored guarantees follow from their event trees is ``audit verify``'s replay
(:mod:`privrelease.audit.replay`).

Importing this module is cheap: no Prefect, no calculus, no chart code (Jinja2 and SQLModel
only, loaded on first use).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

from privrelease.files import sha256_file, sha256_text
from privrelease.reports.html import jinja_environment, write_html

__all__ = [
    "INDEX_FILE",
    "IndexResult",
    "collect",
    "render_index",
    "report_file_name",
    "write_index",
]

INDEX_FILE = "index.html"
TEMPLATE = "index.html.j2"
SHORT = 12
"""Characters of a hash shown in the table (the full value is in the policy section / title)."""
NOT_RECORDED = "not recorded"
"""The verdict, and a target's note, when the run stored no check for it (older runs)."""
NOTION_LABELS = {"probabilistic": "probabilistic DP", "approximate": "approximate DP"}
_SAFE_RUN_ID = re.compile(r"[0-9a-f]{8,64}")


# --- what the page shows ---------------------------------------------------------------------


@dataclass(frozen=True)
class Cell:
    """One recorded value (epsilon, delta or rho) and, under the deciding notion, its target:
    ``passed`` is None when there is no target or nothing to compare with it."""

    symbol: str
    value: str
    target: str | None = None
    passed: bool | None = None
    note: str | None = None


@dataclass(frozen=True)
class GuaranteeRow:
    notion: str
    label: str
    decides: bool
    """True for the policy's accounting notion: its targets decide the verdict."""
    cells: list[Cell]
    detail: str | None


@dataclass
class RunRow:
    run_id: str
    kind: str
    source_run_id: str | None
    status: str
    error: str | None
    started_at: datetime
    finished_at: datetime | None
    data_read_at: datetime | None
    code_version: str
    policy_name: str
    policy_version: str
    policy_sha256: str
    dataset: str | None
    """The fingerprint of the data released from, or a failed run read before it was refused."""
    guarantees: list[GuaranteeRow]
    verdict: str
    """``pass``, ``fail``, ``no targets`` or ``not recorded`` (no guarantee or no plan checks stored)."""
    recorded_checks: tuple[int, int] | None
    """(passed, total) of the plan checks stored with the guarantee, when stored."""
    release: dict[str, Any] | None
    """What the release is, stored with the guarantee (``published_rows``, ``published_nothing``,
    ``short_of_plan``: :meth:`privrelease.reports.context.ReportContext.release_state`); None: not stored."""
    approved_before_read: bool | None
    carried_from: str | None = None
    """A succeeded reissue: the run whose outputs, guarantees, verdict and report it handed back."""
    report_href: str | None = None
    report_file: str | None = None
    report_note: str | None = None


@dataclass
class ApprovalRow:
    approved_by: str
    os_user: str
    approved_at: datetime
    note: str | None
    key: str | None
    """Fingerprint of the key that signed it (None: unsigned)."""
    signature: str
    """Its signature checked against the approver registry in effect (:func:`.approvers.check`)."""
    binds: str
    """What it binds of the data (:func:`.bindings.bound`)."""


@dataclass
class PolicyRow:
    name: str
    version: str
    sha256: str
    registered_at: datetime
    accounting: str | None
    targets: list[tuple[str, str]]
    approvals: list[ApprovalRow]
    runs: int
    draft: bool = False
    """Only runs that did not publish used it: it claims no name@version (``registered_at``: first recorded)."""


@dataclass
class IndexData:
    """Everything the index page shows."""

    generated_at: datetime
    database: str
    chain_head: dict[str, Any]
    runs: list[RunRow]
    policies: list[PolicyRow]
    problems: list[str] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for run in self.runs:
            counts[run.status] = counts.get(run.status, 0) + 1
        return dict(sorted(counts.items()))


@dataclass(frozen=True)
class IndexResult:
    """What :func:`write_index` did."""

    path: Path
    runs: int
    reports_linked: int
    reports_written: list[str]
    problems: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "runs": self.runs,
            "reports_linked": self.reports_linked,
            "reports_written": self.reports_written,
            "problems": self.problems,
        }


# --- formatting ------------------------------------------------------------------------------


def _number(value: float | None) -> str:
    """6 significant digits; ``none`` for a missing value (an unsupported guarantee)."""
    if value is None or math.isnan(value):
        return "none"
    return ("∞" if value > 0 else "-∞") if math.isinf(value) else f"{value:.6g}"


def _utc(moment: datetime) -> str:
    """``YYYY-MM-DD HH:MM:SS`` in UTC (the audit database returns aware UTC timestamps)."""
    assert moment.tzinfo is not None, f"naive timestamp {moment}"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _iso(moment: datetime) -> str:
    return _utc(moment).replace(" ", "T") + "Z"


def report_file_name(run_id: str) -> str:
    """The report's file name in the index folder: ``<run id>.html`` (as ``report show`` writes
    it), or a name derived from the id's sha256 for an id that is not plain hex."""
    if _SAFE_RUN_ID.fullmatch(run_id):
        return f"{run_id}.html"
    return f"run-{sha256_text(run_id)[:32]}.html"


# --- targets against the recorded guarantees -------------------------------------------------


def _targets(canonical_json: str) -> dict[str, Any] | None:
    try:
        targets = json.loads(canonical_json)["policy"]["targets"]
    except (ValueError, KeyError, TypeError):
        return None
    return targets if isinstance(targets, dict) else None


def _target_rows(targets: dict[str, Any] | None) -> list[tuple[str, str]]:
    if targets is None:
        return []
    rows = []
    for key, label in (("max_epsilon", "ε ≤"), ("delta", "δ ≤"), ("rho", "ρ ≤")):
        if targets.get(key) is not None:
            rows.append((label, _number(targets[key])))
    budget = targets.get("lifetime_budget")
    if isinstance(budget, dict):
        rows.append(("lifetime budget", f"ε {_number(budget.get('epsilon'))}, δ {_number(budget.get('delta'))}"))
    for key, label in (("splu_privacy", "SPLU privacy"), ("splu_utility", "SPLU utility")):
        if isinstance(targets.get(key), dict):
            rows.append((label, ", ".join(f"{k} {v}" for k, v in sorted(targets[key].items()))))
    return rows


def _stored_check(checks: list[dict[str, Any]] | None, key: str, accounting: str | None) -> bool | None:
    """Whether the run's stored checks say the ``key`` target (``max_epsilon``, ``delta``,
    ``rho``) was met; None when no check of it is stored."""
    if not checks:
        return None
    if key == "rho":
        composed = [c for c in checks if c.get("target") == "rho (statistics composed)"]
        found = composed or [c for c in checks if str(c.get("target", "")).endswith(": rho")]
    else:
        found = [c for c in checks if c.get("target") == f"{key} ({accounting})"]
    return all(c.get("passed") is True for c in found) if found else None


def _cells(guarantee: Any, targets: dict[str, Any] | None, checks: list[dict[str, Any]] | None = None) -> list[Cell]:
    """The recorded epsilon, delta and rho; with ``targets`` (the deciding notion) each beside
    its target (``max_epsilon``, ``delta``, ``rho``), met or not as the run's stored ``checks``
    say (never compared here; no stored check: "not recorded")."""
    accounting = (targets or {}).get("accounting")
    cells = []
    for key, symbol, value in (
        ("max_epsilon", "ε", guarantee.epsilon),
        ("delta", "δ", guarantee.delta),
        ("rho", "ρ", guarantee.rho),
    ):
        shown = "—" if value is None and key == "rho" else _number(value)
        target = None if targets is None else targets.get(key)
        if target is None:
            cells.append(Cell(symbol, shown))
        elif value is None and key == "rho":  # no rho-identifiable statistic: nothing to bound
            cells.append(Cell(symbol, shown, f"≤ {_number(target)}", None, "no ρ-identifiable statistic"))
        else:
            passed = _stored_check(checks, key, accounting)
            cells.append(Cell(symbol, shown, f"≤ {_number(target)}", passed, NOT_RECORDED if passed is None else None))
    return cells


def _details(guarantee: Any) -> dict[str, Any]:
    try:
        details = json.loads(guarantee.details_json or "{}")
    except ValueError:
        return {}
    return details if isinstance(details, dict) else {}


def _guarantee_rows(guarantees: list[Any], targets: dict[str, Any] | None) -> list[GuaranteeRow]:
    accounting = (targets or {}).get("accounting")
    checks = _stored_checks(guarantees, accounting)
    rows = []
    for guarantee in guarantees:
        decides = guarantee.notion == accounting
        details = _details(guarantee)
        rows.append(
            GuaranteeRow(
                notion=guarantee.notion,
                label=NOTION_LABELS.get(guarantee.notion, guarantee.notion),
                decides=decides,
                cells=_cells(guarantee, targets if decides else None, checks),
                detail=details.get("detail") if details.get("supported") is False else None,
            )
        )
    rows.sort(key=lambda row: not row.decides)  # the deciding notion first
    return rows


def _verdict(rows: list[GuaranteeRow], checks: list[dict[str, Any]] | None) -> str:
    """The run's stored plan checks (epsilon, delta, rho, SPLU, lifetime budget, accuracy):
    ``pass`` when every one passed, ``fail`` when one did not, ``no targets`` when the plan had
    none; ``not recorded`` when no guarantee is stored under the policy's notion (a failed run)
    or the run stored no checks (older runs). Nothing is recomputed."""
    if not any(row.decides for row in rows) or checks is None:
        return NOT_RECORDED
    if not checks:
        return "no targets"
    return "pass" if all(check.get("passed") is True for check in checks) else "fail"


def _stored(guarantees: list[Any], accounting: str | None) -> dict[str, Any]:
    """The details the run stored with its guarantee under ``accounting`` (empty: none)."""
    return next((_details(g) for g in guarantees if g.notion == accounting), {})


def _stored_checks(guarantees: list[Any], accounting: str | None) -> list[dict[str, Any]] | None:
    """The plan checks the run stored with its guarantee under ``accounting``; None: none stored."""
    checks = _stored(guarantees, accounting).get("checks")
    return [check if isinstance(check, dict) else {} for check in checks] if isinstance(checks, list) else None


def _stored_release(guarantees: list[Any], accounting: str | None) -> dict[str, Any] | None:
    """What the release is, as the run stored it with its guarantee; None: not stored (older runs)."""
    release = _stored(guarantees, accounting).get("release")
    keys = {"published_rows", "published_nothing", "short_of_plan"}
    return release if isinstance(release, dict) and keys <= release.keys() else None


def _recorded_checks(checks: list[dict[str, Any]] | None) -> tuple[int, int] | None:
    if not checks:
        return None
    return sum(1 for check in checks if check.get("passed") is True), len(checks)


# --- reading the audit database --------------------------------------------------------------


def collect(session: Any, *, database: str = "") -> IndexData:
    """Everything the index shows, read in ``session`` (a read-only snapshot is enough)."""
    from sqlmodel import col, select

    from privrelease.audit import approvals as approval_records
    from privrelease.audit import approvers, bindings, chain, records
    from privrelease.audit.models import Approval, Guarantee, PolicyVersion, Run

    policies = {p.sha256: p for p in session.exec(select(PolicyVersion)).all()}
    approvals: dict[str, list[Any]] = {}
    for approval in session.exec(select(Approval).order_by(col(Approval.approved_at), col(Approval.id))).all():
        approvals.setdefault(approval.policy_sha256, []).append(approval)
    guarantees: dict[str, list[Any]] = {}
    for guarantee in session.exec(select(Guarantee).order_by(col(Guarantee.id))).all():
        guarantees.setdefault(guarantee.run_id, []).append(guarantee)
    runs = sorted(session.exec(select(Run)).all(), key=lambda r: (r.started_at, r.id), reverse=True)
    targets = {sha: _targets(p.canonical_json) for sha, p in policies.items()}
    problems = [
        f"policy {p.name}@{p.version} ({sha[:SHORT]}): its stored canonical JSON has no readable targets"
        for sha, p in policies.items()
        if targets[sha] is None
    ]
    by_id = {run.id: run for run in runs}
    fingerprinted = records.fingerprints_of_failed_runs(session)
    run_rows = []
    for run in runs:
        policy = policies[run.policy_sha256]  # a foreign key: always there
        policy_targets = targets[run.policy_sha256]
        carried = _handed_back(run, by_id)
        facts = carried or run  # a reissue's guarantees, dataset and verdict are its source's
        recorded = guarantees.get(facts.id, [])
        rows = _guarantee_rows(recorded, policy_targets)
        accounting = (policy_targets or {}).get("accounting")
        stored = _stored_checks(recorded, accounting)
        first_approval = (approvals.get(run.policy_sha256) or [None])[0]
        before = None
        if run.data_read_at is not None:
            before = first_approval is not None and first_approval.approved_at < run.data_read_at
        run_rows.append(
            RunRow(
                run_id=run.id,
                kind=run.kind,
                source_run_id=run.source_run_id,
                status=run.status,
                error=run.error,
                started_at=run.started_at,
                finished_at=run.finished_at,
                data_read_at=run.data_read_at,
                code_version=run.code_version,
                policy_name=policy.name,
                policy_version=policy.version,
                policy_sha256=policy.sha256,
                dataset=facts.dataset_fingerprint or fingerprinted.get(facts.id),
                guarantees=rows,
                verdict=_verdict(rows, stored),
                recorded_checks=_recorded_checks(stored),
                release=_stored_release(recorded, accounting),
                approved_before_read=before,
                carried_from=None if carried is None else carried.id,
            )
        )
    registry = approval_records.effective_registry(session)
    run_counts: dict[str, int] = {}
    for run in runs:
        run_counts[run.policy_sha256] = run_counts.get(run.policy_sha256, 0) + 1
    policy_rows = [
        PolicyRow(
            name=p.name,
            version=p.version,
            sha256=p.sha256,
            registered_at=p.registered_at,
            accounting=(targets[p.sha256] or {}).get("accounting"),
            targets=_target_rows(targets[p.sha256]),
            approvals=[
                ApprovalRow(
                    a.approved_by,
                    a.os_user,
                    a.approved_at,
                    a.note,
                    verdict.fingerprint,
                    verdict.status,
                    bindings.bound(a),
                )
                for a in approvals.get(p.sha256, [])
                for verdict in [approvers.check(p, a, registry)]
            ],
            runs=run_counts.get(p.sha256, 0),
            draft=p.draft,
        )
        for p in sorted(policies.values(), key=lambda p: (p.registered_at, p.id or 0), reverse=True)
    ]
    head = chain.head(session)
    return IndexData(
        generated_at=datetime.now(UTC),
        database=database,
        chain_head={"seq": head.seq, "hash": head.hash},
        runs=run_rows,
        policies=policy_rows,
        problems=problems,
    )


def _handed_back(run: Any, runs: dict[str, Any]) -> Any | None:
    """The run a succeeded reissue ``run`` handed back (None for any other run)."""
    if run.kind != "reissue" or run.status != "succeeded" or run.source_run_id is None:
        return None
    return runs.get(run.source_run_id)


def _file_sha256(path: Path) -> str | None:
    try:
        return sha256_file(path)
    except FileNotFoundError:
        return None


def place_reports(session: Any, data: IndexData, folder: Path) -> list[str]:
    """Make each run's newest stored report readable as ``folder/<run id>.html`` and set the
    rows' links. A file that is missing or differs from the recorded sha256 is written from the
    database's copy, after checking that copy against the recorded sha256 (a copy that does not
    match is not written or linked, and is reported as a problem). Returns the names written."""
    from sqlmodel import col, select

    from privrelease.audit.models import Report

    newest: dict[str, tuple[int, str]] = {}
    statement = select(Report.id, Report.run_id, Report.sha256).order_by(col(Report.created_at), col(Report.id))
    for report_id, run_id, sha256 in session.exec(statement).all():
        newest[run_id] = (report_id, sha256)
    written = []
    for row in data.runs:
        owner = row.carried_from or row.run_id  # a reissue links the report it handed back
        if owner not in newest:
            row.report_note = "no report stored"
            continue
        report_id, recorded = newest[owner]
        name = report_file_name(owner)
        target = folder / name
        if _file_sha256(target) != recorded:
            html = session.get(Report, report_id).html
            if sha256_text(html) != recorded:
                row.report_note = "not linked: the stored copy does not match its recorded sha256"
                data.problems.append(
                    f"run {row.run_id}: the audit database's copy of its report does not match the recorded "
                    f"sha256 {recorded[:SHORT]}; not linked (run `privrelease audit verify`)"
                )
                continue
            write_html(html, target)
            written.append(name)
        row.report_file, row.report_href = name, quote(name)
    return written


# --- rendering and writing -------------------------------------------------------------------


def _environment() -> Any:
    return jinja_environment(utc=_utc, iso=_iso)


def render_index(data: IndexData) -> str:
    """The index page (one self-contained, autoescaped HTML document)."""
    return _environment().get_template(TEMPLATE).render(data=data, short=SHORT, notions=NOTION_LABELS)


def write_index(folder: Path | str, engine: Any = None) -> IndexResult:
    """Write the reports that are missing and ``index.html`` into ``folder`` (created)."""
    from privrelease.audit.database import open_database, session

    folder = Path(folder).expanduser().resolve()
    engine = engine or open_database()
    folder.mkdir(parents=True, exist_ok=True)
    with session(engine, readonly=True) as s:
        data = collect(s, database=engine.url.render_as_string(hide_password=True))
        written = place_reports(s, data, folder)
    path = folder / INDEX_FILE
    write_html(render_index(data), path)
    return IndexResult(
        path=path,
        runs=len(data.runs),
        reports_linked=sum(1 for row in data.runs if row.report_href),
        reports_written=written,
        problems=data.problems,
    )
