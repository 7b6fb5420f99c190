"""Signed approvals: the approver registry, the approval message and its verification.

The **registry** (``PRIVRELEASE_APPROVERS``, a YAML file) declares who may approve and with
which key::

    approvers:
      Disclosure Review Board: 8Jx0...=   # the approver's Ed25519 public key: base64 of its
      Ada Lovelace: q3Lw...=              # 32 raw bytes, the .pub file of `privrelease audit keygen`
    governance:
      quorum: 2                           # optional (default 1): signatures a governance action needs

``privrelease audit mode production`` pins the registry's content (and its sha256) in its
audit record; from then on a production run counts only approvals whose signature verifies
against the pinned key of the approver they name (:func:`check`), and governance actions need
``quorum`` of its approvers (:mod:`.governance`). Names match ignoring case.

An approval signs, with the approver's private key (``policy approve --key``), the message
``b"privrelease-approval-v1\\n"`` + canonical JSON of the policy's sha256, name and version, the
dataset it binds (``dataset.id`` and the pinned vintage ``dataset.sha256``, as the policy
states them), the approver's name, the approval time, the note, the approval's own random id
and what it binds of the data (:class:`.bindings.Binding`: the resolved path and the data's
sha256) (:func:`message`): a signature never passes for another policy, person, time, note or
data, nor for a copy of the approval (a revocation names the id), an audit record or a release
(other domains, :mod:`.signing`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from privrelease.audit import chain, signing
from privrelease.audit.bindings import Binding
from privrelease.errors import UserError
from privrelease.files import sha256_bytes

__all__ = ["DOMAIN", "Check", "Registry", "check", "configured", "load", "message", "sign"]

DOMAIN = b"privrelease-approval-v1\n"
UNSIGNED = "unsigned"
FORM = (
    "expected a mapping `approvers:` of approver names to Ed25519 public keys (base64 of 32 bytes, "
    "the .pub file of `privrelease audit keygen`), and optionally `governance: {quorum: N}`"
)


@dataclass(frozen=True)
class Registry:
    """Approver name -> public key (base64), from ``source`` whose bytes hash to ``sha256``."""

    source: str
    sha256: str
    keys: dict[str, str]
    pinned_at: datetime | None = None
    """When production mode pinned it (None: read from the file)."""
    quorum: int = 1
    """How many distinct approvers' keys must sign a governance action (:mod:`.governance`)."""

    def key_of(self, name: str) -> str | None:
        """The registered key of ``name`` (ignoring case and surrounding spaces), or None."""
        wanted = name.strip().casefold()
        return next((key for who, key in self.keys.items() if who.casefold() == wanted), None)

    def pin(self) -> dict[str, Any]:
        """What an audit record keeps of it (:meth:`from_pin` reads it back)."""
        keys = dict(sorted(self.keys.items()))
        return {"source": self.source, "sha256": self.sha256, "keys": keys, "quorum": self.quorum}

    @classmethod
    def from_pin(cls, pin: dict[str, Any], pinned_at: datetime) -> Registry:
        """A pinned registry; a pin without ``quorum`` (before governance, revision 0006) has 1."""
        return cls(str(pin["source"]), str(pin["sha256"]), dict(pin["keys"]), pinned_at, int(pin.get("quorum", 1)))


def load(path: str | Path, *, what: str = "PRIVRELEASE_APPROVERS") -> Registry:
    """Read and check a registry file; a :class:`UserError` names the file, the entry and the
    expected form."""
    import yaml

    where = f"{what}={str(path)!r}"
    try:
        data = Path(path).read_bytes()
        body = yaml.safe_load(data)
    except OSError as error:
        raise UserError(f"{where}: cannot read the approver registry: {error.strerror or error}") from None
    except yaml.YAMLError as error:
        raise UserError(f"{where} is not valid YAML ({str(error).splitlines()[0]}); {FORM}") from None
    known = isinstance(body, dict) and "approvers" in body and set(body) <= {"approvers", "governance"}
    entries = body.get("approvers") if known else None
    if not isinstance(entries, dict) or not entries:
        got = sorted(map(str, body)) if isinstance(body, dict) else type(body).__name__
        raise UserError(f"{where}: {FORM}; got {got if body is not None else 'an empty file'}")
    keys: dict[str, str] = {}
    for name, key in entries.items():
        if not isinstance(name, str) or not name.strip():
            raise UserError(f"{where}: approver name {name!r} must be a non-empty text; {FORM}")
        if not isinstance(key, str) or signing.decode_public(key) is None:
            raise UserError(f"{where}: the key of approver {name!r} ({key!r}) is not valid; {FORM}")
        if any(other.casefold() == name.strip().casefold() for other in keys):
            raise UserError(f"{where}: approver {name!r} is declared twice (names match ignoring case)")
        keys[name.strip()] = key.strip()
    governance = body.get("governance", {})
    quorum = governance.get("quorum", 1) if isinstance(governance, dict) and set(governance) <= {"quorum"} else None
    distinct = len(set(keys.values()))
    if type(quorum) is not int or not 1 <= quorum <= distinct:
        raise UserError(
            f"{where}: governance must be `{{quorum: N}}` with N a whole number from 1 to {distinct} (the distinct "
            f"approver keys); got {governance!r}"
        )
    source = str(Path(path).expanduser().resolve())
    return Registry(source, sha256_bytes(data), keys, quorum=quorum)


