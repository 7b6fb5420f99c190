"""Signed approvals (privrelease.audit.approvers): the approver registry, signing and verifying,
what a production run counts (signed by a registered key, not revoked, distinct people, not
the runner nor the author) and what ``audit verify`` flags; the registry's error messages."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import select
from test_audit_chain import BACKENDS, audit_database, check, fresh_engine
from test_migration_identity import Writer0001

from privrelease.audit import approvals, approvers, bindings, chain, database, signing, witness
from privrelease.audit.bindings import Account, Binding
from privrelease.audit.models import APPROVAL_RECORD_KINDS, Approval
from privrelease.errors import UserError

REPO = Path(__file__).resolve().parents[1]
PEOPLE = ("Ada", "Grace", "Mallory")
BOUND = Binding(bindings.DATA, "/data/census.csv", "ab" * 32)


def facts(version: str = "1", vintage: str | None = None) -> approvals.PolicyFacts:
    body = {"canonical_version": 1, "policy": {"name": "census", "version": version}}
    body["policy"]["dataset"] = {"id": "census-people", "sha256": vintage}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return approvals.PolicyFacts("census", version, hashlib.sha256(text.encode()).hexdigest(), text)


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Any]:
    """A private key per person; ``keys["public"][name]`` its public key (base64)."""
    found: dict[str, Any] = {"public": {}}
    for name in PEOPLE:
        path = tmp_path / f"{name.lower()}.key"
        found["public"][name] = signing.generate(path)
        found[name] = signing.private_key(str(path), "--key")
    return found


def write_registry(path: Path, entries: dict[str, str]) -> Path:
    path.write_text("approvers:\n" + "".join(f"  {name}: {key}\n" for name, key in entries.items()))
    return path


@pytest.fixture
def engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keys: dict[str, Any]) -> Any:
    """A fresh database in production mode with a pinned registry of Ada and Grace."""
    monkeypatch.delenv("PRIVRELEASE_APPROVERS", raising=False)
    monkeypatch.delenv("PRIVRELEASE_SIGNING_KEY", raising=False)
    engine = fresh_engine(tmp_path)
    registry = approvers.load(write_registry(tmp_path / "approvers.yaml", {n: keys["public"][n] for n in PEOPLE[:2]}))
    with database.session(engine) as s:
        approvals.set_production_mode(s, True, by="CPO", registry=registry)
    yield engine
    database.dispose_engines()


def approve(engine: Any, name: str, key: Any, policy: approvals.PolicyFacts | None = None, **kwargs: Any) -> Approval:
    """An approval by ``name`` binding :data:`BOUND` unless ``binding`` says otherwise."""
    with database.session(engine) as s:
        return approvals.approve_policy(s, policy or facts(), name, key=key, **{"binding": BOUND, **kwargs})


def require(engine: Any, rule: Any = None, policy: approvals.PolicyFacts | None = None, **kwargs: Any) -> Approval:
    """What a production run reading :data:`BOUND`'s data counts (unless ``data_path`` / ``data_sha256``)."""
    with database.session(engine, readonly=True) as s:
        data = {"data_path": BOUND.path, "data_sha256": BOUND.sha256, **kwargs}
        return approvals.require_approved(s, policy or facts(), rule, **data)


def bound_row(**columns: Any) -> Approval:
    """An approval row binding :data:`BOUND`, as a database writer would insert it."""
    return Approval(binds=BOUND.binds, data_path=BOUND.path, data_sha256=BOUND.sha256, **columns)


def forge(engine: Any, approval: Approval) -> None:
    """What a database writer without the approver's key can do: insert (or rewrite) an approval
    row and describe it by a correctly chained record, as privrelease itself would."""
    with database.session(engine) as s:
        chain.append(s, "policy_approved", s.merge(approval), sha256=approval.policy_sha256)


