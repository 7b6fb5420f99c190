"""The witness, and the check every run makes before it spends budget.

The witness is a small JSON file outside the database (``PRIVRELEASE_WITNESS``, or the site
file's ``witness``: :mod:`privrelease.site`; default beside a SQLite file,
``<file>.witness.json``, else ``<work_dir>/audit-witness-<url digest>.json``)::

    {"head": {"seq", "hash"}, "verified": {"seq", "hash"}, "signature", "public_key"}

signed with the service key when one is set (:func:`.signing.witness_message`). ``head`` is the
newest chain head a privrelease writer committed: after each commit that appended records it
moves forward, but only when the committed chain extends the head already witnessed (a
database rolled back or cut short is never witnessed). ``verified`` is the newest head a run's
check verified, or one written on top of it in the same locked transaction.

:func:`check_before_spending` (called when a run opens and by every reservation, under the
audit write lock) verifies the records after ``verified`` only (links, hashes and, with a
signing key, their signatures: :func:`.chain.verify_tail`), that the database still holds
the witnessed ``head`` and, with a signing key, every signed release head it finds in the
release folders (one it cannot read or parse is a refusal: it could be the newest), and that every ledger entry is as its newest record describes it (that
record re-hashed and, with a key, its signature checked, however old: the one part whose cost
grows with the ledger, about 0.1 ms an entry). A database that fails is refused with :class:`~privrelease.errors.AuditRefused` (exit 1)
before anything is charged. What it cannot see is stated in SECURITY.md ("Known limits").
"""

from __future__ import annotations

import fcntl
import json
import logging
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, func, select

from privrelease.audit import chain, signing
from privrelease.audit.models import GENESIS_HASH, LEDGER_RECORD_KINDS, AuditEvent, LedgerEntry, Run
from privrelease.errors import AuditRefused, UserError
from privrelease.files import sha256_text
from privrelease.settings import get_settings, signing_key, sqlite_file

__all__ = [
    "Witness",
    "check_before_spending",
    "head_folders",
    "outside_heads",
    "path_for",
    "prepare",
    "read",
    "released",
    "service_public_key",
    "spending_problem",
]

GENESIS = chain.Head(0, GENESIS_HASH)

_verified: weakref.WeakKeyDictionary[Any, chain.Head] = weakref.WeakKeyDictionary()
"""Engine -> the newest head this process verified or wrote on a verified one (in-memory
databases have no witness file)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Witness:
    """The newest committed ``head`` and the newest ``verified`` head, with the service key's
    ``signature`` over both."""

    head: chain.Head
    verified: chain.Head
    signature: str | None = None

    def body(self) -> dict[str, Any]:
        return {name: {"seq": h.seq, "hash": h.hash} for name, h in (("head", self.head), ("verified", self.verified))}

    def message(self) -> bytes:
        return signing.witness_message(self.body())


def path_for(engine: Any) -> Path | None:
    """The witness file of the database of ``engine`` (None: an in-memory database)."""
    settings = get_settings()
    if settings.witness:
        return Path(settings.witness).expanduser()
    url = engine.url
    if url.get_backend_name() == "sqlite":
        file = sqlite_file(url)
        return None if file is None else file.with_name(f"{file.name}.witness.json")
    digest = sha256_text(url.render_as_string(hide_password=True))[:16]
    return settings.work_dir / f"audit-witness-{digest}.json"


def _head(value: Any) -> chain.Head:
    seq, digest = value["seq"], value["hash"]
    if not isinstance(seq, int) or seq < 0 or not isinstance(digest, str) or len(digest) != 64:
        raise ValueError("seq must be an int >= 0 and hash 64 hex digits")
    return chain.Head(seq, digest)


def read(path: Path, public_key: Any | None) -> Witness | None:
    """The witness at ``path`` (None when there is none yet); with ``public_key``, it must carry
    the service key's valid signature. :class:`AuditRefused` otherwise."""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
        witness = Witness(_head(body["head"]), _head(body["verified"]), body.get("signature"))
    except FileNotFoundError:
        return None
    except OSError as error:
        raise AuditRefused(f"cannot read the witness file {str(path)!r}: {error.strerror or error}") from None
    except (ValueError, KeyError, TypeError) as error:
        raise AuditRefused(
            f"the witness file {str(path)!r} is damaged ({error}): it cannot vouch for the database"
        ) from None
    if public_key is not None and not signing.valid(public_key, witness.message(), witness.signature):
        raise AuditRefused(
            f"the witness file {str(path)!r} carries no valid signature of the service key: forged, or written "
            "before PRIVRELEASE_SIGNING_KEY was set (then move it away once `privrelease audit verify` passes)"
        )
    return witness