def configured() -> Registry | None:
    """The registry ``PRIVRELEASE_APPROVERS`` names, or None when it is not set."""
    from privrelease.settings import get_settings

    path = get_settings().approvers
    return load(path) if path else None


def message(
    policy: Any,
    approved_by: str,
    approved_at: Any,
    note: str | None,
    approval_id: str | None,
    binding: Binding | None = None,
) -> bytes:
    """What an approval of ``policy`` (a ``PolicyFacts`` or ``PolicyVersion``: ``sha256``,
    ``name``, ``version``, ``canonical_json``) with the random ``approval_id``, binding the data
    ``binding``, signs (None: an approval binding nothing, as before revision 0005)."""
    dataset = json.loads(policy.canonical_json).get("policy", {}).get("dataset", {})
    body = {
        "policy_sha256": policy.sha256,
        "policy": policy.name,
        "version": policy.version,
        "dataset_id": dataset.get("id"),
        "vintage_sha256": dataset.get("sha256"),
        "approved_by": approved_by,
        "approved_at": approved_at,
        "note": note,
        "approval_id": approval_id,
    }
    if binding is not None:
        body["data"] = binding.signed()
    return DOMAIN + chain.canonical_json(body).encode("utf-8")


def sign(
    key: Any,
    policy: Any,
    approved_by: str,
    approved_at: Any,
    note: str | None,
    approval_id: str,
    binding: Binding | None = None,
) -> tuple[str, str]:
    """``(signature, public key)``, both base64, of an approval by the holder of ``key``."""
    signed = message(policy, approved_by, approved_at, note, approval_id, binding)
    return signing.sign(key, signed), signing.public_text(key)


@dataclass(frozen=True)
class Check:
    """How an approval's signature fares: ``verified`` against the registry's key of its
    approver (or, without a registry, against the key it names), else ``reason``; ``fingerprint``
    of the key it was signed with (None: unsigned)."""

    verified: bool
    reason: str
    fingerprint: str | None

    @property
    def status(self) -> str:
        """One phrase for people: the reason, prefixed ``not verified:`` unless verified or unsigned."""
        return self.reason if self.verified or self.reason == UNSIGNED else f"not verified: {self.reason}"


def check(policy: Any, approval: Any, registry: Registry | None) -> Check:
    """Verify ``approval`` (an ``Approval`` row) of ``policy`` against ``registry`` (None: only
    that the signature is the named key's, which proves nothing about who holds it)."""
    printed = signing.fingerprint(approval.public_key) if approval.public_key else None
    if not approval.signature or not approval.public_key:
        return Check(False, UNSIGNED, printed)
    expected = approval.public_key if registry is None else registry.key_of(approval.approved_by)
    if expected is None:
        return Check(False, f"{approval.approved_by!r} is not in the approver registry", printed)
    key = signing.decode_public(expected)
    signed = message(
        policy, approval.approved_by, approval.approved_at, approval.note, approval.nonce, Binding.of(approval)
    )
    if key is None or not signing.valid(key, signed, approval.signature):
        whose = (
            "the key it names" if registry is None else f"the key the registry declares for {approval.approved_by!r}"
        )
        return Check(False, f"the signature does not verify against {whose} (forged or altered)", printed)
    return Check(True, "verified" if registry else "signature valid; key not checked against a registry", printed)


def problems(
    approvals: list[Any], policies: dict[str, Any], registry_at: Callable[[datetime], Registry | None]
) -> list[tuple[Any, str, str]]:
    """``(approval id, kind, message)`` for each approval whose signature does not verify
    (against the registry in effect when it was made, ``registry_at(approved_at)``, else the
    key it names), and each unsigned one made after that registry was pinned: what a database
    writer without an approver's key inserted or altered. ``policies``: sha256 -> the policy
    version row."""
    found = []
    for approval in approvals:
        policy = policies.get(approval.policy_sha256)
        if policy is None:
            continue
        registry = registry_at(approval.approved_at)
        verdict = check(policy, approval, registry)
        what = f"approval row {approval.id!r} by {approval.approved_by!r} of {policy.name}@{policy.version}"
        if approval.signature and not verdict.verified:
            found.append((approval.id, "approval_not_verified", f"{what}: {verdict.reason}"))
        elif not approval.signature and registry is not None and registry.pinned_at is not None:
            if approval.approved_at > registry.pinned_at:
                found.append(
                    (
                        approval.id,
                        "approval_unsigned",
                        f"{what} is unsigned although made after the approver registry was pinned",
                    )
                )
    return found
