"""Separation of duties (issue 15, items 2 and 4; privrelease.audit.governance): the service key
does not govern. Each test is an attack that succeeded before governance records: the runner
(holding PRIVRELEASE_SIGNING_KEY) switching production mode off or pinning her own registry,
a database writer (no keys) copying a revoked approval or deleting a revocation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import test_flow_steps as flow_steps
import test_signed_approvals as signed
from sqlmodel import col, select
from test_audit_chain import check, fresh_engine
from test_audit_signing import rechain
from test_signed_approvals import approve, facts, forge, require, write_registry
from typer.testing import CliRunner

from privrelease.audit import approvals, approvers, chain, database, governance, signing
from privrelease.audit.models import Approval, AuditEvent
from privrelease.errors import UserError

engine, keys = signed.engine, signed.keys


@pytest.fixture
def service_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The runner's service key, set: every record she writes is validly signed."""
    public = signing.generate(tmp_path / "service.key")
    monkeypatch.setenv("PRIVRELEASE_SIGNING_KEY", str(tmp_path / "service.key"))
    return public


def append_unsigned(engine: Any, production: bool, registry: approvers.Registry | None = None) -> None:
    """What the runner can do beyond the CLI: append a well-formed, correctly linked governance
    record signed by the service key (as every record), but by no approver."""
    with database.session(engine) as s:
        document = approvals.mode_request(s, production, by="Runner", registry=registry)
        chain.append(s, "mode_set", request=document["request"], signatures=[])


def mode(engine: Any) -> tuple[bool, approvers.Registry | None]:
    with database.session(engine, readonly=True) as s:
        return approvals.production_mode(s), approvals.pinned_registry(s)


def test_the_service_key_cannot_switch_production_mode_off(engine: Any, keys: dict[str, Any], service_key: str) -> None:
    """Before: `audit mode development --by X`, an unapproved run, mode back to production."""
    with database.session(engine) as s, pytest.raises(UserError, match="switching production mode off needs the "
                                                                       "signatures of 1 approver"):  # fmt: skip
        approvals.set_production_mode(s, False, by="Runner")
    append_unsigned(engine, False)  # past the CLI: a record only the service key signed
    assert mode(engine)[0] is True  # ignored: production stays on
    with pytest.raises(UserError, match="is not approved"):
        require(engine)
    result = check(engine, public_key=signing.public_key(service_key))
    assert [p.kind for p in result.problems] == ["unsigned"] + ["governance_ignored"]  # the fixture's pin: no key
    assert "switching production mode off needs the signatures of 1 approver" in result.problems[1].message
    # the old record form (no request, no prior) after governance records breaks the history
    with database.session(engine) as s:
        chain.append(s, "mode_set", production=False, by="Runner", os_user="runner")
    with database.session(engine, readonly=True) as s:
        assert governance.state(s).broken and approvals.production_mode(s)
    with pytest.raises(UserError, match="is malformed"):
        require(engine)


