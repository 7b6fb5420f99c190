"""Initial schema: every audit table, and the chain-head row (seq 0, the genesis hash).

Revision ID: 0001_initial
Revises: (none)
Create Date: 2026-11-22 00:23:58.913342
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001_initial"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_event",
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("time", sa.DateTime(), nullable=False),
        sa.Column("kind", sa.String(length=40), nullable=False),
        sa.Column("payload_json", sa.Text(), nullable=False),
        sa.Column("prev_hash", sa.String(length=64), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("seq"),
    )
    chain_head = op.create_table(
        "chain_head",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("hash", sa.String(length=64), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.bulk_insert(chain_head, [{"id": 1, "seq": 0, "hash": "0" * 64}])
    op.create_table(
        "dataset",
        sa.Column("fingerprint", sa.String(length=64), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("row_count", sa.Integer(), nullable=False),
        sa.Column("lifetime_epsilon", sa.Float(), nullable=False),
        sa.Column("lifetime_delta", sa.Float(), nullable=False),
        sa.Column("notion", sa.String(length=40), nullable=False),
        sa.Column("label", sa.String(length=300), nullable=True),
        sa.Column("registered_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("fingerprint"),
    )
    op.create_table(
        "policy_version",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("version", sa.String(length=100), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("canonical_json", sa.Text(), nullable=False),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("registered_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("name", "version", name="uq_policy_version_name"),
    )
    op.create_index(op.f("ix_policy_version_name"), "policy_version", ["name"], unique=False)
    op.create_index(op.f("ix_policy_version_sha256"), "policy_version", ["sha256"], unique=True)

    op.create_table(
        "approval",
        sa.Column("policy_sha256", sa.String(length=64), nullable=False),
        sa.Column("approved_by", sa.String(length=200), nullable=False),
        sa.Column("os_user", sa.String(length=200), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("approved_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["policy_sha256"],
            ["policy_version.sha256"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_approval_policy_sha256"), "approval", ["policy_sha256"], unique=False)

    op.create_table(
        "run",
        sa.Column("policy_sha256", sa.String(length=64), nullable=False),
        sa.Column("dataset_fingerprint", sa.String(length=64), nullable=True),
        sa.Column("code_version", sa.String(length=200), nullable=False),
        sa.Column("flow_run_id", sa.String(length=100), nullable=True),
        sa.Column("kind", sa.String(length=20), nullable=False),
        sa.Column("source_run_id", sa.String(length=32), nullable=True),
        sa.Column("id", sa.String(length=32), nullable=False),
        sa.Column("status", sa.String(length=20), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("data_read_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("timings_json", sa.Text(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["dataset_fingerprint"],
            ["dataset.fingerprint"],
        ),
        sa.ForeignKeyConstraint(
            ["policy_sha256"],
            ["policy_version.sha256"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_run_dataset_fingerprint"), "run", ["dataset_fingerprint"], unique=False)
    op.create_index(op.f("ix_run_policy_sha256"), "run", ["policy_sha256"], unique=False)

    op.create_table(
        "guarantee",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("notion", sa.String(length=40), nullable=False),
        sa.Column("epsilon", sa.Float(), nullable=True),
        sa.Column("delta", sa.Float(), nullable=True),
        sa.Column("rho", sa.Float(), nullable=True),
        sa.Column("details_json", sa.Text(), nullable=False),
        sa.Column("event_json", sa.Text(), nullable=False),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["run.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_guarantee_run_id"), "guarantee", ["run_id"], unique=False)

    op.create_table(
        "ledger_entry",
        sa.Column("dataset_fingerprint", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("notion", sa.String(length=40), nullable=False),
        sa.Column("event_json", sa.Text(), nullable=False),
        sa.Column("epsilon", sa.Float(), nullable=False),
        sa.Column("delta", sa.Float(), nullable=False),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["dataset_fingerprint"],
            ["dataset.fingerprint"],
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["run.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        op.f("ix_ledger_entry_dataset_fingerprint"),
        "ledger_entry",
        ["dataset_fingerprint"],
        unique=False,
    )
    op.create_index(op.f("ix_ledger_entry_run_id"), "ledger_entry", ["run_id"], unique=False)

    op.create_table(
        "output",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=True),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["run.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_output_run_id"), "output", ["run_id"], unique=False)

    op.create_table(
        "report",
        sa.Column("run_id", sa.String(length=32), nullable=False),
        sa.Column("html", sa.Text(), nullable=False),
        sa.Column("sha256", sa.String(length=64), nullable=False),
        sa.Column("path", sa.Text(), nullable=True),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["run.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(op.f("ix_report_run_id"), "report", ["run_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_report_run_id"), table_name="report")

    op.drop_table("report")
    op.drop_index(op.f("ix_output_run_id"), table_name="output")

    op.drop_table("output")
    op.drop_index(op.f("ix_ledger_entry_run_id"), table_name="ledger_entry")
    op.drop_index(op.f("ix_ledger_entry_dataset_fingerprint"), table_name="ledger_entry")

    op.drop_table("ledger_entry")
    op.drop_index(op.f("ix_guarantee_run_id"), table_name="guarantee")

    op.drop_table("guarantee")
    op.drop_index(op.f("ix_run_policy_sha256"), table_name="run")
    op.drop_index(op.f("ix_run_dataset_fingerprint"), table_name="run")

    op.drop_table("run")
    op.drop_index(op.f("ix_approval_policy_sha256"), table_name="approval")

    op.drop_table("approval")
    op.drop_index(op.f("ix_policy_version_sha256"), table_name="policy_version")
    op.drop_index(op.f("ix_policy_version_name"), table_name="policy_version")

    op.drop_table("policy_version")
    op.drop_table("dataset")
    op.drop_table("chain_head")
    op.drop_table("audit_event")
