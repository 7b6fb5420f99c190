"""Check before spending (issue 15, item 5): a database insider (no keys) refunds a charge by
rechaining or by editing the ledger row, cuts off the newest run, or puts back an older copy
of the database file; the next run (which holds the service key) must refuse before it
charges anything (exit 1, one line, nothing recorded, nothing published). The witness beside
the database (:mod:`privrelease.audit.witness`) is what shows a cut-off or a rollback, the
newest release's signed head shows one when the witness was rolled back too, and a witness
forged to skip the check fails its signature. An intact database runs."""

from __future__ import annotations

import json
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import col, select
from test_audit_signing import _refund, rechain

from privrelease import demo
from privrelease.audit import chain, signing, witness
from privrelease.audit.database import dispose_engines, open_database, session
from privrelease.audit.models import AUDITED_TABLES, AuditEvent, ChainHead, LedgerEntry, Run
from privrelease.errors import EXIT_TARGET_NOT_MET, AuditRefused
from privrelease.flows.steps import release_plain


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """Two signed releases of the demo policy, a copy of the database taken between them and
    the head before the second one."""
    base = tmp_path_factory.mktemp("spending")
    signing.generate(base / "agency.key")
    policy, _ = demo.write_demo(base / "demo", seed=5)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PRIVRELEASE_WORK_DIR", str(base / "work"))
        patch.setenv("PRIVRELEASE_SIGNING_KEY", str(base / "agency.key"))
        for name in ("PRIVRELEASE_DB_URL", "PRIVRELEASE_PRODUCTION", "PRIVRELEASE_WITNESS"):
            patch.delenv(name, raising=False)
        release_plain(policy_path=str(policy))
        with session(open_database(), readonly=True) as s:
            before_second = chain.head(s)
        copy_database(base / "work" / "audit.db", base / "older.db")
        shutil.copy(base / "work" / "audit.db.witness.json", base / "older.witness.json")
        release_plain(policy_path=str(policy))
    dispose_engines()
    return base, policy, before_second


@pytest.fixture
def work(history, tmp_path, monkeypatch):
    """A copy of the work folder (database, witness, releases); the service key is set."""
    base, policy, before_second = history
    work = tmp_path / "work"
    shutil.copytree(base / "work", work)
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(work))
    monkeypatch.setenv("PRIVRELEASE_SIGNING_KEY", str(base / "agency.key"))
    for name in ("PRIVRELEASE_DB_URL", "PRIVRELEASE_PRODUCTION", "PRIVRELEASE_WITNESS"):
        monkeypatch.delenv(name, raising=False)
    yield work, base, policy, before_second
    dispose_engines()


def _state(work: Path) -> tuple[int, list[tuple[int, str]], list[str]]:
    with session(open_database(), readonly=True) as s:
        runs = len(s.exec(select(Run)).all())
        entries = [(e.id, e.state) for e in s.exec(select(LedgerEntry).order_by(col(LedgerEntry.id)))]
    return runs, entries, sorted(p.name for p in (work / "releases").iterdir())


def _cut_off(engine: Any, keep: chain.Head) -> None:
    """A careful insider: delete the records after ``keep`` and the rows they inserted (the
    second run, its charge, outputs and report), and move the chain-head row back."""
    with session(engine) as s:
        doomed = list(s.exec(select(AuditEvent).where(AuditEvent.seq > keep.seq).order_by(col(AuditEvent.seq))))
        payloads = [json.loads(record.payload_json) for record in doomed]
        inserted = dict.fromkeys((p["table"], p["key"]) for p in payloads if "table" in p)
        for table, key in sorted(inserted, key=lambda row: row[0] == "run"):  # the run after what refers to it
            row = s.get(AUDITED_TABLES[table], key)
            if row is not None and table != "dataset":
                s.delete(row)
                s.flush()
        for record in doomed:
            s.delete(record)
        head = s.get(ChainHead, 1)
        head.seq, head.hash = keep.seq, keep.hash
        s.add(head)


