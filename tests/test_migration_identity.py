"""Migration 0002: a fingerprint-keyed ledger (revision 0001, with history) becomes one keyed by
dataset identity; the old hash chain still verifies, every ledger total is unchanged, and new
records chain on. Runs on SQLite, and on PostgreSQL when one is available.

The 0001 database is written the way the 0001 code wrote it: each row inserted, read back,
hashed over all its columns (``{"table", "columns"}``) and described by a chained record."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import select
from test_audit_chain import BACKENDS, POLICY, POLICY_JSON, POLICY_SHA, audit_database, check
from test_ledger import NOTION, RELEASE, composed

from privrelease.audit import chain, database, identities, ledger, records
from privrelease.audit.migrations.versions import HEAD_REVISION
from privrelease.audit.models import AuditEvent, utcnow
from privrelease.errors import UserError
from privrelease.mechanisms.events import event_to_json

FA = hashlib.sha256(b"census 2020").hexdigest()
FB = hashlib.sha256(b"census 2020, one row appended").hexdigest()


class Writer0001:
    """Rows and records as revision 0001's code wrote them (schema reflected from the database)."""

    def __init__(self, connection: sa.Connection) -> None:
        self.connection = connection
        self.meta = sa.MetaData()
        self.meta.reflect(connection)

    def write(self, table: str, kind: str, key: str, values: dict[str, Any], **facts: Any) -> Any:
        t = self.meta.tables[table]
        if values.get(key) is None:  # a new row with a generated key (a serial on PostgreSQL)
            inserted = self.connection.execute(t.insert().values(**values))
            values = {**values, key: inserted.inserted_primary_key[0]}
        elif self.connection.execute(sa.select(t).where(t.c[key] == values[key])).first():
            self.connection.execute(t.update().where(t.c[key] == values[key]).values(**values))
        else:
            self.connection.execute(t.insert().values(**values))
        row = self.connection.execute(sa.select(t).where(t.c[key] == values[key])).mappings().one()
        payload = {**facts, "table": table, "key": values[key], "row_sha256": chain.columns_sha256(table, dict(row))}
        head = self.connection.execute(sa.text("SELECT seq, hash FROM chain_head WHERE id = 1")).one()
        seq, time = head.seq + 1, utcnow().replace(tzinfo=None)
        digest = chain.record_hash(head.hash, seq, time, kind, payload)
        self.connection.execute(
            self.meta.tables["audit_event"]
            .insert()
            .values(
                seq=seq,
                time=time,
                kind=kind,
                payload_json=chain.canonical_json(payload),
                prev_hash=head.hash,
                hash=digest,
            )
        )
        self.connection.execute(
            sa.text("UPDATE chain_head SET seq = :seq, hash = :hash WHERE id = 1"), {"seq": seq, "hash": digest}
        )
        return values[key]

    def policy(self, facts: Any, when: Any) -> None:
        """Register the policy ``facts`` (a ``PolicyFacts``) as every revision before 0007 did."""
        values = {"name": facts.name, "version": facts.version, "sha256": facts.sha256}
        values |= {"canonical_json": facts.canonical_json, "registered_at": when}
        self.write("policy_version", "policy_registered", "id", values, sha256=facts.sha256)


def write_0001_history(engine: Any) -> dict[str, str]:
    """A policy, two fingerprints (10 and 11 rows) with budget (2.0, 1e-6), four runs and their
    charges: committed, released, committed, live reservation. Returns run ids by name."""
    now = utcnow().replace(tzinfo=None)
    tree = event_to_json(RELEASE)
    runs: dict[str, str] = {}
    with engine.begin() as connection:
        w = Writer0001(connection)
        w.write(
            "policy_version",
            "policy_registered",
            "id",
            {"name": POLICY.name, "version": POLICY.version, "sha256": POLICY_SHA, "canonical_json": POLICY_JSON}
            | {"registered_at": now},
        )
        for fingerprint, rows, label in ((FA, 10, "census.csv"), (FB, 11, "census-appended.csv")):
            w.write(
                "dataset",
                "dataset_registered",
                "fingerprint",
                {"fingerprint": fingerprint, "size_bytes": 100 + rows, "row_count": rows}
                | {"lifetime_epsilon": 2.0, "lifetime_delta": 1e-6, "notion": NOTION, "label": label}
                | {"registered_at": now},
            )
        for name, fingerprint, state in (("a1", FA, "committed"), ("a2", FA, "released"), ("b1", FB, "committed")):
            run_id = hashlib.md5(name.encode()).hexdigest()
            runs[name] = run_id
            run = {"id": run_id, "policy_sha256": POLICY_SHA, "dataset_fingerprint": fingerprint}
            run |= {"code_version": "0001", "kind": "release", "status": "running", "started_at": now}
            run |= {"data_read_at": now, "timings_json": "{}"}
            w.write("run", "run_started", "id", run, run=run_id)
            entry = {"dataset_fingerprint": fingerprint, "run_id": run_id, "notion": NOTION, "event_json": tree}
            entry |= {"epsilon": 1.0, "delta": 0.0, "state": "reserved", "created_at": now, "updated_at": now}
            entry |= {"expires_at": now + timedelta(hours=1)}
            key = w.write("ledger_entry", "ledger_reserved", "id", entry, run=run_id, dataset=fingerprint)
            w.write("ledger_entry", f"ledger_{state}", "id", entry | {"id": key, "state": state}, run=run_id)
            w.write("run", "run_finished", "id", run | {"status": "succeeded", "finished_at": now}, run=run_id)
        live = hashlib.md5(b"b2").hexdigest()
        runs["b2"] = live
        run = {"id": live, "policy_sha256": POLICY_SHA, "dataset_fingerprint": FB, "code_version": "0001"}
        run |= {"kind": "release", "status": "pending", "started_at": now, "timings_json": "{}"}
        w.write("run", "run_started", "id", run, run=live)
        entry = {"dataset_fingerprint": FB, "run_id": live, "notion": NOTION, "event_json": tree, "epsilon": 1.0}
        entry |= {"delta": 0.0, "state": "reserved", "created_at": now, "updated_at": now}
        entry |= {"expires_at": now + timedelta(hours=1)}
        w.write("ledger_entry", "ledger_reserved", "id", entry, run=live, dataset=FB)
    return runs


