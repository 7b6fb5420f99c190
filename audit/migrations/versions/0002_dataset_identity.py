"""Dataset identities: the lifetime budget belongs to the population (``dataset.id`` of the
policy), and each file read is a vintage (the ``dataset`` row) of one identity.

Schema: new table ``dataset_identity`` (id, budget, notion, migrated, note); ``dataset`` loses
its budget columns and gains ``identity_id``; ``ledger_entry.dataset_fingerprint`` becomes
``dataset_id`` (the identity). ``run.dataset_fingerprint`` stays: a run names the bytes it read.

Data: each fingerprint becomes an identity of its own, ``fingerprint-<first 12 hex>``, marked
migrated, with a note saying it covers only those bytes; its budget, notion and charges move
with it, so every ledger total is unchanged.

The hash chain: no existing record is touched, so the history verifies as before. Every row
this migration creates or changes gets a new record (``schema_migrated`` first, then
``<table>_migrated`` per row, with the row's new content hash), appended under the chain lock:
the newest record of each row describes it as it now is, and later records chain on.

Revision ID: 0002_dataset_identity
Revises: 0001_initial
Create Date: 2026-11-25 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from privrelease.audit.migrations.history import Row, append_records

revision: str = "0002_dataset_identity"
down_revision: str | None = "0001_initial"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NOTE = (
    "migrated from a fingerprint-keyed ledger: this identity covers only the bytes with sha256 "
    "{fingerprint}; releases from other files about the same people were charged to other "
    "identities. Name it in a policy (dataset.id: {identity}) to charge further releases here"
)

# The audited tables as this revision leaves them (frozen: later revisions must not change these).
IDENTITY = sa.table(
    "dataset_identity",
    sa.column("id", sa.String),
    sa.column("lifetime_epsilon", sa.Float),
    sa.column("lifetime_delta", sa.Float),
    sa.column("notion", sa.String),
    sa.column("migrated", sa.Boolean),
    sa.column("note", sa.Text),
    sa.column("registered_at", sa.DateTime),
)
VINTAGE = sa.table(
    "dataset",
    sa.column("fingerprint", sa.String),
    sa.column("identity_id", sa.String),
    sa.column("size_bytes", sa.Integer),
    sa.column("row_count", sa.Integer),
    sa.column("label", sa.String),
    sa.column("registered_at", sa.DateTime),
)
ENTRY = sa.table(
    "ledger_entry",
    sa.column("dataset_id", sa.String),
    sa.column("run_id", sa.String),
    sa.column("notion", sa.String),
    sa.column("event_json", sa.Text),
    sa.column("epsilon", sa.Float),
    sa.column("delta", sa.Float),
    sa.column("id", sa.Integer),
    sa.column("state", sa.String),
    sa.column("created_at", sa.DateTime),
    sa.column("expires_at", sa.DateTime),
    sa.column("updated_at", sa.DateTime),
    sa.column("reason", sa.Text),
)


def _identity_ids(fingerprints: list[str]) -> dict[str, str]:
    """``fingerprint-<first 12 hex>``, longer where two fingerprints share 12 hex digits."""
    ids: dict[str, str] = {}
    for fingerprint in sorted(fingerprints):
        length = 12
        while f"fingerprint-{fingerprint[:length]}" in ids.values():
            length += 4
        ids[fingerprint] = f"fingerprint-{fingerprint[:length]}"
    return ids


def upgrade() -> None:
    bind = op.get_bind()
    old_dataset = sa.table(
        "dataset",
        sa.column("fingerprint", sa.String),
        sa.column("lifetime_epsilon", sa.Float),
        sa.column("lifetime_delta", sa.Float),
        sa.column("notion", sa.String),
        sa.column("registered_at", sa.DateTime),
    )
    old = bind.execute(sa.select(old_dataset)).all()
    ids = _identity_ids([row.fingerprint for row in old])

    op.create_table(
        "dataset_identity",
        sa.Column("id", sa.String(length=100), nullable=False),
        sa.Column("lifetime_epsilon", sa.Float(), nullable=False),
        sa.Column("lifetime_delta", sa.Float(), nullable=False),
        sa.Column("notion", sa.String(length=40), nullable=False),
        sa.Column("migrated", sa.Boolean(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("registered_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    if old:
        op.bulk_insert(
            IDENTITY,
            [
                {
                    "id": ids[row.fingerprint],
                    "lifetime_epsilon": row.lifetime_epsilon,
                    "lifetime_delta": row.lifetime_delta,
                    "notion": row.notion,
                    "migrated": True,
                    "note": NOTE.format(fingerprint=row.fingerprint, identity=ids[row.fingerprint]),
                    "registered_at": row.registered_at,
                }
                for row in old
            ],
        )

    with op.batch_alter_table("dataset") as batch:
        batch.add_column(sa.Column("identity_id", sa.String(length=100), nullable=True))
    for fingerprint, identity in ids.items():
        bind.execute(VINTAGE.update().where(VINTAGE.c.fingerprint == fingerprint).values(identity_id=identity))
    with op.batch_alter_table("dataset") as batch:
        batch.alter_column("identity_id", existing_type=sa.String(length=100), nullable=False)
        batch.create_index(op.f("ix_dataset_identity_id"), ["identity_id"], unique=False)
        batch.create_foreign_key("fk_dataset_identity_id", "dataset_identity", ["identity_id"], ["id"])
        batch.drop_column("lifetime_epsilon")
        batch.drop_column("lifetime_delta")
        batch.drop_column("notion")

    with op.batch_alter_table("ledger_entry") as batch:
        batch.add_column(sa.Column("dataset_id", sa.String(length=100), nullable=True))
    for fingerprint, identity in ids.items():
        bind.execute(
            sa.text("UPDATE ledger_entry SET dataset_id = :identity WHERE dataset_fingerprint = :fingerprint"),
            {"identity": identity, "fingerprint": fingerprint},
        )
    with op.batch_alter_table("ledger_entry") as batch:
        batch.alter_column("dataset_id", existing_type=sa.String(length=100), nullable=False)
        batch.drop_index("ix_ledger_entry_dataset_fingerprint")
        batch.drop_column("dataset_fingerprint")
        batch.create_index(op.f("ix_ledger_entry_dataset_id"), ["dataset_id"], unique=False)
        batch.create_foreign_key("fk_ledger_entry_dataset_id", "dataset_identity", ["dataset_id"], ["id"])

    _record(bind, len(ids))


def _record(bind: sa.Connection, identities: int) -> None:
    """Append the records of every migrated row (nothing on an empty database)."""
    if not identities:
        return
    rows: list[Row] = [("schema_migrated", {}, {"from_revision": "0001_initial", "to_revision": revision})]
    for table, key, kind in ((IDENTITY, "id", "dataset_identity"), (VINTAGE, "fingerprint", "dataset")):
        for row in bind.execute(sa.select(table).order_by(table.c[key])).mappings():
            rows.append((f"{kind}_migrated", dict(row), {"table": table.name, "key": row[key]}))
    for row in bind.execute(sa.select(ENTRY).order_by(ENTRY.c.id)).mappings():
        rows.append(
            ("ledger_entry_migrated", dict(row), {"table": "ledger_entry", "key": row["id"], "run": row["run_id"]})
        )
    append_records(bind, rows)


def downgrade() -> None:
    raise NotImplementedError(
        "0002_dataset_identity cannot be undone: identities may hold several vintages, which a "
        "fingerprint-keyed ledger cannot express without splitting budgets"
    )