def _refund_rehashed(engine: Any) -> None:
    """A refund whose ledger entry's newest record (older than the verified head) is rewritten
    to describe it, rehashed, and linked from the next record: the chain up to the verified
    head is not rewritten, so only the record's signature shows it."""
    _refund(engine)
    with session(engine) as s:
        entry = s.exec(select(LedgerEntry).order_by(col(LedgerEntry.id))).first()
        records = list(s.exec(select(AuditEvent).order_by(col(AuditEvent.seq))))
        index, record = [
            (i, r)
            for i, r in enumerate(records)
            if '"table":"ledger_entry"' in r.payload_json and f'"key":{entry.id},' in r.payload_json
        ][-1]
        payload = json.loads(record.payload_json) | {"row_sha256": chain.row_sha256(entry)}
        record.payload_json = chain.canonical_json(payload)
        record.hash = chain.record_hash(record.prev_hash, record.seq, record.time, record.kind, payload)
        records[index + 1].prev_hash = record.hash
        s.add_all([record, records[index + 1]])


def copy_database(database: Path, copy: Path) -> None:
    """A consistent copy of the SQLite audit database ``database`` (what its log holds too)."""
    with closing(sqlite3.connect(database)) as source, closing(sqlite3.connect(copy)) as target:
        source.backup(target)


def put_back(database: Path, copy: Path) -> None:
    """The rollback: the older ``copy`` in place of the database file (its log removed, every
    connection of this process closed first)."""
    dispose_engines()
    for suffix in ("-wal", "-shm"):
        database.with_name(database.name + suffix).unlink(missing_ok=True)
    shutil.copy(copy, database)


def _roll_back(work: Path, base: Path) -> None:
    """Put the copy taken before the second release in place of the database file."""
    put_back(work / "audit.db", base / "older.db")


def _roll_back_both(work: Path, base: Path) -> None:
    """An insider who can write the witness too puts back both older copies: the newest
    release's signed head (on the share) names records the database lost."""
    _roll_back(work, base)
    shutil.copy(base / "older.witness.json", work / "audit.db.witness.json")


def _forge_witness(work: Path) -> None:
    """Claim the whole chain verified (so a rechain after the checkpoint would go unchecked)."""
    path = work / "audit.db.witness.json"
    body = json.loads(path.read_text())
    body["verified"] = body["head"] = {"seq": 1, "hash": "0" * 64}
    path.write_text(json.dumps(body))


