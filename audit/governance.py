"""Governance: production mode, the approver registry and revocations, decided by approvers.

The service key (``PRIVRELEASE_SIGNING_KEY``) signs every audit record, so whoever runs
releases holds it: it does not govern. A governance action is an audit record (``mode_set``:
production mode and the approver registry it pins; ``approvals_revoked``: withdrawn approvals)
whose payload holds the ``request`` (what is decided, who proposed it, when, and ``prior``: the
digest of the previous governance record) and approvers' ``signatures`` of :func:`message`.

Every run and ``audit verify`` replay the governance records in order (:func:`state`):

* each names the one before it (``prior``): a governance record deleted, or one replayed from
  earlier, breaks the sequence; the state is then *broken*: production mode, runs refused;
* with no registry pinned, a record takes effect as it is: the first pin is trust on first use;
* with a registry in effect, a record that loosens (development mode, another registry) takes
  effect only when ``quorum`` distinct keys of *that* registry signed it; otherwise it is
  ignored (production mode and the registry stay) and ``audit verify`` flags it;
* a record that only tightens (production mode keeping the registry, a revocation) always takes
  effect: at worst it stops releases. A revocation not signed by the approver it names (which no
  command records, :func:`apply`) is flagged by ``audit verify``. Revocations name approvals by
  their signed random id (``Approval.nonce``), so a copied revoked approval is revoked too.

With quorum > 1 the request travels as a file (:func:`dump`, :func:`load`): proposed with
``--propose FILE``, signed by each approver (``audit governance sign``), then applied
(``audit governance apply``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, select

from privrelease.audit import chain, signing
from privrelease.audit.approvers import Registry
from privrelease.audit.models import Approval, AuditEvent, utcnow
from privrelease.errors import UserError
from privrelease.files import sha256_bytes

__all__ = ["KINDS", "State", "apply", "dump", "load", "message", "request", "sign", "signers", "state"]

DOMAIN = b"privrelease-governance-v1\n"
KINDS = {"mode": "mode_set", "revoke": "approvals_revoked"}
"""Action -> the kind of its audit record."""


def message(body: dict[str, Any]) -> bytes:
    """What an approver signs for a governance request ``body``."""
    return DOMAIN + chain.canonical_json(body).encode("utf-8")


def _digest(body: dict[str, Any]) -> str:
    return sha256_bytes(message(body))


@dataclass
class State:
    """What the governance records decide: the database's ``production`` mode, the approver
    ``registry`` in effect (and every one pinned, ``pins``), the ``revoked`` approval ids (and
    when each was first revoked, ``revoked_at``), the ``head`` a new request follows, the records
    ``ignored`` (``(seq, message)``), the revocations that took effect ``unsigned`` by whom they
    name (``(seq, message)``: they only withdraw approvals, so they count, but no command records
    one) and why the history is ``broken`` (None: it is not)."""

    production: bool = False
    registry: Registry | None = None
    pins: list[Registry] = field(default_factory=list)
    revoked: set[str] = field(default_factory=set)
    revoked_at: dict[str, datetime] = field(default_factory=dict)
    head: str | None = None
    ignored: list[tuple[int, str]] = field(default_factory=list)
    unsigned: list[tuple[int, str]] = field(default_factory=list)
    broken: str | None = None

    def registry_at(self, when: datetime) -> Registry | None:
        """The registry pinned at ``when`` (None: none was)."""
        return next((pin for pin in reversed(self.pins) if pin.pinned_at and pin.pinned_at <= when), None)


def signers(body: dict[str, Any], signatures: Any, registry: Registry) -> list[str]:
    """The approvers of ``registry`` whose valid signature of ``body`` is among ``signatures``
    (``[{"public_key", "signature"}]``), one per distinct key."""
    signed, found = message(body), {}
    for entry in signatures if isinstance(signatures, list) else []:
        public = entry.get("public_key") if isinstance(entry, dict) else None
        name = next((who for who, key in registry.keys.items() if key == public), None)
        if name is None or public is None:
            continue
        key = signing.decode_public(public)
        if key is not None and signing.valid(key, signed, entry.get("signature")):
            found[public] = name
    return sorted(found.values())


def _revoker_unsigned(current: State, body: dict[str, Any], signatures: Any) -> str | None:
    """Why a revocation is not signed as it must be under the registry in effect in ``current``
    (:func:`apply` refuses it, :func:`state` flags it): none of its ``signatures`` is an
    approver's (:func:`signers`), or none is the one it is recorded as by (``by``, as an
    approval's signer must be its approver); None when its ``by`` signed it, when it is no
    revocation, or when no registry is in effect."""
    registry = current.registry
    if body["action"] != "revoke" or registry is None:
        return None
    named = signers(body, signatures, registry)
    if not named:
        return "a revocation needs the signature of an approver of the registry in effect"
    by = body["by"]
    declared = registry.key_of(by)
    if declared is None:
        return f"{by!r} is not in the approver registry (a revocation is recorded as by --by, so they must sign it)"
    if declared not in {registry.keys[name] for name in named}:
        return f"--key is not the key it declares for {by!r} (a revocation is recorded as by --by, so one --key must be theirs)"
    return None


def _refusal(current: State, body: dict[str, Any], signatures: Any) -> str | None:
    """Why ``body`` would not take effect in ``current`` (None: it would)."""
    registry = current.registry
    if registry is None or body["action"] == "revoke":
        return None
    if not isinstance(body["production"], bool):
        raise ValueError("production must be true or false")
    pin = body.get("approvers")
    repin = pin is not None and Registry.from_pin(pin, utcnow()).pin() != registry.pin()
    if body["production"] and not repin:
        return None
    valid = signers(body, signatures, registry)
    if len(valid) >= registry.quorum:
        return None
    what = "pinning another approver registry" if repin else "switching production mode off"
    return (
        f"{what} needs the signatures of {registry.quorum} approver(s) of the registry in effect "
        f"(sha256 {registry.sha256[:12]}); it carries {len(valid)}{': ' + ', '.join(valid) if valid else ''}"
    )


def _take_effect(current: State, body: dict[str, Any], when: datetime) -> None:
    if body["action"] == "revoke":
        current.revoked.update(str(nonce) for nonce in body["approvals"])
        for nonce in body["approvals"]:
            current.revoked_at.setdefault(str(nonce), when)
        return
    current.production = body["production"]
    if body.get("approvers") is not None:
        current.registry = Registry.from_pin(body["approvers"], when)
        current.pins.append(current.registry)


def _legacy(session: Session, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
    """A record written before revision 0006 (no request, prior or signatures) as a request;
    its revocation names approval rows, read as their ids."""
    if kind == KINDS["mode"]:
        return {"action": "mode", "production": payload["production"], "approvers": payload.get("approvers")}
    rows = [int(key) for key in payload["approvals"]]
    nonces = session.exec(select(Approval.nonce).where(col(Approval.id).in_(rows))).all()
    return {"action": "revoke", "approvals": list(nonces)}


def state(session: Session) -> State:
    """Replay the governance records (module docstring); a broken history is production mode."""
    current, modern = State(), False
    statement = select(AuditEvent).where(col(AuditEvent.kind).in_(KINDS.values())).order_by(col(AuditEvent.seq))
    for record in session.exec(statement):
        what = f"governance record {record.seq} ({record.kind})"
        payload, edited = chain.vouch(record)
        if edited is not None or payload is None:
            current.broken = (
                f"{what} was edited after it was appended (its hash or text does not match its contents): "
                "production mode holds and runs are refused until the database is restored from a backup"
            )
            break
        signatures: Any
        try:
            body = payload.get("request")
            if body is None and not modern:
                digest, body, signatures = _digest(payload), _legacy(session, record.kind, payload), []
            elif not isinstance(body, dict) or KINDS.get(body.get("action", "")) != record.kind:
                raise ValueError("its request is missing or names another action")
            elif body.get("prior") != current.head:
                current.broken = (
                    f"{what} does not follow the governance record before it: one was deleted or replayed; "
                    "production mode holds and runs are refused until the database is restored from a backup"
                )
                break
            else:
                modern, digest, signatures = True, _digest(body), payload.get("signatures")
            why = _refusal(current, body, signatures)
            if why is None:
                unsigned = _revoker_unsigned(current, body, signatures)
                if unsigned is not None:
                    current.unsigned.append(
                        (record.seq, f"{what} by {body.get('by')!r} took effect unsigned: {unsigned}")
                    )
                _take_effect(current, body, record.time)
            else:
                current.ignored.append((record.seq, f"{what} by {body.get('by')!r} is ignored: {why}"))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            current.broken = f"{what} is malformed ({error}): production mode holds and runs are refused"
            break
        current.head = digest
    current.production = current.production or current.broken is not None
    return current


def request(session: Session, action: str, *, by: str, **facts: Any) -> dict[str, Any]:
    """A governance request document ``{"request", "signatures": []}`` for ``action`` ("mode":
    ``production``, ``note``, ``approvers`` (a pin or None); "revoke": ``policy_sha256``,
    ``approvals`` (their ids), ``reason``), proposed by ``by``, following the newest record."""
    chain.lock(session)  # no other governance record lands between this read and an apply in the session
    body = {"action": action, **facts, "by": by, "at": utcnow().isoformat(timespec="microseconds")}
    body["prior"] = state(session).head
    return {"request": body, "signatures": []}


def sign(document: dict[str, Any], keys: Iterable[Any]) -> dict[str, Any]:
    """Add the signature of each private key in ``keys`` to ``document`` (replacing an earlier
    one by the same key); returns it."""
    for key in keys:
        public = signing.public_text(key)
        entry = {"public_key": public, "signature": signing.sign(key, message(document["request"]))}
        document["signatures"] = [e for e in document["signatures"] if e.get("public_key") != public] + [entry]
    return document


def apply(session: Session, document: dict[str, Any]) -> AuditEvent:
    """Append the governance record of ``document`` when it takes effect now; otherwise a
    :class:`UserError` saying why (stale, broken history, too few signatures)."""
    chain.lock(session)  # the state read below is the one the record follows
    current = state(session)
    body, signatures = document["request"], document["signatures"]
    if current.broken:
        raise UserError(current.broken)
    if body.get("prior") != current.head:
        raise UserError("another governance record was appended since this request was proposed: propose it again")
    why = _refusal(current, body, signatures) or _revoker_unsigned(current, body, signatures)
    if why is not None:
        raise UserError(
            f"refused: {why}; sign it with --key (or propose it with --propose FILE and collect signatures with "
            "`privrelease audit governance sign FILE --key KEY`)"
        )
    return chain.append(session, KINDS[body["action"]], request=body, signatures=signatures)


def dump(document: dict[str, Any], path: Path) -> None:
    """Write a request document to ``path`` atomically; a :class:`UserError` names the file."""
    try:
        chain.write_json(path, document, indent=1, make_folder=False)  # a request goes where it is asked
    except OSError as error:
        raise UserError(f"cannot write the governance request {str(path)!r}: {error.strerror or error}") from None


def load(path: Path) -> dict[str, Any]:
    """Read a request document written by :func:`dump`; a :class:`UserError` names the file."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise UserError(f"cannot read the governance request {str(path)!r}: {error.strerror or error}") from None
    except ValueError as error:
        raise UserError(f"governance request {str(path)!r} is not JSON: {error}") from None
    if not _well_formed(document):
        raise UserError(
            f"governance request {str(path)!r} must hold {{'request': {{'action': 'mode' or 'revoke', ...}}, "
            "'signatures': [{'public_key', 'signature'}, ...]} as written by --propose"
        )
    return document


def _well_formed(document: Any) -> bool:
    body = document.get("request") if isinstance(document, dict) else None
    if not isinstance(body, dict) or not isinstance(document.get("signatures"), list):
        return False
    if not all(isinstance(entry, dict) for entry in document["signatures"]):
        return False
    if body.get("action") == "revoke":
        return isinstance(body.get("approvals"), list) and all(isinstance(n, str) for n in body["approvals"])
    pin = body.get("approvers")
    pinned = pin is None or (
        isinstance(pin, dict) and {"source", "sha256"} <= set(pin) and isinstance(pin.get("keys"), dict)
    )
    return body.get("action") == "mode" and isinstance(body.get("production"), bool) and pinned
