"""The release steps without Prefect (privrelease.flows.steps): a whole release on the demo data
and the real Adult data, and the faults: each publishes nothing, releases the reservation,
records the failure and loses nothing already stored."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
from sqlmodel import col, select

from privrelease import count_intervals, demo
from privrelease.audit import approvals, chain, ledger, registered, verification
from privrelease.audit.database import open_database, session
from privrelease.audit.models import LedgerEntry, Output, PolicyVersion, Report, Run
from privrelease.errors import TargetNotMet, UserError
from privrelease.files import sha256_file
from privrelease.flows import data, engines, steps
from privrelease.flows.recovery import started_facts
from privrelease.flows.steps import DataStepError, release_plain
from privrelease.mechanisms import composition, splu_scope
from privrelease.mechanisms.events import event_from_json
from privrelease.policies import load_policy
from privrelease.reports.charts import fmt
from privrelease.settings import get_settings

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "policies" / "examples"


# --------------------------------------------------------------------------- fixtures


def variant(demo_dir: Path, name: str, *replacements: tuple[str, str]) -> Path:
    """A copy of the demo policy with text replaced (and its own version)."""
    text = (demo_dir / demo.POLICY_FILE).read_text()
    for old, new in (*replacements, ('version: "1"', f'version: "{name}"')):
        assert old in text, old
        text = text.replace(old, new)
    path = demo_dir / f"{name}.yaml"
    path.write_text(text)
    return path


def runs() -> list[Run]:
    with session(open_database(), readonly=True) as s:
        return list(s.exec(select(Run).order_by(col(Run.started_at))))


def registered_versions() -> list[PolicyVersion]:
    with session(open_database(), readonly=True) as s:
        return list(s.exec(select(PolicyVersion).order_by(col(PolicyVersion.id))))


def refusals() -> list[dict]:
    """The ``release_refused`` audit records (refused drafts), their payloads."""
    with session(open_database(), readonly=True) as s:
        return [json.loads(r.payload_json) for r in chain.records(s) if r.kind == "release_refused"]


def ledger_entries() -> list[LedgerEntry]:
    with session(open_database(), readonly=True) as s:
        return list(s.exec(select(LedgerEntry).order_by(col(LedgerEntry.id))))


def published_dirs(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")) if root.exists() else []


def assert_nothing_published(root: Path, before: list[Path] | None = None) -> None:
    """No new release folder, no staging folder, no temp file under ``root``."""
    assert published_dirs(root) == (before or [])
    if root.exists():
        assert [p for p in root.iterdir() if p.name.startswith(".")] == []
        assert list(root.rglob("*.tmp")) == []


def verify_intact(head_file: Path | None = None) -> None:
    with session(open_database(), readonly=True) as s:
        result = verification.verify(s, head=chain.read_head(head_file) if head_file else None)
    assert result.ok, result.problems


def approve(path: Path, binds: str = "data", **kwargs) -> None:
    """Approve the policy file at ``path`` as ``policy approve --binds BINDS`` does."""
    loaded = load_policy(path)
    binding = steps.approval_binding(loaded, binds)
    with session(open_database()) as s:
        approvals.approve_policy(s, approvals.policy_facts(loaded), "test reviewer", binding=binding, **kwargs)


# --------------------------------------------------------------------------- whole releases


def test_release_on_demo_data(demo_dir, work):
    published = release_plain(policy_path=str(demo_dir / demo.POLICY_FILE))
    folder = Path(published.release_dir)
    root = work / "releases"
    assert published_dirs(root) == [folder]
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [
            "microdata.parquet",
            "microdata.cells.parquet",
            "hours-by-sex.parquet",
            "mean-hours.parquet",
            steps.REPORT_FILE,
            steps.STATEMENT_FILE,
            steps.CHAIN_HEAD_FILE,
            "release.json",
        ]
    )
    microdata = pq.read_table(folder / "microdata.parquet")
    assert microdata.column_names == ["age", "sex", "education", "salary-class"]
    assert 3000 < microdata.num_rows < 6000  # about beta * 50000, less suppressed cells
    assert set(microdata.column("education").to_pylist()) <= {
        "No-diploma",
        "HS-grad",
        "Some-college",
        "Bachelors",
        "Graduate",
    }
    histogram = pq.read_table(folder / "hours-by-sex.parquet")
    assert histogram.column_names == ["hours-per-week", "sex", "count", "estimate", "lower", "upper"]
    cells = histogram.to_pydict()
    counts = cells["count"]
    assert counts and min(counts) >= 20
    # each count with its estimate count / beta (beta 0.1) and the exact 95% interval for the people behind it
    assert cells["estimate"] == [c / 0.1 for c in counts]
    for count, estimate, lower, upper in zip(counts, cells["estimate"], cells["lower"], cells["upper"], strict=True):
        assert count <= lower <= estimate <= upper
    described = json.loads((folder / "release.json").read_text())
    (histogram_entry,) = [o for o in described["outputs"] if o["mechanism"] == "hours-by-sex"]
    stated = histogram_entry["accuracy"]["published_counts"]
    assert stated["confidence"] == 0.95 and set(stated["columns"]) == {"count", "estimate", "lower", "upper"}
    assert "conditional on publication" in stated["construction"] and "no privacy cost" in stated["construction"]
    (microdata_entry,) = [o for o in described["outputs"] if o["mechanism"] == "microdata"]
    assert "--observed c" in microdata_entry["accuracy"]["published_counts"]["how"]
    # the microdata's published cells with their count intervals, beside the rows: the rows grouped
    # by their generalized values (as a user would), each group's size with its exact interval
    companion = pq.read_table(folder / "microdata.cells.parquet")
    labels = ["age", "sex", "education", "salary-class"]
    assert companion.column_names == [*labels, "count", "estimate", "lower", "upper"]
    grouped = microdata.group_by(labels).aggregate([([], "count_all")])
    by_cell = {tuple(row[c] for c in labels): row["count_all"] for row in grouped.to_pylist()}
    rows = companion.to_pylist()
    assert {tuple(row[c] for c in labels): row["count"] for row in rows} == by_cell and len(rows) == len(by_cell)
    expected = count_intervals([row["count"] for row in rows], k=20, beta=0.1, confidence=0.95)
    assert [row["lower"] for row in rows] == expected.lower.tolist()
    assert [row["upper"] for row in rows] == expected.upper.tolist()
    assert [row["estimate"] for row in rows] == expected.estimate.tolist()
    assert microdata_entry["cells"] == {
        "file": "microdata.cells.parquet",
        "sha256": sha256_file(folder / "microdata.cells.parquet"),
        "rows": len(rows),
    }
    assert "companion file '<mechanism>.cells'" in microdata_entry["accuracy"]["published_counts"]["how"]
    mean = pq.read_table(folder / "mean-hours.parquet").column("value").to_pylist()
    assert len(mean) == 1 and 30 < mean[0] < 50
    for output in published.outputs:
        assert sha256_file(Path(output["path"])) == output["sha256"]

    (run,) = runs()
    assert run.status == "succeeded" and run.kind == "release" and run.data_read_at is not None
    assert run.dataset_fingerprint == sha256_file(demo_dir / demo.DATA_FILE)
    assert set(json.loads(run.timings_json)) >= {"verify policy", "read data", "microdata", "report"}
    with session(open_database(), readonly=True) as s:
        outputs = list(s.exec(select(Output).where(Output.run_id == run.id)))
        report = s.exec(select(Report).where(Report.run_id == run.id)).one()
    assert len(outputs) == 6  # three mechanisms, the microdata's cells, the public statement and release.json
    assert report.path == str(folder / steps.REPORT_FILE)
    assert run.id in report.html and "demo-census" in report.html
    (entry,) = ledger_entries()
    assert entry.state == "committed" and entry.epsilon == pytest.approx(3.657, abs=1e-3)
    head = chain.read_head(folder / steps.CHAIN_HEAD_FILE)
    assert head.seq == published.chain_head["seq"]
    verify_intact(folder / steps.CHAIN_HEAD_FILE)
    assert not engines.holds(published.run_id)  # the data is not kept after the run


def test_release_as_csv(demo_dir, work):
    published = release_plain(policy_path=str(demo_dir / demo.POLICY_FILE), output_format="csv")
    histogram = pcsv.read_csv(Path(published.release_dir) / "hours-by-sex.csv")
    assert histogram.column_names == ["hours-per-week", "sex", "count", "estimate", "lower", "upper"]
    assert min(histogram.column("count").to_pylist()) >= 20
    assert (histogram.column("lower").to_numpy() >= histogram.column("count").to_numpy()).all()


def test_release_on_adult_with_scheme_selection(adult_dir, work, tmp_path):
    text = (EXAMPLES / "adult-select.yaml").read_text()
    unbudgeted = tmp_path / "adult-select.yaml"
    unbudgeted.write_text(
        "".join(line for line in text.splitlines(keepends=True) if "lifetime_budget" not in line)
        .replace("../../../shared", str(adult_dir.parent.parent))
        .replace('version: "2"', 'version: "2-unbudgeted"')
    )
    with pytest.raises(UserError, match="no lifetime budget for the dataset"):
        release_plain(policy_path=str(unbudgeted))
    published = release_plain(policy_path=str(EXAMPLES / "adult-select.yaml"))
    output, cells = published.outputs  # the microdata and its published cells (with count intervals)
    assert Path(cells["path"]).name == Path(output["path"]).name.replace(".parquet", ".cells.parquet")
    table = pq.read_table(output["path"])
    assert table.column_names == ["age", "sex", "education", "occupation", "salary-class"]
    assert table.num_rows > 1000
    (entry,) = ledger_entries()
    assert entry.state == "committed"  # selection (0.1) + SDGS (1.0), composed at the lifetime delta
    tree = event_from_json(entry.event_json)
    assert entry.epsilon == pytest.approx(composition.epsilon_at([tree], 1e-6).epsilon)
    assert entry.epsilon < 1.1 and entry.delta == 1e-6
    report = Path(published.report).read_text()  # the internal report shows the lifetime curve and runway
    assert 'id="chart-ledger"' in report and "more runs of this policy fit the lifetime budget" in report
    # the ledger table says what `ledger show` says: the epsilon left at the lifetime delta, never a delta of 0 left
    with session(open_database(), readonly=True) as s:
        left = ledger.ledger_status(s, "adult-census").remaining
    assert left.delta == 1e-6 and left.epsilon > 8
    row = f'<tr><td>ε left at the lifetime δ</td><td class="num">{fmt(left.epsilon)}</td>'
    assert f'{row}<td class="num">at the lifetime δ 1e-06</td></tr>' in report
    assert "<td>remaining</td>" not in report
    # before anything was spent (the dataset's first release) too: the lifetime delta, never 0
    before = '<tr><td>spent before this release (smallest ε at the lifetime δ)</td><td class="num">0</td>'
    assert f'{before}<td class="num">at the lifetime δ 1e-06</td></tr>' in report
    # the statement says which candidate was used, as release.json does
    chosen = json.loads((Path(published.release_dir) / "release.json").read_text())["outputs"][0]["facts"][
        "chosen_scheme"
    ]
    other = ({"coarse", "fine"} - {chosen}).pop()
    statement = Path(published.statement).read_text()
    assert f"microdata used the candidate scheme <strong>{chosen}</strong>" in statement
    assert f"<td>age</td><td>{chosen} (used by microdata)</td>" in statement
    assert f"<td>age</td><td>{other} (not used)</td>" in statement
    verify_intact()


def test_splu_release_charges_no_dp_budget(adult_dir, work):
    """SPLU-Gen is not DP: nothing is reserved, and no lifetime budget is needed."""
    published = release_plain(policy_path=str(EXAMPLES / "adult-splu.yaml"))
    table = pq.read_table(published.outputs[0]["path"])
    assert table.num_rows == 30160  # 30162 rows, made a multiple of gamma = 5
    # release.json says what large-sum utility covers, and what it does not
    (entry,) = json.loads((Path(published.release_dir) / "release.json").read_text())["outputs"]
    assert entry["accuracy"]["large_sum_covers"] == splu_scope.UTILITY_SCOPE
    assert entry["accuracy"]["large_sum_not_covered"] == splu_scope.NO_UTILITY
    assert ledger_entries() == []
    (run,) = runs()
    assert run.status == "succeeded" and run.dataset_fingerprint is None
    verify_intact()


# --------------------------------------------------------------------------- approvals


def test_production_refuses_an_unapproved_policy(demo_dir, work, monkeypatch):
    monkeypatch.setenv("PRIVRELEASE_PRODUCTION", "true")
    policy = demo_dir / demo.POLICY_FILE
    with pytest.raises(UserError, match="is not approved"):
        release_plain(policy_path=str(policy))
    assert_nothing_published(work / "releases")
    assert runs() == [] and ledger_entries() == [] and registered_versions() == []  # a draft stays a draft
    (refused,) = refusals()
    assert refused["policy"] == "demo-census@1" and "is not approved" in refused["reason"]

    approve(policy)
    published = release_plain(policy_path=str(policy))
    run = next(r for r in runs() if r.id == published.run_id)
    with session(open_database(), readonly=True) as s:
        (approval,) = approvals.approvals_of(s, run.policy_sha256)
    assert approval.approved_at < run.data_read_at  # fixed before data access
    verify_intact()


def test_production_mode_of_the_database_cannot_be_switched_off_by_the_runner(demo_dir, work, monkeypatch):
    """The database is set to production (a recorded decision): a runner with
    PRIVRELEASE_PRODUCTION=false and production=False is still refused, `run --no-production`
    does not exist, and each run records the mode it ran in."""
    from typer.testing import CliRunner

    from privrelease.audit.models import AuditEvent
    from privrelease.cli import app

    runner = CliRunner()
    monkeypatch.setenv("PRIVRELEASE_PRODUCTION", "false")
    policy = demo_dir / demo.POLICY_FILE
    first = release_plain(policy_path=str(policy))  # development: runs unapproved
    result = runner.invoke(app, ["audit", "mode", "production", "--by", "Chief Privacy Officer", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output) == {
        "mode": "production",
        "database": "production",
        "environment": False,
        "site": None,
    }
    with pytest.raises(UserError, match="is not approved"):
        release_plain(policy_path=str(policy), production=False)
    flag = runner.invoke(app, ["run", str(policy), "--no-production"])
    assert flag.exit_code == 2 and "No such option" in flag.output
    approve(policy)
    second = release_plain(policy_path=str(policy), production=False)
    with session(open_database(), readonly=True) as s:
        started = {
            payload["run"]: payload.get("production")
            for payload in (json.loads(e.payload_json) for e in s.exec(select(AuditEvent)) if e.kind == "run_started")
        }
        modes = [json.loads(e.payload_json)["request"] for e in s.exec(select(AuditEvent)) if e.kind == "mode_set"]
    assert started[first.run_id] is False and started[second.run_id] is True
    assert [(m["production"], m["by"]) for m in modes] == [(True, "Chief Privacy Officer")]
    bad = runner.invoke(app, ["audit", "mode", "off", "--by", "x"])
    assert isinstance(bad.exception, UserError) and "mode must be one of production, development" in str(bad.exception)
    verify_intact()


def test_an_approval_binds_the_data(demo_dir, work, monkeypatch):
    """Production mode: an approval binds the bytes it saw (its default), so `--data` naming a
    copy of them runs and other bytes are refused, before anything is charged; a policy pinning
    the vintage (dataset.sha256) binds it without the file at hand."""
    import hashlib

    monkeypatch.setenv("PRIVRELEASE_PRODUCTION", "true")
    policy = demo_dir / demo.POLICY_FILE
    approve(policy)
    copy = demo_dir / "copy.csv"
    shutil.copy(demo_dir / demo.DATA_FILE, copy)
    published = release_plain(policy_path=str(policy), data_path=str(copy))  # the approved bytes, other path
    assert Path(published.release_dir).is_dir()
    _same_size_edit(copy)
    with pytest.raises(UserError, match=r"approval 1 by 'test reviewer' \(it binds the data with sha256 .* but "):
        release_plain(policy_path=str(policy), data_path=str(copy))
    assert [e.state for e in ledger_entries()] == ["committed"]  # nothing reserved
    assert (runs()[-1].status, runs()[-1].dataset_fingerprint) == ("failed", None)

    digest = hashlib.sha256((demo_dir / demo.DATA_FILE).read_bytes()).hexdigest()
    pinned = variant(demo_dir, "pinned", ("  path: ", f"  sha256: {digest}\n  path: "), ("path: demo", "path: gone"))
    approve(pinned)  # no file at its path: the pinned vintage is what it binds
    published = release_plain(policy_path=str(pinned), data_path=str(demo_dir / demo.DATA_FILE))
    assert Path(published.release_dir).is_dir()
    with pytest.raises(UserError, match="binds the data with sha256"):
        release_plain(policy_path=str(pinned), data_path=str(copy))
    assert [e.state for e in ledger_entries()] == ["committed", "committed"]
    verify_intact()


def test_an_approved_policy_copied_beside_other_data_is_refused(demo_dir, work, tmp_path, monkeypatch):
    """Issue 15 item 1: the approved policy (relative `dataset.path`) copied into another folder
    beside another file of the same name, header and row count, run in production mode: refused
    whether the approval binds the data or the path, naming what it bound; nothing is charged
    and the original still runs."""
    from typer.testing import CliRunner

    from privrelease.cli import app

    monkeypatch.setenv("PRIVRELEASE_PRODUCTION", "true")
    policy = demo_dir / demo.POLICY_FILE
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.copy(policy, elsewhere / demo.POLICY_FILE)
    demo.write_csv(elsewhere / demo.DATA_FILE, seed=99)
    original, other = (folder / demo.DATA_FILE for folder in (demo_dir, elsewhere))
    assert original.read_text().splitlines()[0] == other.read_text().splitlines()[0]  # same header
    assert len(original.read_text().splitlines()) == len(other.read_text().splitlines())
    assert original.read_bytes() != other.read_bytes()
    result = CliRunner().invoke(app, ["policy", "approve", str(policy), "--by", "Ada"])
    assert result.exit_code == 0, result.output
    assert f"the data with sha256 {data.dataset_sha256(load_policy(policy), original)}" in result.output
    assert f"from any path (dataset.path was {original.resolve()} when approved)" in result.output
    with pytest.raises(UserError, match=r"approval 1 by 'Ada' \(it binds the data with sha256 \w{12}, but "):
        release_plain(policy_path=str(elsewhere / demo.POLICY_FILE))

    result = CliRunner().invoke(app, ["policy", "approve", str(policy), "--by", "Ada", "--binds", "path"])
    assert result.exit_code == 0 and f"whatever is at the path {original.resolve()}" in result.output, result.output
    with pytest.raises(UserError, match=f"approval 2 by 'Ada' \\(it binds the path {original.resolve()}, not {other}"):
        release_plain(policy_path=str(elsewhere / demo.POLICY_FILE))
    monkeypatch.setenv("PRIVRELEASE_DATA_ROOTS", str(elsewhere))  # a folder the runner may read
    with pytest.raises(UserError, match=f"it binds the path {original.resolve()}, not {other}"):
        release_plain(policy_path=str(policy), data_path=str(other))  # --data elsewhere: refused at once
    assert ledger_entries() == []
    assert Path(release_plain(policy_path=str(policy)).release_dir).is_dir()
    verify_intact()


def test_an_approval_binding_the_path_runs_next_months_extract(demo_dir, work, monkeypatch):
    """`--binds path` (scheduled releases): a new extract at the approved path runs without a
    new approval; the same bytes at another path do not."""
    monkeypatch.setenv("PRIVRELEASE_PRODUCTION", "true")
    policy = demo_dir / demo.POLICY_FILE
    approve(policy, "path")
    release_plain(policy_path=str(policy))
    extract = demo_dir / demo.DATA_FILE
    demo.write_csv(extract, seed=11)  # next month's extract, same path
    release_plain(policy_path=str(policy))
    copy = demo_dir / "copy.csv"
    shutil.copy(extract, copy)
    with pytest.raises(UserError, match=f"it binds the path {extract.resolve()}, not {copy.resolve()}"):
        release_plain(policy_path=str(policy), data_path=str(copy))
    assert len({run.dataset_fingerprint for run in runs() if run.status == "succeeded"}) == 2


def test_approving_unreadable_data_is_refused_unless_the_path_is_bound(demo_dir, work):
    """Binding the data needs its fingerprint: with the file missing, `policy approve` is
    refused (a UserError: one line, exit 2) saying so and what to do; `--binds path` approves the path alone."""
    from typer.testing import CliRunner

    from privrelease.cli import app

    (demo_dir / demo.DATA_FILE).unlink()
    policy = str(demo_dir / demo.POLICY_FILE)
    result = CliRunner().invoke(app, ["policy", "approve", policy, "--by", "Ada"])
    assert isinstance(result.exception, UserError)  # exit 2 from the command line
    assert "cannot bind the approval to the data" in str(result.exception) and "--binds path" in str(result.exception)
    bad = CliRunner().invoke(app, ["policy", "approve", policy, "--by", "Ada", "--binds", "bytes"])
    assert "--binds must be one of data, path; got 'bytes'" in str(bad.exception)
    result = CliRunner().invoke(app, ["policy", "approve", policy, "--by", "Ada", "--binds", "path", "--json"])
    assert result.exit_code == 0, result.output
    binds = json.loads(result.output)["binds"]
    assert (binds["binds"], binds["sha256"]) == ("path", None) and "not readable when approved" in binds["description"]


def test_approvals_need_distinct_independent_approvers_and_can_be_revoked(demo_dir, work, monkeypatch):
    """A policy requiring two approvers, neither the OS user who runs it: one approval, or
    approvals by the runner's own OS user, are refused; two independent ones run; a revocation
    (an audit record) refuses it again."""
    from typer.testing import CliRunner

    from privrelease.audit.bindings import Account, os_account
    from privrelease.cli import app

    monkeypatch.setenv("PRIVRELEASE_PRODUCTION", "true")
    policy = variant(demo_dir, "two", ("targets:", "approval: {approvers: 2, independent: true}\ntargets:"))
    facts = approvals.policy_facts(load_policy(policy))

    def approve_as(name: str, account: Account) -> None:
        binding = steps.approval_binding(load_policy(policy))
        with session(open_database()) as s:
            approvals.approve_policy(s, facts, name, binding=binding, account=account)

    monkeypatch.setenv("LOGNAME", "someone-else")  # the environment does not make the runner someone else
    monkeypatch.setenv("USER", "someone-else")
    approve_as("Me Myself", os_account())  # the runner approving their own release
    with pytest.raises(UserError, match=r"has 0 current approver\(s\) other than the runner's OS user"):
        release_plain(policy_path=str(policy))
    approve_as("Alice Auditor", Account("alice", 5001))
    with pytest.raises(UserError, match="has 1 current approver.*needs 2 distinct"):
        release_plain(policy_path=str(policy))
    approve_as("Bob Board", Account("bob", 5002))
    published = release_plain(policy_path=str(policy))
    assert Path(published.release_dir).is_dir()

    runner = CliRunner()
    ref = f"{facts.name}@{facts.version}"
    result = runner.invoke(app, ["policy", "revoke", ref, "--by", "CPO", "--reason", "scheme leaks", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["revoked"] == 3, result.output
    with pytest.raises(UserError, match="has 0 current approver"):
        release_plain(policy_path=str(policy))
    shown = json.loads(runner.invoke(app, ["policy", "show", ref, "--json"]).output)
    assert shown["approved"] is False and all(a["revoked"] for a in shown["approvals"])
    verify_intact()


def test_production_refuses_an_edited_policy(demo_dir, work, monkeypatch):
    monkeypatch.setenv("PRIVRELEASE_PRODUCTION", "true")
    policy = demo_dir / demo.POLICY_FILE
    approve(policy)
    policy.write_text(policy.read_text().replace("k: 20", "k: 5", 1))  # same name@version
    with pytest.raises(UserError, match="was changed"):
        release_plain(policy_path=str(policy))
    assert_nothing_published(work / "releases")
    assert runs() == [] and ledger_entries() == []
    verify_intact()


# --------------------------------------------------------------------------- data


def test_data_with_other_row_count_is_released_with_an_operator_warning(demo_dir, work):
    """dataset.rows is a public constant (the mean's denominator), never a check that refuses:
    a run refused for 1,000 rows where 50,000 are declared is an output that depends on how
    many people are in the data (issue 15, item 13). The release goes on; the operator is
    warned, in the internal report only; the public statement and release.json do not say it."""
    short = demo_dir / "short.csv"
    lines = (demo_dir / demo.DATA_FILE).read_text().splitlines(keepends=True)
    short.write_text("".join(lines[:1001]))
    published = release_plain(policy_path=str(demo_dir / demo.POLICY_FILE), data_path=str(short))
    (warning,) = [line for line in published.warnings if "dataset.rows declares 50000" in line]
    assert "the data has 1000 rows" in warning
    assert "1000 rows" not in Path(published.statement).read_text()
    assert "the data has 1000 rows" not in (Path(published.release_dir) / "release.json").read_text()
    # what the published mean is, in the statement and release.json: the sum over the declared rows
    quantity = (
        "clamped sum of hours-per-week divided by the declared dataset.rows = 50000 "
        "(the mean only if the data has exactly 50000 rows)"
    )
    assert f"estimate = the published value of the {quantity}." in Path(published.statement).read_text()
    described = json.loads((Path(published.release_dir) / "release.json").read_text())
    (mean,) = [o for o in described["outputs"] if o["mechanism"] == "mean-hours"]
    assert mean["accuracy"]["estimate"] == f"the published value of the {quantity}"
    verify_intact()


def test_a_warning_on_a_release_published_as_planned_is_not_headed_nearly_empty(demo_dir, work):
    """The internal report heads the dataset.rows warning "Warnings for the operator"; "Nearly
    empty release" is kept for outputs with no or few rows (the demo publishes as planned)."""
    declared = variant(demo_dir, "rows-49000", ("rows: 50000", "rows: 49000"))
    published = release_plain(policy_path=str(declared))
    (warning,) = published.warnings
    assert "dataset.rows declares 49000" in warning
    report = Path(published.report).read_text()
    shown = report.split('id="warnings"', 1)[1].split("</div>", 1)[0]
    assert "<strong>Warnings for the operator.</strong>" in shown and "dataset.rows declares 49000" in shown
    assert "Nearly empty release" not in report and 'id="nearly-empty"' not in report


def test_data_without_a_declared_column_is_refused(demo_dir, work):
    renamed = demo_dir / "renamed.csv"
    text = (demo_dir / demo.DATA_FILE).read_text()
    renamed.write_text(text.replace('"education"', '"schooling"', 1))
    with pytest.raises(UserError, match="has no column 'education'"):
        release_plain(policy_path=str(demo_dir / demo.POLICY_FILE), data_path=str(renamed))
    assert_nothing_published(work / "releases")
    assert runs()[0].status == "failed" and ledger_entries() == []


def test_bad_value_fails_after_reservation_without_leaking_it(demo_dir, work):
    """A cell that is not a number is found while reading: the reservation is released and
    neither the exception text nor the audit record quotes the value."""
    bad = demo_dir / "bad.csv"
    lines = (demo_dir / demo.DATA_FILE).read_text().splitlines(keepends=True)
    lines[5] = "SECRET-VALUE" + lines[5][lines[5].index(",") :]
    bad.write_text("".join(lines))
    with pytest.raises(DataStepError) as caught:
        release_plain(policy_path=str(demo_dir / demo.POLICY_FILE), data_path=str(bad))
    assert "SECRET-VALUE" not in str(caught.value)
    assert "SECRET-VALUE" in caught.value.detail and caught.value.exit_code == 2
    assert_nothing_published(work / "releases")
    (run,) = runs()
    assert run.status == "failed" and "SECRET-VALUE" not in run.error
    assert run.data_read_at is not None  # it failed while reading
    (entry,) = ledger_entries()
    assert entry.state == "released"
    verify_intact()


def test_undeclared_value_is_refused_without_leaking_it(demo_dir, work):
    """A keep column (sex, declared Male/Female) holding another value: the release is refused
    naming the column and the row, nothing is published and the planted value is persisted
    nowhere."""
    bad = demo_dir / "undeclared.csv"
    lines = (demo_dir / demo.DATA_FILE).read_text().splitlines(keepends=True)
    header = lines[0].rstrip("\n").split(",")
    position = next(i for i, name in enumerate(header) if name.strip('"') == "sex")
    for row in (3, 4):
        fields = lines[row].rstrip("\n").split(",")
        fields[position] = "UNDECLARED-SEX"
        lines[row] = ",".join(fields) + "\n"
    bad.write_text("".join(lines))
    with pytest.raises(DataStepError) as caught:
        release_plain(policy_path=str(demo_dir / demo.POLICY_FILE), data_path=str(bad))
    assert "column 'sex', data row 3" in caught.value.detail and "UNDECLARED-SEX" not in str(caught.value)
    assert_nothing_published(work / "releases")
    (run,) = runs()
    assert run.status == "failed" and "UNDECLARED-SEX" not in run.error
    (entry,) = ledger_entries()
    assert entry.state == "released"
    verify_intact()


def test_rerun_on_other_data_is_refused(demo_dir, work, tmp_path):
    first = release_plain(policy_path=str(demo_dir / demo.POLICY_FILE))
    other = demo_dir / "other"  # inside the policy folder: a readable place
    _, other_data = demo.write_demo(other, seed=99)
    with pytest.raises(UserError, match="a rerun repeats a release on the same data"):
        release_plain(rerun_of=first.run_id, data_path=str(other_data))
    assert published_dirs(work / "releases") == [Path(first.release_dir)]


def test_a_refused_rerun_s_record_names_the_run_it_repeats(demo_dir, work):
    """A rerun of a draft's failed run, refused before its run starts (unapproved in
    production), leaves a ``release_refused`` record naming the run it repeats as well as the
    policy; a refused release of a policy file names none."""
    headless = demo_dir / "headless.csv"
    headless.write_text("a,b\n1,2\n")
    with pytest.raises(UserError):
        release_plain(policy_path=str(demo_dir / demo.POLICY_FILE), data_path=str(headless))
    (failed,) = runs()
    with pytest.raises(UserError, match="not approved"):
        release_plain(rerun_of=failed.id, data_path=str(demo_dir / demo.DATA_FILE), production=True)
    with pytest.raises(UserError, match="not approved"):
        release_plain(policy_path=str(demo_dir / demo.POLICY_FILE), production=True)
    assert [(r["policy"], r["rerun_of"]) for r in refusals()] == [("demo-census@1", failed.id), ("demo-census@1", None)]
    assert [r.id for r in runs()] == [failed.id]
    verify_intact()


# --------------------------------------------------------------------------- targets, budget


def test_target_not_met_is_refused_before_reading(demo_dir, work):
    strict = variant(demo_dir, "strict", ("max_epsilon: 4.5", "max_epsilon: 1.5"))
    with pytest.raises(TargetNotMet, match=r"max_epsilon \(probabilistic\): required <= 1.5"):
        release_plain(policy_path=str(strict))
    assert_nothing_published(work / "releases")
    assert runs() == [] and ledger_entries() == [] and registered_versions() == []
    (refused,) = refusals()
    assert refused["refusal"] == "TargetNotMet" and refused["policy"] == "demo-census@strict"
    # the draft is edited under the same version: nothing registered stands in the way
    strict.write_text(strict.read_text().replace("max_epsilon: 1.5", "max_epsilon: 4.0"))
    published = release_plain(policy_path=str(strict))
    (run,) = runs()
    assert run.id == published.run_id and run.status == "succeeded"
    assert [version.version for version in registered_versions()] == ["strict"]
    verify_intact()


def test_a_registered_version_refused_records_a_failed_run(demo_dir, work, monkeypatch):
    """Once a version is registered (here by its first release), a refusal of it is a failed
    run of that version (production mode, not approved)."""
    policy = demo_dir / demo.POLICY_FILE
    release_plain(policy_path=str(policy))
    monkeypatch.setenv("PRIVRELEASE_PRODUCTION", "true")
    with pytest.raises(UserError, match="is not approved"):
        release_plain(policy_path=str(policy))
    assert [(run.status, (run.error or "")[:9]) for run in runs()] == [("succeeded", ""), ("failed", "refused: ")]
    assert refusals() == []
    verify_intact()


def test_the_pre_flight_records_its_refusal_and_checks_a_reruns_budget(demo_dir, work):
    """What `privrelease run` and `rerun` refuse before Prefect starts leaves one
    ``release_refused`` record, a registered version's too (audit 5, item 5); a rerun's
    pre-flight checks the budget of its stored policy, as its progress line says (item 12)."""
    from privrelease.flows.preflight import preflight, preflight_rerun

    strict = variant(demo_dir, "strict", ("max_epsilon: 4.5", "max_epsilon: 1.5"))
    with pytest.raises(TargetNotMet, match="does not meet its targets"):
        preflight(strict)
    tight = variant(demo_dir, "tight", ("lifetime_budget: {epsilon: 20", "lifetime_budget: {epsilon: 5"))
    first = release_plain(policy_path=str(tight))  # 3.66 of 5: a second does not fit
    with pytest.raises(TargetNotMet, match="privacy budget of dataset .* would be exceeded"):
        preflight_rerun(first.run_id[:8])
    found = [(r["refusal"], r["policy"], r["flow_run"], r["reason"][:30]) for r in refusals()]
    assert found == [
        ("TargetNotMet", "demo-census@strict", None, "policy demo-census@strict does"),
        ("TargetNotMet", "demo-census@tight", None, "privacy budget of dataset demo"),
    ]
    assert [run.status for run in runs()] == ["succeeded"] and len(ledger_entries()) == 1
    verify_intact()


# --------------------------------------------------------------------------- drafts stay drafts


def policy_rows() -> list[tuple[str, str, bool]]:
    """Every recorded policy content: (version, sha256, draft), oldest first."""
    return [(v.version, v.sha256, v.draft) for v in registered_versions()]


def undeclared_sex(demo_dir: Path) -> Path:
    """The demo data with one person's sex a value the demo policy does not declare."""
    lines = (demo_dir / demo.DATA_FILE).read_text().splitlines(keepends=True)
    position = next(i for i, name in enumerate(lines[0].rstrip("\n").split(",")) if name.strip('"') == "sex")
    fields = lines[3].rstrip("\n").split(",")
    fields[position] = "Intersex"
    lines[3] = ",".join(fields) + "\n"
    path = demo_dir / "undeclared.csv"
    path.write_text("".join(lines))
    return path


@pytest.mark.parametrize("check", ["pinned sha256", "undeclared value"])
def test_a_draft_refused_by_a_data_check_is_fixed_under_the_same_version(demo_dir, work, check):
    """Issue 18, item 2: a run of a draft refused inside the flow, after its run started, by a
    data check (the fingerprint against a mistyped dataset.sha256; a value the policy does not
    declare) registers no version: its failed run stands on a draft row that claims nothing,
    the policy fixed under the same name@version runs and publishes, and only the published
    content is registered."""
    from privrelease.reports.index import collect

    data_file = demo_dir / demo.DATA_FILE
    if check == "pinned sha256":
        digest = sha256_file(data_file)
        typo = "0" + digest[1:] if digest[0] != "0" else "1" + digest[1:]
        policy = variant(demo_dir, "7", ("  path: ", f"  sha256: {typo}\n  path: "))
        fix, error, data_path = (typo, digest), (UserError, "pins dataset.sha256"), None
    else:
        policy = variant(demo_dir, "7")
        fix, error = ("values: [Male, Female]", "values: [Male, Female, Intersex]"), (DataStepError, None)
        data_path = str(undeclared_sex(demo_dir))
    with pytest.raises(error[0], match=error[1]):
        release_plain(policy_path=str(policy), data_path=data_path)
    (refused,) = runs()
    assert refused.status == "failed"
    with session(open_database(), readonly=True) as s:
        assert approvals.list_policies(s) == []  # nothing registered
        with pytest.raises(UserError, match="no registered policy"):
            approvals.find_policy(s, "demo-census@7")
    assert policy_rows() == [("7", refused.policy_sha256, True)]  # on record for its run, claiming nothing

    policy.write_text(policy.read_text().replace(*fix))
    published = release_plain(policy_path=str(policy), data_path=data_path)
    first, second = runs()
    assert (first.status, second.status, second.id) == ("failed", "succeeded", published.run_id)
    assert policy_rows() == [("7", first.policy_sha256, True), ("7", second.policy_sha256, False)]
    with session(open_database(), readonly=True) as s:
        assert approvals.find_policy(s, "demo-census@7").sha256 == second.policy_sha256
        assert approvals.author_of(s, first.policy_sha256) is not None  # the draft's runner
        cards = {p.sha256: p.draft for p in collect(s).policies}  # the compliance index tells them apart
    assert cards == {first.policy_sha256: True, second.policy_sha256: False}
    verify_intact(Path(published.release_dir) / steps.CHAIN_HEAD_FILE)


@pytest.mark.parametrize("refusal", ["lifetime budget", "output folder"])
def test_a_draft_refused_before_its_data_is_read_is_fixed_under_the_same_version(demo_dir, work, refusal):
    """Issue 18, item 2: refusals of a run before the data is read (a lifetime budget other than
    the dataset's registered one, before the run starts; an output folder that cannot be made,
    after) register no version either: the draft edited under the same version runs."""
    release_plain(policy_path=str(demo_dir / demo.POLICY_FILE))  # demo-census@1: the budget (20, 1e-6) is set
    out = None
    if refusal == "lifetime budget":
        fix = ("lifetime_budget: {epsilon: 50", "lifetime_budget: {epsilon: 20")
        policy = variant(demo_dir, "2", ("lifetime_budget: {epsilon: 20", fix[0]))
        expected = "a dataset's lifetime budget cannot be changed"
    else:
        fix = ("k: 20", "k: 25")
        policy = variant(demo_dir, "2")
        (demo_dir / "a-file").write_text("not a folder")
        out, expected = str(demo_dir / "a-file" / "releases"), "cannot create the staging folder"
    with pytest.raises(UserError, match=expected):
        release_plain(policy_path=str(policy), out_dir=out)
    started = refusal == "output folder"
    assert [run.status for run in runs()] == ["succeeded", *(["failed"] * started)]
    with session(open_database(), readonly=True) as s:
        assert [v.version for v in approvals.list_policies(s)] == ["1"]  # the refused run registered nothing
    assert [(version, draft) for version, _, draft in policy_rows()] == [("1", False), *([("2", True)] * started)]

    policy.write_text(policy.read_text().replace(*fix, 1))
    published = release_plain(policy_path=str(policy))
    assert runs()[-1].id == published.run_id and runs()[-1].status == "succeeded"
    assert [(version, draft) for version, _, draft in policy_rows()] == [
        ("1", False),
        *([("2", True)] * started),
        ("2", False),
    ]
    verify_intact()


def test_two_contents_are_never_both_published_or_approved_under_one_version(demo_dir, work, monkeypatch):
    """Issue 18, item 2: drafts stay editable, but what registration protects holds. A version
    published with one content refuses another content under its name@version before anything
    is read (a ``release_refused`` record naming the fix), and so does its approval; a draft
    whose run started before another content took its name@version (approved while it ran) is
    refused in its publishing transaction: nothing published, nothing charged."""
    policy = demo_dir / demo.POLICY_FILE
    first = release_plain(policy_path=str(policy))
    edited = variant(demo_dir, "1", ("k: 20", "k: 25"))  # demo-census@1 again, other content
    with pytest.raises(
        UserError, match=r'registered with other content .* published .*new `version`, e.g. version: "2"'
    ):
        release_plain(policy_path=str(edited))
    refused = refusals()[-1]
    assert refused["policy"] == "demo-census@1" and "registered with other content" in refused["reason"]
    with pytest.raises(UserError, match="demo-census@1 is registered with other content"):
        approve(edited)
    assert [r.id for r in runs()] == [first.run_id] and len(policy_rows()) == 1

    # a race: draft A's run is under way when content B is approved under the same name@version
    racing = variant(demo_dir, "3")
    rival = demo_dir / "rival.yaml"
    rival.write_text(racing.read_text().replace("k: 20", "k: 30", 1))
    from privrelease.flows import publishing

    original = publishing._fsync_files

    def approve_the_rival_first(folder):
        approve(rival)
        return original(folder)

    monkeypatch.setattr(publishing, "_fsync_files", approve_the_rival_first)
    with pytest.raises(UserError, match="demo-census@3 is registered with other content"):
        release_plain(policy_path=str(racing))
    assert published_dirs(work / "releases") == [Path(first.release_dir)]
    assert runs()[-1].status == "failed" and ledger_entries()[-1].state == "released"
    with session(open_database(), readonly=True) as s:
        registered = approvals.find_policy(s, "demo-census@3")
        assert registered.sha256 == load_policy(rival).sha256
        assert [(v.version, v.draft) for v in approvals.list_policies(s)] == [("1", False), ("3", False)]
    assert [(version, draft) for version, _, draft in policy_rows()] == [("1", False), ("3", True), ("3", False)]
    verify_intact()


def test_plan_warns_when_the_version_is_registered_with_other_content(demo_dir, work, monkeypatch):
    """Issue 18, item 2: `plan` of a draft whose name@version is registered with other content
    says so and what to do (a warning: the plan itself is fine, exit 0) and `plan --json` has
    the clash in ``version_conflict``; without an audit database it checks nothing and makes
    none; a refused draft of the version is no clash."""
    from typer.testing import CliRunner

    from privrelease.cli import app

    runner = CliRunner()
    edited = variant(demo_dir, "1", ("k: 20", "k: 25"))
    result = runner.invoke(app, ["plan", str(edited), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert (document["version_checked"], document["version_conflict"]) == (False, None)
    assert not work.exists()  # plan made no audit database

    policy = demo_dir / demo.POLICY_FILE
    with pytest.raises(DataStepError):  # a refused draft of demo-census@1 (an undeclared value) claims nothing
        release_plain(policy_path=str(policy), data_path=str(undeclared_sex(demo_dir)))
    document = json.loads(runner.invoke(app, ["plan", str(edited), "--json"]).output)
    assert (document["version_checked"], document["version_conflict"]) == (True, None)

    approve(policy)
    with session(open_database(), readonly=True) as s:
        (approval,) = approvals.approvals_of(s, load_policy(policy).sha256)
    registered_sha, mine = load_policy(policy).sha256, load_policy(edited).sha256
    result = runner.invoke(app, ["plan", str(edited)])
    assert result.exit_code == 0, result.output
    message = (
        f"policy demo-census@1 is registered with other content (sha256 {registered_sha[:12]}, approved "
        f"{approval.approved_at:%Y-%m-%d %H:%M} UTC by 'test reviewer'); this file has sha256 {mine[:12]}: "
        'give this draft a new `version`, e.g. version: "2"'
    )
    assert f"warning: {message}" in " ".join(result.output.split())
    document = json.loads(runner.invoke(app, ["plan", str(edited), "--json"]).output)
    assert document["passed"] is True and document["version_checked"] is True
    conflict = document["version_conflict"]
    assert conflict["message"] == message and conflict["suggested"] == "2"
    assert (conflict["registered_sha256"], conflict["sha256"]) == (registered_sha, mine)
    with pytest.raises(UserError) as caught:  # `run` refuses it with the same words, before reading anything
        release_plain(policy_path=str(edited))
    assert str(caught.value) == message
    document = json.loads(runner.invoke(app, ["plan", str(policy), "--json"]).output)
    assert document["version_conflict"] is None  # the registered content itself
    # plan's cheap read of the SQLite file (audit.registered) agrees with the audit models
    url = get_settings().db_url
    assert registered.peek(url, "demo-census", "1") == registered.Peek(database=True, sha256=registered_sha)
    assert registered.peek(url, "demo-census", "2") == registered.Peek(database=True, sha256=None)
    assert registered.peek(url + "?mode=ro", "demo-census", "1") is None  # options: asked through SQLAlchemy


def test_plan_reads_the_registered_version_without_loading_sqlalchemy(demo_dir, work):
    """`plan` asks the audit database on every call; in the usual case (nothing or this very
    policy registered under its name@version) the SQLite file is read with the standard library,
    so plan stays as fast as before the check (bench/cli.py); a clash loads the audit models."""
    policy = demo_dir / demo.POLICY_FILE
    approve(policy)
    edited = variant(demo_dir, "1", ("k: 20", "k: 25"))
    probe = (
        "import json, sys\n"
        "from privrelease.cli import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print(json.dumps('sqlalchemy' in sys.modules), file=sys.stderr)\n"
    )
    loaded = {}
    for path in (policy, edited):
        done = subprocess.run(
            [sys.executable, "-c", probe, "plan", str(path), "--json"], capture_output=True, text=True, env=os.environ
        )
        document = json.loads(done.stdout)
        loaded[path.name] = (json.loads(done.stderr.strip().splitlines()[-1]), document["version_conflict"] is None)
    assert loaded == {policy.name: (False, True), edited.name: (True, False)}


def test_budget_exhausted(demo_dir, work):
    small = variant(demo_dir, "small", ("lifetime_budget: {epsilon: 20", "lifetime_budget: {epsilon: 5"))
    first = release_plain(policy_path=str(small))
    with pytest.raises(TargetNotMet, match="privacy budget of dataset .* would be exceeded"):
        release_plain(policy_path=str(small))
    assert published_dirs(work / "releases") == [Path(first.release_dir)]
    assert [e.state for e in ledger_entries()] == ["committed"]
    assert [r.status for r in runs()] == ["succeeded", "failed"]
    assert runs()[1].data_read_at is None
    verify_intact()


def test_a_run_refused_after_fingerprinting_shows_the_data_it_read_in_the_index(demo_dir, work):
    """A run refused by its lifetime budget (after step 3, the dataset not yet attached) or by
    the policy's pinned sha256 (in step 3) records the fingerprint of the data it read, and the
    release index shows it instead of "no dataset"."""
    from privrelease.reports.index import collect

    budget = ("lifetime_budget: {epsilon: 20", "lifetime_budget: {epsilon: 5")
    pinned = variant(demo_dir, "pinned", budget, ("  id: demo-census", "  id: demo-census\n  sha256: " + "f" * 64))
    with pytest.raises(UserError, match="pins dataset.sha256"):
        release_plain(policy_path=str(pinned))
    small = variant(demo_dir, "small", budget)
    first = release_plain(policy_path=str(small))
    with pytest.raises(TargetNotMet, match="would be exceeded"):
        release_plain(policy_path=str(small))
    fingerprint = runs()[1].dataset_fingerprint
    assert fingerprint is not None and [r.status for r in runs()] == ["failed", "succeeded", "failed"]
    with session(open_database(), readonly=True) as s:
        rows = {row.run_id: row for row in collect(s).runs}
    assert {run.id: rows[run.id].dataset for run in runs()} == {run.id: fingerprint for run in runs()}
    assert rows[first.run_id].status == "succeeded"
    verify_intact()


def test_lifetime_budget_cannot_be_changed(demo_dir, work):
    """Another lifetime budget than the dataset's is refused before the run starts (as `ledger
    runway` and `plan` say): one ``release_refused`` record, no run, nothing charged."""
    release_plain(policy_path=str(demo_dir / demo.POLICY_FILE))  # registers epsilon 20
    larger = variant(demo_dir, "larger", ("lifetime_budget: {epsilon: 20", "lifetime_budget: {epsilon: 40"))
    with pytest.raises(UserError, match="lifetime budget cannot be changed"):
        release_plain(policy_path=str(larger))
    assert [e.state for e in ledger_entries()] == ["committed"]
    assert [run.status for run in runs()] == ["succeeded"]
    (refusal,) = refusals()
    assert "lifetime budget cannot be changed" in refusal["reason"]


# --------------------------------------------------------------------------- output faults


def test_output_folder_not_writable(demo_dir, work, tmp_path, monkeypatch):
    out = tmp_path / "locked"
    out.mkdir()
    real_mkdir = os.mkdir

    def refuse(path, *args, **kwargs):  # root ignores permissions, so refuse explicitly
        if Path(path).parent == out:
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", refuse)
    with pytest.raises(UserError, match="is not writable"):
        release_plain(policy_path=str(demo_dir / demo.POLICY_FILE), out_dir=str(out))
    assert list(out.iterdir()) == []
    assert runs()[0].status == "failed" and ledger_entries() == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_output_folder_not_writable_for_real(demo_dir, work, tmp_path):
    out = tmp_path / "readonly"
    out.mkdir(mode=0o555)
    with pytest.raises(UserError, match="is not writable"):
        release_plain(policy_path=str(demo_dir / demo.POLICY_FILE), out_dir=str(out))


def test_disk_full_publishes_nothing_and_loses_nothing(demo_dir, work, monkeypatch):
    policy = str(demo_dir / demo.POLICY_FILE)
    first = release_plain(policy_path=policy)
    kept = {o["path"]: o["sha256"] for o in first.outputs}
    root = work / "releases"
    before = published_dirs(root)
    real_write = pq.write_table
    calls = []

    def full_disk(table, where, **kwargs):
        calls.append(where)
        if len(calls) == 2:  # the second output: the first is already staged
            Path(where).write_bytes(b"partial")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(table, where, **kwargs)

    monkeypatch.setattr(pq, "write_table", full_disk)
    with pytest.raises(UserError, match="No space left on device"):
        release_plain(policy_path=policy)
    assert_nothing_published(root, before)
    failed = runs()[-1]
    assert failed.status == "failed" and "No space left" in failed.error
    assert [e.state for e in ledger_entries()] == ["committed", "released"]
    for path, digest in kept.items():
        assert sha256_file(Path(path)) == digest
    verify_intact(Path(first.release_dir) / steps.CHAIN_HEAD_FILE)

    monkeypatch.setattr(pq, "write_table", real_write)
    release_plain(policy_path=policy)  # the released budget is available again
    assert [e.state for e in ledger_entries()] == ["committed", "released", "committed"]


def _same_size_edit(path: Path) -> None:
    """Change one digit of the first data row, keeping size and modification time."""
    stat = path.stat()
    text = path.read_text()
    cut = text.index("\n") + 1
    digit = next(i for i in range(cut, len(text)) if text[i].isdigit())
    path.write_text(text[:digit] + str((int(text[digit]) + 1) % 10) + text[digit + 1 :])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (stat.st_size, stat.st_mtime_ns)


def _renamed_over(path: Path) -> None:
    other = path.with_name("other.csv")
    shutil.copy2(path, other)
    _same_size_edit(other)
    os.replace(other, path)


def _relinked(path: Path) -> None:
    other = path.with_name("other.csv")
    shutil.copy2(path, other)
    _same_size_edit(other)
    path.unlink()
    path.symlink_to(other)


def swap_after_fingerprint(monkeypatch: pytest.MonkeyPatch, when: str, swap: Callable[[], None]) -> None:
    """Call ``swap`` after the budget is reserved ("before the read") or after the read step,
    then as if a task in another process read again (its data and open file not in this one)."""
    if when == "before the read":
        reserve = steps.reserve_budget

        def reserve_then_swap(*args, **kwargs):
            result = reserve(*args, **kwargs)
            swap()
            return result

        monkeypatch.setattr(steps, "reserve_budget", reserve_then_swap)
        return
    read = steps.read_data

    def read_then_swap(run, dataset):
        result = read(run, dataset)
        steps.forget_data(run.run_id)
        swap()
        return result

    monkeypatch.setattr(steps, "read_data", read_then_swap)


@pytest.mark.parametrize("swap", [_same_size_edit, _renamed_over, _relinked])
@pytest.mark.parametrize("when", ["before the read", "before a second process reads"])
def test_data_swapped_after_the_fingerprint_is_never_released(demo_dir, work, monkeypatch, swap, when):
    """The file is changed between its fingerprint (which the reservation and the audit record
    name) and its read: edited in place with its size and mtime kept, another file renamed over
    it, or the path relinked. The run reads through the descriptor its fingerprint read
    (:mod:`privrelease.datafiles`), and hashes the very bytes it parses: a file renamed over or
    relinked is not seen at all (the checked file's bytes are released); an edit in place, or
    any swap before another process opens the file again, fails the run before any mechanism
    sees the other data, and nothing is published or charged."""
    data = demo_dir / demo.DATA_FILE
    original_sha256 = sha256_file(data)
    swap_after_fingerprint(monkeypatch, when, lambda: swap(data))
    if when == "before the read" and swap is not _same_size_edit:
        published = release_plain(policy_path=str(demo_dir / demo.POLICY_FILE))
        (run,) = runs()
        assert run.status == "succeeded" and run.dataset_fingerprint == original_sha256
        verify_intact(Path(published.release_dir) / steps.CHAIN_HEAD_FILE)
        return
    with pytest.raises(DataStepError) as caught:
        release_plain(policy_path=str(demo_dir / demo.POLICY_FILE))
    expected = "became a symbolic link" if swap is _relinked else "changed after it was fingerprinted"
    assert expected in caught.value.detail
    assert_nothing_published(work / "releases")
    (run,) = runs()
    assert run.status == "failed"
    assert [e.state for e in ledger_entries()] == ["released"]
    verify_intact()


def test_failed_commit_removes_the_published_folder(demo_dir, work, monkeypatch):
    from privrelease.audit import records

    def broken(*args, **kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(records, "store_report", broken)
    with pytest.raises(RuntimeError, match="database went away"):
        release_plain(policy_path=str(demo_dir / demo.POLICY_FILE))
    assert_nothing_published(work / "releases")
    assert [e.state for e in ledger_entries()] == ["released"]
    with session(open_database(), readonly=True) as s:
        assert list(s.exec(select(Output))) == []
    verify_intact()


def test_reservation_expired_before_commit_publishes_nothing(demo_dir, work, monkeypatch):
    from privrelease.audit.ledger import LedgerStateError

    monkeypatch.setenv("PRIVRELEASE_RESERVATION_TTL_SECONDS", "1")
    from privrelease.mechanisms.kinds import all_kinds

    for kind in all_kinds().values():

        def slow(spec, loaded, table, original=kind.run):
            time.sleep(0.6)
            return original(spec, loaded, table)

        monkeypatch.setattr(kind, "run", slow)
    with pytest.raises(LedgerStateError, match="expired"):
        release_plain(policy_path=str(demo_dir / demo.POLICY_FILE))
    assert_nothing_published(work / "releases")
    (run,) = runs()
    assert run.status == "failed" and "expired" in run.error
    assert [e.state for e in ledger_entries()] == ["released"]
    verify_intact()


KILLED_RUN = """
import sys, time
from pathlib import Path
from privrelease.flows import steps
from privrelease.mechanisms.kinds import all_kinds

marker = Path(sys.argv[2])

def slowed(original):
    def slow(spec, loaded, table):
        if spec.name == "hours-by-sex":  # the first mechanism is done and staged
            marker.write_text("in the mechanism step")
            time.sleep(120)
        return original(spec, loaded, table)
    return slow

for kind in all_kinds().values():
    kind.run = slowed(kind.run)
steps.release_plain(policy_path=sys.argv[1])
"""


def test_process_killed_mid_run(demo_dir, work, tmp_path):
    """SIGKILL during the mechanisms: the next run settles the killed one at once (its process
    is gone; no waiting for the reservation to expire): nothing published, the reservation
    released, its staging folder gone and the chain intact."""
    policy = str(demo_dir / demo.POLICY_FILE)
    marker = tmp_path / "marker"
    child = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(KILLED_RUN), policy, str(marker)],
        env={**os.environ},
    )
    try:
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None, "the release process ended early"
            assert time.monotonic() < deadline, "the release never reached the mechanisms"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.wait(timeout=30)
    root = work / "releases"
    assert published_dirs(root) == []  # only the hidden staging folder is left
    (staging,) = root.glob(".*.partial")
    assert (staging / "microdata.parquet").exists()
    (killed,) = runs()
    assert killed.status == "running"
    (entry,) = ledger_entries()
    assert entry.state == "reserved"

    second = release_plain(policy_path=policy)
    assert published_dirs(root) == [Path(second.release_dir)]
    assert list(root.glob(".*")) == []  # the killed run's staging folder was removed
    killed, ok = runs()
    assert killed.status == "failed" and "crashed before publishing (recovered)" in killed.error
    assert ok.status == "succeeded"
    assert [(e.run_id, e.state) for e in ledger_entries()] == [(killed.id, "released"), (ok.id, "committed")]
    with session(open_database(), readonly=True) as s:
        assert list(s.exec(select(Output).where(Output.run_id == killed.id))) == []
    verify_intact(Path(second.release_dir) / steps.CHAIN_HEAD_FILE)


# --------------------------------------------------------------------------- rerun, reissue


def test_the_read_step_says_where_the_data_is_computed(demo_dir, work, monkeypatch):
    """What a run shows while it reads names the engine: "reading the data (in-process)", or
    the Dask cluster (:meth:`.engines.Engine.describe`)."""
    from privrelease.flows import context

    shown: list[tuple[str, str]] = []

    class Sink:
        def start(self, step: str, description: str) -> None:
            shown.append((step, description))

        def done(self, step: str, seconds: float, note: str = "") -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(context, "_progress", Sink())
    release_plain(policy_path=str(demo_dir / demo.POLICY_FILE))
    assert dict(shown)["read data"] == "reading the data (in-process)"
    assert engines.Engine("dask", workers=8).describe() == "Dask, on a local cluster of 8 processes"


def test_rerun_and_reissue(demo_dir, work, tmp_path):
    from privrelease.reissuing import reissue

    first = release_plain(policy_path=str(demo_dir / demo.POLICY_FILE))
    again = release_plain(rerun_of=first.run_id[:10])
    by_id = {r.id: r for r in runs()}
    assert by_id[again.run_id].kind == "rerun" and by_id[again.run_id].source_run_id == first.run_id
    assert by_id[again.run_id].policy_sha256 == by_id[first.run_id].policy_sha256
    assert [e.state for e in ledger_entries()] == ["committed", "committed"]  # a new charge
    assert first.outputs[0]["sha256"] != again.outputs[0]["sha256"]  # fresh randomness
    # audit 10: its report and `report list` say it reruns the first run (neither did)
    report = " ".join(Path(again.report).read_text().split())
    assert f'Rerun of</dt><dd id="rerun-of">run <code class="hash">{first.run_id}</code>' in report
    assert "rerun-of" not in Path(first.report).read_text()
    first_state, again_state = (
        json.loads((Path(run.release_dir) / "release.json").read_text())["release"] for run in (first, again)
    )
    assert again_state["rerun_of"] == first.run_id and "rerun_of" not in first_state
    from privrelease.reports.stored import stored_reports

    listed = {row.run_id: row for row in stored_reports()}
    assert listed[again.run_id].rerun_of == first.run_id and listed[first.run_id].rerun_of is None
    assert not first.warnings and again.warnings == [  # not approved here: the rerun says it is a draft
        f"this rerun of run {first.run_id} is a DRAFT (its report and statement say so): no current approval of "
        "its policy counts for this data (revoked since, or never given)"
    ]
    assert "DRAFT" in report

    handed = reissue(first.run_id, tmp_path / "copies")
    assert [e.state for e in ledger_entries()] == ["committed", "committed"]  # no charge
    assert [Path(o.path).name for o in handed.outputs][:4] == [
        "microdata.parquet",
        "microdata.cells.parquet",
        "hours-by-sex.parquet",
        "mean-hours.parquet",
    ]
    for copy, original in zip(handed.outputs, first.outputs, strict=False):
        assert sha256_file(Path(copy.path)) == original["sha256"]
    assert Path(handed.report or "").name == steps.REPORT_FILE
    reissued = next(r for r in runs() if r.id == handed.run_id)
    assert reissued.kind == "reissue" and reissued.source_run_id == first.run_id
    with session(open_database(), readonly=True) as s:  # the code that made what it hands back
        kinds = {run: started_facts(s, run).get("kinds") for run in (first.run_id, handed.run_id)}
    described = json.loads((Path(first.release_dir) / "release.json").read_text())
    assert kinds[handed.run_id] == kinds[first.run_id] == described["kinds"]
    assert described["kinds"] and {kind["distribution"] for kind in described["kinds"].values()} == {"privrelease"}
    verify_intact()

    Path(first.outputs[0]["path"]).write_bytes(b"tampered")
    with pytest.raises(UserError, match="was edited"):
        reissue(first.run_id)
    with pytest.raises(UserError, match="only a succeeded release"):
        reissue(handed.run_id)


def test_report_list_and_show_of_a_reissue(demo_dir, work, tmp_path):
    """A reissue has no report of its own: `report list` lists it as a reissue of its source run,
    `report show` gives the report it handed back (its --out copy, else the source's file)."""
    from typer.testing import CliRunner

    from privrelease.cli import app
    from privrelease.reissuing import reissue

    first = release_plain(policy_path=str(demo_dir / demo.POLICY_FILE))
    copied = reissue(first.run_id, tmp_path / "copies")
    again = reissue(first.run_id)

    def cli(*args: str) -> CliRunner:
        result = CliRunner().invoke(app, list(args))
        assert result.exit_code == 0 and result.exception is None, result.output
        return result

    listed = {row["run_id"]: row for row in json.loads(cli("report", "list", "--json").output)["reports"]}
    assert list(listed) == [first.run_id, copied.run_id, again.run_id]
    assert listed[first.run_id]["reissue_of"] is None
    for handed in (copied, again):
        row = listed[handed.run_id]
        assert (row["kind"], row["reissue_of"], row["policy"]) == ("reissue", first.run_id, "demo-census")
    assert listed[copied.run_id]["path"] == copied.report and listed[again.run_id]["path"] == first.report
    table = [line for line in cli("report", "list").output.splitlines() if line.startswith("│")]
    assert [line.split("│")[6].strip() for line in table] == ["", *[f"reissue of {first.run_id[:8]}"] * 2]

    shown = json.loads(cli("report", "show", copied.run_id[:10], "--json").output)
    assert (shown["path"], shown["reissue_of"], shown["source"]) == (copied.report, first.run_id, "file")
    assert shown["sha256"] == sha256_file(Path(first.report)) and "this is its copy" in shown["note"]
    plain = cli("report", "show", again.run_id)
    assert plain.stdout == f"{first.report}\n"
    assert f"is a reissue of run {first.run_id}" in plain.stderr and "ended before" not in plain.stderr

    Path(copied.report or "").unlink()  # the copy gone: the source run's report
    shown = json.loads(cli("report", "show", copied.run_id, "--json").output)
    assert shown["path"] == first.report and "is missing or changed" in shown["note"]


def test_a_reissue_says_the_approval_of_its_release_was_revoked_since(demo_dir, work, monkeypatch):
    """A production release whose approval was revoked afterwards is handed back with its
    "APPROVED RELEASE" statement unchanged: the reissue says the approval was revoked since
    (audit 5, item 14); a release whose approval stands gets no such note."""
    from typer.testing import CliRunner

    from privrelease.cli import app

    monkeypatch.setenv("PRIVRELEASE_PRODUCTION", "true")
    policy = demo_dir / demo.POLICY_FILE
    approve(policy)
    first = release_plain(policy_path=str(policy))
    runner = CliRunner()
    standing = runner.invoke(app, ["reissue", first.run_id, "--json"])
    assert standing.exit_code == 0 and json.loads(standing.output)["approval_revoked"] is None, standing.output
    revoked = runner.invoke(app, ["policy", "revoke", "demo-census@1", "--by", "CPO", "--reason", "scheme leaks"])
    assert revoked.exit_code == 0, revoked.output
    result = runner.invoke(app, ["reissue", first.run_id])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "warning: the approval of policy demo-census@1 was revoked on " in said
    assert "UTC, after this release: the report and statement handed back still say it was approved" in said
    document = json.loads(runner.invoke(app, ["reissue", first.run_id, "--json"]).output)
    assert document["approval_revoked"].startswith("the approval of policy demo-census@1 was revoked on ")


def test_open_run_needs_exactly_one_source(work):
    with pytest.raises(UserError, match="either a policy file or the id of a run"):
        release_plain()
    with pytest.raises(UserError, match="no run with id"):
        release_plain(rerun_of="feedfacecafe")
    with pytest.raises(UserError, match="policy file not found"):
        release_plain(policy_path=str(work / "nope.yaml"))


def test_release_describes_itself_and_flags_a_nearly_empty_output(demo_dir, work):
    """release.json beside the outputs holds the public facts a data user needs (parameters,
    guarantees, generalization, the 1/beta scaling of sampled counts) and is checksummed in the
    audit database; a k so large that nothing survives is published but flagged to the operator."""
    published = release_plain(policy_path=str(demo_dir / demo.POLICY_FILE))
    document = json.loads((Path(published.release_dir) / "release.json").read_text())
    by_file = {entry["file"]: entry for entry in document["outputs"]}
    companions = {entry["cells"]["file"] for entry in document["outputs"] if "cells" in entry}
    assert companions == {"microdata.cells.parquet"}
    assert set(by_file) | companions == {Path(output["path"]).name for output in published.outputs}
    sampled = next(entry for entry in by_file.values() if entry["type"] == "sdgs")
    assert sampled["parameters"]["k"] > 0 and "1/beta = 10 to estimate counts of rows" in sampled["estimation"]
    assert sampled["guarantees"]["probabilistic"]["delta"] > 0 and sampled["generalization"]
    assert published.warnings == []
    verify_intact()  # release.json is checksummed like the outputs

    strict = variant(demo_dir, "huge-k", ("beta: 0.1", "beta: 0.0005"))
    strict.write_text(re.sub(r"\n  accuracy:\n(    - .*\n)+", "\n", strict.read_text()))  # it misses them, on purpose
    flagged = release_plain(policy_path=str(strict))
    assert any("published no rows" in warning for warning in flagged.warnings)
    nearly_empty = Path(flagged.report).read_text().split('id="nearly-empty"', 1)[1].split("</div>", 1)[0]
    assert "Nearly empty release" in nearly_empty and "published no rows" in nearly_empty
    assert "Nearly empty release" not in Path(flagged.statement).read_text()


def test_a_run_parses_and_plans_its_policy_once(demo_dir, work, monkeypatch):
    """The command line's pre-flight and the flow's steps in one process share one parse and
    one plan of the policy (the memo of :class:`~privrelease.flows.context.PolicySource`), and
    the report and the public statement are rendered from one view (charts computed once)."""
    from privrelease import planning
    from privrelease.flows import context
    from privrelease.flows.preflight import preflight
    from privrelease.policies import loader
    from privrelease.reports import render

    context._load_policy.cache_clear()
    context.plan_of.cache_clear()
    parses, plans, views = [], [], []
    load, plan, view = loader._load, planning.plan_policy, render.view
    monkeypatch.setattr(loader, "_load", lambda *a, **k: parses.append(1) or load(*a, **k))
    monkeypatch.setattr(planning, "plan_policy", lambda *a, **k: plans.append(1) or plan(*a, **k))
    monkeypatch.setattr(render, "view", lambda *a, **k: views.append(1) or view(*a, **k))
    path = str(demo_dir / demo.POLICY_FILE)
    preflight(path)
    release_plain(policy_path=path)
    assert (len(parses), len(plans), len(views)) == (1, 1, 1)


def test_the_report_arithmetic_runs_beside_the_data_steps_and_follows_the_ledger(demo_dir, work, monkeypatch):
    """The report's charts and ledger curve are computed in a background thread while the data
    steps run (:func:`.reporting.prepare_report`); a release on the same dataset committed in
    the meantime makes the report compute the curve again, with that release counted before."""
    import threading

    from privrelease.audit import ledger
    from privrelease.flows import reporting
    from privrelease.reports import charts

    calls: list[tuple[str, str]] = []
    contexts = []
    curve_of, all_charts, report_context, read_data = (
        ledger.curve_of,
        charts.all_charts,
        reporting.report_context,
        steps.read_data,
    )

    def record(name, function):
        return lambda *a, **k: calls.append((name, threading.current_thread().name)) or function(*a, **k)

    monkeypatch.setattr(ledger, "curve_of", record("curve", curve_of))
    monkeypatch.setattr(charts, "all_charts", record("charts", all_charts))
    monkeypatch.setattr(
        reporting, "report_context", lambda *a, **k: contexts.append(report_context(*a, **k)) or contexts[-1]
    )
    path = str(variant(demo_dir, "approximate", ("accounting: probabilistic", "accounting: approximate")))
    release_plain(policy_path=path)
    assert [(name, thread.startswith("privrelease-report")) for name, thread in calls] == [
        ("charts", True),
        ("curve", True),
    ]
    assert contexts[-1].charts is not None and contexts[-1].ledger_curve["releases_before"] == 0

    inner: list[str] = []

    def read_beside_another_release(run, dataset):
        if not inner:  # another run on the same dataset commits while this one reads
            inner.append(run.run_id)
            release_plain(policy_path=path)
        return read_data(run, dataset)

    monkeypatch.setattr(steps, "read_data", read_beside_another_release)
    calls.clear()
    release_plain(policy_path=path)
    assert contexts[-1].ledger_curve["releases_before"] == 2 and contexts[-1].ledger_curve["releases_after"] == 3
    assert ("curve", threading.current_thread().name) in calls  # the ledger changed: computed again


# --------------------------------------------------------------------------- CSV dialect


QUOTED_DELIMITER_POLICY = """\
name: quoted-header
version: "1"
description: A header whose first name holds the other delimiter inside quotes
dataset:
  id: quoted-header
  path: cities.csv
  format: csv
  missing: reject
  columns:
    "city, state": {type: string, values: ["Paris, IDF", "Lyon, ARA"]}
    zip: {type: string}
generalization:
  "city, state": keep
mechanisms:
  - name: cities
    type: histogram
    columns: ["city, state"]
    k: 2
    beta: 0.5
    epsilon: 1.0
targets:
  accounting: probabilistic
  max_epsilon: 4.5
  delta: 0.5
  lifetime_budget: {epsilon: 20, delta: 0.5}
"""


def test_a_quoted_delimiter_in_the_header_is_read_alike_by_every_step(work, tmp_path):
    """``"city, state";zip``: one comma inside quotes, one semicolon outside. The pre-flight,
    the fingerprint, the reader and ``policy init`` decide the same dialect (two columns split
    by ``;``), so the valid file is released, not refused by one step and read by another."""
    from privrelease.drafting import draft_policy
    from privrelease.flows import preflight

    folder = tmp_path / "quoted"
    folder.mkdir()
    rows = "".join(f'"{city}";{zip_code}\n' for city, zip_code in [("Paris, IDF", 75001), ("Lyon, ARA", 69001)] * 20)
    (folder / "cities.csv").write_text('"city, state";zip\n' + rows, encoding="utf-8")
    policy = folder / "policy.yaml"
    policy.write_text(QUOTED_DELIMITER_POLICY, encoding="utf-8")
    loaded = load_policy(policy)
    assert data.header_names(folder / "cities.csv", loaded.policy.dataset) == ["city, state", "zip"]
    preflight.preflight(policy)
    published = release_plain(policy_path=str(policy))
    assert runs()[0].status == "succeeded" and published.outputs
    draft = draft_policy(folder / "cities.csv", "quoted-header", folder)
    assert '"city, state"' in draft and 'delimiter: ";"' in draft
