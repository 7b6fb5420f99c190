"""Attacks on SECURITY.md's claims found by the security review of 2026-11-27, one test each.

Each test states a claim, performs the attack and asserts what the claim promises. The defects
fixed since are plain tests; those still open are marked ``xfail(strict=True)``, so the suite
stays green and the test turns into a failure (XPASS) once the defect is fixed: then drop the
mark. The roots, as found:

* The run-start check (``audit/witness.py``, ``check_before_spending``) vouched only for the
  records after the witness's verified head; older governance records, approval rows and
  ledger records (found by a text match on ``payload_json``) were read without re-hashing.
  Fixed: governance and ledger records are re-hashed, ledger records found by kind, approval
  rows compared with their records, and the records up to the verified head counted.
* Crash recovery ran before the check and trusted the run and ledger rows, and the records it
  signed then described the tampered rows. Fixed: recovery checks first.
* The runner holds the service key, writes the work folder (the default SQLite database) and
  chose ``PRIVRELEASE_WITNESS``, so the witness she cannot write did not bind her runs. Fixed
  by the site file (``privrelease/site.py``): the tests below state their claims under one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import test_flow_steps as flow_steps
import test_governance as governed
from sqlmodel import col, select
from test_audit_chain import check
from test_audit_signing import rechain
from test_check_before_spending import copy_database, put_back
from test_signed_approvals import write_registry

from privrelease.audit import approvals, approvers, chain, database, governance, signing, witness
from privrelease.audit.models import LEDGER_RECORD_KINDS, Approval, AuditEvent
from privrelease.errors import AuditRefused, UserError
from privrelease.files import sha256_bytes
from privrelease.settings import signing_key

keys, revoked_demo, service_key, release_plain = (
    governed.keys,
    governed.revoked_demo,
    governed.service_key,
    governed.release_plain,
)


def _release_other_approved_version(demo_dir: Path, keys: dict[str, Any]) -> None:
    """Normal business after the governance record: Ada approves demo-census@2 and it runs, so
    the witness's verified head moves past every record written so far."""
    from privrelease.flows.opening import approval_binding
    from privrelease.policies import load_policy

    other = flow_steps.variant(demo_dir, "2")
    audit = database.open_database()
    with database.session(audit) as s:
        loaded = load_policy(other)
        approvals.approve_policy(
            s, approvals.policy_facts(loaded), "Ada", key=keys["Ada"], binding=approval_binding(loaded)
        )
    release_plain(policy_path=str(other))


def _edit_in_place(audit: Any, kind: str, edit: Any) -> int:
    """The database insider rewrites the payload of the first ``kind`` governance record in place
    and re-links the governance records after it (each one's ``prior`` is a plain sha256 of the
    body before it: no key needed). No record hash, link or signature is touched. Returns the
    edited record's seq."""
    with database.session(audit) as s:
        records = s.exec(
            select(AuditEvent).where(col(AuditEvent.kind).in_(governance.KINDS.values())).order_by(col(AuditEvent.seq))
        ).all()
        target = next(record for record in records if record.kind == kind)
        prior = None
        for record in records:
            payload = json.loads(record.payload_json)
            if record.seq > target.seq:
                payload["request"]["prior"] = prior
            elif record.seq == target.seq:
                edit(payload)
            prior = sha256_bytes(governance.message(payload["request"]))
            record.payload_json = chain.canonical_json(payload)
            s.add(record)
        return target.seq


def _verified_seq() -> int:
    path = witness.path_for(database.open_database())
    return json.loads(path.read_text())["verified"]["seq"]


def test_the_pinned_production_mode_edited_in_place_is_refused_by_the_next_run(
    revoked_demo: tuple[Path, Any], demo_dir: Path, keys: dict[str, Any], service_key: str
) -> None:
    """Claims: the database insider cannot get a tampered database spent (every run checks it
    before it reserves budget); once a registry is pinned only a quorum of its approvers
    switches production mode off; production mode runs only approved policies."""
    policy, audit = revoked_demo
    _release_other_approved_version(demo_dir, keys)

    def unpin(payload: dict[str, Any]) -> None:
        payload["request"]["production"] = False
        payload["request"]["approvers"] = None

    seq = _edit_in_place(audit, "mode_set", unpin)
    assert seq <= _verified_seq()  # the edited record is older than what the witness vouches for
    draft = flow_steps.variant(demo_dir, "draft")  # never approved by anyone
    kinds = [p.kind for p in check(audit, public_key=signing.public_key(service_key)).problems]
    assert "record_edited" in kinds  # `audit verify` sees it (this part holds)
    with pytest.raises(UserError):  # the claim: refused (tampered database, or not approved)
        release_plain(policy_path=str(draft))


