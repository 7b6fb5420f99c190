"""Appending the hash-chain records of a schema migration (see :mod:`privrelease.audit.chain`).

A migration that creates or changes audited rows leaves every existing record as it is and
appends, under the chain lock, one ``schema_migrated`` record and then a ``<table>_migrated``
record per row with the row's new content hash: the history before it still verifies and the
newest record of each row describes it as it now is. Written with plain SQL on the migration's
connection (the models may be newer than the revision).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from privrelease.audit.chain import canonical_json, columns_sha256, record_hash
from privrelease.settings import signing_key

Row = tuple[str, dict[str, Any], dict[str, Any]]
"""``(kind, columns, payload)``: the row's columns (empty: a record describing no row) and the
record's payload (``table`` and ``key`` of the row, and any facts)."""


def append_records(bind: sa.Connection, rows: list[Row], *, signed: bool = False) -> None:
    """Append one record per entry of ``rows`` (``row_sha256`` added to the payload of each
    row's record) and move the chain head. ``signed``: the ``audit_event.signature`` column
    exists (revision 0003 on), so sign the records when ``PRIVRELEASE_SIGNING_KEY`` is set."""
    from privrelease.audit import signing

    lock = " FOR UPDATE" if bind.dialect.name == "postgresql" else ""
    head = bind.execute(sa.text(f"SELECT seq, hash FROM chain_head WHERE id = 1{lock}")).one()
    seq, previous = head.seq, head.hash
    time = datetime.now(UTC).replace(tzinfo=None)
    key = signing_key() if signed else None
    columns = ("kind", "payload_json", "prev_hash", "hash", *(("signature",) if signed else ()))
    events = sa.table(
        "audit_event",
        sa.column("seq", sa.Integer),
        sa.column("time", sa.DateTime),
        *(sa.column(name, sa.Text) for name in columns),
    )
    for kind, values, payload in rows:
        if values:
            payload["row_sha256"] = columns_sha256(payload["table"], values)
        seq += 1
        digest = record_hash(previous, seq, time, kind, payload)
        record = {"seq": seq, "time": time, "kind": kind, "payload_json": canonical_json(payload)}
        record.update(prev_hash=previous, hash=digest)
        if key is not None:
            record["signature"] = signing.sign(key, signing.record_message(seq, digest))
        bind.execute(events.insert().values(**record))
        previous = digest
    bind.execute(sa.text("UPDATE chain_head SET seq = :seq, hash = :hash WHERE id = 1"), {"seq": seq, "hash": previous})


def migrated(table: str, columns: dict[str, Any], key: Any, **facts: Any) -> Row:
    """The ``<table>_migrated`` record of one row: its columns as the revision leaves them, and
    the payload naming it (``table``, ``key``, and ``facts``)."""
    return (f"{table}_migrated", columns, {"table": table, "key": key, **facts})


def append_migration(bind: sa.Connection, from_revision: str | None, to_revision: str, rows: list[Row]) -> None:
    """The records of a revision that changed audited rows: one ``schema_migrated`` record, then
    ``rows`` (:func:`migrated`), signed when ``PRIVRELEASE_SIGNING_KEY`` is set; nothing when no
    row changed."""
    if rows:
        schema: Row = ("schema_migrated", {}, {"from_revision": from_revision, "to_revision": to_revision})
        append_records(bind, [schema, *rows], signed=True)
