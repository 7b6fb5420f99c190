"""The content registered under a policy's name@version, read cheaply.

``plan`` asks on every call, and the answer is nearly always "nothing" or "this very policy". For
the default SQLite file that answer is read with the standard library's ``sqlite3``, read-only,
without importing SQLAlchemy and the audit models (about 0.3 s of a 0.6 s ``plan``). Anything else
(another database, a URL with options, a file this query cannot read, such as an older schema)
returns None, and the caller asks :func:`privrelease.audit.approvals.version_clash`, which also
builds the full message when the contents differ.

>>> peek("sqlite:////nonexistent/audit.db", "adult", "1")
Peek(database=False, sha256=None)
>>> peek("postgresql+psycopg://u@db/audit", "adult", "1") is None
True
>>> dataset_registered("sqlite:////nonexistent/audit.db", "adult-census")
False
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

_PREFIX = "sqlite:///"
_QUERY = "SELECT sha256 FROM policy_version WHERE name = ? AND version = ? AND NOT draft"


@dataclass(frozen=True)
class Peek:
    """``database``: an audit database file exists; ``sha256``: the content registered under
    name@version (drafts aside), None when nothing is."""

    database: bool
    sha256: str | None


def peek(db_url: str, name: str, version: str) -> Peek | None:
    """What is registered under ``name@version`` in the SQLite file of ``db_url`` (a plain
    ``sqlite:///PATH`` URL, as SQLAlchemy reads it), or None when it cannot be read this way."""
    found = _rows(db_url, _QUERY, (name, version))
    if found is None:
        return None
    database, rows = found
    return Peek(database=database, sha256=rows[0][0] if rows else None)


def dataset_registered(db_url: str, dataset_id: str) -> bool | None:
    """Whether dataset ``dataset_id`` (a policy's ``dataset.id``) is registered in the SQLite file
    of ``db_url`` (False when there is no such file), or None when it cannot be read this way."""
    found = _rows(db_url, "SELECT 1 FROM dataset_identity WHERE id = ?", (dataset_id,))
    return None if found is None else bool(found[1])


def _rows(db_url: str, query: str, parameters: tuple[str, ...]) -> tuple[bool, list] | None:
    """Whether the SQLite file of ``db_url`` exists and the rows ``query`` reads from it (none
    without a file), or None when it cannot be read this way."""
    if not db_url.startswith(_PREFIX) or "?" in db_url or len(db_url) == len(_PREFIX):
        return None
    path = Path(db_url[len(_PREFIX) :]).expanduser()
    if not path.is_file():
        return False, []
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as connection:
            return True, connection.execute(query, parameters).fetchall()
    except sqlite3.Error:
        return None
