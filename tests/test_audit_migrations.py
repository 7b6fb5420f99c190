"""Settings, engines and Alembic migrations of the audit database."""

from __future__ import annotations

import multiprocessing
import tomllib
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlmodel import SQLModel
from test_audit_chain import BACKENDS, audit_database, check

from privrelease.audit import database
from privrelease.audit.migrations.versions import HEAD_REVISION
from privrelease.audit.models import AUDITED_TABLES, ChainHead
from privrelease.errors import UserError
from privrelease.settings import Settings, get_settings

REPO = Path(__file__).resolve().parents[1]


def test_migrations_create_the_schema_of_the_models_on_a_fresh_sqlite_file(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    engine = database.create_engine(url)
    assert database.current_revision(engine) is None
    database.migrate(engine)
    assert database.current_revision(engine) == HEAD_REVISION == database.head_revision()
    tables = set(sa.inspect(engine).get_table_names())
    assert set(AUDITED_TABLES) | {"audit_event", "chain_head", "alembic_version"} == tables
    with engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, SQLModel.metadata) == []  # models == migrations
    with database.session(engine, readonly=True) as s:
        head = s.get(ChainHead, 1)
        assert head is not None and (head.seq, head.hash) == (0, "0" * 64)
    database.migrate(engine)  # idempotent
    engine.dispose()


def test_open_database_migrates_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    try:
        engine = database.open_database(url)
        assert database.current_revision(engine) == HEAD_REVISION
        assert database.open_database(url) is engine
    finally:
        database.dispose_engines()


def test_sqlite_runs_in_wal_mode_with_foreign_keys(tmp_path: Path) -> None:
    engine = database.create_engine(f"sqlite:///{tmp_path / 'audit.db'}")
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
        assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() >= 10_000
    engine.dispose()


def test_only_sqlite_and_postgresql_urls() -> None:
    with pytest.raises(UserError, match="PRIVRELEASE_DB_URL"):
        database.create_engine("mysql://localhost/audit")
    engine = database.create_engine("postgresql+psycopg://u:p@127.0.0.1:1/audit")  # lazy: no I/O
    assert engine.dialect.name == "postgresql"


def test_migration_files_ship_in_the_package() -> None:
    """Every folder under audit/ with Python files is a listed package (setuptools then ships
    env.py and the versions); Alembic is configured without any ini file."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = set(config["tool"]["setuptools"]["packages"])
    for init in (REPO / "audit").rglob("__init__.py"):
        relative = init.parent.relative_to(REPO / "audit")
        name = ".".join(("privrelease", "audit", *relative.parts))
        assert name in packages, f"{name} missing from pyproject packages"
    assert (database.MIGRATIONS_DIR / "env.py").is_file()
    assert database.alembic_config().config_file_name is None


def test_settings_defaults_and_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("DB_URL", "WORK_DIR", "PRODUCTION", "DEFAULT_LIFETIME_BUDGET"):
        monkeypatch.delenv(f"PRIVRELEASE_{name}", raising=False)
    monkeypatch.chdir(tmp_path)
    settings = get_settings()
    assert settings.work_dir == tmp_path / "privrelease-work"
    assert settings.db_url == f"sqlite:///{tmp_path / 'privrelease-work' / 'audit.db'}"
    assert settings.production is False and settings.default_lifetime_budget is None
    monkeypatch.setenv("PRIVRELEASE_DB_URL", "postgresql+psycopg://u@127.0.0.1/a")
    monkeypatch.setenv("PRIVRELEASE_PRODUCTION", "true")
    monkeypatch.setenv("PRIVRELEASE_DEFAULT_LIFETIME_BUDGET", "[2.0, 1e-6]")
    monkeypatch.setenv("PRIVRELEASE_RESERVATION_TTL_SECONDS", "90")
    settings = get_settings()
    assert settings.db_url == "postgresql+psycopg://u@127.0.0.1/a"
    assert settings.production is True
    assert settings.default_lifetime_budget == (2.0, 1e-6)
    assert settings.reservation_ttl_seconds == 90
    with pytest.raises(ValueError, match="delta"):
        Settings(default_lifetime_budget=(1.0, 1.5))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_models_are_the_schema_the_migrations_create(backend: str, tmp_path: Path) -> None:
    """Alembic finds nothing to change between the models and a migrated database, on both
    backends (the SQLite file above checks the same on a fresh file). Alembic does not compare
    an index's predicate: name@version is unique among registered versions only (migration
    0007's partial index, which the model names without its dialect options)."""
    with audit_database(backend, tmp_path) as engine, engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        assert compare_metadata(context, SQLModel.metadata) == []
        (index,) = [
            i for i in sa.inspect(connection).get_indexes("policy_version") if i["name"] == "uq_policy_version_name"
        ]
        assert index["unique"] and index["column_names"] == ["name", "version"]
        predicate = index.get("dialect_options", {}).get(f"{engine.dialect.name}_where")
        assert " ".join(str(predicate).replace("(", " ").replace(")", " ").split()).lower() == "not draft"