def _delete_revocation_record(audit: Any) -> int:
    """The database insider deletes the revocation record, nothing rechained. Returns its seq."""
    with database.session(audit) as s:
        (record,) = s.exec(select(AuditEvent).where(col(AuditEvent.kind) == "approvals_revoked")).all()
        s.delete(record)
        return record.seq


UNDO_REVOCATION = {
    "edited in place": (
        lambda audit: _edit_in_place(audit, "approvals_revoked", lambda p: p["request"].update(approvals=[])),
        "record_edited",
    ),
    "deleted, not rechained": (_delete_revocation_record, "records_missing"),
}


@pytest.mark.parametrize("attack", list(UNDO_REVOCATION))
def test_a_revocation_undone_in_place_is_refused_by_the_next_run(
    revoked_demo: tuple[Path, Any], demo_dir: Path, keys: dict[str, Any], service_key: str, attack: str
) -> None:
    """Claim: the database insider cannot undo a revocation (SECURITY.md: a copied approval
    stays revoked, a deleted revocation breaks the governance sequence or is caught by the
    run-start chain verification). Neither holds for an edit in place, nor for a deletion of
    the newest governance record without rechaining."""
    policy, audit = revoked_demo
    _release_other_approved_version(demo_dir, keys)
    undo, flagged_as = UNDO_REVOCATION[attack]
    seq = undo(audit)
    assert seq <= _verified_seq()
    kinds = [p.kind for p in check(audit, public_key=signing.public_key(service_key)).problems]
    assert flagged_as in kinds, kinds  # `audit verify` sees it (this part holds)
    with pytest.raises(UserError):  # the claim: the revoked policy stays refused
        release_plain(policy_path=str(policy))


def test_an_approvals_os_user_edited_in_place_does_not_make_it_independent(
    revoked_demo: tuple[Path, Any], demo_dir: Path, keys: dict[str, Any], service_key: str
) -> None:
    """Claim: the runner cannot pass for another OS user to `approval.independent` (the runner,
    author and approver are the account, matched by name or uid); the database insider cannot
    get a tampered database spent."""
    from privrelease.flows.opening import approval_binding
    from privrelease.policies import load_policy

    policy, audit = revoked_demo
    independent = flow_steps.variant(demo_dir, "independent")
    independent.write_text(independent.read_text() + "approval:\n  approvers: 1\n  independent: true\n")
    loaded = load_policy(independent)
    with database.session(audit) as s:  # Ada signs, but from the runner's own OS account
        approval = approvals.approve_policy(
            s, approvals.policy_facts(loaded), "Ada", key=keys["Ada"], binding=approval_binding(loaded)
        )
        approval_id = approval.id
    with pytest.raises(UserError, match="is the runner"):
        release_plain(policy_path=str(independent))
    _release_other_approved_version(demo_dir, keys)
    with database.session(audit) as s:  # the insider: another account, in place (no hash touched)
        row = s.get(Approval, approval_id)
        row.os_user, row.os_uid = "ada", 424242
        s.add(row)
    kinds = [p.kind for p in check(audit, public_key=signing.public_key(service_key)).problems]
    assert "row_edited" in kinds  # `audit verify` sees it (this part holds)
    with pytest.raises(UserError):  # the claim: still the runner's approval, refused
        release_plain(policy_path=str(independent))


def _rewrite_without_governance(audit: Any, work: Path) -> None:
    """The runner: holds the service key and writes the work folder (so the default SQLite
    audit database). She drops the governance records, renumbers, rehashes and re-signs every
    record with the service key, moves the chain head and re-signs the release heads under
    ``work/releases`` to the new numbering."""
    renumbered = rechain(audit, drop_kinds=governance.KINDS.values(), key=signing_key())
    for file in (work / "releases").glob(f"*/{chain.RELEASE_HEAD_FILE}"):
        old = chain.read_head(file)
        chain.write_head(file, renumbered[old.seq], files=old.files, release=old.release)