def _witnessed(session: Session, head: chain.Head, path: Path) -> list[chain.Problem]:
    """The database still holds the witnessed head."""
    if head.seq == 0:
        return []
    at = session.get(AuditEvent, head.seq)
    if at is None:
        end = session.exec(select(func.max(AuditEvent.seq))).one() or 0
        message = (
            f"the log ends at record {end} but the witness {str(path)!r} names record {head.seq}: records were "
            "cut off, or the database was rolled back to an older copy"
        )
    elif at.hash != head.hash:
        message = f"record {head.seq} differs from the witness {str(path)!r}: the database was rolled back or rewritten"
    else:
        return []
    return [chain.Problem(head.seq, "rolled_back", message)]


@dataclass(frozen=True)
class Recorded:
    """The newest record describing each row (by ``(table, key)``) among some records, each
    vouched for (:func:`.chain.vouch`); ``edited``: the problems of those not as appended."""

    newest: dict[tuple[str, Any], tuple[AuditEvent, dict[str, Any]]]
    edited: list[chain.Problem]

    def problem(self, row: Any) -> chain.Problem | None:
        """Why ``row`` is not as its newest record describes it: a record edited (any of them:
        an edit can hide the newest), the row changed after its record, or no record describing
        it. None when it is."""
        if self.edited:
            return self.edited[0]
        key, table = chain.primary_key(row), chain._table(row).name
        found = self.newest.get((table, key))
        if found is None:
            return chain.Problem(None, "row_unrecorded", f"{table} {key} is described by no record")
        record, payload = found
        if chain.row_sha256(row) != payload.get("row_sha256"):
            return chain.Problem(record.seq, "row_edited", f"{table} {key} was edited after record {record.seq}")
        return None


def recorded(session: Session, *, kinds: Sequence[str] | None = None, mentioning: str | None = None) -> Recorded:
    """:class:`Recorded` of the records of ``kinds`` (a column of their own), or of those whose
    text holds ``mentioning`` (a row's unique text key, e.g. a run id: found whatever the
    spacing, which vouching then refuses); never a match on the text's form."""
    where = col(AuditEvent.kind).in_(kinds) if kinds is not None else col(AuditEvent.payload_json).contains(mentioning)
    newest: dict[tuple[str, Any], tuple[AuditEvent, dict[str, Any]]] = {}
    edited = []
    for record in session.exec(select(AuditEvent).where(where).order_by(col(AuditEvent.seq))):
        payload, problem = chain.vouch(record)
        if problem is not None or payload is None:
            edited.append(problem or chain.Problem(record.seq, "record_edited", f"{chain.describe(record)} was edited"))
        elif "table" in payload and "key" in payload:
            newest[(str(payload["table"]), payload["key"])] = (record, payload)
    return Recorded(newest, edited)


def _ledger_problems(session: Session, public_key: Any | None) -> list[chain.Problem]:
    """Ledger entries not as their newest record describes them (a refund written into a row,
    a deleted or inserted entry); each ledger record must be as appended (:func:`recorded`)
    and, with ``public_key``, each entry's newest must carry its valid signature, however old
    it is."""
    rows = {e.id: e for e in session.exec(select(LedgerEntry).execution_options(populate_existing=True))}
    ledger = recorded(session, kinds=LEDGER_RECORD_KINDS)
    problems = list(ledger.edited)
    for (table, key), (record, payload) in ledger.newest.items():
        if table != "ledger_entry":
            continue
        row = rows.pop(key, None)
        if public_key is not None and not signing.valid(
            public_key, signing.record_message(record.seq, record.hash), record.signature
        ):
            problems.append(
                chain.Problem(record.seq, "record_edited", f"record {record.seq} ({record.kind}) was edited")
            )
        elif row is None:
            problems.append(chain.Problem(record.seq, "row_deleted", f"ledger entry {key} was deleted"))
        elif chain.row_sha256(row) != payload.get("row_sha256"):
            problems.append(
                chain.Problem(record.seq, "row_edited", f"ledger entry {key} was edited after record {record.seq}")
            )
    problems += [chain.Problem(None, "row_unrecorded", f"ledger entry {key} is described by no record") for key in rows]
    return problems


