"""The audit database tables (SQLModel), following the SQLModel docs: a ``...Base`` class with
the fields a caller provides, and a ``table=True`` class adding keys and timestamps.

Every row an audit function writes is described by a record of the append-only, hash-chained
:class:`AuditEvent` log (see :mod:`privrelease.audit.chain`), whose payload holds the row's
content hash, so editing the row itself is detected as well as editing the log.

Conventions: timestamps are UTC (stored naive-UTC, returned timezone-aware); JSON is stored as
canonical text (sorted keys, no whitespace), never as a database JSON type, so that it hashes
to the same bytes on SQLite and PostgreSQL. No raw data is ever stored: a dataset is an identity
(the population it is about, which holds the budget) with vintages (files) known by fingerprint,
size and row count only.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlmodel import Field, SQLModel

GENESIS_HASH = "0" * 64


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


class UTCDateTime(sa.types.TypeDecorator[datetime]):
    """A timestamp stored as naive UTC (same text on SQLite, same value on PostgreSQL) and
    returned timezone-aware UTC. Naive input is taken as UTC."""

    impl = sa.DateTime(timezone=False)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _when(**kwargs: Any) -> Any:
    return Field(sa_type=UTCDateTime, **kwargs)


def _text(**kwargs: Any) -> Any:
    return Field(sa_type=sa.Text, **kwargs)


# --- policies and approvals -------------------------------------------------------------------


class PolicyVersionBase(SQLModel):
    name: str = Field(index=True, max_length=200)
    version: str = Field(max_length=100)
    sha256: str = Field(unique=True, index=True, max_length=64)
    canonical_json: str = _text()


class PolicyVersion(PolicyVersionBase, table=True):
    """One content-addressed version of a policy: ``sha256`` is the hash of its canonical form.

    A registered version (``draft`` False) holds ``name@version``: at most one content per
    name@version is registered (a partial unique index), and only an approval or a publication
    registers one (:mod:`privrelease.audit.approvals`). A ``draft`` row (revision 0007) is the
    content of a run that was refused or failed before it published: recorded for that run's
    history, it claims no name@version, so the draft can be edited under the same version.
    ``registered_at``: when it was registered (a draft's: when it was first recorded)."""

    __tablename__ = "policy_version"
    # Partial (WHERE NOT draft) on both backends, as migration 0007 creates it (Alembic compares no
    # predicate; tests/test_audit_migrations.py reads it back): as a dialect option here it would
    # import SQLAlchemy's PostgreSQL dialect (about 0.09 s) in every SQLite process.
    __table_args__ = (
        sa.Index(
            "uq_policy_version_name",
            "name",
            "version",
            unique=True,
        ),
    )

    id: int | None = Field(default=None, primary_key=True)
    registered_at: datetime = _when(default_factory=utcnow)
    draft: bool = Field(default=False, sa_column_kwargs={"server_default": sa.false()})


class ApprovalBase(SQLModel):
    policy_sha256: str = Field(foreign_key="policy_version.sha256", index=True, max_length=64)
    approved_by: str = Field(max_length=200)
    os_user: str = Field(max_length=200)
    note: str | None = _text(default=None)


class Approval(ApprovalBase, table=True):
    """Who approved which policy hash, when (``approved_by`` as given, ``os_user`` as logged in).
    A signed approval (revision 0004) holds the approver's Ed25519 ``signature`` of
    :func:`privrelease.audit.approvers.message` and the ``public_key`` it was made with (base64);
    both are None for an unsigned one. Revision 0005: what it binds of the data (``binds``,
    ``data_path``, ``data_sha256``: :class:`privrelease.audit.bindings.Binding`; None: nothing,
    as every earlier approval) and the approving account's ``os_uid``. ``nonce`` (revision 0006)
    is the approval's own random id: signed with it and named by revocations, so a copied row is
    the same approval."""

    __tablename__ = "approval"

    id: int | None = Field(default=None, primary_key=True)
    approved_at: datetime = _when(default_factory=utcnow)
    signature: str | None = Field(default=None, max_length=128)
    public_key: str | None = Field(default=None, max_length=64)
    binds: str | None = Field(default=None, max_length=10)
    data_path: str | None = _text(default=None)
    data_sha256: str | None = Field(default=None, max_length=64)
    os_uid: int | None = Field(default=None)
    nonce: str = Field(default_factory=lambda: uuid.uuid4().hex, max_length=32)


# --- datasets, runs and what they produced -----------------------------------------------------


class DatasetIdentityBase(SQLModel):
    id: str = Field(primary_key=True, max_length=100)
    lifetime_epsilon: float
    lifetime_delta: float
    notion: str = Field(max_length=40)
    migrated: bool = False
    note: str | None = _text(default=None)


class DatasetIdentity(DatasetIdentityBase, table=True):
    """The population a dataset is about (the policy's ``dataset.id``), holding the lifetime
    privacy budget, under ``notion``, that every release from any of its files is charged
    against. ``migrated``: created from a fingerprint-keyed ledger (revision 0002)."""

    __tablename__ = "dataset_identity"

    registered_at: datetime = _when(default_factory=utcnow)


class DatasetBase(SQLModel):
    fingerprint: str = Field(primary_key=True, max_length=64)
    identity_id: str = Field(foreign_key="dataset_identity.id", index=True, max_length=100)
    size_bytes: int
    row_count: int
    label: str | None = Field(default=None, max_length=300)


class Dataset(DatasetBase, table=True):
    """A vintage of a dataset identity: one file known only by its fingerprint (sha256 of its
    bytes), size and row count. ``registered_at``: when a run first fingerprinted it."""

    __tablename__ = "dataset"

    registered_at: datetime = _when(default_factory=utcnow)


class RunBase(SQLModel):
    policy_sha256: str = Field(foreign_key="policy_version.sha256", index=True, max_length=64)
    dataset_fingerprint: str | None = Field(default=None, foreign_key="dataset.fingerprint", index=True, max_length=64)
    code_version: str = Field(max_length=200)
    flow_run_id: str | None = Field(default=None, max_length=100)
    kind: str = Field(default="release", max_length=20)
    source_run_id: str | None = Field(default=None, max_length=32)


class Run(RunBase, table=True):
    """One execution of a policy: ``pending`` (created, data not read) -> ``running`` (data read)
    -> ``publishing`` (charge committed, folder not yet visible) -> ``succeeded`` | ``failed``. ``timings_json`` holds seconds per step; ``error`` the failure
    message (never data)."""

    __tablename__ = "run"

    id: str = Field(primary_key=True, max_length=32)
    status: str = Field(default="pending", max_length=20)
    started_at: datetime = _when(default_factory=utcnow)
    data_read_at: datetime | None = _when(default=None)
    finished_at: datetime | None = _when(default=None)
    timings_json: str = _text(default="{}")
    error: str | None = _text(default=None)


class OutputBase(SQLModel):
    run_id: str = Field(foreign_key="run.id", index=True, max_length=32)
    path: str = _text()
    sha256: str = Field(max_length=64)
    rows: int | None = None
    bytes: int


class Output(OutputBase, table=True):
    """A published file: its path (as written) and the sha256 of its bytes."""

    __tablename__ = "output"

    id: int | None = Field(default=None, primary_key=True)
    created_at: datetime = _when(default_factory=utcnow)


class GuaranteeBase(SQLModel):
    run_id: str = Field(foreign_key="run.id", index=True, max_length=32)
    notion: str = Field(max_length=40)
    epsilon: float | None = None
    delta: float | None = None
    rho: float | None = None
    details_json: str = _text(default="{}")
    event_json: str = _text()


class Guarantee(GuaranteeBase, table=True):
    """A guarantee of one run under one accountant, with the stored event tree it was computed
    from (``event_to_json``), so an auditor can replay the arithmetic."""

    __tablename__ = "guarantee"

    id: int | None = Field(default=None, primary_key=True)
    created_at: datetime = _when(default_factory=utcnow)


class LedgerEntryBase(SQLModel):
    dataset_id: str = Field(foreign_key="dataset_identity.id", index=True, max_length=100)
    run_id: str = Field(foreign_key="run.id", index=True, max_length=32)
    notion: str = Field(max_length=40)
    event_json: str = _text()
    epsilon: float
    delta: float


class LedgerEntry(LedgerEntryBase, table=True):
    """One release's charge against a dataset identity's lifetime budget. ``epsilon``/``delta`` are this
    tree alone (for display); the budget check always composes the stored trees."""

    __tablename__ = "ledger_entry"

    id: int | None = Field(default=None, primary_key=True)
    state: str = Field(default="reserved", max_length=20)
    created_at: datetime = _when(default_factory=utcnow)
    expires_at: datetime | None = _when(default=None)
    updated_at: datetime = _when(default_factory=utcnow)
    reason: str | None = _text(default=None)


APPROVAL_RECORD_KINDS = ("policy_approved", "approval_migrated")
"""The kinds of the records describing approval rows (:mod:`.approvals` appends them; revisions
0004-0006 migrated them)."""

LEDGER_RECORD_KINDS = (
    "ledger_reserved",
    "ledger_committed",
    "ledger_released",
    "ledger_expired",
    "ledger_entry_migrated",
)
"""The kinds of the records describing ledger entries (:mod:`.ledger` appends them, revision 0002
migrated them): the run-start check finds an entry's records by kind, a column of its own,
never by matching their text."""


class ReportBase(SQLModel):
    run_id: str = Field(foreign_key="run.id", index=True, max_length=32)
    html: str = _text()
    sha256: str = Field(max_length=64)
    path: str | None = _text(default=None)


class Report(ReportBase, table=True):
    """The disclosure report of a run: the HTML itself and its sha256."""

    __tablename__ = "report"

    id: int | None = Field(default=None, primary_key=True)
    created_at: datetime = _when(default_factory=utcnow)


# --- the hash chain -----------------------------------------------------------------------------


class AuditEvent(SQLModel, table=True):
    """One record of the append-only log: ``hash = sha256(prev_hash || canonical JSON of
    {seq, time, kind, payload})``; ``payload`` names the row it describes and its content hash."""

    __tablename__ = "audit_event"

    seq: int = Field(primary_key=True, sa_column_kwargs={"autoincrement": False})
    time: datetime = _when()
    kind: str = Field(max_length=40)
    payload_json: str = _text()
    prev_hash: str = Field(max_length=64)
    hash: str = Field(max_length=64)
    signature: str | None = Field(default=None, max_length=128)
    """Ed25519 signature of ``(seq, hash)`` by the signing key (:mod:`.signing`); not hashed."""


class ChainHead(SQLModel, table=True):
    """The single row (id 1) holding the newest record's seq and hash. Appenders lock it
    (``SELECT ... FOR UPDATE``) so two processes never fork the chain."""

    __tablename__ = "chain_head"

    id: int = Field(default=1, primary_key=True, sa_column_kwargs={"autoincrement": False})
    seq: int = 0
    hash: str = Field(default=GENESIS_HASH, max_length=64)


#: Tables whose rows are described by audit records, by table name.
AUDITED_TABLES: dict[str, type[SQLModel]] = {
    cls.__tablename__: cls
    for cls in (
        PolicyVersion,
        Approval,
        DatasetIdentity,
        Dataset,
        Run,
        Output,
        Guarantee,
        LedgerEntry,
        Report,
    )
}
