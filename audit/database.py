"""Engine, sessions and schema migrations of the audit database.

The URL comes from the settings (``PRIVRELEASE_DB_URL``; default a SQLite file under the working
folder). SQLite runs in WAL mode with a busy timeout and foreign keys on; a writing session
starts with ``BEGIN IMMEDIATE`` so that writers are serialized from their first statement (the
budget check and the reservation happen under one lock). PostgreSQL (``postgresql+psycopg://``)
serializes writers by ``SELECT ... FOR UPDATE`` on the chain-head row
(:func:`privrelease.audit.chain.lock`).

The schema is created and upgraded by Alembic, configured here programmatically (no ini file is
looked up, so it works from an installed package): :func:`migrate` is ``alembic upgrade head``.

>>> engine = get_engine("sqlite://")
>>> migrate(engine)
>>> with session(engine) as s:
...     s.get(ChainHead, 1).seq
0
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import StaticPool
from sqlmodel import Session

from privrelease.audit.models import ChainHead  # noqa: F401  (doctest)
from privrelease.errors import UserError
from privrelease.settings import get_settings, sqlite_file

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
SQLITE_BUSY_TIMEOUT_S = 60.0
_READONLY = "privrelease_readonly"
_MIGRATION_LOCK = 0x70726976  # PostgreSQL advisory lock key ("priv")

_engines: dict[str, sa.Engine] = {}
_migrated: set[str] = set()
_lock = threading.Lock()


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    # Let SQLAlchemy (the "begin" hook below) emit BEGIN instead of the sqlite3 module, which
    # would begin lazily and DEFERRED (a later write then fails instead of waiting).
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
    _enable_wal(cursor)
    cursor.execute("PRAGMA synchronous=FULL")  # a committed charge survives a power cut
    cursor.close()


def _enable_wal(cursor: Any) -> None:
    """Switch the file to WAL (persistent, so usually already on). The switch needs the file to
    itself, and SQLite can answer BUSY at once instead of waiting when another process is inside
    a transaction, so it is retried until the busy timeout."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            if cursor.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def _sqlite_begin(connection: sa.Connection) -> None:
    if connection.get_execution_options().get(_READONLY):
        connection.exec_driver_sql("BEGIN")
    else:
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def create_engine(url: str) -> sa.Engine:
    """A new engine for ``url`` (SQLite: WAL, busy timeout, foreign keys, ``BEGIN IMMEDIATE`` for
    writing sessions; no file or folder is made before a connection). Prefer :func:`get_engine`,
    which caches."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        kwargs: dict[str, Any] = {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}}
        if sqlite_file(parsed) is None:
            kwargs["connect_args"]["check_same_thread"] = False
            kwargs["poolclass"] = StaticPool
        engine = sa.create_engine(url, **kwargs)
        event.listen(engine, "connect", _sqlite_pragmas)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    if parsed.get_backend_name() == "postgresql":
        return sa.create_engine(url, pool_pre_ping=True)
    raise UserError(f"PRIVRELEASE_DB_URL must be a sqlite:/// or postgresql+psycopg:// URL; got {url!r}")


def get_engine(url: str | None = None) -> sa.Engine:
    """The (cached, per process) engine for ``url``, by default the settings' ``db_url``."""
    url = url or get_settings().db_url
    with _lock:
        engine = _engines.get(url)
        if engine is None:
            engine = _engines[url] = create_engine(url)
        return engine


def dispose_engines(*, close: bool = True) -> None:
    """Forget every cached engine; ``close`` its pooled connections too (not in a forked child,
    whose inherited connections belong to the parent)."""
    with _lock:
        for engine in _engines.values():
            engine.dispose(close=close)
        _engines.clear()
        _migrated.clear()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    dispose_engines(close=False)


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextmanager
def session(engine: sa.Engine | None = None, *, readonly: bool = False) -> Iterator[Session]:
    """A session in one transaction: committed on normal exit, rolled back on an exception.

    ``engine`` defaults to the settings' database (:func:`open_database`: schema upgraded on
    first use). A writing session (the default) takes SQLite's write lock at its first
    statement (``BEGIN IMMEDIATE``; other writers wait up to the busy timeout), so keep it
    short: never hold one open while reading or processing data. ``readonly=True`` reads a
    consistent snapshot without blocking writers. Objects stay usable after the block.
    """
    engine = engine or open_database()
    if readonly:
        options: dict[str, Any] = {_READONLY: True}
        if engine.dialect.name == "postgresql":
            options["isolation_level"] = "REPEATABLE READ"  # one snapshot for all reads
        engine = engine.execution_options(**options)
    with Session(engine, expire_on_commit=False) as s:
        try:
            yield s
        except BaseException:
            s.rollback()
            raise
        if not readonly:
            from privrelease.audit import witness

            update = witness.prepare(s)
            s.commit()
            if update is not None:
                update()
        # closing ends a read-only transaction without expiring the objects read


def alembic_config(connection: sa.Connection | None = None) -> Any:
    """An Alembic ``Config`` pointing at the packaged migrations (no ini file needed)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    """The newest migration's revision id."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, f"no migrations found under {MIGRATIONS_DIR}"
    return head


def current_revision(engine: sa.Engine) -> str | None:
    """The revision the database is at (None: not created yet), read without SQLite's write
    lock, so an account that may only read the database can check it."""
    with engine.execution_options(**{_READONLY: True}).connect() as connection:
        if not sa.inspect(connection).has_table("alembic_version"):
            return None
        return connection.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()


