"""The hash chain: appends, and ``verify`` naming the first broken record for every kind of
tampering (edited/deleted/reordered records and rows, edited/missing files, truncation)."""

from __future__ import annotations

import atexit
import functools
import hashlib
import json
import multiprocessing
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import select

from privrelease.audit import approvals, chain, database, records, verification
from privrelease.audit.models import AuditEvent, Run
from privrelease.errors import UserError
from privrelease.files import sha256_file

POLICY_JSON = '{"name":"census","version":"1"}'
POLICY_SHA = hashlib.sha256(POLICY_JSON.encode()).hexdigest()
POLICY = approvals.PolicyFacts("census", "1", POLICY_SHA, POLICY_JSON)
FINGERPRINT = hashlib.sha256(b"dataset bytes").hexdigest()


@functools.cache
def _migrated_template() -> Path:
    """A freshly migrated, empty SQLite audit database (built once per process)."""
    path = Path(tempfile.mkdtemp(prefix="privrelease-audit-template-")) / "audit.db"
    engine = database.create_engine(f"sqlite:///{path}")
    database.migrate(engine)
    engine.dispose()  # the last connection closing checkpoints the WAL into the file
    atexit.register(shutil.rmtree, path.parent, True)
    return path


def fresh_engine(folder: Path) -> Any:
    """An engine on a new SQLite audit database in ``folder`` (a copy of the migrated template:
    much faster than migrating each time)."""
    path = folder / "audit.db"
    shutil.copyfile(_migrated_template(), path)
    return database.open_database(f"sqlite:///{path}")


POSTGRES_ENV = "PRIVRELEASE_TEST_POSTGRES_URL"
BACKENDS = [
    "sqlite",
    pytest.param(
        "postgresql",
        marks=pytest.mark.skipif(
            POSTGRES_ENV not in os.environ,
            reason=f"set {POSTGRES_ENV} to a PostgreSQL maintenance database URL to test it",
        ),
    ),
]


@contextmanager
def audit_database(backend: str, folder: Path, *, migrated: bool = True) -> Iterator[Any]:
    """A fresh audit database (migrated, or empty): SQLite in ``folder``, or a new database on
    the PostgreSQL server named by ``PRIVRELEASE_TEST_POSTGRES_URL`` (dropped afterwards)."""
    if backend == "sqlite":
        try:
            if migrated:
                yield fresh_engine(folder)
            else:
                yield database.get_engine(f"sqlite:///{folder / 'audit.db'}")
        finally:
            database.dispose_engines()
        return
    admin = sa.create_engine(os.environ[POSTGRES_ENV], isolation_level="AUTOCOMMIT")
    name = f"privrelease_test_{uuid.uuid4().hex[:12]}"
    template = _postgres_template() if migrated else "template1"
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    try:
        url = _postgres_url(name)
        with pytest.MonkeyPatch.context() as patch:  # its witness in the test's folder, not the working directory's
            patch.setenv("PRIVRELEASE_WITNESS", str(folder / f"{name}.witness.json"))
            yield database.open_database(url) if migrated else database.get_engine(url)
    finally:
        database.dispose_engines()
        _drop_postgres_database(name)
        admin.dispose()


def _postgres_url(name: str) -> str:
    url = sa.make_url(os.environ[POSTGRES_ENV]).set(database=name)
    return url.render_as_string(hide_password=False)


