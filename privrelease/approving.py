"""Approving and revoking a policy version (``privrelease policy approve`` / ``revoke``, and the
Python API's :func:`privrelease.approve` / :func:`privrelease.revoke`): the policy loaded, what
the approval binds of its data settled (:func:`privrelease.flows.opening.approval_binding`),
the approval or the revocation request recorded in the audit database. Never imports Prefect.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sqlmodel import Session

    from privrelease.audit.approvals import PolicyFacts
    from privrelease.audit.approvers import Check
    from privrelease.audit.chain import Head
    from privrelease.audit.models import Approval

__all__ = ["Approved", "Revoked", "approve", "govern", "revoke"]


@dataclass(frozen=True)
class Approved:
    """A recorded approval: the ``policy`` version approved (name, version, sha256, canonical
    JSON), the ``approval`` row (approver, OS user, time, note, what it binds of the data), its
    ``signature`` check against the approver registry in effect (``.verified``, ``.status``,
    ``.fingerprint``: None unsigned), the policy's ``dataset_id`` and the audit ``chain_head``
    after it."""

    policy: PolicyFacts
    approval: Approval
    signature: Check
    dataset_id: str | None
    chain_head: Head

    @property
    def binds(self) -> str:
        """What the approval binds of the data, for people."""
        from privrelease.audit import bindings

        return bindings.bound(self.approval)


def approve(
    policy: str | Path,
    by: str,
    *,
    note: str | None = None,
    key: str | Path | None = None,
    binds: str = "data",
) -> Approved:
    """Record ``by``'s approval of the policy file's exact content (its canonical sha256) and of
    its data (``binds``: ``data``, the bytes at ``dataset.path`` now or the pinned
    ``dataset.sha256``; ``path``, whatever is at the resolved path when a run reads it), signed
    with the approver's private ``key`` file when given (required once an approver registry is
    in effect)."""
    from privrelease.audit import approvals, approvers, chain, signing
    from privrelease.audit.database import open_database, session
    from privrelease.flows.opening import approval_binding
    from privrelease.policies import load_policy

    loaded = load_policy(policy)
    facts = approvals.policy_facts(loaded)
    binding = approval_binding(loaded, binds)
    private = None if key is None else signing.private_key(str(key), "--key")
    with session(open_database()) as s:
        approval = approvals.approve_policy(s, facts, by, note=note, binding=binding, key=private)
        registry = approvals.effective_registry(s)
        head = chain.head(s)
    return Approved(facts, approval, approvers.check(facts, approval, registry), loaded.policy.dataset.id, head)


@dataclass(frozen=True)
class Revoked:
    """A revocation of every current approval of a ``policy`` version: how many approvals it
    names (``revoked``), the signed governance ``request`` document, and ``proposed``: the file
    it was written to for other approvers to sign (None: applied)."""

    policy: PolicyFacts
    revoked: int
    request: dict[str, Any]
    proposed: Path | None = None


def govern(s: Session, document: dict[str, Any], keys: Iterable[str | Path] | None, propose: Path | None) -> None:
    """Sign a governance request with the private ``keys`` files; write it to ``propose``,
    else apply it (:mod:`privrelease.audit.governance`)."""
    from privrelease.audit import governance, signing

    governance.sign(document, [signing.private_key(str(key), "--key") for key in keys or []])
    if propose is None:
        governance.apply(s, document)
    else:
        governance.dump(document, propose)


def revoke(
    ref: str,
    *,
    by: str,
    reason: str,
    keys: Iterable[str | Path] = (),
    propose: str | Path | None = None,
) -> Revoked:
    """Withdraw every current approval of a policy version (``NAME@VERSION`` or a sha256
    prefix): production runs refuse it until it is approved again. A governance record, signed
    with the approvers' private ``keys`` files (needed once a registry is pinned); with
    ``propose``, the signed request is written there instead of applied."""
    from privrelease.audit import approvals
    from privrelease.audit.database import open_database, session

    proposed = None if propose is None else Path(propose)
    with session(open_database()) as s:
        version = approvals.find_policy(s, ref)
        facts = approvals.PolicyFacts(version.name, version.version, version.sha256, version.canonical_json)
        document = approvals.revoke_request(s, facts, by=by, reason=reason)
        govern(s, document, keys, proposed)
    return Revoked(facts, len(document["request"]["approvals"]), document, proposed)
