"""The hash chain over the audit log and its own walk (links, hashes, signatures; the whole
database's verification, rows, files and approvals included: :mod:`.verification`).

Every audit write appends one :class:`~privrelease.audit.models.AuditEvent` record::

    hash(n) = sha256( hash(n-1) || canonical_json({"seq", "time", "kind", "payload"}) )

with ``hash(0) = "0" * 64`` (UTF-8 of the hex strings concatenated). The payload names the row
the record describes (``table``, ``key``) and that row's content hash (``row_sha256`` = sha256
of the canonical JSON of all its columns), so editing a row is detected as well as editing,
deleting or reordering log records. A row rewritten later (a run finishing, a reservation
committed) gets a new record; the newest record of each row must match the row as it is.

Appending is serialized: the appender locks the chain-head row (``SELECT ... FOR UPDATE`` on
PostgreSQL; on SQLite the writing session already holds the write lock, ``BEGIN IMMEDIATE``),
and ``seq`` is the primary key, so two processes can never fork the chain.

A schema migration that changes audited rows leaves every existing record as it is and appends
a record for each row it creates or changes (``<table>_migrated``), so the history before it
still verifies and each row's newest record describes it as it now is.

Cutting off the newest records (and the rows they describe) leaves a shorter chain that is
consistent in itself; an externally kept head (:func:`write_head`, a small JSON file
``{"seq", "hash"}`` written beside the outputs and printed in the report) detects it:
``verification.verify(session, head=read_head(path))``; so does the witness every run checks
before it spends (:mod:`.witness`), which verifies only the records after its last verified
head (:func:`verify_tail`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Table, event, func
from sqlmodel import Session, SQLModel, col, select

from privrelease.audit import signing
from privrelease.audit.models import (
    GENESIS_HASH,
    AuditEvent,
    ChainHead,
    utcnow,
)
from privrelease.errors import UserError
from privrelease.files import sha256_text, write_atomic
from privrelease.settings import signing_key

__all__ = [
    "GENESIS_HASH",
    "Head",
    "Problem",
    "append",
    "canonical_json",
    "check_chain",
    "columns_sha256",
    "describe",
    "head",
    "lock",
    "read_head",
    "record_hash",
    "records",
    "row_sha256",
    "signature_problems",
    "verify_tail",
    "write_head",
    "write_json",
]


# --- canonical forms and hashes -----------------------------------------------------------------


def _canon(value: Any) -> Any:
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            value = value.astimezone(UTC).replace(tzinfo=None)
        return value.isoformat(timespec="microseconds") + "Z"
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # "inf", "-inf", "nan": JSON has no such numbers
    if isinstance(value, dict):
        return {str(key): _canon(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canon(item) for item in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    raise TypeError(f"cannot put {type(value).__name__} into canonical JSON: {value!r}")


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept, datetimes as UTC ISO-8601 with microseconds and a
    ``Z``, non-finite floats as strings: the same text on every machine and database."""
    return json.dumps(
        _canon(value),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def _table(row: SQLModel) -> Table:
    """The table of a row of a table model."""
    # sqlmodel's types declare __table__ only on the table=True subclasses, not on SQLModel
    return row.__table__  # type: ignore[attr-defined]


def row_sha256(row: SQLModel) -> str:
    """Content hash of a table row: :func:`columns_sha256` of all its columns."""
    table = _table(row)
    return columns_sha256(table.name, {column.name: getattr(row, column.key) for column in table.columns})


def columns_sha256(table: str, columns: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of ``{"table": table, "columns": columns}`` (column name ->
    value): a row's content hash."""
    return sha256_text(canonical_json({"table": table, "columns": columns}))


def record_hash(prev_hash: str, seq: int, time: datetime, kind: str, payload: Any) -> str:
    """``sha256(prev_hash || canonical_json({"seq", "time", "kind", "payload"}))``."""
    body = canonical_json({"seq": seq, "time": time, "kind": kind, "payload": payload})
    return sha256_text(prev_hash + body)


def primary_key(row: SQLModel) -> Any:
    (column,) = _table(row).primary_key.columns
    return getattr(row, column.key)


# --- appending ----------------------------------------------------------------------------------

RELEASE_HEAD_FILE = "chain-head.json"
"""The signed head file in every release folder."""

APPENDED = "privrelease_appended_head"
"""``session.info`` key: the head after this session's last :func:`append` (:mod:`.witness`)."""

VERIFIED = "privrelease_chain_verified"
"""``session.info`` key: this transaction's check before spending passed (:mod:`.witness`)."""


@event.listens_for(Session, "after_rollback")
def _forget_transaction(session: Session) -> None:
    """A rolled-back transaction appended nothing and its check vouches for nothing after it."""
    session.info.pop(APPENDED, None)
    session.info.pop(VERIFIED, None)


@dataclass(frozen=True)
class Head:
    """The newest record of a chain: its ``seq`` and ``hash`` (seq 0: the empty chain). A head
    file beside a release also lists its ``files`` (name -> sha256) and the ``release`` it
    belongs to (``folder``, ``run``, ``policy`` name@version, ``policy_sha256``;
    :func:`.records.release_binding`) and, when a signing key is set, carries the key holder's
    ``signature`` (:mod:`.signing`; the file also names the public key, for people)."""

    seq: int
    hash: str
    files: dict[str, str] | None = None
    signature: str | None = None
    release: dict[str, str] | None = None

    def message(self) -> bytes:
        """What :attr:`signature` signs (each kind in its own domain, never a record's)."""
        if self.files is None:
            return signing.head_message(self.seq, self.hash)
        return signing.release_message(self.seq, self.hash, self.files, self.release)


def lock(session: Session) -> ChainHead:
    """Lock and return the chain-head row. Every audit writer calls this first, so writers are
    serialized for the rest of their transaction (PostgreSQL: ``SELECT ... FOR UPDATE``; SQLite:
    the writing session's ``BEGIN IMMEDIATE`` already holds the database's write lock)."""
    statement = select(ChainHead).where(ChainHead.id == 1).with_for_update().execution_options(populate_existing=True)
    row = session.exec(statement).first()
    assert row is not None, "chain_head row missing: the database was not created by migrate()"
    return row


def append(session: Session, kind: str, row: SQLModel | None = None, **facts: Any) -> AuditEvent:
    """Append one record describing ``row`` (flushed first; its table, key and content hash go
    into the payload) plus ``facts`` (small, never data). Locks the chain head; the caller's
    transaction commits both the row and the record, or neither."""
    head_row = lock(session)
    payload: dict[str, Any] = dict(facts)
    if row is not None:
        session.add(row)
        session.flush()
        payload.update(
            table=_table(row).name,
            key=primary_key(row),
            row_sha256=row_sha256(row),
        )
    seq = head_row.seq + 1
    time = utcnow()
    digest = record_hash(head_row.hash, seq, time, kind, payload)
    key = signing_key()
    record = AuditEvent(
        seq=seq,
        time=time,
        kind=kind,
        payload_json=canonical_json(payload),
        prev_hash=head_row.hash,
        hash=digest,
        signature=None if key is None else signing.sign(key, signing.record_message(seq, digest)),
    )
    session.add(record)
    head_row.seq, head_row.hash = seq, record.hash
    session.add(head_row)
    session.flush()
    session.info[APPENDED] = Head(seq, digest)
    return record


def records(session: Session, *, run_id: str | None = None) -> list[AuditEvent]:
    """The log in order; with ``run_id``, only the records about that run (its start, dataset,
    data read, reservation, outputs, guarantees, report and end): the run's audit trail."""
    found = list(session.exec(select(AuditEvent).order_by(col(AuditEvent.seq))).all())
    if run_id is None:
        return found
    return [r for r in found if json.loads(r.payload_json).get("run") == run_id]


def head(session: Session) -> Head:
    """The chain's newest record as the chain-head row says."""
    row = session.get(ChainHead, 1)
    assert row is not None, "chain_head row missing: the database was not created by migrate()"
    return Head(seq=row.seq, hash=row.hash)


def write_head(
    path: Path | str,
    chain_head: Head,
    *,
    files: dict[str, str] | None = None,
    release: dict[str, str] | None = None,
) -> Path:
    """Write ``{"seq", "hash"}`` to ``path`` atomically, with ``files`` (name -> sha256 of each
    file of a release) and the ``release`` binding when given, signed when a signing key is
    set; returns the path. Heads are public (0o644): a reviewer on another account, and every
    run's check of the published folders, must be able to read them."""
    body: dict[str, Any] = {"seq": chain_head.seq, "hash": chain_head.hash}
    if files is not None:
        body["files"] = dict(sorted(files.items()))
    if release is not None:
        body["release"] = release
    key = signing_key()
    if key is not None:
        unsigned = Head(chain_head.seq, chain_head.hash, body.get("files"), release=release)
        body.update(signature=signing.sign(key, unsigned.message()), public_key=signing.public_text(key))
    return write_json(path, body, mode=0o644)


def write_json(
    path: Path | str, body: dict[str, Any], *, indent: int | None = None, make_folder: bool = True, mode: int = 0o600
) -> Path:
    """Write ``body`` as JSON to ``path`` atomically and durably (:func:`.files.write_atomic`;
    owner-only, 0o600, unless ``mode`` says otherwise; a missing folder is made unless
    ``make_folder`` is False); returns the path."""
    text = json.dumps(body, sort_keys=True, indent=indent) + "\n"
    return write_atomic(path, text, make_folder=make_folder, mode=mode)


def read_head(path: Path | str) -> Head:
    """Read a head file written by :func:`write_head`."""
    path = Path(path)
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        seq, digest = body["seq"], body["hash"]
    except FileNotFoundError:
        raise
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"chain head file {path} must hold JSON {{'seq': int, 'hash': hex}}; {error}") from None
    if not isinstance(seq, int) or seq < 0 or not isinstance(digest, str) or len(digest) != 64:
        raise UserError(f"chain head file {path}: seq must be an int >= 0 and hash 64 hex digits")
    files = body.get("files")
    if files is not None and not (
        isinstance(files, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in files.items())
    ):
        raise UserError(f"chain head file {path}: files must map file names to sha256 hex digests")
    release = body.get("release")
    if release is not None and not (
        isinstance(release, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in release.items())
    ):
        raise UserError(f"chain head file {path}: release must map folder, run and policy to strings")
    return Head(seq, digest, files, body.get("signature"), release)


# --- findings -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    """One finding of a check of the audit trail (:mod:`.verification`, :mod:`.replay`,
    :mod:`.witness`): the record (``seq``; None for a row no record describes), a short ``kind``
    and a message naming the record, row or file."""

    seq: int | None
    kind: str
    message: str


# --- the chain's own walk ----------------------------------------------------------------------


def describe(record: AuditEvent) -> str:
    return f"record {record.seq} ({record.kind})"


def check_chain(
    records: list[AuditEvent], problems: list[Problem], start: Head | None = None
) -> dict[tuple[str, Any], tuple[AuditEvent, dict[str, Any]]]:
    """Walk the records in seq order, the first following ``start`` (default: the genesis);
    return the newest record (and payload) of every row."""
    newest: dict[tuple[str, Any], tuple[AuditEvent, dict[str, Any]]] = {}
    previous_hash, expected = (start.hash, start.seq + 1) if start else (GENESIS_HASH, 1)
    for record in records:
        if record.seq != expected:
            problems.append(
                Problem(
                    expected,
                    "records_missing",
                    f"records {expected}..{record.seq - 1} are missing (deleted); "
                    f"the log jumps from {expected - 1} to {record.seq}",
                )
            )
        elif record.prev_hash != previous_hash:
            problems.append(
                Problem(
                    record.seq,
                    "chain_broken",
                    f"{describe(record)} does not link to record {record.seq - 1}: its "
                    f"prev_hash {record.prev_hash[:16]}... is not {previous_hash[:16]}... "
                    "(records reordered, replaced or edited)",
                )
            )
        payload, edited = vouch(record)
        if edited is not None:
            problems.append(edited)
        if isinstance(payload, dict) and "table" in payload and "key" in payload:
            newest[(str(payload["table"]), payload["key"])] = (record, payload)
        previous_hash, expected = record.hash, record.seq + 1
    return newest


def vouch(record: AuditEvent) -> tuple[dict[str, Any] | None, Problem | None]:
    """The record's payload, and a problem when the record is not as it was appended: its text
    not the canonical JSON of its payload (an edit that keeps the parsed payload, e.g. spacing),
    or its hash not that of its contents. What a check that reads an older record relies on."""
    try:
        payload = json.loads(record.payload_json)
    except ValueError:
        payload = None
    if not isinstance(payload, dict) or canonical_json(payload) != record.payload_json:
        return (payload if isinstance(payload, dict) else None), Problem(
            record.seq, "record_edited", f"{describe(record)}: payload was edited"
        )
    if record_hash(record.prev_hash, record.seq, record.time, record.kind, payload) != record.hash:
        return payload, Problem(
            record.seq, "record_edited", f"{describe(record)} was edited: its hash does not match its contents"
        )
    return payload, None


def signature_problems(records: list[AuditEvent], head: Head | None, key: Any) -> list[Problem]:
    """Records (the first 20, then a count) and the external head without a valid signature."""
    bad = [r for r in records if not signing.valid(key, signing.record_message(r.seq, r.hash), r.signature)]
    found = [
        Problem(
            record.seq,
            "bad_signature" if record.signature else "unsigned",
            f"{describe(record)} carries no valid signature of the signing key: written, edited or "
            "rechained without it",
        )
        for record in bad[:20]
    ]
    if len(bad) > 20:
        found.append(
            Problem(bad[20].seq, "unsigned", f"... and {len(bad) - 20} more records without a valid signature")
        )
    if head is not None and not signing.valid(key, head.message(), head.signature):
        legacy = head.files is None and signing.valid(key, signing.record_message(head.seq, head.hash), head.signature)
        found.append(
            Problem(
                head.seq,
                "head_unsigned",
                f"the external head (record {head.seq}) is signed in the old format, which record {head.seq}'s "
                "own signature also satisfies, so it proves nothing: write a new one (privrelease audit head --write)"
                if legacy
                else f"the external head (record {head.seq}) carries no valid signature of the signing key: "
                "forged or swapped",
            )
        )
    return found


def verify_tail(session: Session, start: Head, public_key: Any | None = None) -> list[Problem]:
    """Verify only what follows ``start`` (a head verified earlier): record ``start.seq`` still
    has hash ``start.hash``, every later record links to the one before and hashes to its
    contents (with ``public_key``: carries its valid signature), and the chain-head row names
    the last one. The records up to ``start`` are vouched for by its hash (the chain), and
    counted: none of them may be missing (a record deleted without rechaining leaves the
    hashes after it intact)."""
    tail = list(session.exec(select(AuditEvent).where(AuditEvent.seq >= start.seq).order_by(col(AuditEvent.seq))))
    problems: list[Problem] = []
    if start.seq > 0:
        first = tail.pop(0) if tail and tail[0].seq == start.seq else None
        if first is None or first.hash != start.hash:
            found = "is missing" if first is None else f"has hash {first.hash[:16]}..."
            problems.append(
                Problem(
                    start.seq,
                    "head_mismatch",
                    f"record {start.seq} {found}, not {start.hash[:16]}... as verified before: the database was "
                    "rolled back, truncated or rewritten",
                )
            )
            return problems
        held = session.exec(select(func.count()).select_from(AuditEvent).where(AuditEvent.seq <= start.seq)).one()
        if held != start.seq:
            problems.append(
                Problem(
                    None,
                    "records_missing",
                    f"{start.seq - held} of the records up to the verified record {start.seq} are missing (deleted)",
                )
            )
    check_chain(tail, problems, start)
    last = Head(tail[-1].seq, tail[-1].hash) if tail else start
    stored = session.get(ChainHead, 1, populate_existing=True)
    if stored is None or (stored.seq, stored.hash) != (last.seq, last.hash):
        problems.append(
            Problem(last.seq, "head_mismatch", f"the chain_head row does not name the log's last record {last.seq}")
        )
    if public_key is not None:
        problems += signature_problems(tail, None, public_key)
    return problems
