"""Approvals bind the data: ``approval.binds`` (``data`` or ``path``), ``approval.data_path``
(the resolved absolute path at approval) and ``approval.data_sha256`` (its fingerprint), all
signed with the approval (:mod:`privrelease.audit.bindings`), and ``approval.os_uid`` (the
approving account's uid). Every existing approval gets NULL: it binds nothing, and production
runs refuse it until the policy is approved again.

The hash chain: as in revision 0004, each existing approval gets an ``approval_migrated``
record with its new content hash (after one ``schema_migrated``); no record is touched.

Revision ID: 0005_approval_binds_data
Revises: 0004_signed_approvals
Create Date: 2026-11-25 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from privrelease.audit.migrations.history import append_migration, migrated

revision: str = "0005_approval_binds_data"
down_revision: str | None = "0004_signed_approvals"
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
)


def upgrade() -> None:
    with op.batch_alter_table("approval") as batch:
        batch.add_column(sa.Column("binds", sa.String(length=10), nullable=True))
        batch.add_column(sa.Column("data_path", sa.Text(), nullable=True))
        batch.add_column(sa.Column("data_sha256", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("os_uid", sa.Integer(), nullable=True))
    bind = op.get_bind()
    rows = [
        migrated("approval", dict(row), row["id"], sha256=row["policy_sha256"])
        for row in bind.execute(sa.select(APPROVAL).order_by(APPROVAL.c.id)).mappings()
    ]
    append_migration(bind, down_revision, revision, rows)


def downgrade() -> None:
    raise NotImplementedError(
        "0005_approval_binds_data cannot be undone: the approvals' newest records hash their binding columns"
    )
