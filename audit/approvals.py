"""Policy versions and their approvals.

A policy is content-addressed: its ``sha256`` is the hash of its canonical form
(:mod:`privrelease.policies`). Approving records that hash with who approved it (``--by``), the
operating-system account (:func:`.bindings.os_account`: name and uid from the password
database, never the environment), the time, a note and what it binds of the data
(:mod:`.bindings`). A name@version is bound to
one hash once it is registered, which only an approval or a publication does
(:func:`register_policy`): a changed file under a registered name and version is refused (bump
``version``). A run that has not published records its content as a draft
(:func:`record_draft`), which binds nothing, so a refused draft is edited under its version. In
production mode a run calls :func:`require_approved`, which refuses an unapproved or changed
policy, or data the approvals it counts do not bind.

Production mode is a property of the audit database (:func:`set_production_mode`, a
governance record, :mod:`.governance`), so whoever runs a release cannot switch it off: a run
is in production mode when the database says so, or ``PRIVRELEASE_PRODUCTION`` or
``--production`` asks for it; once an approver registry is pinned, nothing turns it off but a
record signed by a quorum of its approvers.

Setting production mode pins the approver registry (:mod:`.approvers`) in its record; a
production run then counts only approvals signed by the registered key of the approver they
name (:func:`effective_registry`; without a pinned registry, the one ``PRIVRELEASE_APPROVERS``
names, if any, else unsigned approvals count as before).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from sqlmodel import Session, col, select

from privrelease.audit import approvers, bindings, chain, governance, signing, witness
from privrelease.audit.bindings import Account, Binding, os_account
from privrelease.audit.models import APPROVAL_RECORD_KINDS, Approval, AuditEvent, PolicyVersion, Run, utcnow
from privrelease.errors import UserError
from privrelease.files import sha256_text
from privrelease.settings import get_settings

__all__ = [
    "PolicyFacts",
    "approvals_of",
    "approve_policy",
    "author_of",
    "describe",
    "effective_registry",
    "find_policy",
    "list_policies",
    "mode_request",
    "policy_facts",
    "next_version",
    "record_draft",
    "register_policy",
    "registered_version",
    "version_clash",
    "VersionClash",
    "current_approvals",
    "pinned_registry",
    "production_mode",
    "require_approved",
    "revoke",
    "revoke_request",
    "set_production_mode",
]


@dataclass(frozen=True)
class PolicyFacts:
    """What the audit database keeps of a policy: name, version, hash, canonical JSON."""

    name: str
    version: str
    sha256: str
    canonical_json: str

    @classmethod
    def recorded(cls, session: Session, sha256: str) -> PolicyFacts:
        """The facts of the policy content recorded with hash ``sha256`` (registered or draft)."""
        row = session.exec(select(PolicyVersion).where(PolicyVersion.sha256 == sha256)).one()
        return cls(row.name, row.version, row.sha256, row.canonical_json)


def policy_facts(loaded: Any) -> PolicyFacts:
    """The facts of a policy loaded by ``privrelease.policies.load_policy``: name, version,
    sha256 and the canonical JSON that sha256 is the hash of."""
    from privrelease.policies import canonical_json

    text = canonical_json(loaded)
    assert sha256_text(text) == loaded.sha256, "policy hash is not of its canonical JSON"
    policy = loaded.policy
    return PolicyFacts(
        name=str(policy.name),
        version=str(policy.version),
        sha256=loaded.sha256,
        canonical_json=text,
    )


def register_policy(session: Session, facts: PolicyFacts, *, by_approval: bool = False) -> PolicyVersion:
    """Register a policy version: freeze its content under name@version (idempotent for the same
    hash; a draft of it, :func:`record_draft`, becomes registered). Called by an approval
    (``by_approval``) and in the transaction that publishes a release, and only then. The record
    names the OS account (name and uid) that registered it, its author (:func:`author_of`)
    unless it is an approval's. Raises :class:`UserError` (:class:`VersionClash`) when
    name@version is already registered with another hash."""
    return _record(session, facts, draft=False, by_approval=by_approval)


def record_draft(session: Session, facts: PolicyFacts) -> PolicyVersion:
    """The row of a policy's content for a run that has not published (yet): its registered
    version, or a ``draft`` row that claims no name@version (recorded once, with the OS account
    recording it: the draft's author, :func:`author_of`), so a refused or failed run of a draft
    leaves its content on record without freezing the version. Raises :class:`UserError` when
    name@version is registered with another hash (no run of it could ever publish)."""
    return _record(session, facts, draft=True)


def _record(session: Session, facts: PolicyFacts, *, draft: bool, **recorded: Any) -> PolicyVersion:
    """The row of ``facts.sha256``: returned as it is when it is registered (or a draft is
    wanted), else made or turned into a ``draft`` or registered row with a ``policy_drafted`` or
    ``policy_registered`` record naming the OS account and ``recorded`` facts."""
    chain.lock(session)  # before the look-up: concurrent registrations wait, then find it
    existing = session.exec(select(PolicyVersion).where(PolicyVersion.sha256 == facts.sha256)).first()
    if existing is not None and (draft or not existing.draft):
        return existing
    clash = version_clash(session, facts)
    if clash is not None:
        raise UserError(clash.message)
    account = os_account()
    version = existing or PolicyVersion(
        name=facts.name,
        version=facts.version,
        sha256=facts.sha256,
        canonical_json=facts.canonical_json,
    )
    version.draft, version.registered_at = draft, utcnow()
    chain.append(
        session,
        "policy_drafted" if draft else "policy_registered",
        version,
        policy=facts.name,
        version=facts.version,
        sha256=facts.sha256,
        os_user=account.name,
        os_uid=account.uid,
        **recorded,
    )
    return version


def registered_version(session: Session, name: str, version: str) -> PolicyVersion | None:
    """The content registered under ``name@version`` (None: none, drafts aside)."""
    statement = select(PolicyVersion).where(
        PolicyVersion.name == name, PolicyVersion.version == version, col(PolicyVersion.draft).is_(False)
    )
    return session.exec(statement).first()


@dataclass(frozen=True)
class VersionClash:
    """A policy's name@version is registered with other content: what is registered, since when
    and by what (``since``: approved, published or registered, with times), and a free version
    to give the draft instead (``suggested``)."""

    policy: str
    sha256: str
    registered_sha256: str
    since: str
    suggested: str

    @property
    def message(self) -> str:
        return (
            f"policy {self.policy} is registered with other content (sha256 {self.registered_sha256[:12]}, "
            f"{self.since}); this file has sha256 {self.sha256[:12]}: give this draft a new `version`, "
            f'e.g. version: "{self.suggested}"'
        )

    def as_dict(self) -> dict[str, str]:
        return {**asdict(self), "message": self.message}


def version_clash(session: Session, facts: PolicyFacts) -> VersionClash | None:
    """The clash when ``facts.name@facts.version`` is registered with another hash, else None:
    such a draft can be neither approved nor published (bump its ``version``)."""
    other = registered_version(session, facts.name, facts.version)
    if other is None or other.sha256 == facts.sha256:
        return None
    since = []
    approved = approvals_of(session, other.sha256)
    if approved:
        since.append(f"approved {_minute(approved[0].approved_at)} UTC by {approved[0].approved_by!r}")
    published = session.exec(
        select(Run)
        .where(Run.policy_sha256 == other.sha256, Run.status == "succeeded")
        .order_by(col(Run.finished_at), col(Run.id))
    ).first()
    if published is not None and published.finished_at is not None:
        since.append(f"published {_minute(published.finished_at)} UTC by run {published.id[:12]}")
    taken = set(
        session.exec(
            select(PolicyVersion.version).where(PolicyVersion.name == facts.name, col(PolicyVersion.draft).is_(False))
        )
    )
    return VersionClash(
        policy=f"{facts.name}@{facts.version}",
        sha256=facts.sha256,
        registered_sha256=other.sha256,
        since=", ".join(since) or f"registered {_minute(other.registered_at)} UTC",
        suggested=next_version(facts.version, taken),
    )


def next_version(version: str, taken: Iterable[str]) -> str:
    """The first version after ``version`` not in ``taken``: its last number counted up
    (``3`` -> ``4``, ``1.2`` -> ``1.3``, ``v7`` -> ``v8``), else ``-2``, ``-3``, ... appended."""
    taken = set(taken)
    match = re.fullmatch(r"(.*?)(\d+)", version)
    prefix, number = (match.group(1), int(match.group(2)) + 1) if match else (f"{version}-", 2)
    while f"{prefix}{number}" in taken:
        number += 1
    return f"{prefix}{number}"


def _minute(when: Any) -> str:
    return when.strftime("%Y-%m-%d %H:%M")


def author_of(session: Session, sha256: str) -> Account | None:
    """The OS account that first recorded the policy hash: a run of its draft
    (:func:`record_draft`) or its registration (None: registered by its first approval, or
    before registrations named the OS user; uid None before they recorded it)."""
    kinds = ("policy_drafted", "policy_registered")
    statement = select(AuditEvent).where(col(AuditEvent.kind).in_(kinds)).order_by(col(AuditEvent.seq))
    for record in session.exec(statement):
        payload = json.loads(record.payload_json)
        if payload.get("sha256") == sha256:
            if payload.get("by_approval") or not payload.get("os_user"):
                return None
            return Account(payload["os_user"], payload.get("os_uid"))
    return None


def approve_policy(
    session: Session,
    facts: PolicyFacts,
    approved_by: str,
    *,
    note: str | None = None,
    binding: Binding | None = None,
    account: Account | None = None,
    key: Any = None,
) -> Approval:
    """Register the policy version if new and record an approval of its hash and of the data
    ``binding`` (None: no data, which no production run counts), by ``account`` (default: this
    process's, :func:`.bindings.os_account`), signed with the approver's private ``key`` when
    given (:func:`.approvers.sign`). When a registry is in effect (:func:`effective_registry`)
    the approval must be signed by the key it declares for ``approved_by``: anything else would
    not count, so it is refused."""
    approved_by = approved_by.strip()
    if not approved_by:
        raise UserError("--by must name the person approving; got an empty name")
    registry = effective_registry(session)
    approved_at, nonce = utcnow(), uuid.uuid4().hex
    signature = public = None
    if key is not None:
        signature, public = approvers.sign(key, facts, approved_by, approved_at, note, nonce, binding)
    why = None if registry is None else _not_counting(registry, approved_by, public)
    if registry is not None and why is not None:
        raise UserError(f"the approver registry ({registry.source}, sha256 {registry.sha256[:12]}) is in effect: {why}")
    register_policy(session, facts, by_approval=True)
    account = account or os_account()
    approval = Approval(
        policy_sha256=facts.sha256,
        approved_by=approved_by,
        os_user=account.name,
        os_uid=account.uid,
        note=note,
        approved_at=approved_at,
        signature=signature,
        public_key=public,
        nonce=nonce,
        binds=None if binding is None else binding.binds,
        data_path=None if binding is None else binding.path,
        data_sha256=None if binding is None else binding.sha256,
    )
    chain.append(
        session,
        "policy_approved",
        approval,
        sha256=facts.sha256,
        approved_by=approved_by,
        key=None if public is None else signing.fingerprint(public),
    )
    return approval


def _not_counting(registry: approvers.Registry, approved_by: str, public: str | None) -> str | None:
    """Why an approval by ``approved_by`` signed with ``public`` (None: unsigned) would not count
    against ``registry``; None when it would."""
    declared = registry.key_of(approved_by)
    if declared is None:
        return f"{approved_by!r} is not in it"
    if public is None:
        return "an unsigned approval would not count (pass --key)"
    return None if public == declared else f"--key is not the key it declares for {approved_by!r}"


def approvals_of(session: Session, sha256: str) -> list[Approval]:
    """Approvals of a policy hash, oldest first."""
    statement = (
        select(Approval).where(Approval.policy_sha256 == sha256).order_by(col(Approval.approved_at), col(Approval.id))
    )
    return list(session.exec(statement).all())


def revoke_request(session: Session, facts: PolicyFacts, *, by: str, reason: str) -> dict[str, Any]:
    """A governance request (:mod:`.governance`) revoking every current approval of a policy
    version, by their ids: a production run then needs new approvals."""
    if not by.strip() or not reason.strip():
        raise UserError("--by and --reason are required to revoke (who and why are recorded)")
    current = current_approvals(session, facts.sha256)
    if not current:
        raise UserError(f"policy {facts.name}@{facts.version} (sha256 {facts.sha256[:12]}) has no approval to revoke")
    nonces = [approval.nonce for approval in current]
    return governance.request(
        session, "revoke", by=by.strip(), policy_sha256=facts.sha256, approvals=nonces, reason=reason
    )


def revoke(session: Session, facts: PolicyFacts, *, by: str, reason: str, keys: Iterable[Any] = ()) -> int:
    """Revoke every current approval of a policy version, signed with the approvers' private
    ``keys`` (needed once a registry is pinned; ``by``'s own among them). Returns how many
    were revoked."""
    document = governance.sign(revoke_request(session, facts, by=by, reason=reason), keys)
    governance.apply(session, document)
    return len(document["request"]["approvals"])


def current_approvals(session: Session, sha256: str) -> list[Approval]:
    """Approvals of a policy hash that no revocation withdrew (by their id), oldest first."""
    revoked = governance.state(session).revoked
    return [approval for approval in approvals_of(session, sha256) if approval.nonce not in revoked]


def shortfall(session: Session, facts: PolicyFacts) -> str | None:
    """Why no production run could go by this policy version's approvals as they stand,
    whatever its data and runner: no current approval, or fewer distinct approvers than its
    ``approval.approvers`` whose approvals bind data and the registry in effect verifies
    (revoked ones never count); None when enough do. A run then still checks what they bind and, with
    ``independent``, who runs it (:func:`require_approved`)."""
    current = current_approvals(session, facts.sha256)
    if not current:
        return "not approved" if not approvals_of(session, facts.sha256) else "every approval revoked"
    registry = effective_registry(session)
    counting = [
        a
        for a in current
        if Binding.of(a) is not None and (registry is None or approvers.check(facts, a, registry).verified)
    ]
    people = _people(counting, registry)
    needed = (json.loads(facts.canonical_json)["policy"].get("approval") or {}).get("approvers", 1)
    if len(people) >= needed:
        return None
    verified = " verified by the approver registry" if registry is not None else ""
    return f"{len(people)} of the {needed} distinct approver(s){verified} it needs (approval.approvers)"


def revoked_since(session: Session, run: Run) -> str | None:
    """A note when every approval of the policy of ``run`` was revoked after it finished (the
    report and statement of a production release, handed back as they are, still say
    approved); None otherwise."""
    state = governance.state(session)
    made = approvals_of(session, run.policy_sha256)
    if not made or any(approval.nonce not in state.revoked for approval in made):
        return None
    when = max(state.revoked_at[approval.nonce] for approval in made)
    if run.finished_at is not None and when < run.finished_at:
        return None
    policy = session.exec(select(PolicyVersion).where(PolicyVersion.sha256 == run.policy_sha256)).one()
    return (
        f"the approval of policy {policy.name}@{policy.version} was revoked on {when:%Y-%m-%d %H:%M} UTC, after "
        "this release: the report and statement handed back still say it was approved"
    )


def require_approved(
    session: Session,
    facts: PolicyFacts,
    rule: Any = None,
    *,
    data_path: str,
    data_sha256: str | None = None,
    runner: Account | None = None,
) -> Approval:
    """The earliest counting approval of exactly this policy hash for the data at ``data_path``
    (fingerprint ``data_sha256``; None: not known yet) when the policy's approval ``rule``
    holds, or :class:`UserError` saying what is missing: a changed policy, no approval, a
    revoked one, too few approvers, data no approval binds. An approval counts when no
    revocation withdrew it, its signature verifies against the registry in effect
    (:func:`effective_registry`, if any), it binds this data (:meth:`.bindings.Binding.refusal`;
    an approval binding nothing never counts, so call this again once the data is
    fingerprinted) and, with ``independent``, it was made by neither the ``runner`` (default:
    this process's account) nor the policy's author (:func:`author_of`), whether by account
    name or uid. ``approvers`` distinct people must approve (distinct registered keys when a
    registry is in effect). A broken governance history refuses every run."""
    broken = governance.state(session).broken
    if broken:
        raise UserError(broken)
    registry = effective_registry(session)
    independent = rule is not None and rule.independent
    runner = runner or os_account()
    author = author_of(session, facts.sha256) if independent else None
    excluded = [("the runner", runner), *([("the policy's author", author)] if author else [])] if independent else []
    counted, ignored = [], []
    as_recorded = witness.recorded(session, kinds=APPROVAL_RECORD_KINDS)  # a row edited in place never counts
    for approval in current_approvals(session, facts.sha256):
        verdict = approvers.check(facts, approval, registry) if registry is not None else None
        binding = Binding.of(approval)
        why: str | None
        if verdict is not None and not verdict.verified:
            why = verdict.reason
        elif binding is None:
            why = "it binds no data (made before approvals did): approve it again"
        else:
            why = binding.refusal(data_path, data_sha256)
        edited = as_recorded.problem(approval)
        who = next((role for role, account in excluded if account.same(approval.os_user, approval.os_uid)), None)
        why = (
            why
            or (edited and f"its row is not as recorded: {edited.message}")
            or (who and f"OS user {approval.os_user!r} is {who}")
        )
        if why:
            ignored.append(f"approval {approval.id} by {approval.approved_by!r} ({why})")
        else:
            counted.append(approval)
    people = _people(counted, registry)
    needed = rule.approvers if rule is not None else 1
    if len(people) >= needed:
        return counted[0]
    if counted or ignored or approvals_of(session, facts.sha256):
        besides = f" other than the runner's OS user {runner.name!r}" if independent else ""
        besides += f" and the author's {author.name!r}" if author else ""
        signed = " signed by their registered key" if registry is not None else ""
        why = f"; ignored: {', '.join(ignored)}" if ignored else ""
        raise UserError(
            f"policy {facts.name}@{facts.version} (sha256 {facts.sha256[:12]}) has {len(people)} current "
            f"approver(s){besides}{signed}; it needs {needed} distinct (approval.approvers; revoked approvals do "
            f"not count){why}: `privrelease policy approve POLICY.yaml --by NAME`"
        )
    same_name = registered_version(session, facts.name, facts.version)
    if same_name is not None and same_name.sha256 != facts.sha256:
        raise UserError(
            f"policy {facts.name}@{facts.version} was changed: its sha256 is "
            f"{facts.sha256[:12]} but the registered version has {same_name.sha256[:12]}; "
            "production mode runs only approved policies (bump `version` and approve it)"
        )
    raise UserError(
        f"policy {facts.name}@{facts.version} (sha256 {facts.sha256[:12]}) is not approved; "
        "production mode runs only approved policies: "
        "`privrelease policy approve POLICY.yaml --by NAME`"
    )


def _people(approvals: list[Approval], registry: approvers.Registry | None) -> set[str | None]:
    """The distinct people who made ``approvals``: by registered key when a registry is in
    effect, else by name (case and surrounding spaces ignored)."""
    return {
        registry.key_of(a.approved_by) if registry is not None else a.approved_by.strip().casefold() for a in approvals
    }


def describe(session: Session, facts: Any, approval: Approval | None) -> dict[str, Any] | None:
    """What a report shows of the approvals of a run's policy: the ``approval`` the run went by
    (approver, OS user, time, note, what it binds) and every current approval with its
    approver, what it binds, key fingerprint and signature status against the registry in
    effect."""
    if approval is None:
        return None
    registry = effective_registry(session)
    listed = []
    for current in current_approvals(session, facts.sha256):
        verdict = approvers.check(facts, current, registry)
        listed.append(
            {
                "approved_by": current.approved_by,
                "os_user": current.os_user,
                "approved_at": current.approved_at,
                "binds": bindings.bound(current),
                "key": verdict.fingerprint,
                "signature": verdict.status,
            }
        )
    return {
        "approved_by": approval.approved_by,
        "os_user": approval.os_user,
        "approved_at": approval.approved_at,
        "note": approval.note,
        "binds": bindings.bound(approval),
        "approvals": listed,
    }


def list_policies(session: Session) -> list[PolicyVersion]:
    """Every registered policy version (drafts aside), by name then registration time."""
    statement = (
        select(PolicyVersion)
        .where(col(PolicyVersion.draft).is_(False))
        .order_by(col(PolicyVersion.name), col(PolicyVersion.registered_at), col(PolicyVersion.id))
    )
    return list(session.exec(statement).all())


def find_policy(session: Session, ref: str) -> PolicyVersion:
    """``NAME@VERSION``, ``NAME`` (its newest registered version) or a sha256 prefix of a
    registered version (drafts aside)."""
    name, _, version = ref.partition("@")
    registered = col(PolicyVersion.draft).is_(False)
    statement = select(PolicyVersion).where(PolicyVersion.name == name, registered)
    if version:
        statement = statement.where(PolicyVersion.version == version)
    statement = statement.order_by(col(PolicyVersion.registered_at).desc(), col(PolicyVersion.id).desc())
    found = session.exec(statement).first()
    if found is None and not version and len(ref) >= 6:
        by_hash = list(
            session.exec(
                select(PolicyVersion).where(col(PolicyVersion.sha256).startswith(ref.lower()), registered)
            ).all()
        )
        if len(by_hash) == 1:
            found = by_hash[0]
    if found is None:
        raise UserError(f"no registered policy {ref!r} (see `privrelease policy list`)")
    return found


def production_mode(session: Session) -> bool:
    """The database's mode as its governance records decide it (:func:`.governance.state`)."""
    return governance.state(session).production


def pinned_registry(session: Session) -> approvers.Registry | None:
    """The approver registry in effect by the governance records (None: none pinned yet), with
    the time it was pinned; it stays in development mode too (it governs)."""
    return governance.state(session).registry


def effective_registry(session: Session) -> approvers.Registry | None:
    """The registry approvals are checked against: the site file's (:mod:`privrelease.site`:
    the database cannot override it), else the pinned one, else the one
    ``PRIVRELEASE_APPROVERS`` names, else None (unsigned approvals count)."""
    if get_settings().site.approvers is not None:
        return approvers.configured()
    return pinned_registry(session) or approvers.configured()


def mode_request(
    session: Session, production: bool, *, by: str, note: str | None = None, registry: approvers.Registry | None = None
) -> dict[str, Any]:
    """A governance request (:mod:`.governance`) setting the database's mode, pinning the
    approver ``registry`` (its content, quorum and sha256) when given."""
    if not by.strip():
        raise UserError("--by must name who sets the mode; got an empty name")
    pin = None if registry is None else registry.pin()
    return governance.request(session, "mode", by=by.strip(), production=production, note=note, approvers=pin)


def set_production_mode(
    session: Session,
    production: bool,
    *,
    by: str,
    note: str | None = None,
    registry: approvers.Registry | None = None,
    keys: Iterable[Any] = (),
) -> None:
    """Record the database's mode, pinning ``registry`` when given, signed with the approvers'
    private ``keys``: once a registry is pinned, development mode or another registry needs its
    quorum (:func:`.governance.apply` refuses otherwise)."""
    governance.apply(
        session, governance.sign(mode_request(session, production, by=by, note=note, registry=registry), keys)
    )