def test_a_signed_approval_verifies_and_counts(engine: Any, keys: dict[str, Any]) -> None:
    approval = approve(engine, "Ada", keys["Ada"], note="reviewed")
    assert approval.signature and approval.public_key == keys["public"]["Ada"]
    assert require(engine).id == approval.id
    with database.session(engine, readonly=True) as s:
        registry = approvals.effective_registry(s)
        assert registry is not None and registry.pinned_at is not None
        verdict = approvers.check(facts(), approvals.approvals_of(s, facts().sha256)[0], registry)  # read back
    assert verdict.verified and verdict.status == "verified"
    assert (
        verdict.fingerprint
        == hashlib.sha256(signing.decode_public(approval.public_key).public_bytes_raw()).hexdigest()[:16]
    )
    assert check(engine).ok
    # the message binds every field: another note, time, person, policy, vintage, id or data does not verify
    key, nonce = signing.decode_public(approval.public_key), approval.nonce
    signed = approvers.message(facts(), "Ada", approval.approved_at, "reviewed", nonce, BOUND)
    assert signing.valid(key, signed, approval.signature)
    for other in (
        approvers.message(facts(), "Ada", approval.approved_at, "other note", nonce, BOUND),
        approvers.message(facts(), "Grace", approval.approved_at, "reviewed", nonce, BOUND),
        approvers.message(facts(version="2"), "Ada", approval.approved_at, "reviewed", nonce, BOUND),
        approvers.message(facts(vintage="ab" * 32), "Ada", approval.approved_at, "reviewed", nonce, BOUND),
        approvers.message(facts(), "Ada", approval.approved_at, "reviewed", "0" * 32, BOUND),
        approvers.message(facts(), "Ada", approval.approved_at, "reviewed", nonce),
        *(
            approvers.message(facts(), "Ada", approval.approved_at, "reviewed", nonce, binding)
            for binding in (
                Binding(bindings.PATH, BOUND.path, BOUND.sha256),
                Binding(bindings.DATA, "/data/other.csv", BOUND.sha256),
                Binding(bindings.DATA, BOUND.path, "cd" * 32),
            )
        ),
    ):
        assert not signing.valid(key, other, approval.signature)
    assert signed.startswith(b"privrelease-approval-v1\n")


def test_a_signed_approval_binding_no_data_verifies_but_never_counts(engine: Any, keys: dict[str, Any]) -> None:
    """A signed approval made before revision 0005 (its message has no ``data``) still verifies,
    so `audit verify` does not call it forged, but it binds no data: no production run counts it."""
    old = approve(engine, "Ada", keys["Ada"], binding=None)
    with database.session(engine, readonly=True) as s:
        assert approvers.check(facts(), old, approvals.effective_registry(s)).verified
    assert check(engine).ok
    with pytest.raises(UserError, match=rf"approval {old.id} by 'Ada' \(it binds no data .*approve it again"):
        require(engine)
    approve(engine, "Ada", keys["Ada"])  # approved again, binding the data
    assert require(engine).approved_by == "Ada"


def test_approving_against_the_registry_needs_the_declared_key(engine: Any, keys: dict[str, Any]) -> None:
    with pytest.raises(UserError, match="unsigned approval would not count"):
        approve(engine, "Ada", None)
    with pytest.raises(UserError, match="'Mallory' is not in it"):
        approve(engine, "Mallory", keys["Mallory"])
    with pytest.raises(UserError, match="--key is not the key it declares for 'Ada'"):
        approve(engine, "Ada", keys["Grace"])
    with pytest.raises(UserError, match="is not approved"):
        require(engine)


