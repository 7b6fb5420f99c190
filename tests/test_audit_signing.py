"""The insider attack matrix: a colleague with write access to the audit database (and
privrelease's own code, but not the signing key) rewrites history; a file-share writer changes
a published release. Each attack must be caught by `audit verify --public-key` or by
`audit verify-release` of an affected release; the same attacks without signatures show why
the key is needed (a rechained history passes the unsigned check).

Threat model (docs: audit/signing.py):
* database writer, no key: can edit, add, delete rows and records and recompute every hash;
  cannot make a valid signature, so every record it adds or rechains is flagged; deleting the
  newest records is caught against any release's signed head file written after them.
* file-share writer: can change, add or swap files of a release folder; the signed head file
  lists every file's sha256, and a swapped head file fails its signature or its file list.
* key holder: can write any history; that is why the key lives outside the database.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import col, select
from typer.testing import CliRunner

from privrelease import demo
from privrelease.audit import approvals, chain, signing
from privrelease.audit.database import dispose_engines, open_database, session
from privrelease.audit.models import AUDITED_TABLES, AuditEvent, ChainHead, LedgerEntry, Report, Run
from privrelease.cli import app
from privrelease.errors import UserError
from privrelease.files import sha256_text
from privrelease.flows.steps import release_plain
from privrelease.policies import load_policy

runner = CliRunner()


@pytest.fixture(scope="module")
def signed_history(tmp_path_factory):
    """Two signed releases of the demo policy (one approved), the key pair and the database."""
    base = tmp_path_factory.mktemp("signed")
    public = signing.generate(base / "agency.key")
    policy, _ = demo.write_demo(base / "demo", seed=5)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PRIVRELEASE_WORK_DIR", str(base / "work"))
        patch.setenv("PRIVRELEASE_SIGNING_KEY", str(base / "agency.key"))
        for name in ("PRIVRELEASE_DB_URL", "PRIVRELEASE_PRODUCTION"):
            patch.delenv(name, raising=False)
        first = release_plain(policy_path=str(policy))
        with session(open_database()) as s:
            approvals.approve_policy(s, approvals.policy_facts(load_policy(policy)), "Reviewer")
        second = release_plain(policy_path=str(policy))
    dispose_engines()
    return base, public, Path(first.release_dir), Path(second.release_dir)


@pytest.fixture
def attacked(signed_history, tmp_path, monkeypatch):
    """A copy of the signed database (and releases) to attack; the key is not configured."""
    base, public, first, second = signed_history
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(base / "work" / "audit.db", work / "audit.db")  # the releases stay where they were published
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(work))
    for name in ("PRIVRELEASE_DB_URL", "PRIVRELEASE_SIGNING_KEY", "PRIVRELEASE_PRODUCTION"):
        monkeypatch.delenv(name, raising=False)
    yield open_database(), public, first, second
    dispose_engines()


def verify(*args: str) -> tuple[int, list[dict[str, Any]]]:
    result = runner.invoke(app, ["audit", "verify", "--json", *args])
    return result.exit_code, json.loads(result.output)["problems"]


def rechain(
    engine: Any, *, drop_run: str | None = None, drop_kinds: Collection[str] = (), key: Any = None
) -> dict[int, chain.Head]:
    """What an insider does after editing rows: re-describe every row as it now is, drop the
    records of a deleted run (and those of ``drop_kinds``), renumber and recompute every hash, and
    move the chain head. Without ``key`` the signatures are left as they were (or none); with it
    (the runner holds the service key) every record is signed again. Returns the new head of
    each kept record by its old seq."""
    with session(engine) as s:
        records = list(s.exec(select(AuditEvent).order_by(col(AuditEvent.seq))))
        current = {
            (table, json.dumps(chain.primary_key(row), default=str)): chain.row_sha256(row)
            for table, cls in AUDITED_TABLES.items()
            for row in s.exec(select(cls))
        }
        kept = []
        for record in records:
            payload = json.loads(record.payload_json)
            if (drop_run is not None and payload.get("run") == drop_run) or record.kind in drop_kinds:
                continue
            described = (payload.get("table"), json.dumps(payload.get("key"), default=str))
            if described in current:
                payload["row_sha256"] = current[described]
            kept.append((record, payload))
        for record in records:
            s.delete(record)
        s.flush()
        previous, renumbered = chain.GENESIS_HASH, {}
        for seq, (record, payload) in enumerate(kept, 1):
            digest = chain.record_hash(previous, seq, record.time, record.kind, payload)
            signature = record.signature if key is None else signing.sign(key, signing.record_message(seq, digest))
            s.add(
                AuditEvent(
                    seq=seq,
                    time=record.time,
                    kind=record.kind,
                    payload_json=chain.canonical_json(payload),
                    prev_hash=previous,
                    hash=digest,
                    signature=signature,
                )
            )
            renumbered[record.seq] = chain.Head(seq, digest)
            previous = digest
        head = s.get(ChainHead, 1)
        head.seq, head.hash = len(kept), previous
        s.add(head)
    return renumbered


def _refund(engine: Any) -> None:
    with session(engine) as s:
        entry = s.exec(select(LedgerEntry)).first()
        entry.state = "released"
        s.add(entry)


def _delete_run(engine: Any) -> str:
    with session(engine) as s:
        run = s.exec(select(Run).order_by(col(Run.started_at))).first()
        for cls in AUDITED_TABLES.values():
            if cls is not Run and "run_id" in cls.model_fields:
                for row in s.exec(select(cls).where(cls.run_id == run.id)):
                    s.delete(row)
        s.flush()
        s.delete(run)
        return run.id


def _replace_report(engine: Any) -> None:
    with session(engine) as s:
        report = s.exec(select(Report)).first()
        report.html = report.html.replace("Disclosure report", "Nothing to disclose")
        report.sha256 = sha256_text(report.html)
        s.add(report)


def _forge_approval(engine: Any) -> None:
    with session(engine) as s:
        version = approvals.list_policies(s)[0]
        facts = approvals.PolicyFacts(version.name, version.version, version.sha256, version.canonical_json)
        approvals.approve_policy(s, facts, "Chief Privacy Officer", note="back-dated")


@pytest.mark.parametrize("attack", ["refund", "delete run", "replace report", "forged approval"])
def test_rechained_history_is_caught_only_with_the_key(attacked, attack):
    engine, public, _, newest = attacked
    assert verify("--public-key", public) == (0, [])
    if attack == "refund":
        _refund(engine)
        rechain(engine)
    elif attack == "delete run":
        rechain(engine, drop_run=_delete_run(engine))
    elif attack == "replace report":
        _replace_report(engine)
        rechain(engine)
    else:
        _forge_approval(engine)  # privrelease's own code, without the key
    code, problems = verify("--no-files")
    # the broken variant: a hash chain alone does not see it (a deleted run's folder still shows)
    assert [p for p in problems if p["kind"] != "unrecorded_release"] == []
    assert bool(problems) == (attack == "delete run")
    code, problems = verify("--no-files", "--public-key", public)
    assert code == 1 and {"unsigned", "bad_signature"} & {p["kind"] for p in problems}
    if attack == "delete run":  # the newest release's signed head names records the log lost
        code, problems = verify("--no-files", "--head", str(newest / "chain-head.json"))
        assert code == 1


@pytest.mark.parametrize("attack", ["edit record", "delete record", "truncate"])
def test_plain_tampering_is_caught(attacked, attack):
    engine, public, _, newest = attacked
    with session(engine) as s:
        records = list(s.exec(select(AuditEvent).order_by(col(AuditEvent.seq))))
        if attack == "edit record":
            records[3].kind = "policy_registered" if records[3].kind != "policy_registered" else "run_started"
            s.add(records[3])
        elif attack == "delete record":
            s.delete(records[4])
        else:  # cut the newest records off and move the head row back
            for record in records[-3:]:
                s.delete(record)
            head = s.get(ChainHead, 1)
            head.seq, head.hash = records[-4].seq, records[-4].hash
            s.add(head)
    code, problems = verify("--no-files", "--head", str(newest / "chain-head.json"), "--public-key", public)
    assert code == 1 and problems


def test_release_folders_verify_offline(attacked, tmp_path):
    """`verify-release`: intact as published; a changed output, an added file, a head file from
    another release or one re-signed by another key are each caught."""
    _, public, first, second = attacked
    check = lambda folder, key=public: runner.invoke(app, ["audit", "verify-release", str(folder), "--public-key", key])  # noqa: E731
    assert check(first).exit_code == 0 and check(second).exit_code == 0
    assert json.loads((second / "chain-head.json").read_text())["public_key"] == public
    assert f'<code class="hash">{public}</code>' in (second / "report.html").read_text()  # the report names it

    changed = tmp_path / "changed" / second.name  # the folder keeps its signed name
    shutil.copytree(second, changed)
    (changed / "mean-hours.parquet").write_bytes((changed / "mean-hours.parquet").read_bytes() + b"\0")
    result = check(changed)
    assert result.exit_code == 1 and "was changed" in result.output

    added = tmp_path / "added" / second.name  # the folder keeps its signed name
    shutil.copytree(second, added)
    (added / "extra.csv").write_text("x\n")
    assert "not among the signed files" in check(added).output

    swapped = tmp_path / "swapped" / second.name  # the folder keeps its signed name
    shutil.copytree(second, swapped)
    shutil.copy(first / "chain-head.json", swapped / "chain-head.json")
    assert check(swapped).exit_code == 1  # the first release's files differ in their bytes

    resigned = tmp_path / "resigned" / second.name  # the folder keeps its signed name
    shutil.copytree(second, resigned)
    other = signing.generate(tmp_path / "mallory.key")
    key = signing._load_private(str(tmp_path / "mallory.key"), 0)
    head = chain.read_head(resigned / "chain-head.json")
    body = json.loads((resigned / "chain-head.json").read_text())
    body.update(signature=signing.sign(key, head.message()), public_key=other)
    (resigned / "chain-head.json").write_text(json.dumps(body))
    assert "no valid signature of this key" in check(resigned).output
    assert check(resigned, other).exit_code == 0  # Mallory's key vouches for it: use the agency's


def test_release_heads_are_public(signed_history):
    """A release's head is as public as its other files (issue 25, item 14): written 0644, so a
    reviewer on another account, or a run's check of a published folder, can read it (it was
    0600: owner-only)."""
    import stat

    _, _, first, second = signed_history
    for folder in (first, second):
        modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in folder.iterdir()}
        assert modes[chain.RELEASE_HEAD_FILE] == 0o644
        assert all(mode & stat.S_IROTH for mode in modes.values()), modes


def test_an_unsigned_release_is_said_unsigned_not_forged(demo_dir, work, tmp_path, monkeypatch):
    """A release published without a signing key (the quickstart's) checked against a key is
    UNSIGNED, exit 3: not BROKEN ("forged, altered or signed by another", exit 1) as it was
    (issue 25, item 14); a changed file in it is still BROKEN, the missing signature named."""
    monkeypatch.delenv("PRIVRELEASE_SIGNING_KEY", raising=False)
    folder = Path(release_plain(policy_path=str(demo_dir / demo.POLICY_FILE)).release_dir)
    assert "signature" not in json.loads((folder / chain.RELEASE_HEAD_FILE).read_text())
    public = signing.generate(tmp_path / "agency.key")

    def check(*more: str) -> Any:
        return runner.invoke(app, ["audit", "verify-release", str(folder), "--public-key", public, *more])

    result = check()
    assert result.exit_code == 3, result.output
    assert result.output.startswith("UNSIGNED: ") and "published without a signing key" in result.output
    assert "BROKEN" not in result.output and "forged" not in result.output
    document = json.loads(check("--json").output)
    assert (document["ok"], document["status"], document["problems"]) == (False, "unsigned", [])
    assert document["unsigned"] is True
    (folder / "report.html").write_text("changed")
    (folder / "extra.csv").write_text("x\n")
    renamed = folder.rename(folder.with_name("r1"))
    folder = renamed
    result = check()
    assert result.exit_code == 1 and result.output.startswith("BROKEN: ") and "was changed" in result.output
    assert "carries no signature, so no key vouches for it" in result.output
    assert "the folder is named 'r1' but its head is for release" in result.output
    assert (
        "'report.html' does not have the sha256 " in result.output
        and " its head lists: it was changed" in result.output
    )
    assert "'extra.csv' is in the folder but not among the files its head lists" in result.output
    assert "signed" not in result.output.replace("unsigned", "")  # nothing in it was signed
    document = json.loads(check("--json").output)
    assert (document["status"], document["unsigned"], len(document["problems"])) == ("broken", True, 3)


def test_release_folders_swapped_on_the_share_fail(attacked, tmp_path):
    """Two complete signed releases swapped by renaming: each folder's signed head names the
    release it belongs to (folder, run, policy), so both fail; `--run`/`--policy` check it."""
    _, public, first, second = attacked
    share = tmp_path / "share"
    shutil.copytree(first, share / second.name)
    shutil.copytree(second, share / first.name)

    def check(folder: Path, *more: str) -> Any:
        return runner.invoke(app, ["audit", "verify-release", str(folder), "--public-key", public, *more])

    for folder in share.iterdir():
        result = check(folder)
        assert result.exit_code == 1 and "renamed or swapped" in result.output
    release = chain.read_head(second / "chain-head.json").release
    assert release is not None and release["folder"] == second.name
    policy = release["policy"]
    assert check(second, "--run", release["run"][:8], "--policy", policy).exit_code == 0
    assert f"run {release['run']}, policy {policy}" in check(second).output
    other_run = chain.read_head(first / "chain-head.json").release["run"]
    result = check(second, "--run", other_run)
    assert result.exit_code == 1 and f"not of --run {other_run}" in result.output
    assert check(second, "--policy", "another@1").exit_code == 1
    sha256 = release["policy_sha256"]
    assert check(second, "--policy", sha256[:12].upper()).exit_code == 0
    # a value that cannot name one run or policy is the user's mistake (a UserError: exit 2), never BROKEN
    for option, value, needed in (
        ("--run", release["run"][:4], "at least 8 of its hex characters"),
        ("--run", "not-a-run-id", "at least 8 of its hex characters"),
        ("--policy", sha256[:8], "NAME@VERSION or at least 12 hex digits"),
        ("--policy", policy.split("@")[0], "NAME@VERSION or at least 12 hex digits"),
    ):
        result = check(second, option, value)
        assert isinstance(result.exception, UserError) and needed in str(result.exception), result.output
        assert result.exception.field == option[2:] and "BROKEN" not in result.output


def test_a_record_signature_is_not_a_head_file(attacked, tmp_path):
    """A record's own signature presented as a signed `--head` file (the old head format signed
    the record message) is refused: head files are signed in their own domain."""
    engine, public, _, _ = attacked
    with session(engine) as s:
        record = s.exec(select(AuditEvent).order_by(col(AuditEvent.seq).desc())).first()
    forged = tmp_path / "head.json"
    forged.write_text(json.dumps({"seq": record.seq, "hash": record.hash, "signature": record.signature}))
    result = runner.invoke(app, ["audit", "verify", "--no-files", "--head", str(forged), "--public-key", public])
    assert result.exit_code == 1 and "signed in the old format" in result.output
    message = chain.Head(record.seq, record.hash).message()
    assert message != signing.record_message(record.seq, record.hash) and message.startswith(b"privrelease-head:")


def test_a_release_head_from_before_the_run_binding_verifies_with_a_warning(attacked, signed_history, tmp_path):
    """A head written before the binding (no `release`) keeps verifying, with a warning, but
    `--run` cannot be checked on it."""
    _, public, _, second = attacked
    old = tmp_path / "old" / second.name
    shutil.copytree(second, old)
    body = json.loads((old / "chain-head.json").read_text())
    del body["release"]
    key = signing.private_key(str(signed_history[0] / "agency.key"), "key")
    body["signature"] = signing.sign(key, signing.release_message(body["seq"], body["hash"], body["files"]))
    (old / "chain-head.json").write_text(json.dumps(body))
    check = lambda *more: runner.invoke(app, ["audit", "verify-release", str(old), "--public-key", public, *more])  # noqa: E731
    result = check()
    assert result.exit_code == 0 and "predates the run" in result.output
    result = check("--run", "0123456789")
    assert result.exit_code == 1 and "cannot be checked" in result.output
