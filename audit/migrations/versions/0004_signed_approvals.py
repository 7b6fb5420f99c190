"""Signed approvals: ``approval.signature`` holds the approver's Ed25519 signature of the
approval message (:func:`privrelease.audit.approvers.message`) and ``approval.public_key`` the
key it was made with (base64 of 32 bytes); both are NULL for an unsigned approval, as every
existing one stays.

The hash chain: a row's content hash covers all its columns, so each existing approval gets a
new record (``schema_migrated`` first, then ``approval_migrated`` per row, with the row's new
content hash) appended under the chain lock, signed when ``PRIVRELEASE_SIGNING_KEY`` is set; no
existing record is touched, so the history before it verifies as before.

Revision ID: 0004_signed_approvals
Revises: 0003_record_signatures
Create Date: 2026-11-25 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from privrelease.audit.migrations.history import append_migration, migrated

revision: str = "0004_signed_approvals"
down_revision: str | None = "0003_record_signatures"
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
)


def upgrade() -> None:
    with op.batch_alter_table("approval") as batch:
        batch.add_column(sa.Column("signature", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("public_key", sa.String(length=64), nullable=True))
    bind = op.get_bind()
    rows = [
        migrated("approval", dict(row), row["id"], sha256=row["policy_sha256"])
        for row in bind.execute(sa.select(APPROVAL).order_by(APPROVAL.c.id)).mappings()
    ]
    append_migration(bind, down_revision, revision, rows)


def downgrade() -> None:
    raise NotImplementedError(
        "0004_signed_approvals cannot be undone: the approvals' newest records hash their signature "
        "columns, and signed approvals would lose what makes them count"
    )