@pytest.fixture(params=BACKENDS)
def old_engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """An audit database at revision 0001 with history."""
    with audit_database(request.param, tmp_path, migrated=False) as engine:
        database.migrate(engine, "0001_initial")
        yield engine


def test_a_fingerprint_keyed_ledger_migrates_and_still_verifies(old_engine: Any) -> None:
    runs = write_0001_history(old_engine)
    with old_engine.connect() as connection:
        old_records = connection.execute(sa.text("SELECT seq, hash FROM audit_event ORDER BY seq")).all()
    url = old_engine.url.render_as_string(hide_password=False)
    engine = database.open_database(url)  # the automatic upgrade every command does
    assert database.current_revision(engine) == HEAD_REVISION

    result = check(engine)
    assert result.ok, result.problems
    # one schema record, then 2 identities, 2 vintages and 4 ledger entries re-described; and
    # revision 0007's schema record and the policy re-described (it stays registered)
    assert result.records == len(old_records) + 1 + 2 + 2 + 4 + 2
    with database.session(engine, readonly=True) as s:
        events = s.exec(select(AuditEvent).order_by(AuditEvent.seq)).all()
        assert [(e.seq, e.hash) for e in events[: len(old_records)]] == [tuple(r) for r in old_records]
        migrated = events[len(old_records) :]
        assert migrated[0].kind == "schema_migrated" and migrated[0].prev_hash == old_records[-1][1]
        assert [e.kind for e in migrated[1:]] == ["dataset_identity_migrated"] * 2 + ["dataset_migrated"] * 2 + [
            "ledger_entry_migrated"
        ] * 4 + ["schema_migrated", "policy_version_migrated"]

        ids = {fingerprint: f"fingerprint-{fingerprint[:12]}" for fingerprint in (FA, FB)}
        for fingerprint, identity in ids.items():
            found = identities.find_identity(s, fingerprint[:10])  # an old fingerprint prefix
            assert found.id == identity and found.migrated
            assert found.note is not None and f"covers only the bytes with sha256 {fingerprint}" in found.note
            assert (found.lifetime_epsilon, found.lifetime_delta, found.notion) == (2.0, 1e-6, NOTION)
            (vintage,) = identities.vintages_of(s, identity)
            assert vintage.dataset.fingerprint == fingerprint
        # totals unchanged: A has one committed charge (one released); B one committed, one live
        assert ledger.ledger_status(s, ids[FA]).spent == composed(RELEASE)
        assert ledger.ledger_status(s, FB).spent == composed(RELEASE, RELEASE)
        assert [e.run_id for e in ledger.ledger_status(s, ids[FB]).counting] == [runs["b1"], runs["b2"]]

    # new records chain on: a new vintage of the migrated identity charges the same budget
    newer = hashlib.sha256(b"census 2020, one cell edited").hexdigest()
    with database.session(engine) as s:
        records.register_dataset(
            s,
            newer,
            identity=ids[FA],
            size_bytes=110,
            row_count=10,
            lifetime_epsilon=2.0,
            lifetime_delta=1e-6,
            notion=NOTION,
        )
        run = records.start_run(s, policy_sha256=POLICY_SHA, code_version="0002", dataset_fingerprint=newer)
        reservation = ledger.reserve(s, ids[FA], run.id, RELEASE, NOTION)
        assert reservation.spent_before == composed(RELEASE)
        ledger.commit(s, reservation)
    with database.session(engine) as s, pytest.raises(UserError, match=f"already a vintage of dataset {ids[FA]}"):
        records.register_dataset(
            s,
            FA,
            identity="census",
            size_bytes=110,
            row_count=10,
            lifetime_epsilon=9.0,
            lifetime_delta=1e-6,
            notion=NOTION,
        )
    result = check(engine)
    assert result.ok, result.problems
    assert result.records > len(old_records) + 9

    # the migrated rows are protected by the chain like any other
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE dataset_identity SET lifetime_epsilon = 99 WHERE id = :i"), {"i": ids[FB]})
    broken = check(engine)
    assert broken.first is not None and broken.first.kind == "row_edited"
    assert f"dataset_identity row '{ids[FB]}'" in broken.first.message
    payload = json.loads(migrated[2].payload_json)
    assert (payload["table"], payload["key"], broken.first.seq) == ("dataset_identity", ids[FB], migrated[2].seq)


def test_migrating_an_empty_0001_database_appends_nothing(old_engine: Any) -> None:
    database.migrate(old_engine)
    result = check(old_engine)
    assert result.ok and result.records == 0
