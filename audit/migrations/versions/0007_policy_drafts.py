"""Drafts stay drafts: ``policy_version.draft``. A run that is refused or fails before it
publishes records its policy's content as a draft, which claims no ``name@version``; only an
approval or a publication registers a version. The unique constraint on (name, version)
becomes a unique index over the registered rows only (``WHERE NOT draft``): two contents can
still never be registered under one name@version, while drafts of it may be recorded.

Every existing row was registered under the earlier rule and stays registered (``draft``
false). The hash chain: as in revision 0005, one ``schema_migrated`` record, then a
``policy_version_migrated`` record per row with its new content hash; no record is touched.

Revision ID: 0007_policy_drafts
Revises: 0006_governance
Create Date: 2026-11-25 17:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from privrelease.audit.migrations.history import append_migration, migrated

revision: str = "0007_policy_drafts"
down_revision: str | None = "0006_governance"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The policy_version table as this revision leaves it (frozen: later revisions must not change it).
POLICY_VERSION = sa.table(
    "policy_version",
    sa.column("name", sa.String),
    sa.column("version", sa.String),
    sa.column("sha256", sa.String),
    sa.column("canonical_json", sa.Text),
    sa.column("id", sa.Integer),
    sa.column("registered_at", sa.DateTime),
    sa.column("draft", sa.Boolean),
)


def upgrade() -> None:
    with op.batch_alter_table("policy_version") as batch:
        batch.add_column(sa.Column("draft", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch.drop_constraint("uq_policy_version_name", type_="unique")
    op.create_index(
        "uq_policy_version_name",
        "policy_version",
        ["name", "version"],
        unique=True,
        sqlite_where=sa.text("NOT draft"),
        postgresql_where=sa.text("NOT draft"),
    )
    bind = op.get_bind()
    rows = [
        migrated("policy_version", {**row, "draft": False}, row["id"], sha256=row["sha256"])
        for row in bind.execute(sa.select(POLICY_VERSION).order_by(POLICY_VERSION.c.id)).mappings()
    ]
    append_migration(bind, down_revision, revision, rows)


def downgrade() -> None:
    raise NotImplementedError(
        "0007_policy_drafts cannot be undone: the policy versions' newest records hash their draft column"
    )