def write_site(**pins: Any) -> Path:
    """The custodian writes the host's site file (:mod:`privrelease.site`), out of the runner's
    reach; the suite's is a file of each test's own (conftest)."""
    from privrelease import site

    site.SITE_FILE.write_text(json.dumps({name: str(value) for name, value in pins.items()}))
    return site.SITE_FILE


def audit_verify_problems() -> list[str]:
    """What `privrelease audit verify` (no options: the site's key) reports, one kind each."""
    from typer.testing import CliRunner

    from privrelease.cli import app

    result = CliRunner().invoke(app, ["audit", "verify", "--json"])
    return [problem["kind"] for problem in json.loads(result.stdout)["problems"]]


def refused_under_her_witness_then_the_sites(
    policy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refusal: str
) -> None:
    """The runner names a witness of her own: a setting error, since the site pins one; without
    it, the site's witness refuses the run (``refusal``: what the refusal says)."""
    monkeypatch.setenv("PRIVRELEASE_WITNESS", str(tmp_path / "runners-own" / "audit.witness.json"))
    with pytest.raises(UserError, match="PRIVRELEASE_WITNESS=.* names another file than the site file"):
        release_plain(policy_path=str(policy))
    monkeypatch.delenv("PRIVRELEASE_WITNESS")
    with pytest.raises(AuditRefused, match=refusal):
        release_plain(policy_path=str(policy))


