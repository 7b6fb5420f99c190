"""What a disclosure report is rendered from: the release's :class:`~privrelease.planning.Plan`
(policy-derived, public) and the facts of one run (internal).

The flow fills a :class:`ReportContext` after the outputs are written and hands it to
:func:`privrelease.reports.render.report_html`. Nothing in it may hold raw data: datasets are
known by fingerprint, outputs by name and sha256, mechanisms by counts (rows sampled, cells
suppressed).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import privrelease.policies
from privrelease.files import sha256_text
from privrelease.planning import Plan, plan_policy
from privrelease.policies import LoadedPolicy, load_policy

LOW_SHARE = 0.1
"""An output holding less than this share of what the policy leads to expect (an SDGS sample:
the declared rows x beta) is far short of its plan: its public statement says so."""

EXAMPLES_DIR = Path(privrelease.policies.__file__).resolve().parent / "examples"
"""The example policies (``policies/examples`` in the source tree)."""


@dataclass(frozen=True, kw_only=True)
class ReportContext:
    """Everything a report shows. Only ``plan`` is public; the rest are run facts.

    - ``plan``: the release's plan (mechanisms, event tree, guarantees, checks).
    - ``run_id``, ``flow_run_id`` (Prefect, None outside a flow), ``code_version``, ``status``
      (``succeeded``, ``failed``, ...), ``generated_at`` (aware UTC).
    - ``approval``: ``{approved_by, os_user, approved_at (datetime), note, approvals}`` or None;
      ``approvals``: every current approval ``{approved_by, os_user, approved_at, key (its
      fingerprint or None), signature (status)}`` (:func:`privrelease.audit.approvals.describe`).
    - ``data_read_at``: when the run first read the data (from the audit record) or None.
    - ``dataset``: ``{sha256, size_bytes, rows}`` (a fingerprint, never contents).
    - ``budget``: the dataset's lifetime budget ``{epsilon, delta}`` or None.
    - ``ledger_before`` / ``ledger_after``: ``{epsilon, delta}`` spent (stored trees composed)
      before and after this release; ``ledger_remaining``: what is left after it, as the ledger
      computes it; ``ledger_at_lifetime_delta``: spent and left are epsilons at the lifetime
      delta (approximate DP), so their delta is the lifetime delta, not an amount spent or left.
    - ``ledger_curve``: the dataset's composed privacy curve before and after this release and
      the runway (:func:`privrelease.audit.ledger.history_curve`), or None.
    - ``warnings``: for the operator (internal), other than ``nearly_empty``: a statistic that
      read another number of rows than ``dataset.rows`` declares.
    - ``nearly_empty``: for the operator (internal): outputs with no or few rows.
    - ``outputs``: ``[{mechanism, path (relative name), sha256, rows, bytes}]``.
    - ``timings``: step -> seconds.
    - ``internal_facts``: mechanism name -> facts (rows sampled, cells suppressed, ...).
    - ``public_facts``: mechanism name -> its run's public facts (as in ``release.json``).
    - ``chain_head``: ``{seq, hash}`` of the audit hash chain after this run's records, and
      ``public_key`` when the records are signed.
    - ``production``: the run was a production run, so a counting approval of the policy's hash
      for this data was checked before the data was read
      (:func:`privrelease.audit.approvals.require_approved`); otherwise the release is a draft.
    - ``charts``: the plan's charts when already computed
      (:func:`privrelease.reports.charts.all_charts`, which depends on the plan alone), or None:
      computed when rendered.
    """

    plan: Plan
    run_id: str
    flow_run_id: str | None = None
    rerun_of: str | None = None
    """For a rerun (``privrelease rerun``): the run it repeats."""
    code_version: str
    status: str
    generated_at: datetime
    approval: dict[str, Any] | None = None
    data_read_at: datetime | None = None
    dataset: dict[str, Any] = field(default_factory=dict)
    budget: dict[str, float] | None = None
    ledger_before: dict[str, float] | None = None
    ledger_after: dict[str, float] | None = None
    ledger_remaining: dict[str, float] | None = None
    ledger_at_lifetime_delta: bool = False
    ledger_curve: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    nearly_empty: list[str] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    internal_facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    public_facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    chain_head: dict[str, Any] | None = None
    charts: list[Any] | None = None
    production: bool = False

    @property
    def chosen_schemes(self) -> dict[str, str]:
        """Mechanism -> the candidate scheme its ``select_scheme`` chose, from its public facts (a
        differentially private choice, published in ``release.json``)."""
        return {name: facts["chosen_scheme"] for name, facts in self.public_facts.items() if "chosen_scheme" in facts}

    @property
    def published_rows(self) -> int | None:
        """The rows of every published output's files together (a table's cells one row each: not
        a count of anything across outputs, but 0 only when nothing was published), companion
        files (a microdata's cells with their intervals) left out (None: no file states its rows)."""
        counted = [output["rows"] for output in self._outputs_proper() if output.get("rows") is not None]
        return sum(counted) if counted else None

    @property
    def published_nothing(self) -> bool:
        """A run that succeeded with files that hold no row at all: a release of nothing."""
        return self.status == "succeeded" and self.published_rows == 0

    def short_outputs(self) -> list[dict[str, Any]]:
        """The published files far short of their plan: no row, or fewer than :data:`LOW_SHARE`
        of the rows the policy leads to expect (its kind's
        :meth:`~privrelease.mechanisms.kinds.MechanismKind.expected_rows`, None: unknown)."""
        short: list[dict[str, Any]] = []
        if self.status != "succeeded":
            return short
        for name, files in self.files_by_output().items():
            if any(output.get("rows") is None for output in files):
                continue
            rows = sum(output["rows"] for output in files)
            expected = self.plan.loaded.policy.mechanism(name).expected_rows(self.plan.loaded)
            if rows == 0 or (expected is not None and rows < LOW_SHARE * expected):
                short.append({"mechanism": name, "rows": rows, "expected": expected})
        return short

    def files_by_output(self) -> dict[str, list[dict[str, Any]]]:
        """Per mechanism the files of its output, in order (several: a release of several
        tables, or SDGS microdata written on Dask, each file by a worker), companions left out."""
        files: dict[str, list[dict[str, Any]]] = {}
        for output in self._outputs_proper():
            files.setdefault(output.get("mechanism") or "", []).append(output)
        return files

    def _outputs_proper(self) -> list[dict[str, Any]]:
        """The outputs the mechanisms publish, without their companion files (a companion's rows
        are the published cells, not the release's rows)."""
        return [output for output in self.outputs if not output.get("companion")]

    def release_state(self) -> dict[str, Any]:
        """What the release is, for the first screen of its public statement and
        ``release.json``: ``approved`` (a production run: a counting approval was checked) or
        a ``draft``, its ``published_rows``, whether it ``published_nothing``, the files far
        short of their plan (:meth:`short_outputs`), the plan's warnings (from the policy
        alone, made before any data was read) and, for a rerun, the run it repeats
        (``rerun_of``: the same policy on the same data with fresh randomness, charged again; a
        reader combining both releases learns more than from either)."""
        return {
            "approved": self.production,
            "draft": not self.production,
            "published_rows": self.published_rows,
            "published_nothing": self.published_nothing,
            "short_of_plan": self.short_outputs(),
            "plan_warnings": list(self.plan.warnings),
        } | ({"rerun_of": self.rerun_of} if self.rerun_of else {})

    @property
    def fixed_before_data_access(self) -> bool | None:
        """True when the approval is recorded before the first read of the data, False when
        after, None when either time is unknown."""
        approved_at = (self.approval or {}).get("approved_at")
        if approved_at is None or self.data_read_at is None:
            return None
        return _aware(approved_at) < _aware(self.data_read_at)


def _aware(moment: datetime) -> datetime:
    """Naive timestamps are UTC (the audit database's convention)."""
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment


def example_context(policy: str | Path | LoadedPolicy | None = None, *, status: str = "succeeded") -> ReportContext:
    """A complete context for tests and previews: a real :class:`Plan` of ``policy`` (default
    ``policies/examples/demo.yaml``, which needs no external files) with made-up run facts
    from its kinds (:meth:`~privrelease.mechanisms.kinds.MechanismKind.example_run`; rows from
    the policy, else 10,000) and fake checksums."""
    loaded = policy if isinstance(policy, LoadedPolicy) else load_policy(policy or EXAMPLES_DIR / "demo.yaml")
    plan = plan_policy(loaded)
    now = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
    rows = loaded.policy.dataset.rows or 10_000
    facts: dict[str, dict[str, Any]] = {}
    outputs: list[dict[str, Any]] = []
    for spec in loaded.policy.mechanisms:
        facts[spec.name], published = spec.example_run(loaded, rows)
        parts = published if isinstance(published, dict) else {"": published}
        for part, count in parts.items():
            name = f"{spec.name}-{part}.csv" if part else f"{spec.name}.csv"
            outputs.append(
                {
                    "mechanism": spec.name,
                    "path": name,
                    "sha256": sha256_text(name),
                    "rows": count,
                    "bytes": 40 * count,
                }
            )
    budget = loaded.policy.targets.lifetime_budget
    spent = plan.guarantee
    return ReportContext(
        plan=plan,
        run_id="0123456789abcdef0123456789abcdef",
        flow_run_id="11111111-2222-3333-4444-555555555555",
        code_version="0.1.0+example",
        status=status,
        generated_at=now,
        approval={
            "approved_by": "Disclosure Review Board",
            "os_user": "reviewer",
            "approved_at": now - timedelta(days=2),
            "note": "example approval",
            "approvals": [
                {
                    "approved_by": "Disclosure Review Board",
                    "os_user": "reviewer",
                    "approved_at": now - timedelta(days=2),
                    "key": "3f2a9c0d11e84b7a",
                    "signature": "verified",
                }
            ],
        },
        data_read_at=now - timedelta(seconds=30),
        dataset={
            "sha256": sha256_text("example dataset"),
            "size_bytes": 64 * rows,
            "rows": rows,
        },
        budget=None if budget is None else {"epsilon": budget.epsilon, "delta": budget.delta},
        ledger_before={"epsilon": 0.0, "delta": 0.0},
        ledger_after={"epsilon": spent.epsilon, "delta": spent.delta} if spent.supported else None,
        outputs=outputs,
        timings={
            "load policy": 0.05,
            "fingerprint": 0.12,
            "plan": 0.4,
            "mechanisms": 1.3,
            "write outputs": 0.2,
        },
        internal_facts=facts,
        chain_head={
            "seq": 42,
            "hash": sha256_text("example chain head"),
        },
        production=True,
    )