ATTACKS = {
    "refund rechained": ("rewritten", lambda engine, work, base, keep: (_refund(engine), rechain(engine))),
    "refund in the row": ("ledger entry 1 was edited", lambda engine, work, base, keep: _refund(engine)),
    "refund, its record rehashed": ("was edited", lambda engine, work, base, keep: _refund_rehashed(engine)),
    "tail cut off": ("witness", lambda engine, work, base, keep: _cut_off(engine, keep)),
    "rolled back to an older copy": ("witness", lambda engine, work, base, keep: _roll_back(work, base)),
    "rolled back with its witness": (
        "signed head of release",
        lambda engine, work, base, keep: _roll_back_both(work, base),
    ),
    "witness forged": ("no valid signature", lambda engine, work, base, keep: _forge_witness(work)),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_tampered_database_is_refused_before_charging(work, monkeypatch, attack):
    work_dir, base, policy, before_second = work
    expected, do = ATTACKS[attack]
    monkeypatch.delenv("PRIVRELEASE_SIGNING_KEY")  # the insider has no key
    do(open_database(), work_dir, base, before_second)
    dispose_engines()
    monkeypatch.setenv("PRIVRELEASE_SIGNING_KEY", str(base / "agency.key"))
    before = _state(work_dir)
    with pytest.raises(AuditRefused, match="refused before spending") as refused:
        release_plain(policy_path=str(policy))
    message = str(refused.value)
    assert expected in message and "nothing was charged" in message and "\n" not in message
    assert refused.value.exit_code == EXIT_TARGET_NOT_MET
    assert _state(work_dir) == before  # no run, no reservation, no folder


def test_an_intact_database_runs_and_moves_the_signed_witness(work):
    work_dir, base, policy, _ = work
    published = release_plain(policy_path=str(policy))
    public = signing.public_key(str(base / "agency.key.pub"))
    found = witness.read(work_dir / "audit.db.witness.json", public)  # signed by the service key
    assert found is not None and found.head.seq == published.chain_head["seq"]
    with session(open_database(), readonly=True) as s:
        reserved = s.exec(select(AuditEvent).where(AuditEvent.kind == "ledger_reserved")).all()[-1]
    assert reserved.seq <= found.verified.seq <= found.head.seq  # checked up to the reservation at least


def test_without_a_witness_the_whole_chain_is_checked(work):
    """The first run after an upgrade (or a witness moved away) verifies from the genesis: an
    insider's rechained refund is still refused by its signatures."""
    work_dir, base, policy, _ = work
    (work_dir / "audit.db.witness.json").unlink()
    _refund(open_database())
    rechain(open_database())
    with pytest.raises(AuditRefused, match="refused before spending: .* no valid signature"):
        release_plain(policy_path=str(policy))


def test_a_revocation_deleted_and_rechained_is_refused(work, monkeypatch):
    """An approval is revoked; an insider deletes the revocation record and rechains, so the
    approval counts again: the next production run is refused before it charges anything."""
    from privrelease.audit import approvals, governance
    from privrelease.flows import steps
    from privrelease.policies import load_policy

    work_dir, base, policy, _ = work
    loaded = load_policy(policy)
    facts = approvals.policy_facts(loaded)
    with session(open_database()) as s:
        approvals.approve_policy(s, facts, "Reviewer", binding=steps.approval_binding(loaded, "data"))
        approvals.revoke(s, facts, by="CPO", reason="the scheme leaks")
    monkeypatch.delenv("PRIVRELEASE_SIGNING_KEY")
    with session(open_database()) as s:
        s.delete(s.exec(select(AuditEvent).where(AuditEvent.kind == governance.KINDS["revoke"])).one())
    rechain(open_database())
    dispose_engines()
    monkeypatch.setenv("PRIVRELEASE_SIGNING_KEY", str(base / "agency.key"))
    monkeypatch.setenv("PRIVRELEASE_PRODUCTION", "true")
    before = _state(work_dir)
    with pytest.raises(AuditRefused, match="refused before spending"):
        release_plain(policy_path=str(policy))
    assert _state(work_dir) == before


def test_the_pre_flight_refuses_a_tampered_database_before_prefect(work):
    """`privrelease run` and `rerun` check the chain in their pre-flight, before any Prefect
    server starts: a refund rechained by an insider is refused there with the run's own message."""
    from privrelease.flows.preflight import preflight, preflight_rerun

    work_dir, _, policy, _ = work
    (work_dir / "audit.db.witness.json").unlink()
    with session(open_database(), readonly=True) as s:
        run_id = s.exec(select(Run.id)).first()
    _refund(open_database())
    rechain(open_database())
    with pytest.raises(AuditRefused, match="refused before spending"):
        preflight(policy)
    with pytest.raises(AuditRefused, match="refused before spending"):
        preflight_rerun(run_id)
    assert not list(work_dir.rglob("prefect-server*"))


def test_records_deleted_from_the_end_are_named_by_the_logs_real_end(work):
    """A careless insider deletes the newest 3 records only (the chain-head row still names the
    old end): the refusal names the log's real last record, and `audit verify` does not call
    the run row those records described "edited"."""
    from typer.testing import CliRunner

    from privrelease.cli import app

    work_dir, _, policy, _ = work
    with closing(sqlite3.connect(work_dir / "audit.db")) as db, db:
        end = db.execute("SELECT max(seq) FROM audit_event").fetchone()[0]
        db.execute("DELETE FROM audit_event WHERE seq > ?", (end - 3,))
    dispose_engines()
    with pytest.raises(AuditRefused, match=f"the log ends at record {end - 3} but the witness .* names record {end}:"):
        release_plain(policy_path=str(policy))
    verified = CliRunner().invoke(app, ["audit", "verify"])
    assert verified.exit_code == 1
    headline = verified.stdout.splitlines()[0]
    assert "its newest remaining record, describes: edited, or the records describing it were removed" in headline
    assert "was edited after" not in verified.stdout