def _open(url: str, barrier: Any) -> None:
    barrier.wait(30)
    database.open_database(url)


@pytest.mark.parametrize("backend", BACKENDS)
def test_processes_migrating_a_fresh_database_at_once_do_not_collide(backend: str, tmp_path: Path) -> None:
    with audit_database(backend, tmp_path, migrated=False) as engine:
        url = engine.url.render_as_string(hide_password=False)
        context = multiprocessing.get_context(
            "spawn"
        )  # a fresh interpreter: forking a test process that runs threads can deadlock or fail the child
        barrier = context.Barrier(3)
        workers = [context.Process(target=_open, args=(url, barrier)) for _ in range(3)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert [worker.exitcode for worker in workers] == [0, 0, 0]
        assert database.current_revision(engine) == HEAD_REVISION


@pytest.mark.parametrize("backend", BACKENDS)
def test_upgrade_to_0007_keeps_registered_versions_registered(backend: str, tmp_path: Path) -> None:
    """Revision 0007 (drafts): a 0006 database with a policy registered by a run that failed
    (the earlier rule) and a run of it, upgraded: the old records stay as they were, one
    ``schema_migrated`` and one ``policy_version_migrated`` record follow, the chain verifies,
    the version stays registered (other contents of it are refused, even as drafts), several
    drafts of a free name@version can now be recorded, and the database refuses a second
    registered content."""
    import hashlib

    from sqlmodel import select
    from test_migration_identity import Writer0001

    from privrelease.audit import approvals, chain
    from privrelease.audit.models import AuditEvent, PolicyVersion

    def facts(content: str, version: str = "3") -> approvals.PolicyFacts:
        text = f'{{"content":"{content}","version":"{version}"}}'
        return approvals.PolicyFacts("census", version, hashlib.sha256(text.encode()).hexdigest(), text)

    old, edited = facts("typo"), facts("fixed")
    with audit_database(backend, tmp_path, migrated=False) as engine:
        database.migrate(engine, "0006_governance")
        now = chain.utcnow().replace(tzinfo=None)
        with engine.begin() as connection:
            writer = Writer0001(connection)
            writer.policy(old, now)
            writer.write("run", "run_started", "id",
                         {"id": "f" * 32, "policy_sha256": old.sha256, "code_version": "0006", "kind": "release",
                          "status": "failed", "started_at": now, "timings_json": "{}", "error": "refused"},
                         run="f" * 32)  # fmt: skip
            before = connection.execute(sa.text("SELECT seq, hash FROM audit_event ORDER BY seq")).all()
        database.migrate(engine)
        assert database.current_revision(engine) == HEAD_REVISION == "0007_policy_drafts"
        result = check(engine)
        assert result.ok, result.problems
        with database.session(engine, readonly=True) as s:
            events = list(s.exec(select(AuditEvent).order_by(AuditEvent.seq)).all())
            assert [(e.seq, e.hash) for e in events[: len(before)]] == [tuple(r) for r in before]
            assert [e.kind for e in events[len(before) :]] == ["schema_migrated", "policy_version_migrated"]
            (row,) = s.exec(select(PolicyVersion)).all()
            assert (row.sha256, row.draft) == (old.sha256, False)
            assert approvals.version_clash(s, edited) is not None
        with database.session(engine) as s:
            for attempt in (approvals.register_policy, approvals.record_draft):
                with pytest.raises(UserError, match=r'census@3 is registered with other content .*version: "4"'):
                    attempt(s, edited)
            assert [approvals.record_draft(s, facts(text, "4")).draft for text in ("a", "b")] == [True, True]
        with database.session(engine) as s:
            s.add(PolicyVersion(name="census", version="3", sha256=edited.sha256, canonical_json=edited.canonical_json))
            with pytest.raises(sa.exc.IntegrityError):
                s.flush()
            s.rollback()
        assert check(engine).ok


def test_a_new_sqlite_database_is_private_and_a_postgresql_url_makes_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`audit init` makes a SQLite file 0600 whatever the umask (its -wal and -shm files take its
    mode); a PostgreSQL URL's database name is no file to make (issue 25, item 21)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "work"))
    database._check_folder(database.create_engine("postgresql+psycopg://u:p@127.0.0.1:1/audit"), True)  # lazy
    assert list(tmp_path.iterdir()) == []
    engine = database.open_database(f"sqlite:///{tmp_path / 'work' / 'audit.db'}", create=True)
    assert (tmp_path / "work" / "audit.db").stat().st_mode & 0o777 == 0o600
    engine.dispose()