def service_public_key() -> Any | None:
    """The key records, witnesses and release heads are checked against: the site's pinned one
    (:mod:`privrelease.site`), which ``PRIVRELEASE_SIGNING_KEY`` must then hold (or the runs'
    records would not verify: :class:`AuditRefused`), else that of ``PRIVRELEASE_SIGNING_KEY``
    (None: no key set)."""
    settings = get_settings()
    key = signing_key()
    pinned = settings.site.verifying_key()
    if pinned is None:
        return key.public_key() if key is not None else None
    if key is None or signing.public_text(key) != signing.encode_public(pinned):
        held = "is not set" if key is None else f"holds key {signing.fingerprint(signing.public_text(key))}"
        raise AuditRefused(
            f"the site file {str(settings.site.source)!r} pins the service key "
            f"{signing.fingerprint(signing.encode_public(pinned))} and PRIVRELEASE_SIGNING_KEY {held}: "
            "set it to the service key; nothing was charged or published"
        )
    return pinned


def head_folders(extra: Path | None = None) -> list[Path]:
    """The folders whose release heads are checked: ``<work_dir>/releases``, the site's
    published folders and ``extra`` (a run's ``--out``)."""
    settings = get_settings()
    return sorted({settings.work_dir / "releases", *settings.site.releases, *([extra] if extra else [])})


def _release_heads(roots: Sequence[Path]) -> tuple[list[tuple[Path, chain.Head]], list[chain.Problem]]:
    """The release heads in the folders of ``roots`` (``ROOT/FOLDER/chain-head.json``; hidden
    folders are releases still being written), and a problem for each root, folder or head
    that cannot be listed, read or parsed: a head nobody can check could be the newest, so it
    is a refusal, never skipped. A missing root or a folder without a head holds none."""
    heads, problems = [], []
    for root in roots:
        try:
            folders = sorted(entry for entry in root.iterdir() if not entry.name.startswith("."))
        except FileNotFoundError:
            continue
        except OSError as error:
            problems.append(_unreadable(root, error))
            continue
        for folder in folders:
            file = folder / chain.RELEASE_HEAD_FILE
            try:
                if not folder.is_dir():
                    continue
                head = chain.read_head(file)
            except FileNotFoundError:
                continue
            except OSError as error:
                problems.append(_unreadable(file, error))
            except UserError as error:
                problems.append(chain.Problem(None, "head_unreadable", f"{error}: it cannot be checked"))
            else:
                if head.files is not None:  # a release's, not a copy of `audit head`
                    heads.append((file, head))
    return heads, problems


def _unreadable(path: Path, error: OSError) -> chain.Problem:
    return chain.Problem(
        None,
        "head_unreadable",
        f"{str(path)!r} cannot be read ({error.strerror or error}): a release head there may name records the "
        "database does not hold; make it readable to this account (heads are public: 0644)",
    )


def released(session: Session, roots: Sequence[Path], public_key: Any) -> list[chain.Problem]:
    """A release head in ``roots`` signed by the service key that the database does not hold
    (a rollback or cut-off the witness cannot show, e.g. the witness was rolled back too),
    unless its run is still publishing (a crash between the head and the commit); or a head
    there that cannot be read (:func:`_release_heads`)."""
    heads, unreadable = _release_heads(roots)
    if unreadable:
        return unreadable
    held = dict(
        session.exec(
            select(AuditEvent.seq, AuditEvent.hash).where(col(AuditEvent.seq).in_({h.seq for _, h in heads}))
        ).all()
    )
    for file, head in heads:
        if held.get(head.seq) == head.hash or not signing.valid(public_key, head.message(), head.signature):
            continue
        run = session.get(Run, (head.release or {}).get("run", ""))
        if run is not None and run.status == "publishing":
            continue
        return [
            chain.Problem(
                head.seq,
                "rolled_back",
                f"the signed head of release {str(file.parent)!r} names record {head.seq}, which the database "
                f"{'holds with another hash' if head.seq in held else 'does not hold'}: it was rolled back or cut short",
            )
        ]
    return []


