"""The Python API's functions for the audit commands (``approve``, ``revoke``, ``ledger``,
``list_ledgers``, ``report``, ``list_reports``, ``reissue``, ``rerun``) end to end on a fresh work
dir: typed results, the CLI's figures and messages, nothing printed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import privrelease
from privrelease import demo
from privrelease.audit import approvers, signing
from privrelease.audit.database import dispose_engines, open_database, session
from privrelease.errors import UserError
from privrelease.files import sha256_file
from privrelease.flows.steps import release_plain


@pytest.fixture(autouse=True)
def _fresh_engines() -> Any:
    yield
    dispose_engines()


def cli_json(*args: str) -> Any:
    from privrelease.cli import app

    result = CliRunner().invoke(app, [*args, "--json"])
    assert result.exit_code == 0 and result.exception is None, result.output
    return json.loads(result.stdout)


def test_exported_lazily() -> None:
    for name in privrelease.API:
        assert callable(getattr(privrelease, name)), name
        assert name in dir(privrelease)


def test_approve_and_revoke(demo_dir: Path, work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = demo_dir / demo.POLICY_FILE
    public = signing.generate(tmp_path / "ada.key")
    approved = privrelease.approve(policy, by="Ada Lovelace", note="reviewed", key=tmp_path / "ada.key")
    assert (approved.policy.name, approved.policy.version) == ("demo-census", "1")
    assert approved.policy.sha256 == privrelease.load(policy).sha256
    assert (approved.approval.approved_by, approved.approval.note, approved.approval.binds) == (
        "Ada Lovelace",
        "reviewed",
        "data",
    )
    assert approved.signature.fingerprint == signing.fingerprint(public) and approved.signature.verified
    assert approved.dataset_id == "demo-census" and approved.chain_head.seq == 2  # policy registered, approval
    assert "sha256" in approved.binds  # the data's bytes, for people

    with pytest.raises(UserError, match="--binds must be one of data, path; got 'nope'"):
        privrelease.approve(policy, by="Ada Lovelace", binds="nope")
    with pytest.raises(UserError, match="--by must name the person approving"):
        privrelease.approve(policy, by="  ")

    proposed = privrelease.revoke(
        "demo-census@1", by="Grace Hopper", reason="wrong bins", propose=tmp_path / "revoke.json"
    )
    assert proposed.revoked == 1 and proposed.proposed == tmp_path / "revoke.json"
    assert json.loads((tmp_path / "revoke.json").read_text())["request"]["reason"] == "wrong bins"
    assert cli_json("policy", "show", "demo-census@1")["approved"] is True  # only proposed

    revoked = privrelease.revoke(approved.policy.sha256[:10], by="Grace Hopper", reason="wrong bins")
    assert (revoked.policy.sha256, revoked.revoked, revoked.proposed) == (approved.policy.sha256, 1, None)
    assert revoked.request["request"]["approvals"] == [approved.approval.nonce]
    assert cli_json("policy", "show", "demo-census@1")["approved"] is False
    with pytest.raises(UserError, match=r"policy demo-census@1 \(sha256 \w+\) has no approval to revoke"):
        privrelease.revoke("demo-census@1", by="Grace Hopper", reason="again")
    with pytest.raises(UserError, match="--by and --reason are required"):
        privrelease.revoke("demo-census@1", by="Grace Hopper", reason=" ")
    capsys.readouterr()
    privrelease.approve(policy, by="Ada Lovelace", key=tmp_path / "ada.key")
    assert capsys.readouterr() == ("", "")  # quiet


def test_approve_under_a_pinned_registry(demo_dir: Path, work: Path, tmp_path: Path) -> None:
    """Once a registry is pinned an approval must be signed by the key it declares for the
    approver (an identity of their own, not the runner's): the API refuses as the CLI does."""
    from privrelease.audit import approvals

    policy = demo_dir / demo.POLICY_FILE
    ada = signing.generate(tmp_path / "ada.key")
    signing.generate(tmp_path / "mallory.key")
    (tmp_path / "approvers.yaml").write_text(f"approvers:\n  Ada: {ada}\n")
    with session(open_database()) as s:
        approvals.set_production_mode(s, True, by="CPO", registry=approvers.load(tmp_path / "approvers.yaml"))
    with pytest.raises(UserError, match=r"an unsigned approval would not count \(pass --key\)"):
        privrelease.approve(policy, by="Ada")
    with pytest.raises(UserError, match="--key is not the key it declares for 'Ada'"):
        privrelease.approve(policy, by="Ada", key=tmp_path / "mallory.key")
    approved = privrelease.approve(policy, by="Ada", key=tmp_path / "ada.key")
    assert approved.signature.verified and approved.signature.status == "verified"


def test_ledger_reports_and_reissue(
    demo_dir: Path, work: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = demo_dir / demo.POLICY_FILE
    assert privrelease.list_ledgers() == [] and privrelease.list_reports() == []
    first = release_plain(policy_path=str(policy))
    capsys.readouterr()

    ledger = privrelease.ledger("demo-census")
    (entry,) = ledger.status.entries
    assert (entry.run_id, ledger.status.effective_state(entry)) == (first.run_id, "committed")
    assert ledger.latest == entry and ledger.runway is not None and ledger.runway.runs >= 1
    (vintage,) = ledger.vintages
    assert vintage.runs == [first.run_id]
    assert privrelease.ledger(vintage.dataset.fingerprint[:12]).dataset.id == "demo-census"  # a file names it too
    shown = cli_json("ledger", "show", "demo-census")
    assert shown["spent"] == ledger.status.spent.as_dict() and shown["remaining"] == ledger.status.remaining.as_dict()
    assert shown["runway"]["runs"] == ledger.runway.runs
    (listed,) = privrelease.list_ledgers()
    assert listed.dataset.id == "demo-census" and listed.status.spent == ledger.status.spent
    with pytest.raises(UserError, match="no dataset"):
        privrelease.ledger("no-such-dataset")

    (stored,) = privrelease.list_reports()
    assert (stored.run_id, stored.policy, stored.kind, stored.reissue_of) == (
        first.run_id,
        "demo-census",
        "release",
        None,
    )
    assert cli_json("report", "list") == {"reports": [stored.as_dict()]}
    located = privrelease.report(first.run_id[:10])
    assert (located.path, located.source, located.note) == (Path(first.report).resolve(), "file", None)

    handed = privrelease.reissue(first.run_id, out=tmp_path / "copies")
    assert handed.source_run_id == first.run_id and handed.folder is not None
    assert {o["sha256"] for o in first.outputs} <= {o.sha256 for o in handed.outputs}  # and the statement, ...
    assert all(sha256_file(Path(o.path)) == o.sha256 for o in handed.outputs)
    assert privrelease.ledger("demo-census").status.spent == ledger.status.spent  # no new charge
    reissued = privrelease.list_reports()[-1]
    assert (reissued.run_id, reissued.kind, reissued.reissue_of, reissued.path) == (
        handed.run_id,
        "reissue",
        first.run_id,
        handed.report,
    )
    with pytest.raises(UserError, match="only a succeeded release or rerun can be reissued"):
        privrelease.reissue(handed.run_id)

    Path(first.report).unlink()  # written out from the audit database's copy
    restored = privrelease.report(first.run_id)
    assert restored.source == "audit-db" and "is missing" in (restored.note or "")
    assert sha256_file(restored.path) == stored.sha256
    with pytest.raises(UserError, match="no run with id 'feedface'"):
        privrelease.report("feedface")
    assert capsys.readouterr() == ("", "")


def test_rerun_refuses_before_prefect(work: Path) -> None:
    with pytest.raises(UserError, match="no run with id 'feedface'"):
        privrelease.rerun("feedface")
    with pytest.raises(UserError, match="output format must be one of parquet, csv; got 'xlsx'"):
        privrelease.rerun("feedface", output_format="xlsx")


def test_rerun_runs_the_audited_flow(
    prefect_harness: str, demo_dir: Path, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``privrelease.rerun`` is ``privrelease rerun``: the stored policy, fresh randomness, a new charge."""
    monkeypatch.setenv("PREFECT_API_URL", prefect_harness)
    first = release_plain(policy_path=str(demo_dir / demo.POLICY_FILE))
    again = privrelease.rerun(first.run_id[:10], out=work / "again")
    assert again.run_id != first.run_id and again.release_dir.startswith(str(work / "again"))
    assert again.outputs[0]["sha256"] != first.outputs[0]["sha256"]
    entries = privrelease.ledger("demo-census").status.entries
    assert [(e.run_id, e.state) for e in entries] == [(first.run_id, "committed"), (again.run_id, "committed")]
    assert privrelease.verify().ok


def test_a_refusal_inside_the_flow_reaches_the_caller_as_the_cli_reports_it(
    prefect_harness: str, demo_dir: Path, work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A data step's refusal (an undeclared value, seen only when the data is read) is the
    same :class:`UserError` line ``privrelease run`` prints, not the flow's internal error."""
    monkeypatch.setenv("PREFECT_API_URL", prefect_harness)
    bad = demo_dir / "undeclared.csv"
    lines = (demo_dir / demo.DATA_FILE).read_text().splitlines(keepends=True)
    position = [name.strip('"') for name in lines[0].rstrip("\n").split(",")].index("sex")
    fields = lines[3].rstrip("\n").split(",")
    fields[position] = "UNDECLARED-SEX"
    lines[3] = ",".join(fields) + "\n"
    bad.write_text("".join(lines))
    with pytest.raises(UserError, match=r"^\w[\w ]*: .*column 'sex', data row 3") as caught:
        privrelease.run(demo_dir / demo.POLICY_FILE, data=bad)
    assert caught.value.exit_code == 2
    from privrelease.cli import app

    result = CliRunner().invoke(app, ["run", str(demo_dir / demo.POLICY_FILE), "--data", str(bad)])
    assert result.exit_code == 2 and str(caught.value) in " ".join(result.stderr.split())


def test_expected_failures_of_the_flow() -> None:
    """What :func:`privrelease.running.expected_failure` makes of each failure the flow can end in."""
    import pickle

    from privrelease.audit.ledger import LedgerStateError
    from privrelease.errors import AuditRefused, ClusterFailure, TargetNotMet
    from privrelease.flows.context import DataStepError
    from privrelease.running import expected_failure

    refused = expected_failure(DataStepError("read data", AuditRefused("the witness disagrees")))
    assert type(refused) is AuditRefused and str(refused) == "read data: the witness disagrees"
    assert refused.exit_code == 1
    withheld = pickle.loads(pickle.dumps(DataStepError("read data", UserError("row 3 holds 'x'"))))
    assert type(expected_failure(withheld)) is UserError
    assert str(expected_failure(withheld)) == "read data: (withheld)"
    lost = ClusterFailure("the scheduler went away")
    assert expected_failure(lost) is lost
    assert type(expected_failure(LedgerStateError("entry 3 is committed"))) is TargetNotMet
    assert expected_failure(DataStepError("mechanism", ZeroDivisionError("bug"))) is None
    assert expected_failure(KeyError("bug")) is None
