"""``privrelease policy approve/list/show``, ``audit verify/head/migrate``, ``ledger show``, with
and without ``--json``; they never import Prefect and answer quickly."""

from __future__ import annotations

import json
import os
import pwd
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import sqlalchemy as sa
import typer
from conftest import child_cpu_seconds
from test_audit_chain import FINGERPRINT, fresh_engine
from typer.testing import CliRunner

from privrelease.audit import database, records
from privrelease.errors import UserError

try:
    from privrelease.cli import audit as audit_cli
except ImportError as error:  # the CLI package imports every command module
    if "calculus" not in str(error):
        raise
    pytest.skip("privrelease.cli.calculus has not landed yet", allow_module_level=True)

REPO = Path(__file__).resolve().parents[1]
DEMO_POLICY = REPO / "policies" / "examples" / "demo.yaml"

app = typer.Typer()
audit_cli.register(app)
runner = CliRunner()


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh audit database that the commands use (``PRIVRELEASE_DB_URL``)."""
    engine = fresh_engine(tmp_path)
    monkeypatch.setenv("PRIVRELEASE_DB_URL", engine.url.render_as_string(hide_password=False))
    monkeypatch.chdir(tmp_path)
    yield engine
    database.dispose_engines()


def run(*args: str, code: int = 0) -> str:
    result = runner.invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == code, result.output
    return result.output


def run_json(*args: str, code: int = 0) -> Any:
    return json.loads(run(*args, "--json", code=code))


def approve(*extra: str) -> Any:
    """Approve the demo policy, binding its path (the example has no data beside it)."""
    return run_json("policy", "approve", str(DEMO_POLICY), "--by", "Ada Lovelace", "--binds", "path", *extra)


def test_policy_approve_list_show(db: Any) -> None:
    from privrelease.policies import load_policy, load_policy_text

    loaded = load_policy(DEMO_POLICY)
    approval = approve("--note", "first review")
    assert approval["policy"] == "demo-census" and approval["version"] == "1"
    assert approval["sha256"] == loaded.sha256
    assert approval["approved_by"] == "Ada Lovelace"
    assert (approval["os_user"], approval["binds"]["binds"]) == (pwd.getpwuid(os.geteuid()).pw_name, "path")
    assert approval["binds"]["path"] == str(loaded.dataset_path.resolve())
    assert approval["note"] == "first review"
    assert approval["chain_head"]["seq"] == 2  # policy registered, approval

    assert "approved" in run("policy", "approve", str(DEMO_POLICY), "--by", "Grace Hopper", "--binds", "path")
    (listed,) = run_json("policy", "list")["policies"]
    assert listed["sha256"] == loaded.sha256
    assert [a["approved_by"] for a in listed["approvals"]] == [
        "Ada Lovelace",
        "Grace Hopper",
    ]
    assert "demo-census" in run("policy", "list")

    for ref in ("demo-census", "demo-census@1", loaded.sha256[:10]):
        shown = run_json("policy", "show", ref)
        assert shown["sha256"] == loaded.sha256 and shown["approved"] is True
        assert shown["policy"]["policy"]["name"] == "demo-census"
    human = run("policy", "show", "demo-census@1")
    # the approved YAML first (not the canonical JSON), then one row per approval
    lines = human.splitlines()
    assert lines[0].startswith(f"# demo-census@1  sha256 {loaded.sha256}")
    assert "comments and layout are not stored" in lines[1]
    assert lines[2:4] == ["name: demo-census", "version: '1'"]
    assert '"canonical_version"' not in human
    yaml_text = human[: human.index("\napprovals")]
    assert load_policy_text(yaml_text, DEMO_POLICY.parent).sha256 == loaded.sha256
    rows = [line for line in lines if line.startswith("│")]
    assert len(rows) == 2 and "Ada Lovelace" in rows[0] and "Grace Hopper" in rows[1]
    os_user = pwd.getpwuid(os.geteuid()).pw_name
    assert all(f"│ {os_user} " in row and "│ unsigned " in row for row in rows)
    assert "first review" in rows[0] and "whatever is at the path" in rows[0]
    assert run_json("policy", "show", "demo-census@1")["policy_yaml"] == yaml_text.split("\n", 2)[2]
    with pytest.raises(UserError, match="no registered policy"):
        run("policy", "show", "demo-census@2")


def test_a_changed_policy_under_the_same_version_is_refused(db: Any, tmp_path: Path) -> None:
    approve()
    changed = tmp_path / "demo.yaml"
    text = DEMO_POLICY.read_text(encoding="utf-8")
    changed.write_text(text.replace("description: ", "description: edited "), encoding="utf-8")
    with pytest.raises(UserError, match="new `version`"):
        run("policy", "approve", str(changed), "--by", "Mallory", "--binds", "path")


def test_empty_lists(db: Any) -> None:
    assert run_json("policy", "list") == {"policies": []}
    assert "no policies" in run("policy", "list")
    assert run_json("ledger", "list") == {"datasets": []}
    assert "no datasets" in run("ledger", "list")


def test_audit_verify_head_and_tampering(db: Any, tmp_path: Path) -> None:
    approve()
    assert run_json("audit", "verify")["ok"] is True
    assert "intact" in run("audit", "verify")
    head_file = tmp_path / "head.json"
    head = run_json("audit", "head", "--write", str(head_file))
    assert head["seq"] == 2 and json.loads(head_file.read_text()) == head
    assert "seq 2" in run("audit", "head")
    assert run_json("audit", "verify", "--head", str(head_file))["ok"] is True

    head_file.write_text(json.dumps({"seq": 5, "hash": "0" * 64}))
    cut = run_json("audit", "verify", "--head", str(head_file), code=1)
    assert cut["first_broken"]["kind"] == "truncated" and cut["first_broken"]["seq"] == 3

    with db.begin() as connection:
        connection.execute(sa.text("UPDATE approval SET approved_by = 'Mallory'"))
    broken = run_json("audit", "verify", code=1)
    assert broken["ok"] is False
    assert broken["first_broken"]["seq"] == 2
    assert broken["first_broken"]["kind"] == "row_edited"
    human = run("audit", "verify", code=1)
    assert "BROKEN" in human and "record 2" in human


def test_audit_migrate(db: Any) -> None:
    from privrelease.audit.migrations.versions import HEAD_REVISION

    assert run_json("audit", "migrate")["revision"] == HEAD_REVISION
    assert HEAD_REVISION in run("audit", "migrate")


def test_ledger_show(db: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    accountants = pytest.importorskip(
        "privrelease.mechanisms.accountants",
        reason="the accountants module has not landed yet",
    )
    from test_ledger import RELEASE as release

    from privrelease.audit import ledger

    approval = approve()
    one = accountants.account(release, "probabilistic")
    with database.session(db) as s:
        records.register_dataset(
            s,
            FINGERPRINT,
            identity="census",
            size_bytes=10,
            row_count=2,
            lifetime_epsilon=10 * one.epsilon,
            lifetime_delta=1e-6,
            notion="probabilistic",
            label="census.csv",
        )
        run_id = records.start_run(s, policy_sha256=approval["sha256"], code_version="t").id
        failed_id = records.start_run(s, policy_sha256=approval["sha256"], code_version="t").id
    with database.session(db) as s:
        ledger.commit(s, ledger.reserve(s, FINGERPRINT, run_id, release, "probabilistic"))
        ledger.release(s, ledger.reserve(s, FINGERPRINT, failed_id, release, "probabilistic"), "run failed: test")
    shown = run_json("ledger", "show", FINGERPRINT[:8])
    assert shown == run_json("ledger", "show", "census")
    assert shown["dataset"] == "census" and shown["migrated"] is False
    (vintage,) = shown["vintages"]
    assert (vintage["fingerprint"], vintage["label"], vintage["row_count"]) == (FINGERPRINT, "census.csv", 2)
    assert vintage["runs"] == [] and vintage["first_read"] is None  # reserved, data not read
    assert shown["spent"]["epsilon"] == pytest.approx(one.epsilon)
    assert shown["remaining"]["epsilon"] == pytest.approx(9 * one.epsilon)
    assert shown["at_lifetime_delta"] is False  # probabilistic: the stated deltas add up, delta is spent
    assert [e["state"] for e in shown["entries"]] == ["committed", "released"]  # the stored words
    assert shown["entries"][0]["event"]["event"]["kind"] == "laplace"
    assert run_json("ledger", "show", "census.csv")["dataset"] == "census"
    from privrelease.audit import witness

    locks = []
    monkeypatch.setattr(witness.chain, "lock", lambda s: locks.append(s))  # a writer's lock: never taken here
    human = run("ledger", "show", "census.csv")
    assert locks == []  # the ledger's check reads a snapshot: no write lock, nothing written
    assert "remaining" in human and "spent (published)" in human
    assert "returned (nothing published; not counted)" in " ".join(human.split()) and "released" not in human
    assert "spent is not their sum: it is composition of 1 stored tree " in " ".join(human.split())
    assert "'census.csv' is a file of dataset census" in human and FINGERPRINT[:12] in human
    (listed,) = run_json("ledger", "list")["datasets"]
    assert listed["dataset"] == "census" and listed["counting_entries"] == 1
    assert listed["files"] == ["census.csv"] and listed["at_lifetime_delta"] is False
    assert "census.csv" in run("ledger", "list")
    with pytest.raises(UserError, match="no dataset"):
        run("ledger", "show", "ffff")


def test_commands_never_import_prefect_and_are_quick(db: Any) -> None:
    """Within 3x of merely importing the CLI and the audit database (CPU time, measured now)."""
    script = (
        "import sys, typer\n"
        "from privrelease.cli.audit import register\n"
        "app = typer.Typer(); register(app)\n"
        "for args in (['policy', 'list', '--json'], ['audit', 'verify', '--json']):\n"
        "    app(args, standalone_mode=False)\n"
        "assert 'prefect' not in sys.modules, 'prefect was imported'\n"
    )
    done, cpu, baseline = child_cpu_seconds(script)
    assert done.returncode == 0, done.stderr
    assert cpu < 3 * baseline, f"two audit commands took {cpu:.2f} s of CPU; importing them {baseline:.2f} s"


def test_the_audit_database_is_never_created_by_accident(tmp_path, monkeypatch) -> None:
    """A command pointed at a database that does not exist refuses, naming the URL, and creates
    nothing; `audit init` creates it (once); then the commands work."""
    from typer.testing import CliRunner

    from privrelease.cli import app
    from privrelease.errors import UserError

    runner = CliRunner()
    work = tmp_path / "typo"
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(work))
    monkeypatch.delenv("PRIVRELEASE_DB_URL", raising=False)
    monkeypatch.delenv("PRIVRELEASE_AUTO_INIT", raising=False)
    for args in (["audit", "verify"], ["ledger", "list"], ["policy", "list"], ["report", "list"]):
        result = runner.invoke(app, args)
        assert isinstance(result.exception, UserError), (args, result.output)
        assert f"there is no audit database at sqlite:///{work / 'audit.db'}" in str(result.exception)
        assert "privrelease audit init" in str(result.exception)
    assert not (work / "audit.db").exists()
    created = runner.invoke(app, ["audit", "init", "--json"])
    assert created.exit_code == 0 and json.loads(created.output)["created"] is True
    again = runner.invoke(app, ["audit", "init"])
    assert again.exit_code == 0 and "already exists" in again.output
    assert runner.invoke(app, ["audit", "verify"]).exit_code == 0


# --- audit verify replays the stored guarantees ----------------------------------------------


def record_release(db: Any) -> str:
    """A release of the demo policy recorded as the flow records it: its plan's guarantees under
    every notion (the flow's own step) and its DP tree charged, under approximate DP, to a
    dataset with a lifetime budget. Returns the run id."""
    from types import SimpleNamespace

    from privrelease.audit import ledger
    from privrelease.flows import publishing, steps

    approval = approve()
    source = steps.PolicySource.from_file(DEMO_POLICY)
    summary = steps.plan_summary(source)
    assert summary.charged_event_json is not None
    with database.session(db) as s:
        records.register_dataset(
            s,
            FINGERPRINT,
            identity="demo-census",
            size_bytes=10,
            row_count=50_000,
            lifetime_epsilon=50.0,
            lifetime_delta=1e-6,
            notion="approximate",
        )
        run_id = records.start_run(
            s, policy_sha256=approval["sha256"], code_version="t", dataset_fingerprint=FINGERPRINT
        ).id
    with database.session(db) as s:
        reservation = ledger.reserve(s, "demo-census", run_id, summary.charged_event_json, "approximate")
    with database.session(db) as s:
        records.record_data_read(s, run_id)
        ledger.commit(s, reservation.entry_id)
        publishing._record_guarantees(s, SimpleNamespace(run_id=run_id, policy=source), summary, {})
        records.finish_run(s, run_id, "succeeded")
    return run_id


def rewrite_and_resign(db: Any, key_file: Path, *statements: str) -> None:
    """A write that lands before the records describing it are chained and signed: the rows are
    edited, every record re-describes them, the chain is recomputed and every record signed
    again with the service key. It models whoever writes the audit database through a process
    holding the key (a patched or compromised runner, a restore or migration script run with
    the key, the key holder): the hash chain and the signatures are intact afterwards, so only a
    replay of the arithmetic can tell."""
    from sqlmodel import col, select
    from test_audit_signing import rechain

    from privrelease.audit import chain, signing, verification, witness
    from privrelease.audit.models import AuditEvent

    with db.begin() as connection:
        for statement in statements:
            connection.execute(sa.text(statement))
    rechain(db)
    key = signing.private_key(str(key_file), "key")
    with database.session(db) as s:
        for record in s.exec(select(AuditEvent).order_by(col(AuditEvent.seq))):
            record.signature = signing.sign(key, signing.record_message(record.seq, record.hash))
            s.add(record)
    with database.session(db, readonly=True) as s:
        intact = verification.verify(s, public_key=signing.public_key(str(key_file) + ".pub"))
        head = chain.head(s)
    assert intact.ok, intact.problems  # the chain and the signatures alone see nothing
    path = witness.path_for(db)
    assert path is not None
    path.unlink(missing_ok=True)  # the key holder witnesses the history she wrote
    with mock.patch.dict(os.environ, {"PRIVRELEASE_SIGNING_KEY": str(key_file)}):
        witness._write(path, witness.Witness(head, head))


def replay_findings(db: Any, *args: str) -> list[dict[str, Any]]:
    found = run_json("audit", "verify", *args, code=1)["problems"]
    assert found and all(p["kind"] in ("guarantee_mismatch", "replay_failed") for p in found), found
    return found


def test_audit_verify_replays_every_stored_guarantee(db: Any) -> None:
    """A database recorded as the flow records it replays exactly: every guarantee row (both
    notions) and the ledger charge, with today's accountants."""
    from sqlmodel import select

    from privrelease.audit import replay
    from privrelease.audit.models import Guarantee, LedgerEntry

    record_release(db)
    with database.session(db, readonly=True) as s:
        assert len(s.exec(select(Guarantee)).all()) == 2 and len(s.exec(select(LedgerEntry)).all()) == 1
        assert replay.problems(s) == []
    assert run_json("audit", "verify")["ok"] is True


def test_audit_verify_flags_an_understated_guarantee_written_before_it_was_chained(db: Any, tmp_path: Path) -> None:
    """A smaller epsilon/delta written into a guarantee row and a ledger entry, then chained and
    signed (see rewrite_and_resign: the signed chain verifies) is flagged by the replay, naming
    the row, the run, the stored and the recomputed values, as the dangerous direction; a larger
    one is flagged as overstated."""
    from sqlmodel import select

    from privrelease.audit import signing
    from privrelease.audit.models import Guarantee, LedgerEntry

    key_file = tmp_path / "agency.key"
    (tmp_path / "agency.key.pub").write_text(signing.generate(key_file), encoding="utf-8")
    run_id = record_release(db)
    with database.session(db, readonly=True) as s:
        stored = {(row.notion, row.id): (row.epsilon, row.delta) for row in s.exec(select(Guarantee))}
        entry = s.exec(select(LedgerEntry)).one()
    probabilistic = next(key for key in stored if key[0] == "probabilistic")
    rewrite_and_resign(
        db,
        key_file,
        f"UPDATE guarantee SET epsilon = epsilon / 2 WHERE id = {probabilistic[1]}",
        f"UPDATE ledger_entry SET epsilon = epsilon * 0.999 WHERE id = {entry.id}",
    )
    found = replay_findings(db, "--public-key", str(tmp_path / "agency.key.pub"))
    assert [p["kind"] for p in found] == ["guarantee_mismatch", "guarantee_mismatch"]
    by_table = {p["message"].split(" row ")[0]: p["message"] for p in found}
    epsilon, delta = stored[probabilistic]
    assert by_table["guarantee"].startswith(f"guarantee row {probabilistic[1]} of run {run_id}: the probabilistic")
    assert f"stored (epsilon {epsilon / 2!r}, delta {delta!r})" in by_table["guarantee"]
    assert f"replays to (epsilon {epsilon!r}, delta {delta!r})" in by_table["guarantee"]
    assert "UNDERSTATED" in by_table["guarantee"] and "dangerous direction" in by_table["guarantee"]
    assert by_table["ledger_entry"].startswith(f"ledger_entry row {entry.id} of run {run_id}: the charge to dataset")
    assert f"replays to (epsilon {entry.epsilon!r}, delta {entry.delta!r})" in by_table["ledger_entry"]
    assert "UNDERSTATED" in by_table["ledger_entry"]
    human = run("audit", "verify", code=1)
    assert "BROKEN" in human and "UNDERSTATED" in human

    rewrite_and_resign(db, key_file, f"UPDATE guarantee SET epsilon = {epsilon * 3!r} WHERE id = {probabilistic[1]}")
    (overstated,) = [p["message"] for p in replay_findings(db) if p["message"].startswith("guarantee")]
    assert "overstated" in overstated and "UNDERSTATED" not in overstated


def test_audit_verify_flags_an_event_tree_that_no_longer_parses(db: Any, tmp_path: Path) -> None:
    """A stored tree naming an event kind this code does not know (or not JSON at all) is a
    finding naming the row, never a crash."""
    from privrelease.audit import signing

    key_file = tmp_path / "agency.key"
    (tmp_path / "agency.key.pub").write_text(signing.generate(key_file), encoding="utf-8")
    run_id = record_release(db)
    rewrite_and_resign(
        db,
        key_file,
        'UPDATE guarantee SET event_json = replace(event_json, \'"kind":"laplace"\', \'"kind":"quantum"\')',
        "UPDATE ledger_entry SET event_json = 'not json'",
    )
    found = replay_findings(db)
    assert {p["kind"] for p in found} == {"replay_failed"} and len(found) == 3
    assert all(f"of run {run_id}: its stored event tree cannot be replayed" in p["message"] for p in found)
    assert any("cannot replay event kind 'quantum'" in p["message"] for p in found), found
    assert "BROKEN" in run("audit", "verify", code=1)


def test_piped_tables_keep_one_line_per_row(db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Captured output is not a terminal: a long name is printed whole on its row, never folded
    over several lines (the old 80-column layout split it); COLUMNS, when set, still rules."""
    monkeypatch.delenv("COLUMNS", raising=False)
    long_name = "demo-census-" + "-".join(["a-long-policy-name"] * 6)
    long_version = "2026-11-25-" + "x" * 40
    policy = tmp_path / "long.yaml"
    text = DEMO_POLICY.read_text(encoding="utf-8")
    policy.write_text(
        text.replace("name: demo-census\n", f"name: {long_name}\n").replace(
            'version: "1"', f'version: "{long_version}"'
        ),
        encoding="utf-8",
    )
    run("policy", "approve", str(policy), "--by", "Ada Lovelace", "--binds", "path")
    listed = run("policy", "list")
    (row,) = [line for line in listed.splitlines() if long_name in line]
    assert long_version in row and "Ada Lovelace" in row
    assert len([line for line in listed.splitlines() if line.startswith("│")]) == 1
    monkeypatch.setenv("COLUMNS", "80")
    assert max(len(line) for line in run("policy", "list").splitlines()) <= 80
