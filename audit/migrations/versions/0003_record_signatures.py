"""Signed audit records: ``audit_event.signature`` holds the Ed25519 signature of each record's
``(seq, hash)`` by the signing key (:mod:`privrelease.audit.signing`), outside the hashed content.

No existing record is touched (records written before a signing key was set stay unsigned, and
``audit verify --public-key`` names them), so the history verifies as before.

Revision ID: 0003_record_signatures
Revises: 0002_dataset_identity
Create Date: 2026-11-25 12:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_record_signatures"
down_revision: str | None = "0002_dataset_identity"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("audit_event", sa.Column("signature", sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("audit_event") as batch:
        batch.drop_column("signature")