def test_an_approver_quorum_switches_the_mode(
    tmp_path: Path, engine: Any, keys: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Quorum 2, approvers on different machines: propose, sign, apply (the CLI); one valid
    signature, or a replay of the applied request, is refused (exit 2, one line)."""
    from privrelease.cli import app

    two = write_registry(tmp_path / "two.yaml", {n: keys["public"][n] for n in ("Ada", "Grace")})
    two.write_text(two.read_text() + "governance:\n  quorum: 2\n")
    with database.session(engine) as s:  # re-pinning needs the old registry's quorum (1): Ada
        approvals.set_production_mode(s, True, by="Ada", registry=approvers.load(two), keys=[keys["Ada"]])
    with database.session(engine) as s, pytest.raises(UserError, match="needs the signatures of 2 .* carries 1: Ada"):
        approvals.set_production_mode(s, False, by="Ada", keys=[keys["Ada"]])
    monkeypatch.setenv("PRIVRELEASE_DB_URL", engine.url.render_as_string(hide_password=False))
    request, key = tmp_path / "request.json", lambda name: str(tmp_path / f"{name}.key")
    steps = [
        (["audit", "mode", "development", "--by", "Ada", "--key", key("ada"), "--propose", str(request)], 0),
        (["audit", "governance", "apply", str(request)], 2),  # Ada alone
        (["audit", "governance", "sign", str(request), "--key", key("mallory")], 0),  # not registered
        (["audit", "governance", "apply", str(request)], 2),
        (["audit", "governance", "sign", str(request), "--key", key("grace")], 0),
        (["audit", "governance", "apply", str(request)], 0),
        (["audit", "governance", "apply", str(request)], 2),  # a replay
    ]
    messages = []
    for args, code in steps:
        result = CliRunner().invoke(app, args)
        refused = isinstance(result.exception, UserError) and result.exception.exit_code == 2
        assert (2 if refused else result.exit_code) == code, (args, result.output, result.exception)
        messages.append(str(result.exception) if code else result.output)
    assert "carries 1: Ada" in messages[1] and "carries 1: Ada" in messages[3]
    assert "another governance record was appended since this request was proposed" in messages[6]
    production, registry = mode(engine)
    assert production is False and registry is not None and registry.quorum == 2  # the registry still governs
    assert check(engine).ok


def test_the_runner_cannot_pin_her_own_registry(tmp_path: Path, engine: Any, keys: dict[str, Any]) -> None:
    """Before: `audit mode production --approvers mine.yaml` listing her key under Ada's name;
    her approval then counted and audit verify called Ada's genuine approval forged."""
    genuine = approve(engine, "Ada", keys["Ada"], policy=facts("2"))  # Ada's real approval of another version
    mine = approvers.load(write_registry(tmp_path / "mine.yaml", {"Ada": keys["public"]["Mallory"]}))
    with database.session(engine) as s, pytest.raises(UserError, match="pinning another approver registry needs"):
        approvals.set_production_mode(s, True, by="Runner", registry=mine)
    append_unsigned(engine, False)  # the old dance: development first (drops nothing now) ...
    append_unsigned(engine, True, mine)  # ... then her registry
    assert mode(engine)[0] is True and mode(engine)[1].key_of("Ada") == keys["public"]["Ada"]
    with database.session(engine) as s:
        approvals.register_policy(s, facts())
    signature, public = approvers.sign(keys["Mallory"], facts(), "Ada", genuine.approved_at, None, "2" * 32)
    forge(
        engine,
        Approval(policy_sha256=facts().sha256, approved_by="Ada", os_user="m", approved_at=genuine.approved_at,
                 signature=signature, public_key=public, nonce="2" * 32),
    )  # fmt: skip
    with pytest.raises(UserError, match=r"has 0 current approver.*does not verify against the key the registry"):
        require(engine)
    problems = check(engine).problems
    assert sorted(p.kind for p in problems) == ["approval_not_verified", "governance_ignored", "governance_ignored"]
    flagged = next(p.message for p in problems if p.kind == "approval_not_verified")
    assert "approval row 2 " in flagged and f"row {genuine.id} " not in flagged  # hers, not Ada's


def test_a_copied_revoked_approval_stays_revoked(engine: Any, keys: dict[str, Any]) -> None:
    """Before: the signature covered no approval id, so a copy of a revoked approval in a new
    row counted again. Now the copy has the revoked id; a new id breaks the signature."""
    original = approve(engine, "Ada", keys["Ada"])
    with database.session(engine) as s:
        approvals.revoke(s, facts(), by="Ada", reason="scheme leaks", keys=[keys["Ada"]])
    forge(engine, Approval(**original.model_dump(exclude={"id"})))
    with pytest.raises(UserError, match="has 0 current approver"):
        require(engine)
    forge(engine, Approval(**original.model_dump(exclude={"id", "nonce"}), nonce="3" * 32))
    with pytest.raises(UserError, match=r"has 0 current approver.*does not verify"):
        require(engine)


def test_a_revocation_signed_by_no_one_it_names_counts_and_is_flagged(
    engine: Any, keys: dict[str, Any], service_key: str
) -> None:
    """The runner appends a revocation of Ada's approval past the CLI, unsigned (which `policy
    revoke` refuses): it only withdraws approvals, so it takes effect (runs are refused), and
    `audit verify` and `audit mode` say it took effect unsigned."""
    approve(engine, "Ada", keys["Ada"])
    with database.session(engine) as s, pytest.raises(UserError, match="a revocation needs the signature"):
        approvals.revoke(s, facts(), by="Ada", reason="forged")
    with database.session(engine) as s:
        document = approvals.revoke_request(s, facts(), by="Ada", reason="forged")
        chain.append(s, "approvals_revoked", request=document["request"], signatures=[])
    with pytest.raises(UserError, match="has 0 current approver"):
        require(engine)
    problems = check(engine, public_key=signing.public_key(service_key)).problems
    assert [p.kind for p in problems if p.kind != "unsigned"] == ["revocation_unsigned"]
    flagged = next(p.message for p in problems if p.kind == "revocation_unsigned")
    assert "by 'Ada' took effect unsigned: a revocation needs the signature of an approver" in flagged


def _delete_revocation(engine: Any) -> None:
    """A database writer without keys deletes the revocation record and recomputes the chain."""
    with database.session(engine) as s:
        (record,) = s.exec(select(AuditEvent).where(col(AuditEvent.kind) == "approvals_revoked"))
        s.delete(record)
    rechain(engine)


def test_a_deleted_revocation_breaks_the_governance_history(engine: Any, keys: dict[str, Any]) -> None:
    """Before: deleting the revocation record (chain recomputed) made the approval count again.
    Now the next governance record names the deleted one (prior): every run refuses."""
    approve(engine, "Ada", keys["Ada"])
    with database.session(engine) as s:
        approvals.revoke(s, facts(), by="Ada", reason="scheme leaks", keys=[keys["Ada"]])
        approvals.set_production_mode(s, True, by="CPO")  # any later governance record
    _delete_revocation(engine)
    with database.session(engine, readonly=True) as s:
        assert approvals.production_mode(s) is True
    with pytest.raises(UserError, match="does not follow the governance record before it: one was deleted"):
        require(engine)
    assert [p.kind for p in check(engine).problems] == ["governance_broken"]


def test_a_replayed_governance_record_breaks_the_history(engine: Any, keys: dict[str, Any]) -> None:
    """Ada's signed 'development' of last year, copied after a later 'production': not a new
    decision (its prior is not the newest record), the history is broken, production holds."""
    with database.session(engine) as s:
        approvals.set_production_mode(s, False, by="Ada", keys=[keys["Ada"]])
        old = json.loads(chain.records(s)[-1].payload_json)
        approvals.set_production_mode(s, True, by="CPO")
    with database.session(engine) as s:
        chain.append(s, "mode_set", request=old["request"], signatures=old["signatures"])
    with database.session(engine, readonly=True) as s:
        assert approvals.production_mode(s) is True and governance.state(s).broken


@pytest.fixture
def revoked_demo(
    demo_dir: Path, work: Path, tmp_path: Path, keys: dict[str, Any], service_key: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Any]:
    """The demo policy in a production database with Ada's registry pinned, approved by Ada and
    revoked by her: a production run is refused. Returns the policy file and the engine."""
    from privrelease import demo
    from privrelease.flows.opening import approval_binding
    from privrelease.policies import load_policy

    monkeypatch.delenv("PRIVRELEASE_APPROVERS", raising=False)
    monkeypatch.setenv("PRIVRELEASE_AUTO_INIT", "true")
    policy = demo_dir / demo.POLICY_FILE
    policy_facts = approvals.policy_facts(load_policy(policy))
    registry = approvers.load(write_registry(tmp_path / "approvers.yaml", {"Ada": keys["public"]["Ada"]}))
    audit = database.open_database()
    with database.session(audit) as s:
        approvals.set_production_mode(s, True, by="CPO", registry=registry)
        approvals.approve_policy(s, policy_facts, "Ada", key=keys["Ada"], binding=approval_binding(load_policy(policy)))
    release_plain(policy_path=str(policy))  # approved: it runs
    with database.session(audit) as s:
        approvals.revoke(s, policy_facts, by="Ada", reason="scheme leaks", keys=[keys["Ada"]])
    with pytest.raises(UserError, match="has 0 current approver"):
        release_plain(policy_path=str(policy))
    return policy, audit


def release_plain(**kwargs: Any) -> Any:
    from privrelease.flows.steps import release_plain as release

    return release(**kwargs)


def test_a_production_run_refuses_a_copied_revoked_approval(revoked_demo: tuple[Path, Any]) -> None:
    """The database writer copies the revoked approval into a new row and rechains: the run is
    refused (the copy keeps the revoked id)."""
    policy, audit = revoked_demo
    with database.session(audit) as s:
        (original,) = s.exec(select(Approval)).all()
        s.add(Approval(**original.model_dump(exclude={"id"})))
    rechain(audit)
    with pytest.raises(UserError):  # also refused by the run-start chain check, once merged
        release_plain(policy_path=str(policy))
    with database.session(audit, readonly=True) as s:  # this mechanism alone: the copy is revoked
        assert len(s.exec(select(Approval)).all()) == 2 and approvals.current_approvals(s, original.policy_sha256) == []


def test_a_production_run_refuses_after_a_deleted_revocation(revoked_demo: tuple[Path, Any]) -> None:
    """The revocation deleted, the chain recomputed, a later governance record (production mode
    set again by the runner) naming it: the run is refused by the governance sequence."""
    policy, audit = revoked_demo
    with database.session(audit) as s:
        approvals.set_production_mode(s, True, by="Runner")
    _delete_revocation(audit)
    with pytest.raises(UserError):  # also refused by the run-start chain check, once merged
        release_plain(policy_path=str(policy))
    with database.session(audit, readonly=True) as s:  # this mechanism alone: the sequence is broken
        assert "does not follow the governance record before it" in (governance.state(s).broken or "")


def test_deleting_the_newest_revocation_is_refused_by_the_next_run(revoked_demo: tuple[Path, Any]) -> None:
    """The revocation deleted and the chain recomputed, nothing governed since: the production run
    refuses before spending (the run-start chain check: the rechained records carry no valid
    service signature)."""
    policy, audit = revoked_demo
    _delete_revocation(audit)
    with pytest.raises(UserError):
        release_plain(policy_path=str(policy))


def test_the_runner_cannot_switch_a_release_database_to_development(
    revoked_demo: tuple[Path, Any], demo_dir: Path
) -> None:
    """End to end with the CLI: the runner (service key set) asks for development mode, then runs
    an unapproved policy: both refused."""
    from privrelease.cli import app

    result = CliRunner().invoke(app, ["audit", "mode", "development", "--by", "Runner"])
    assert isinstance(result.exception, UserError) and "switching production mode off needs" in str(result.exception)
    draft = flow_steps.variant(demo_dir, "draft")
    with pytest.raises(UserError, match="is not approved"):
        release_plain(policy_path=str(draft))


def test_records_written_before_governance_still_decide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A database written before revision 0006: its mode record (no request, no signatures) sets
    the mode, its revocation (naming approval rows) withdraws those approvals, copies included;
    the first governance record after them follows the last of them."""
    monkeypatch.delenv("PRIVRELEASE_APPROVERS", raising=False)
    engine = fresh_engine(tmp_path)
    try:
        approve(engine, "Ada", None)
        with database.session(engine) as s:
            (approval,) = approvals.approvals_of(s, facts().sha256)
            chain.append(s, "mode_set", production=True, by="CPO", os_user="cpo", note=None)
            chain.append(s, "approvals_revoked", sha256=facts().sha256, by="CPO", reason="r", approvals=[approval.id])
        forge(engine, Approval(**approval.model_dump(exclude={"id"})))
        with database.session(engine, readonly=True) as s:
            assert approvals.production_mode(s) and approvals.current_approvals(s, facts().sha256) == []
        approve(engine, "Grace", None)
        with database.session(engine) as s:
            approvals.revoke(s, facts(), by="CPO", reason="again")
            assert governance.state(s).broken is None and approvals.current_approvals(s, facts().sha256) == []
        assert check(engine).ok
    finally:
        database.dispose_engines()