@pytest.mark.parametrize("how", ["wrong key", "tampered policy hash", "name not in registry", "unsigned"])
def test_forged_approvals_do_not_count_and_audit_verify_flags_them(
    engine: Any, keys: dict[str, Any], how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, other = facts(), facts(version="2")
    with database.session(engine) as s:
        approvals.register_policy(s, target)
    genuine = approve(engine, "Ada", keys["Ada"], policy=other)  # Ada approved version 2 only
    now = genuine.approved_at
    if how == "wrong key":  # Mallory signs in Ada's name
        signature, public = approvers.sign(keys["Mallory"], target, "Ada", now, None, "1" * 32, BOUND)
        forged = bound_row(policy_sha256=target.sha256, approved_by="Ada", os_user="ada", approved_at=now)
        forged.signature, forged.public_key, forged.nonce = signature, public, "1" * 32
    elif how == "tampered policy hash":  # Ada's real signature moved to another policy
        forged = genuine.model_copy(update={"policy_sha256": target.sha256})
    elif how == "name not in registry":  # a valid signature, by a key nobody registered
        signature, public = approvers.sign(keys["Mallory"], target, "Mallory", now, None, "1" * 32, BOUND)
        forged = bound_row(policy_sha256=target.sha256, approved_by="Mallory", os_user="m", approved_at=now)
        forged.signature, forged.public_key, forged.nonce = signature, public, "1" * 32
    else:  # an unsigned approval inserted after the registry was pinned
        forged = bound_row(policy_sha256=target.sha256, approved_by="Ada", os_user="ada", approved_at=now)
    forge(engine, forged)
    reason = {
        "wrong key": "does not verify against the key the registry declares for 'Ada'",
        "tampered policy hash": "does not verify against the key the registry declares for 'Ada'",
        "name not in registry": "'Mallory' is not in the approver registry",
        "unsigned": "unsigned",
    }[how]
    with pytest.raises(
        UserError,
        match=rf"has 0 current approver\(s\) signed by their registered key.*ignored: approval \d+ by '\w+' \(.*{reason}",
    ):
        require(engine, policy=target)
    result = check(engine)
    assert [p.kind for p in result.problems] == ["approval_unsigned" if how == "unsigned" else "approval_not_verified"]
    assert reason in result.problems[0].message
    if how in ("wrong key", "tampered policy hash"):  # the test fails with a verifier that accepts anything
        monkeypatch.setattr(signing, "valid", lambda *args: True)
        assert require(engine, policy=target).approved_by == "Ada"
        assert check(engine).ok


def test_revoked_signed_approvals_do_not_count(engine: Any, keys: dict[str, Any]) -> None:
    approve(engine, "Ada", keys["Ada"])
    assert require(engine).approved_by == "Ada"
    with database.session(engine) as s:
        approvals.set_production_mode(s, True, by="CPO")  # no registry given: the pinned one stays
        assert approvals.pinned_registry(s) is not None
        with pytest.raises(UserError, match="a revocation needs the signature of an approver"):
            approvals.revoke(s, facts(), by="CPO", reason="scheme leaks")  # the service alone cannot
    with database.session(engine) as s, pytest.raises(UserError, match="--key is not the key it declares for 'Ada'"):
        approvals.revoke(
            s, facts(), by="Ada", reason="scheme leaks", keys=[keys["Grace"]]
        )  # audit 10: Grace signs as Ada
    with database.session(engine) as s:
        assert approvals.revoke(s, facts(), by="Grace", reason="scheme leaks", keys=[keys["Grace"]]) == 1
    with pytest.raises(UserError, match=r"has 0 current approver.*revoked approvals do not count"):
        require(engine)
    approve(engine, "Grace", keys["Grace"])
    assert require(engine).approved_by == "Grace"
    assert check(engine).ok


def test_n_distinct_registered_approvers(tmp_path: Path, engine: Any, keys: dict[str, Any]) -> None:
    two = SimpleNamespace(approvers=2, independent=False)
    approve(engine, "Ada", keys["Ada"])
    approve(engine, "ada ", keys["Ada"], account=Account("someone-else"))  # the same person again
    with pytest.raises(UserError, match="has 1 current approver.*needs 2 distinct"):
        require(engine, two)
    approve(engine, "Grace", keys["Grace"])
    assert require(engine, two).approved_by == "Ada"
    with database.session(engine, readonly=True) as s:  # what `policy list` and `policy show` say
        assert approvals.shortfall(s, facts()) is None
    with pytest.raises(UserError, match="has 2 current approver.*needs 3 distinct"):
        require(engine, SimpleNamespace(approvers=3, independent=False))
    # two names declared with one key are one approver
    shared = write_registry(
        tmp_path / "shared.yaml", {"Ada": keys["public"]["Ada"], "Ada Alias": keys["public"]["Ada"]}
    )
    with database.session(engine) as s:
        approvals.set_production_mode(s, True, by="CPO", registry=approvers.load(shared), keys=[keys["Grace"]])
    approve(engine, "Ada Alias", keys["Ada"], policy=facts("3"))
    approve(engine, "Ada", keys["Ada"], policy=facts("3"))
    with pytest.raises(UserError, match="has 1 current approver.*needs 2 distinct"):
        require(engine, two, policy=facts("3"))


def test_policy_list_and_show_call_approved_only_what_a_production_run_could_count(
    tmp_path: Path, engine: Any, keys: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Audit 10: after the registry drops the only approver, or with one approval where
    ``approval.approvers`` asks for 2, ``policy list`` and ``policy show`` said "approved"
    (``"approved": true``) while every production run refused: they now say what is missing."""
    from typer.testing import CliRunner

    from privrelease.cli import app

    monkeypatch.setenv("PRIVRELEASE_DB_URL", f"sqlite:///{tmp_path / 'audit.db'}")  # the engine's database
    two = json.loads(facts("2").canonical_json)
    two["policy"]["approval"] = {"approvers": 2, "independent": False}
    text = json.dumps(two, sort_keys=True, separators=(",", ":"))
    needs_two = approvals.PolicyFacts("census", "2", hashlib.sha256(text.encode()).hexdigest(), text)
    approve(engine, "Ada", keys["Ada"])
    approve(engine, "Ada", keys["Ada"], policy=needs_two)

    def shown(ref: str) -> dict[str, Any]:
        return json.loads(CliRunner().invoke(app, ["policy", "show", ref, "--json"]).output)

    assert shown("census@1")["approved"] is True and shown("census@2")["approved"] is False
    assert shown("census@2")["shortfall"] == (
        "1 of the 2 distinct approver(s) verified by the approver registry it needs (approval.approvers)"
    )
    with pytest.raises(UserError, match="has 1 current approver.*needs 2 distinct"):
        require(engine, SimpleNamespace(approvers=2, independent=False), policy=needs_two)
    without_ada = write_registry(tmp_path / "grace.yaml", {"Grace": keys["public"]["Grace"]})
    with database.session(engine) as s:
        approvals.set_production_mode(s, True, by="CPO", registry=approvers.load(without_ada), keys=[keys["Grace"]])
    with pytest.raises(UserError, match="has 0 current approver"):
        require(engine)
    assert shown("census@1")["approved"] is False and shown("census@1")["shortfall"].startswith("0 of the 1")
    listed = {
        row["version"]: row
        for row in json.loads(CliRunner().invoke(app, ["policy", "list", "--json"]).output)["policies"]
    }
    assert not listed["1"]["approved"] and not listed["2"]["approved"]
    table = CliRunner().invoke(app, ["policy", "list"], env={"COLUMNS": "250"}).output
    assert "0 of the 1 distinct approver(s)" in table and "approved by" in table


def test_independent_excludes_the_runner_and_the_author(
    engine: Any, keys: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    independent = SimpleNamespace(approvers=1, independent=True)
    author, runner = Account("author", 4001), Account("runner", 4002)
    monkeypatch.setattr(approvals, "os_account", lambda: author)
    with database.session(engine) as s:
        approvals.register_policy(s, facts())  # the author registers the policy (a dev run)
        assert approvals.author_of(s, facts().sha256) == author
    approve(engine, "Ada", keys["Ada"], account=author)
    approve(engine, "Grace", keys["Grace"], account=runner)
    assert require(engine).approved_by == "Ada"  # without `independent` both count
    with pytest.raises(UserError, match="other than the runner's OS user 'runner' and the author's 'author'.*"
                       "'author' is the policy's author.*'runner' is the runner"):  # fmt: skip
        require(engine, independent, runner=runner)
    assert require(engine, independent, runner=Account("someone", 4003)).approved_by == "Grace"
    # the account's uid is the account, whatever name it goes by
    with pytest.raises(UserError, match="'runner' is the runner"):
        require(engine, independent, runner=Account("renamed", runner.uid))
    # a policy first registered by its approval has no known author: only the runner is excluded
    approve(engine, "Ada", keys["Ada"], policy=facts("2"), account=author)
    with database.session(engine, readonly=True) as s:
        assert approvals.author_of(s, facts("2").sha256) is None
    assert require(engine, independent, policy=facts("2"), runner=runner).approved_by == "Ada"


def test_unsigned_approvals_count_without_a_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PRIVRELEASE_APPROVERS", raising=False)
    engine = fresh_engine(tmp_path)
    try:
        with database.session(engine) as s:
            approvals.set_production_mode(s, True, by="CPO")
        approve(engine, "Ada", None)
        assert require(engine).approved_by == "Ada"
        assert check(engine).ok
    finally:
        database.dispose_engines()


MALFORMED = {
    "not yaml": ("approvers: [unclosed\n", "is not valid YAML"),
    "no approvers key": ("Ada: abc\n", "expected a mapping `approvers:`"),
    "empty": ("", "an empty file"),
    "bad key": ("approvers:\n  Ada: not-a-key\n", "the key of approver 'Ada' ('not-a-key') is not valid"),
    "twice": (f"approvers:\n  Ada: {'A' * 43}=\n  ada: {'A' * 43}=\n", "approver 'ada' is declared twice"),
    "quorum": (
        f"approvers:\n  Ada: {'A' * 43}=\ngovernance:\n  quorum: 2\n",
        "governance must be `{quorum: N}` with N a whole number from 1 to 1",
    ),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_registry_is_one_line_and_exit_2(tmp_path: Path, name: str) -> None:
    text, expected = MALFORMED[name]
    registry = tmp_path / "approvers.yaml"
    registry.write_text(text)
    env = {**__import__("os").environ, "PRIVRELEASE_WORK_DIR": str(tmp_path / "work"), "PRIVRELEASE_AUTO_INIT": "true"}
    env["PRIVRELEASE_APPROVERS"] = str(registry)
    for args in (
        ["audit", "mode", "production", "--by", "CPO"],
        ["policy", "approve", str(REPO / "policies" / "examples" / "demo.yaml"), "--by", "Ada", "--binds", "path"],
    ):
        result = subprocess.run(
            [sys.executable, "-m", "privrelease", *args], capture_output=True, text=True, env=env, timeout=60
        )
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert f"PRIVRELEASE_APPROVERS={str(registry)!r}" in result.stderr and expected in result.stderr


def test_registry_form_is_named_for_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"--approvers='.*nothere.yaml': cannot read the approver registry"):
        approvers.load(tmp_path / "nothere.yaml", what="--approvers")


@pytest.mark.parametrize("backend", BACKENDS)
def test_upgrade_from_0003_keeps_old_approvals_verifying(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 0003 database with an (unsigned) approval, upgraded through 0004 to 0007: the chain
    verifies (with the signing key too: the migrations' records are signed); the approval binds
    no data, so no production run counts it (fail closed: approve again)."""
    key_file = tmp_path / "agency.key"
    public = signing.generate(key_file)
    monkeypatch.setenv("PRIVRELEASE_SIGNING_KEY", str(key_file))
    monkeypatch.delenv("PRIVRELEASE_APPROVERS", raising=False)
    with audit_database(backend, tmp_path, migrated=False) as engine:
        _upgrade_from_0003(engine, public)


def _upgrade_from_0003(engine: Any, public: str) -> None:
    database.migrate(engine, "0003_record_signatures")
    policy, now = facts(), chain.utcnow().replace(tzinfo=None)
    with engine.begin() as connection:
        writer = Writer0001(connection)
        writer.policy(policy, now)
        writer.write("approval", "policy_approved", "id",
                     {"policy_sha256": policy.sha256, "approved_by": "Ada", "os_user": "ada",
                      "note": None, "approved_at": now},
                     sha256=policy.sha256)  # fmt: skip
    database.migrate(engine)
    with engine.connect() as connection:
        kinds = [row.kind for row in connection.execute(sa.text("SELECT kind FROM audit_event ORDER BY seq"))]
    assert kinds[-8:] == ["schema_migrated", "approval_migrated"] * 3 + [  # 0004, 0005, 0006
        "schema_migrated",
        "policy_version_migrated",  # 0007: the policy stays registered
    ]
    result = check(engine, public_key=signing.public_key(public))
    assert [p.seq for p in result.problems] == [1, 2]  # only the two records written without the key
    assert all(p.kind == "unsigned" for p in result.problems)
    assert check(engine).ok
    with pytest.raises(UserError, match=r"approval 1 by 'Ada' \(it binds no data .*approve it again"):
        require(engine)
    with database.session(engine, readonly=True) as s:
        old = s.exec(select(Approval)).one()
        assert approvers.check(policy, old, None).status == "unsigned"
        assert (
            witness.recorded(s, kinds=APPROVAL_RECORD_KINDS).problem(old) is None
        )  # as its newest (migration) record says
    assert (old.approved_by, old.binds, old.data_path, old.data_sha256, old.os_uid) == ("Ada", None, None, None, None)
    assert len(old.nonce) == 32 and int(old.nonce, 16) >= 0  # revision 0006 gave it its own id


def test_a_production_release_shows_who_approved_with_which_key(
    demo_dir: Path, work: Path, tmp_path: Path, keys: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The commands end to end: pin the registry, approve with a key, release; the report lists
    the approver, key fingerprint and signature status; a forged approval fails audit verify."""
    from typer.testing import CliRunner

    from privrelease import demo
    from privrelease.cli import app
    from privrelease.flows.steps import release_plain

    monkeypatch.delenv("PRIVRELEASE_APPROVERS", raising=False)
    monkeypatch.delenv("PRIVRELEASE_SIGNING_KEY", raising=False)
    monkeypatch.setenv("PRIVRELEASE_AUTO_INIT", "true")
    registry = write_registry(tmp_path / "approvers.yaml", {"Ada": keys["public"]["Ada"]})
    policy = demo_dir / demo.POLICY_FILE

    def cli(*args: str, code: int = 0) -> Any:
        result = CliRunner().invoke(app, [*args, "--json"])
        assert result.exit_code == code, result.output
        return json.loads(result.output) if code == 0 else result.output

    mode = cli("audit", "mode", "production", "--by", "CPO", "--approvers", str(registry))
    assert mode["approver_registry"]["approvers"] == ["Ada"] and mode["approver_registry"]["source"] == str(registry)
    assert mode["approver_registry"]["sha256"] == hashlib.sha256(registry.read_bytes()).hexdigest()
    approved = cli("policy", "approve", str(policy), "--by", "Ada", "--key", str(tmp_path / "ada.key"))
    fingerprint = signing.fingerprint(keys["public"]["Ada"])
    assert (approved["key"], approved["signature"], approved["verified"]) == (fingerprint, "verified", True)
    data = demo_dir / demo.DATA_FILE
    assert approved["binds"]["binds"] == "data" and approved["binds"]["path"] == str(data.resolve())
    assert approved["binds"]["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()

    report = Path(release_plain(policy_path=str(policy)).report).read_text()
    row = report[report.index('<table id="approvals">') :]
    row = row[: row.index("</table>")]
    assert "Ada" in row and fingerprint in row and "verified" in row
    assert f"the data with sha256 {approved['binds']['sha256']}" in row

    with database.session(database.open_database(), readonly=True) as s:
        sha256 = approvals.find_policy(s, "demo-census").sha256
    signature, public = approvers.sign(
        keys["Mallory"], approvals.PolicyFacts("x", "1", sha256, "{}"), "Ada", None, None, "1" * 32
    )
    forge(
        database.open_database(),
        Approval(policy_sha256=sha256, approved_by="Ada", os_user="m", signature=signature, public_key=public),
    )
    shown = cli("policy", "show", "demo-census")
    assert [a["verified"] for a in shown["approvals"]] == [True, False]
    verified = cli("audit", "verify", "--no-files", code=1)
    assert "approval_not_verified" in verified and "declares for 'Ada'" in verified


def test_the_readme_registry_example_is_a_valid_registry(tmp_path: Path) -> None:
    import re

    (block,) = [
        b
        for b in re.findall(r"```yaml\n(.*?)```", (REPO / "README.md").read_text(), re.S)
        if b.startswith("approvers:")
    ]
    example = tmp_path / "example.yaml"
    example.write_text(block)
    assert sorted(approvers.load(example).keys) == ["Ada Lovelace", "Disclosure Review Board"]


def test_the_report_index_shows_each_approvals_key_and_signature(engine: Any, keys: dict[str, Any]) -> None:
    """The compliance index lists every approval with the fingerprint of the key that signed
    it and whether it verifies against the pinned registry (a forgery says so)."""
    from privrelease.reports.index import collect

    target = facts()
    with database.session(engine) as s:
        approvals.register_policy(s, target)
    genuine = approve(engine, "Ada", keys["Ada"], policy=target)
    signature, public = approvers.sign(keys["Mallory"], target, "Grace", genuine.approved_at, None, "1" * 32, BOUND)
    forged = bound_row(policy_sha256=target.sha256, approved_by="Grace", os_user="m", approved_at=genuine.approved_at)
    forged.signature, forged.public_key, forged.nonce = signature, public, "1" * 32
    forge(engine, forged)
    with database.session(engine, readonly=True) as s:
        (policy,) = collect(s).policies
    rows = {row.approved_by: row for row in policy.approvals}
    assert rows["Ada"].key == signing.fingerprint(keys["public"]["Ada"]) and rows["Ada"].signature == "verified"
    assert rows["Grace"].key == signing.fingerprint(public)
    assert rows["Grace"].signature.startswith("not verified: the signature does not verify against the key")


def test_the_revoke_command_needs_the_key_of_whom_it_names(
    tmp_path: Path, engine: Any, keys: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Audit 10: `policy revoke --by Ada --key grace.key` (the command's path, through
    :func:`privrelease.approving.govern`) recorded Ada as revoking with Grace's signature alone:
    refused, nothing revoked; with Ada's own key it revokes."""
    from privrelease import approving

    monkeypatch.setenv("PRIVRELEASE_DB_URL", f"sqlite:///{tmp_path / 'audit.db'}")  # the engine's database
    approve(engine, "Ada", keys["Ada"])
    with pytest.raises(UserError, match="--key is not the key it declares for 'Ada'"):
        approving.revoke("census@1", by="Ada", reason="leaks", keys=[tmp_path / "grace.key"])
    assert require(engine).approved_by == "Ada"
    assert approving.revoke("census@1", by="Ada", reason="leaks", keys=[tmp_path / "ada.key"]).revoked == 1