def test_the_runner_cannot_switch_production_off_by_rewriting_the_history(
    demo_dir: Path, work: Path, tmp_path: Path, keys: dict[str, Any], service_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claim (runner, with a site file): holding the service key and writing the audit database,
    she cannot run an unapproved policy by rewriting the history without its governance records:
    production mode, the registry and the witness are the site's. Naming her own witness is a
    setting error; the site's witness shows the rewrite to every run and to `audit verify`;
    rewriting that witness too (she signs it with the service key) still leaves the policy
    unapproved against the site's registry."""
    from privrelease import demo
    from privrelease.flows.opening import approval_binding
    from privrelease.policies import load_policy

    monkeypatch.delenv("PRIVRELEASE_APPROVERS", raising=False)
    protected = tmp_path / "protected" / "audit.witness.json"
    registry = write_registry(tmp_path / "approvers.yaml", {"Ada": keys["public"]["Ada"]})
    write_site(production=True, approvers=registry, witness=protected, public_key=service_key)
    policy = demo_dir / demo.POLICY_FILE
    loaded = load_policy(policy)
    audit = database.open_database()
    with database.session(audit) as s:
        approvals.set_production_mode(s, True, by="CPO", registry=approvers.load(registry))
        approvals.approve_policy(
            s, approvals.policy_facts(loaded), "Ada", key=keys["Ada"], binding=approval_binding(loaded)
        )
    release_plain(policy_path=str(policy))
    draft = flow_steps.variant(demo_dir, "draft")
    with pytest.raises(UserError, match="is not approved"):
        release_plain(policy_path=str(draft))

    _rewrite_without_governance(audit, work)
    database.dispose_engines()  # the runner's next command is a new process
    refused_under_her_witness_then_the_sites(draft, tmp_path, monkeypatch, "rolled back")
    assert "rolled_back" in audit_verify_problems()

    with database.session(database.open_database()) as s:  # the witness rewritten and re-signed too
        current = chain.head(s)
    witness._write(protected.with_name("new.json"), witness.Witness(current, current))
    protected.with_name("new.json").replace(protected)
    with pytest.raises(UserError, match="is not approved"):
        release_plain(policy_path=str(draft))


def test_the_runner_cannot_give_back_a_published_charge_by_choosing_her_witness(
    demo_dir: Path, work: Path, tmp_path: Path, service_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims (with a site file): nothing is published without being charged to its dataset's
    lifetime budget; every run refuses a database put back to an older copy (check before
    spending). The runner puts back an older copy of the database in her work folder and moves
    the newer release to the share: naming a fresh witness is a setting error, the site's witness
    refuses the copy, and putting back the older witness too is refused by the newer release's
    signed head in the site's published folder. `audit verify` flags the rollback."""
    import shutil

    from privrelease import demo

    protected = tmp_path / "protected" / "audit.witness.json"
    published = tmp_path / "share"
    published.mkdir()
    write_site(witness=protected, public_key=service_key, releases=published)
    policy = demo_dir / demo.POLICY_FILE
    release_plain(policy_path=str(policy))
    copy_database(work / "audit.db", tmp_path / "copy.db")
    shutil.copy(protected, tmp_path / "older-witness.json")
    newer = release_plain(policy_path=str(policy))
    put_back(work / "audit.db", tmp_path / "copy.db")
    for folder in (work / "releases").iterdir():
        if newer.run_id[:8] in folder.name:
            folder.rename(published / folder.name)
    refused_under_her_witness_then_the_sites(policy, tmp_path, monkeypatch, "witness")
    shutil.copy(tmp_path / "older-witness.json", protected)
    with pytest.raises(AuditRefused, match="the signed head of release .*share"):
        release_plain(policy_path=str(policy))
    assert "rolled_back" in audit_verify_problems()


def test_a_committed_charge_hidden_from_the_text_match_is_refused_by_the_next_run(
    demo_dir: Path, work: Path, tmp_path: Path, service_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claim (database insider): every run refuses a tampered database before it reserves
    budget; every ledger entry must be as its newest record says. The refund here is not
    rechained and touches the ledger (SECURITY.md's limit on older records does not apply)."""
    from datetime import timedelta

    from privrelease import demo
    from privrelease.audit import ledger
    from privrelease.audit.models import LedgerEntry, utcnow

    monkeypatch.setenv("PRIVRELEASE_WITNESS", str(tmp_path / "protected" / "audit.witness.json"))
    policy = demo_dir / demo.POLICY_FILE
    release_plain(policy_path=str(policy))
    release_plain(policy_path=str(policy))
    audit = database.open_database()
    with database.session(audit) as s:  # the insider: no key, nothing rehashed or rechained
        entry = s.get(LedgerEntry, 1)
        assert entry.state == "committed"
        described = [
            r
            for r in s.exec(select(AuditEvent).order_by(col(AuditEvent.seq)))
            if json.loads(r.payload_json).get("table") == "ledger_entry" and json.loads(r.payload_json).get("key") == 1
        ]
        assert [r.kind for r in described] == ["ledger_reserved", "ledger_committed"]
        committed = described[-1]
        committed.payload_json = json.dumps(json.loads(committed.payload_json), sort_keys=True)  # ", " and ": "
        entry.state, entry.reason, entry.updated_at = "reserved", None, entry.created_at
        assert chain.row_sha256(entry) == json.loads(described[0].payload_json)["row_sha256"]
        s.add_all([committed, entry])
    later = utcnow() + timedelta(hours=2)  # a charge older than the reservation TTL (default 1 h)
    monkeypatch.setattr(ledger, "utcnow", lambda: later)
    assert "payload" in " ".join(p.message for p in check(audit, public_key=signing.public_key(service_key)).problems)
    for _ in range(2):  # the claim: refused before spending, every time
        with pytest.raises(UserError, match="refused before spending"):
            release_plain(policy_path=str(policy))
    with database.session(audit, readonly=True) as s:  # and nothing given back: no record releases a charge
        kinds = [r.kind for r in s.exec(select(AuditEvent).where(col(AuditEvent.kind).in_(LEDGER_RECORD_KINDS)))]
        assert kinds.count("ledger_committed") == 2 and not {"ledger_expired", "ledger_released"} & set(kinds)


def _published_to_the_share(
    demo_dir: Path, work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Path, Any, Path]:
    """The demo released once with the witness where the runner cannot write it, and its folder
    moved to the share, as published releases are: (policy, what was published, the share)."""
    from privrelease import demo

    monkeypatch.setenv("PRIVRELEASE_WITNESS", str(tmp_path / "protected" / "audit.witness.json"))
    policy = demo_dir / demo.POLICY_FILE
    published = release_plain(policy_path=str(policy))
    share = tmp_path / "share"
    share.mkdir()
    for folder in (work / "releases").iterdir():
        if published.run_id[:8] in folder.name:
            folder.rename(share / folder.name)
    return policy, published, share


def test_a_published_run_set_back_to_running_is_not_laundered_by_recovery(
    demo_dir: Path, work: Path, tmp_path: Path, service_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims (database insider): edits to rows are noticed by `audit verify --public-key`
    (nothing is changed without a trace) and a tampered database is refused before spending.
    The release folder went to the share, as published releases do."""
    from privrelease.audit.models import Run

    policy, published, share = _published_to_the_share(demo_dir, work, tmp_path, monkeypatch)
    audit = database.open_database()
    with database.session(audit) as s:  # the insider: one column, in place
        run = s.get(Run, published.run_id)
        assert run.status == "succeeded"
        run.status, run.finished_at = "running", None
        s.add(run)
    with pytest.raises(AuditRefused, match=f"run {published.run_id} is not settled: run {published.run_id} was edited"):
        release_plain(policy_path=str(policy))
    with database.session(audit, readonly=True) as s:
        assert s.get(Run, published.run_id).status == "running"  # as the insider left it: not laundered
    assert "row_edited" in [p.kind for p in check(audit, public_key=signing.public_key(service_key)).problems]


def test_a_published_charge_cannot_be_given_back_through_crash_recovery(
    demo_dir: Path, work: Path, tmp_path: Path, service_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims: nothing is published without being charged to its dataset's lifetime budget;
    the database insider cannot get a tampered database spent (refund written into the row:
    refused) nor go unnoticed by `audit verify --public-key`; a charge whose outputs are visible
    is never given back. The release folder went to the share, as published releases do."""
    from privrelease.audit.models import LedgerEntry, Run

    policy, published, share = _published_to_the_share(demo_dir, work, tmp_path, monkeypatch)
    (head,) = share.glob(f"*/{chain.RELEASE_HEAD_FILE}")
    audit = database.open_database()
    with database.session(audit) as s:  # the insider: two columns, in place, nothing rehashed
        run = s.get(Run, published.run_id)
        (entry,) = s.exec(select(LedgerEntry).where(LedgerEntry.run_id == published.run_id)).all()
        assert (run.status, entry.state) == ("succeeded", "committed")
        run.status, run.finished_at, entry.state = "running", None, "reserved"
        s.add_all([run, entry])
    with pytest.raises(AuditRefused, match="refused before spending: ledger entry .* was edited"):
        release_plain(policy_path=str(policy))
    with database.session(audit, readonly=True) as s:
        (entry,) = s.exec(select(LedgerEntry).where(LedgerEntry.run_id == published.run_id)).all()
        assert entry.state == "reserved" and s.get(Run, published.run_id).status == "running"  # nothing settled
    result = check(audit, public_key=signing.public_key(service_key), head=chain.read_head(head))
    assert {"row_edited"} <= {p.kind for p in result.problems}


# --------------------------------------------------------------------------- a second account

AS_THE_RUNNER = r"""
import json, sys
from pathlib import Path
from typer.testing import CliRunner
from privrelease import site
site.SITE_FILE = Path(sys.argv[1])  # the suite's own site file, as conftest pins it
from privrelease.cli import app
from privrelease.errors import UserError
from privrelease.flows.steps import release_plain
try:
    release_plain(policy_path=sys.argv[2])
    run = "published"
except UserError as error:
    run = str(error)
verified = CliRunner().invoke(app, ["audit", "verify", "--json"])
print(json.dumps({"run": run, "verify": [problem["kind"] for problem in json.loads(verified.stdout)["problems"]]}))
"""


@pytest.fixture
def runners_account(tmp_path: Path) -> Any:
    """A second local account (``nobody``) for the runner, and a folder every account can reach
    (pytest's own are root's, 0700): root reads any file, so what the runner cannot read is
    shown by a process of hers (``setpriv``). Skipped unless the suite runs as root with
    ``setpriv`` and that account."""
    import os
    import pwd
    import shutil
    import tempfile

    setpriv = shutil.which("setpriv")
    if os.geteuid() != 0 or setpriv is None:
        pytest.skip("needs root and setpriv (util-linux) to run a process as a second account")
    try:
        account = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' account to be the second account")
    import subprocess
    import sys

    ids = [f"--reuid={account.pw_uid}", f"--regid={account.pw_gid}", "--clear-groups"]
    probe = subprocess.run(
        [setpriv, *ids, sys.executable, "-c", "import privrelease.cli"], capture_output=True, text=True, timeout=120
    )
    if probe.returncode != 0:  # e.g. a checkout under a 0700 folder (mktemp -d, a home folder)
        pytest.skip(
            f"the second account cannot import this checkout's environment ({sys.executable}): a folder on its path is private"
        )
    base = Path(tempfile.mkdtemp(prefix="privrelease-runner-"))
    base.chmod(0o755)

    def run_as_her(*args: str, owned: list[Path]) -> dict[str, Any]:
        """``AS_THE_RUNNER`` with ``args`` as her, the paths ``owned`` (recursively) made hers."""
        for top in owned:
            for path in [top, *(top.rglob("*") if top.is_dir() else [])]:
                os.chown(path, account.pw_uid, account.pw_gid, follow_symlinks=False)
        done = subprocess.run(
            [setpriv, *ids, sys.executable, "-c", AS_THE_RUNNER, *args],
            capture_output=True,
            text=True,
            cwd=base,
            env={**os.environ, "HOME": str(base)},
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout.splitlines()[-1])

    yield base, run_as_her
    shutil.rmtree(base)


def test_a_release_head_the_runner_cannot_read_is_a_refusal(
    work: Path, runners_account: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Claims (runner, with a site file pinning the witness, the service key and the share): a
    charge is never given back by putting back an older database and witness while the newer
    release sits in a published folder; `audit verify` shows it. She puts back both copies from
    after release 1 and takes release 2 out of her `--out`; its signed head sits in the share,
    but she cannot read it: a copy that is not hers, 0600 (as heads were written), or her own
    that she `chmod 000`s in an add-only share. A head nobody can check was skipped, so her next
    run spent again (issue 25, item 18); it is a refusal, for the run and for `audit verify`."""
    import os
    import shutil

    from privrelease import demo, site

    base, run_as_her = runners_account
    mine = base / "runner"
    mine.mkdir()
    public = signing.generate(mine / "service.key")
    monkeypatch.setenv("PRIVRELEASE_SIGNING_KEY", str(mine / "service.key"))
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(mine / "work"))
    protected = mine / "witness" / "audit.witness.json"  # her process writes it: she can put it back
    share = base / "share"
    share.mkdir()
    write_site(witness=protected, public_key=public, releases=share)
    custodians = shutil.copy(site.SITE_FILE, base / "site.yaml")
    policy, _ = demo.write_demo(mine / "demo", seed=11)
    release_plain(policy_path=str(policy))
    copy_database(mine / "work" / "audit.db", base / "copy.db")
    shutil.copy(protected, base / "older-witness.json")
    newer = release_plain(policy_path=str(policy))
    put_back(mine / "work" / "audit.db", base / "copy.db")
    shutil.copy(base / "older-witness.json", protected)
    (folder,) = [f for f in (mine / "work" / "releases").iterdir() if newer.run_id[:8] in f.name]
    folder.rename(share / folder.name)
    head = share / folder.name / chain.RELEASE_HEAD_FILE
    assert os.stat(head).st_mode & 0o044 == 0o044  # heads are written public now

    head.chmod(0o600)  # not hers (the custodian's copy), owner-only
    refused = run_as_her(str(custodians), str(policy), owned=[mine])
    assert "refused before spending" in refused["run"] and "cannot be read (Permission denied)" in refused["run"]
    assert str(head) in refused["run"] and "head_unreadable" in refused["verify"]

    os.chown(head, *[os.stat(mine).st_uid, os.stat(mine).st_gid])  # hers, in a share she can only add to
    head.chmod(0o000)
    refused = run_as_her(str(custodians), str(policy), owned=[])
    assert "cannot be read (Permission denied)" in refused["run"] and "head_unreadable" in refused["verify"]


def test_a_release_head_that_does_not_parse_is_a_refusal(
    demo_dir: Path, work: Path, tmp_path: Path, service_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A head in a checked folder that is not a head (garbled) cannot be checked either: the next
    run is refused and `audit verify` names it, where it was skipped (issue 25, item 18)."""
    from privrelease import demo

    share = tmp_path / "share"
    share.mkdir()
    write_site(public_key=service_key, releases=share)
    policy = demo_dir / demo.POLICY_FILE
    published = release_plain(policy_path=str(policy))
    folder = Path(published.release_dir)
    folder.rename(share / folder.name)
    (share / folder.name / chain.RELEASE_HEAD_FILE).write_text('{"seq": "newest"}')
    with pytest.raises(AuditRefused, match="refused before spending: chain head file .*share.* it cannot be checked"):
        release_plain(policy_path=str(policy))
    assert "head_unreadable" in audit_verify_problems()