def outside_heads(session: Session, public_key: Any | None, roots: Sequence[Path]) -> list[chain.Problem]:
    """What the database does not hold of the heads kept outside it, for ``audit verify``: the
    witness's newest head (its signature checked against ``public_key``) and, with
    ``public_key``, every signed release head in ``roots`` (:func:`released`)."""
    path = path_for(session.get_bind())
    try:
        found = read(path, public_key) if path is not None else None
    except AuditRefused as error:
        return [chain.Problem(None, "witness", str(error))]
    problems = _witnessed(session, found.head, path) if found is not None and path is not None else []
    return problems + (released(session, roots, public_key) if public_key is not None else [])


def check_before_spending(session: Session, release_root: Path | None = None) -> None:
    """Refuse (:class:`AuditRefused`) a database that is tampered with, cut short or rolled
    back, before a run spends anything (:func:`spending_problem`)."""
    problem = spending_problem(session, release_root)
    if problem is not None:
        raise AuditRefused(
            f"refused before spending: {problem}; nothing was charged or published "
            "(`privrelease audit verify` names every problem)"
        )


def spending_problem(session: Session, release_root: Path | None = None, *, lock: bool = True) -> str | None:
    """The first reason :func:`check_before_spending` refuses the database, None when it
    passes; once per session, under the audit write lock (``lock=False``: a read-only session's
    snapshot, as the ledger commands read it). Verifies the records after the newest verified
    head (the witness's, or this process's), with their signatures when a signing key is set
    (:func:`service_public_key`), each ledger entry against its newest record, and then the
    signed release heads in :func:`head_folders`. Reads only."""
    if session.info.get(chain.VERIFIED):
        return None
    if lock:
        chain.lock(session)
    public = service_public_key()
    engine = session.get_bind()
    path = path_for(engine)
    try:
        witness = read(path, public) if path is not None else None
    except AuditRefused as error:
        problems = [chain.Problem(None, "witness", str(error))]
    else:
        problems = _witnessed(session, witness.head, path) if witness is not None and path is not None else []
        starts = [GENESIS, _verified.get(engine, GENESIS), witness.verified if witness else GENESIS]
        problems = problems or chain.verify_tail(session, max(starts, key=lambda h: h.seq), public)
        problems += _ledger_problems(session, public)
        if public is not None and not problems:
            problems = released(session, head_folders(release_root), public)
    if problems:
        return problems[0].message
    session.info[chain.VERIFIED] = True
    return None


def prepare(session: Session) -> Callable[[], None] | None:
    """Before a writing session commits: what to write to the witness once it has committed
    (None: nothing). The head moves forward only when this database extends the witnessed one;
    ``verified`` moves with it when this session's check passed."""
    appended = session.info.get(chain.APPENDED)
    verified = bool(session.info.get(chain.VERIFIED))
    if appended is None and not verified:
        return None
    engine = session.get_bind()
    current = appended or chain.head(session)
    path = path_for(engine)
    if path is None:
        return (lambda: _verified.__setitem__(engine, current)) if verified else None
    try:
        witness = read(path, None)  # its signature is the runs' check's business
    except AuditRefused:
        return None
    if witness is not None and (witness.head.seq > current.seq or _witnessed(session, witness.head, path)):
        return None  # not witnessed: the next run's check refuses this database
    new = Witness(current, current if verified else witness.verified if witness else GENESIS)

    def write() -> None:
        if verified:
            _verified[engine] = current
        try:
            _write(path, new)
        except OSError as error:  # the commit stands; the next check finds an older witness
            log.warning("could not update the witness file %s: %s", path, error.strerror or error)

    return write


def _write(path: Path, witness: Witness) -> None:
    """Replace the witness unless a newer head is witnessed already (writers commit in chain
    order but may write the file in another)."""
    body = witness.body()
    key = signing_key()
    if key is not None:
        body.update(signature=signing.sign(key, witness.message()), public_key=signing.public_text(key))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f"{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            newest = json.loads(path.read_text(encoding="utf-8"))["head"]["seq"]
        except (OSError, ValueError, KeyError, TypeError):
            newest = -1
        if not isinstance(newest, int) or newest <= witness.head.seq:
            chain.write_json(path, body)