def _drop_postgres_database(name: str) -> None:
    admin = sa.create_engine(os.environ[POSTGRES_ENV], isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    admin.dispose()


@functools.cache
def _postgres_template() -> str:
    """A migrated PostgreSQL database that test databases are copied from (faster)."""
    name = f"privrelease_template_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(os.environ[POSTGRES_ENV], isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.exec_driver_sql(f'CREATE DATABASE "{name}"')
    admin.dispose()
    engine = database.create_engine(_postgres_url(name))
    database.migrate(engine)
    engine.dispose()
    atexit.register(_drop_postgres_database, name)
    return name


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    with audit_database(request.param, tmp_path) as engine:
        yield engine


def populate(engine: Any, out: Path, *, fail: bool = False) -> dict[str, Any]:
    """A complete release in the audit DB: policy approved, dataset, run, two outputs, a
    guarantee, a report, run finished. Returns ids and paths."""
    out.mkdir(parents=True, exist_ok=True)
    facts = POLICY
    with database.session(engine) as s:
        approvals.approve_policy(s, facts, "Ada Lovelace", note="reviewed")
        records.register_dataset(
            s,
            FINGERPRINT,
            identity="census",
            size_bytes=1234,
            row_count=50,
            lifetime_epsilon=2.0,
            lifetime_delta=1e-6,
            notion="probabilistic",
            label="census.csv",
        )
        run = records.start_run(
            s,
            policy_sha256=POLICY_SHA,
            code_version="test",
            dataset_fingerprint=FINGERPRINT,
        )
    with database.session(engine) as s:
        records.record_data_read(s, run.id)
        paths = []
        for name in ("cells.csv", "rows.csv"):
            path = out / name
            path.write_text(f"{name}\n1,2\n", encoding="utf-8")
            records.record_output(s, run.id, path, rows=1)
            paths.append(path)
        records.record_guarantee(
            s,
            run.id,
            notion="probabilistic",
            event_json='{"event":{}}',
            epsilon=1.0,
            delta=1e-9,
        )
        report_path = out / "report.html"
        html = "<html><body>report \u00e9</body></html>"
        report_path.write_text(html, encoding="utf-8")
        records.store_report(s, run.id, html, path=report_path)
        records.finish_run(
            s,
            run.id,
            "failed" if fail else "succeeded",
            timings={"total": 0.5},
            error="boom" if fail else None,
        )
    return {"run": run.id, "outputs": paths, "report": report_path}


def check(engine: Any, **kwargs: Any) -> verification.VerifyResult:
    with database.session(engine, readonly=True) as s:
        return verification.verify(s, **kwargs)


def execute(engine: Any, sql: str, **params: Any) -> None:
    with engine.begin() as connection:
        connection.execute(sa.text(sql), params)


def seq_of(engine: Any, kind: str, *, table: str | None = None, nth: int = 0) -> int:
    with database.session(engine, readonly=True) as s:
        found = [
            r
            for r in s.exec(select(AuditEvent).order_by(AuditEvent.seq)).all()
            if r.kind == kind and (table is None or json.loads(r.payload_json)["table"] == table)
        ]
    return found[nth].seq


def test_intact_release_verifies(engine: Any, tmp_path: Path) -> None:
    populate_ids = populate(engine, tmp_path / "out")
    result = check(engine)
    assert result.ok, result.problems
    assert result.first is None
    assert result.records == 11
    assert result.files_checked == 3  # two outputs and the report
    with database.session(engine, readonly=True) as s:
        assert chain.head(s) == result.head
        kinds = [r.kind for r in s.exec(select(AuditEvent).order_by(AuditEvent.seq)).all()]
    assert kinds[:5] == [
        "policy_registered",
        "policy_approved",
        "dataset_identity_registered",
        "dataset_registered",
        "run_started",
    ]
    assert kinds[-1] == "run_finished"
    with database.session(engine, readonly=True) as s:
        trail = [r.kind for r in chain.records(s, run_id=populate_ids["run"])]
    assert trail[0] == "run_started" and trail[1] == "data_read"
    assert trail.count("output_recorded") == 2 and trail[-1] == "run_finished"
    with database.session(engine, readonly=True) as s:
        (run,) = records.list_runs(s)
        assert records.find_run(s, run.id[:6]) == run
        assert [Path(o.path).name for o in records.outputs_of(s, run)] == [
            "cells.csv",
            "rows.csv",
        ]
        assert [g.epsilon for g in records.guarantees_of(s, run.id)] == [1.0]
        (report,) = records.reports_of(s, run)
        assert report.sha256 == sha256_file(populate_ids["report"])
        assert run.status == "succeeded" and run.data_read_at is not None
        assert json.loads(run.timings_json) == {"total": 0.5}


def test_record_hash_is_sha256_of_previous_hash_and_canonical_json(engine: Any) -> None:
    with database.session(engine) as s:
        version = approvals.register_policy(s, POLICY)
    with database.session(engine, readonly=True) as s:
        (record,) = s.exec(select(AuditEvent)).all()
    payload = json.loads(record.payload_json)
    assert payload["table"] == "policy_version" and payload["key"] == version.id
    assert payload["row_sha256"] == chain.row_sha256(version)
    time = record.time.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds")
    body = json.dumps(
        {"kind": record.kind, "payload": payload, "seq": 1, "time": time + "Z"},
        sort_keys=True,
        separators=(",", ":"),
    )
    assert record.prev_hash == "0" * 64
    assert record.hash == hashlib.sha256(("0" * 64 + body).encode()).hexdigest()


def test_canonical_json_is_stable() -> None:
    when = datetime(2026, 1, 2, 4, 4, 5, 6, tzinfo=timezone(timedelta(hours=1)))
    text = chain.canonical_json({"b": [1.5, float("inf")], "a": when, "c": "\u00e9"})
    assert text == '{"a":"2026-01-02T03:04:05.000006Z","b":[1.5,"inf"],"c":"\u00e9"}'
    with pytest.raises(TypeError):
        chain.canonical_json({"x": object()})


# populate() writes records 1 policy_registered, 2 policy_approved, 3 dataset_identity_registered,
# 4 dataset_registered, 5 run_started, 6 data_read, 7-8 output_recorded, 9 guarantee_recorded,
# 10 report_stored, 11 run_finished.
SWAP = "UPDATE {table} SET {key} = {b} WHERE {key} = {a}"
EDIT_PAYLOAD = "UPDATE audit_event SET payload_json = replace(payload_json, 'census', 'x')"
TAMPERINGS = {
    "edited run row": (["UPDATE run SET code_version = 'evil'"], "row_edited", 11),
    "edited approval row": (
        ["UPDATE approval SET approved_by = 'Mallory'"],
        "row_edited",
        2,
    ),
    "edited record kind": (
        ["UPDATE audit_event SET kind = 'policy_rejected' WHERE seq = 2"],
        "record_edited",
        2,
    ),
    "edited record payload": ([EDIT_PAYLOAD], "record_edited", 1),
    "deleted row": (
        ["DELETE FROM output WHERE path LIKE '%rows.csv'"],
        "row_deleted",
        8,
    ),
    "deleted record": (["DELETE FROM audit_event WHERE seq = 6"], "records_missing", 6),
    "reordered records": (
        [
            SWAP.format(table="audit_event", key="seq", a=7, b=-1),
            SWAP.format(table="audit_event", key="seq", a=8, b=7),
            SWAP.format(table="audit_event", key="seq", a=-1, b=8),
        ],
        "chain_broken",
        7,
    ),
    "reordered rows": (
        [
            SWAP.format(table="output", key="id", a=1, b=-1),
            SWAP.format(table="output", key="id", a=2, b=1),
            SWAP.format(table="output", key="id", a=-1, b=2),
        ],
        "row_edited",
        7,
    ),
}


@pytest.mark.parametrize("how", list(TAMPERINGS))
def test_tampering_names_the_first_broken_record(engine: Any, tmp_path: Path, how: str) -> None:
    statements, kind, seq = TAMPERINGS[how]
    populate(engine, tmp_path / "out")
    for statement in statements:
        execute(engine, statement)
    result = check(engine)
    assert not result.ok
    assert result.first is not None
    assert (result.first.kind, result.first.seq) == (kind, seq), result.problems


def test_a_row_edit_is_named_with_its_table_and_key(engine: Any, tmp_path: Path) -> None:
    ids = populate(engine, tmp_path / "out")
    execute(engine, "UPDATE run SET code_version = 'evil'")
    first = check(engine).first
    assert first is not None
    assert f"run row '{ids['run']}' was edited after record 11 (run_finished)" in first.message


def test_edited_output_file_is_named(engine: Any, tmp_path: Path) -> None:
    ids = populate(engine, tmp_path / "out")
    ids["outputs"][1].write_text("rows.csv\n1,3\n", encoding="utf-8")
    result = check(engine)
    assert result.first is not None
    assert result.first.kind == "file_edited"
    assert result.first.seq == seq_of(engine, "output_recorded", nth=1)
    assert str(ids["outputs"][1]) in result.first.message
    assert check(engine, check_files=False).ok


def test_missing_output_file_and_report_are_named(engine: Any, tmp_path: Path) -> None:
    ids = populate(engine, tmp_path / "out")
    ids["outputs"][0].unlink()
    ids["report"].write_text("<html>changed</html>", encoding="utf-8")
    result = check(engine)
    assert [(p.kind, p.seq) for p in result.problems] == [
        ("file_missing", seq_of(engine, "output_recorded")),
        ("file_edited", seq_of(engine, "report_stored")),
    ]


def test_relative_output_paths_resolve_against_output_root(
    engine: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "published"
    out.mkdir()
    (out / "cells.csv").write_text("a\n", encoding="utf-8")
    monkeypatch.chdir(out)
    with database.session(engine) as s:
        approvals.register_policy(s, POLICY)
        run = records.start_run(s, policy_sha256=POLICY_SHA, code_version="t")
        output = records.record_output(s, run, "cells.csv", rows=1)
        records.finish_run(s, run, "succeeded")
    assert output.path == "cells.csv"
    monkeypatch.chdir(tmp_path)
    assert check(engine, output_root=out).ok
    result = check(engine)
    assert result.first is not None and result.first.kind == "file_missing"


def test_files_of_failed_runs_are_not_required(engine: Any, tmp_path: Path) -> None:
    ids = populate(engine, tmp_path / "out", fail=True)
    for path in ids["outputs"]:
        path.unlink()
    ids["report"].unlink()
    result = check(engine)
    assert result.ok, result.problems
    assert result.files_checked == 0


def test_content_that_does_not_match_its_hash_is_found(engine: Any) -> None:
    with database.session(engine) as s:
        approvals.register_policy(s, approvals.PolicyFacts("p", "1", POLICY_SHA, "{}"))
    first = check(engine).first
    assert first is not None
    assert (first.kind, first.seq) == ("content_mismatch", 1)


def test_unrecorded_row_is_found(engine: Any, tmp_path: Path) -> None:
    populate(engine, tmp_path / "out")
    execute(
        engine,
        "INSERT INTO approval (policy_sha256, approved_by, os_user, approved_at, nonce) "
        "VALUES (:sha, 'Mallory', 'x', '2026-01-01 00:00:00.000000', 'f00d')",
        sha=POLICY_SHA,
    )
    result = check(engine)
    assert result.first is not None
    assert result.first.kind == "row_unrecorded" and result.first.seq is None


def truncate(engine: Any, keep: int) -> None:
    """A careful attacker: delete the newest records and the rows they inserted, and move the
    chain-head row back, leaving a chain consistent in itself."""
    with database.session(engine) as s:
        doomed = s.exec(select(AuditEvent).where(AuditEvent.seq > keep)).all()
        tables = [(json.loads(r.payload_json)["table"], json.loads(r.payload_json)["key"]) for r in doomed]
        last = s.exec(select(AuditEvent).where(AuditEvent.seq == keep)).one()
        last_hash = last.hash
    for table, key in tables:
        execute(engine, f"DELETE FROM {table} WHERE id = :key", key=key)
    execute(engine, "DELETE FROM audit_event WHERE seq > :keep", keep=keep)
    execute(
        engine,
        "UPDATE chain_head SET seq = :seq, hash = :hash",
        seq=keep,
        hash=last_hash,
    )


def test_truncation_is_seen_only_against_an_external_head(engine: Any, tmp_path: Path) -> None:
    ids = populate(engine, tmp_path / "out")
    extra = tmp_path / "out" / "extra.csv"
    extra.write_text("x\n", encoding="utf-8")
    with database.session(engine) as s:
        records.record_output(s, ids["run"], extra, rows=1)
        records.store_report(s, ids["run"], "<html>second</html>")
        head_file = chain.write_head(tmp_path / "out" / "audit-head.json", chain.head(s))
    written = chain.read_head(head_file)
    assert written.seq == 13
    assert check(engine, head=written).ok

    truncate(engine, keep=11)
    assert check(engine).ok  # invisible from inside the database
    result = check(engine, head=written)
    assert result.first is not None
    assert (result.first.kind, result.first.seq) == ("truncated", 12)
    assert "records 12..13 were removed" in result.first.message


def test_careless_truncation_is_seen_without_a_head(engine: Any, tmp_path: Path) -> None:
    populate(engine, tmp_path / "out")
    execute(engine, "DELETE FROM audit_event WHERE seq = 11")
    result = check(engine)
    kinds = {(p.kind, p.seq) for p in result.problems}
    assert ("truncated", 11) in kinds  # the chain-head row still says record 11
    # the run row no longer matches its newest remaining record (data_read, seq 6)
    assert result.first is not None
    assert (result.first.kind, result.first.seq) == ("row_edited", 6)
    assert "is not as record 6 (data_read), its newest remaining record, describes: edited, or the records" in (
        result.first.message
    )


def test_external_head_with_another_hash_is_named(engine: Any, tmp_path: Path) -> None:
    populate(engine, tmp_path / "out")
    result = check(engine, head=chain.Head(seq=3, hash="f" * 64))
    assert result.first is not None
    assert (result.first.kind, result.first.seq) == ("head_mismatch", 3)


def test_head_file_round_trip_and_bad_files(tmp_path: Path) -> None:
    head = chain.Head(seq=7, hash="a" * 64)
    path = chain.write_head(tmp_path / "sub" / "head.json", head)
    assert chain.read_head(path) == head
    assert json.loads(path.read_text()) == {"seq": 7, "hash": "a" * 64}
    (tmp_path / "bad.json").write_text('{"seq": "x"}')
    with pytest.raises(UserError, match="seq"):
        chain.read_head(tmp_path / "bad.json")
    with pytest.raises(FileNotFoundError):
        chain.read_head(tmp_path / "absent.json")


def _append_many(url: str, worker: int, count: int, barrier: Any) -> None:
    engine = database.open_database(url)
    barrier.wait()
    for _ in range(count):
        with database.session(engine) as s:
            records.start_run(s, policy_sha256=POLICY_SHA, code_version=f"worker {worker}")


def test_two_processes_appending_never_fork_the_chain(engine: Any) -> None:
    with database.session(engine) as s:
        approvals.register_policy(s, POLICY)
    url = engine.url.render_as_string(hide_password=False)
    context = multiprocessing.get_context(
        "spawn"
    )  # a fresh interpreter: forking a test process that runs threads can deadlock or fail the child
    barrier = context.Barrier(2)
    workers = [context.Process(target=_append_many, args=(url, worker, 15, barrier)) for worker in (1, 2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    result = check(engine)
    assert result.ok, result.problems
    assert result.records == 31
    with database.session(engine, readonly=True) as s:
        assert len(s.exec(select(Run)).all()) == 30


def test_read_only_commands_on_a_read_only_sqlite_database(tmp_path: Path) -> None:
    """The read-only commands run on a connection that refuses every write (a ``mode=ro`` URI
    filename of a 0444 file; chmod alone does not stop root) and print what they print on a
    writing one: the URL is accepted and the schema check reads without SQLite's write lock."""
    import subprocess
    import sys

    with audit_database("sqlite", tmp_path) as engine:
        populate(engine, tmp_path / "out")
    file = tmp_path / "audit.db"
    file.chmod(0o444)
    read_only = f"sqlite:///file:{file}?mode=ro&uri=true"

    def run(command: list[str], url: str) -> tuple[int, str, str]:
        env = {**os.environ, "PRIVRELEASE_DB_URL": url, "PRIVRELEASE_WORK_DIR": str(tmp_path / "work")}
        done = subprocess.run(
            [sys.executable, "-m", "privrelease", *command], capture_output=True, text=True, env=env, cwd=tmp_path
        )
        return done.returncode, done.stdout, done.stderr

    for command in (["ledger", "list"], ["audit", "verify"], ["report", "list"], ["report", "index", "--out", "i"]):
        found = run(command, read_only)
        assert found == run(command, f"sqlite:///{file}") and "Traceback" not in found[2], (command, found)
    try:
        with (
            pytest.raises(sa.exc.OperationalError, match="readonly database"),
            database.session(database.open_database(read_only)) as s,
        ):
            chain.append(s, "probe")
    finally:
        database.dispose_engines()


def test_a_read_only_connection_to_an_older_schema_is_told_who_can_upgrade_it(tmp_path: Path) -> None:
    """A database behind this code's schema, opened by a connection that may not write it: one
    clear error naming both revisions and `audit migrate` with a writing account (no SQLite
    OperationalError, no traceback), and the database is left at its revision."""
    import subprocess
    import sys

    from privrelease.audit.migrations.versions import HEAD_REVISION

    file = tmp_path / "audit.db"
    with audit_database("sqlite", tmp_path, migrated=False) as engine:
        database.migrate(engine, "0006_governance")
    file.chmod(0o444)
    env = {
        **os.environ,
        "PRIVRELEASE_DB_URL": f"sqlite:///file:{file}?mode=ro&uri=true",
        "PRIVRELEASE_WORK_DIR": str(tmp_path / "work"),
    }
    done = subprocess.run(
        [sys.executable, "-m", "privrelease", "ledger", "list"], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert f"has schema 0006_governance and this privrelease needs {HEAD_REVISION}" in done.stderr
    assert "run `privrelease audit migrate` with an account that may write it" in done.stderr
    engine = sa.create_engine(f"sqlite:///{file}")
    try:
        assert database.current_revision(engine) == "0006_governance"
    finally:
        engine.dispose()
