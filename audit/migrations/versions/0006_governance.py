"""Governance: ``approval.nonce``, each approval's own random id, signed with it and named by
revocations (:mod:`privrelease.audit.governance`), so a copy of a revoked approval stays revoked.

Each existing approval gets a fresh id and a new record (``schema_migrated`` first, then
``approval_migrated`` per row, with the row's new content hash) under the chain lock, signed
when ``PRIVRELEASE_SIGNING_KEY`` is set; no existing record is touched. Approvals signed before
this revision do not verify any more (their message had no id): approve again.

Revision ID: 0006_governance
Revises: 0005_approval_binds_data
Create Date: 2026-11-25 15:00:00
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from privrelease.audit.migrations.history import Row, append_migration, migrated

revision: str = "0006_governance"
down_revision: str | None = "0005_approval_binds_data"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The approval table as this revision leaves it (frozen: later revisions must not change it).
APPROVAL = sa.table(
    "approval",
    sa.column("policy_sha256", sa.String),
    sa.column("approved_by", sa.String),
    sa.column("os_user", sa.String),
    sa.column("note", sa.Text),
    sa.column("id", sa.Integer),
    sa.column("approved_at", sa.DateTime),
    sa.column("signature", sa.String),
    sa.column("public_key", sa.String),
    sa.column("binds", sa.String),
    sa.column("data_path", sa.Text),
    sa.column("data_sha256", sa.String),
    sa.column("os_uid", sa.Integer),
    sa.column("nonce", sa.String),
)


def upgrade() -> None:
    with op.batch_alter_table("approval") as batch:
        batch.add_column(sa.Column("nonce", sa.String(length=32), nullable=True))
    bind = op.get_bind()
    rows: list[Row] = []
    for row in bind.execute(sa.select(APPROVAL).order_by(APPROVAL.c.id)).mappings():
        columns = {**row, "nonce": uuid.uuid4().hex}
        bind.execute(APPROVAL.update().where(APPROVAL.c.id == row["id"]).values(nonce=columns["nonce"]))
        rows.append(migrated("approval", columns, row["id"], sha256=row["policy_sha256"]))
    with op.batch_alter_table("approval") as batch:
        batch.alter_column("nonce", existing_type=sa.String(length=32), nullable=False)
    append_migration(bind, down_revision, revision, rows)


def downgrade() -> None:
    raise NotImplementedError(
        "0006_governance cannot be undone: revocations name approvals by their nonce, and the approvals' "
        "newest records hash it"
    )