def migrate(engine: sa.Engine | None = None, revision: str = "head") -> None:
    """``alembic upgrade <revision>`` on ``engine`` (default: the settings' database), in one
    transaction that concurrent migrators wait for (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL:
    an advisory lock), so two processes starting on a fresh database do not collide.

    SQLite: foreign keys are off while the tables are rebuilt (a rebuilt parent table is
    dropped and renamed back), and ``PRAGMA foreign_key_check`` must find nothing before the
    transaction commits."""
    from alembic import command

    engine = engine or get_engine()
    with engine.connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:
            _sqlite_foreign_keys(connection, False)  # only takes effect outside a transaction
        try:
            with connection.begin():
                if connection.dialect.name == "postgresql":
                    connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_MIGRATION_LOCK})")
                command.upgrade(alembic_config(connection), revision)
                if sqlite:
                    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                    assert not broken, f"migration left rows with dangling foreign keys: {broken[:5]}"
        finally:
            if sqlite:
                _sqlite_foreign_keys(connection, True)


def _sqlite_foreign_keys(connection: sa.Connection, on: bool) -> None:
    driver = connection.connection.driver_connection
    assert driver is not None
    driver.execute(f"PRAGMA foreign_keys={'ON' if on else 'OFF'}")


def open_database(url: str | None = None, *, create: bool = False) -> sa.Engine:
    """The engine for ``url`` with its schema at the newest migration (upgraded if needed,
    checked once per process). A database that does not exist yet (no SQLite file, or no
    schema) is created only when ``create`` (``privrelease audit init``, ``demo``) or the
    ``PRIVRELEASE_AUTO_INIT`` setting says so; otherwise a UserError names the URL: a typo in
    the URL or another working folder must not start a fresh, empty history and ledger.
    Creating makes no folder but the working folder (:func:`_check_folder`)."""
    engine = get_engine(url)
    key = engine.url.render_as_string(hide_password=False)
    if key in _migrated:
        return engine
    from privrelease.audit.migrations.versions import HEAD_REVISION

    creating = create or get_settings().auto_init
    _check_folder(engine, creating)
    if not (creating or exists(engine)):
        shown = engine.url.render_as_string(hide_password=True)
        raise UserError(
            f"there is no audit database at {shown}: `privrelease audit init` creates it (`privrelease demo` "
            "creates one too); if it exists elsewhere, set PRIVRELEASE_WORK_DIR or PRIVRELEASE_DB_URL to it"
        )
    found = current_revision(engine)
    if found != HEAD_REVISION:
        _upgrade(engine, found, HEAD_REVISION)
    _migrated.add(key)
    return engine


def _upgrade(engine: sa.Engine, found: str | None, head: str) -> None:
    """:func:`migrate` a database behind this code's schema; a UserError naming both revisions
    when this connection may not write it (a read-only account or ``mode=ro`` file): only an
    account that may write it can upgrade it, and nothing was changed."""
    try:
        migrate(engine)
    except (sa.exc.OperationalError, sa.exc.ProgrammingError) as error:
        if not _refused_write(error):
            raise
        shown = engine.url.render_as_string(hide_password=True)
        raise UserError(
            f"the audit database at {shown} has schema {found or 'none'} and this privrelease needs {head}, but "
            "this connection may not write it (a read-only account or file): run `privrelease audit migrate` with "
            "an account that may write it, then run this command again; nothing was changed"
        ) from None


def _refused_write(error: sa.exc.DBAPIError) -> bool:
    """Whether the database refused ``error``'s statement for want of write access (SQLite's
    read-only database or file, PostgreSQL's permission denied or read-only transaction)."""
    text = str(error.orig).lower()
    return any(
        words in text
        for words in ("readonly database", "read-only", "permission denied", "attempt to write", "read only")
    )


def _check_folder(engine: sa.Engine, create: bool) -> None:
    """A SQLite file's folder must exist: only the working folder is made (when ``create``); any
    other (a typo in ``PRIVRELEASE_DB_URL``) is a UserError naming it, and nothing is made. A
    SQLite file made here is ``0600`` (SQLite gives its ``-wal`` and ``-shm`` files the same mode):
    the history and the ledger are not for other local accounts to read."""
    file = sqlite_file(engine.url) if engine.url.get_backend_name() == "sqlite" else None
    if file is None:
        return
    if not file.parent.is_dir():
        _make_work_dir(engine, file, create)
    if create and file.parent.is_dir() and not file.exists():
        os.close(os.open(file, os.O_WRONLY | os.O_CREAT, 0o600))  # an empty file is an empty SQLite database


def _make_work_dir(engine: sa.Engine, file: Path, create: bool) -> None:
    folder, work_dir = file.parent.resolve(), get_settings().work_dir
    if folder != work_dir:
        shown = engine.url.render_as_string(hide_password=True)
        raise UserError(
            f"PRIVRELEASE_DB_URL={shown!r} is not valid: its folder {folder} does not exist (nothing was "
            "created); create that folder, or correct the URL",
            field="PRIVRELEASE_DB_URL",
            allowed="a SQLite file in an existing folder, or the working folder (PRIVRELEASE_WORK_DIR)",
        )
    if create:
        work_dir.mkdir(parents=True, exist_ok=True)


def exists(engine: sa.Engine) -> bool:
    """True when the database holds a privrelease schema (SQLite: checked without creating the file)."""
    if engine.url.get_backend_name() == "sqlite":
        file = sqlite_file(engine.url)
        if file is None:
            return True
        if not file.is_file():
            return False
    return current_revision(engine) is not None
