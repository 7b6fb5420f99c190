"""Alembic environment: the target metadata is the SQLModel tables of
:mod:`privrelease.audit.models`. The connection is handed in by
:func:`privrelease.audit.database.migrate` (``config.attributes["connection"]``); when Alembic is
run from its command line instead, the URL comes from the settings (``PRIVRELEASE_DB_URL``)."""

from __future__ import annotations

import logging.config

from alembic import context
from sqlalchemy.engine import Connection
from sqlmodel import SQLModel

import privrelease.audit.models  # noqa: F401  (registers the tables)

config = context.config
if config.config_file_name is not None and config.attributes.get("connection") is None:
    logging.config.fileConfig(config.config_file_name, disable_existing_loggers=False)

target_metadata = SQLModel.metadata


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        return
    from privrelease.audit.database import get_engine

    with get_engine().begin() as connection:
        _configure(connection)


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run_migrations_online()
