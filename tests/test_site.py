"""The site file (``privrelease/site.py``): what the custodian pins, read by every command, that
the environment can tighten and never loosen. The attacks it stops, with the service key in
the runner's hands, are in ``test_attacks_found.py``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import test_flow_steps as flow_steps
import test_governance as governed
from test_attacks_found import write_site
from test_check_before_spending import copy_database, put_back
from test_signed_approvals import write_registry
from typer.testing import CliRunner

from privrelease import site
from privrelease.audit import approvals, approvers, database, signing
from privrelease.cli import app
from privrelease.errors import AuditRefused, UserError
from privrelease.settings import get_settings

keys, service_key, release_plain = governed.keys, governed.service_key, governed.release_plain


def test_without_a_site_file_nothing_is_pinned(work: Path) -> None:
    assert not site.SITE_FILE.exists()
    assert get_settings().site == site.Site()
    assert get_settings().site.verifying_key() is None
    site.SITE_FILE.write_text("# nothing pinned yet\n")
    assert site.load() == site.Site(source=site.SITE_FILE) and not get_settings().production


def test_the_environment_cannot_loosen_the_site(work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Production stays on whatever PRIVRELEASE_PRODUCTION says; the witness and the registry
    are the site's: another file named by the environment is one error naming the variable,
    the same file spelt otherwise is fine."""
    registry = write_registry(tmp_path / "approvers.yaml", {"Ada": signing.generate(tmp_path / "ada.key")})
    witness = tmp_path / "protected" / "audit.witness.json"
    write_site(production=True, approvers=registry, witness=witness)
    monkeypatch.setenv("PRIVRELEASE_PRODUCTION", "false")
    pinned = get_settings()
    assert pinned.production and pinned.witness == str(witness) and pinned.approvers == str(registry)
    monkeypatch.setenv("PRIVRELEASE_WITNESS", str(tmp_path / "protected" / ".." / "protected" / "audit.witness.json"))
    assert get_settings().witness == str(witness)
    for variable, other in (("PRIVRELEASE_WITNESS", "mine.json"), ("PRIVRELEASE_APPROVERS", "mine.yaml")):
        monkeypatch.setenv(variable, str(tmp_path / other))
        with pytest.raises(UserError, match=f"{variable}=.*mine.* names another file than the site file") as error:
            get_settings()
        assert error.value.field == variable
        monkeypatch.delenv(variable)


def test_an_edited_site_file_is_read_at_the_next_call(work: Path) -> None:
    write_site(production=False)
    assert not get_settings().production
    write_site(production=True)
    assert get_settings().production


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("production: [", "is not valid YAML"),
        ("- production", "must be a mapping of production"),
        ("production: maybe", "production='maybe' is not valid"),
        ("witnes: /var/lib/w.json", "witnes='/var/lib/w.json' is not valid (Extra inputs are not permitted)"),
        ("witness: relative/w.json", "witness='relative/w.json' is not valid (must be an absolute path"),
        ("releases: [/srv/share, share]", "must be absolute folder paths; got 'share'"),
        ("public_key: not-a-key", "public_key='not-a-key' is not valid (must be the key (base64) or the absolute path"),
        ("public_key: agency.key.pub", "public_key='agency.key.pub' is not valid (must be the key (base64) or the"),
        ("public_key: /nowhere/agency.key.pub", "public_key='/nowhere/agency.key.pub' is not valid"),
    ],
)
def test_a_malformed_site_file_is_one_line_naming_the_field(
    work: Path, text: str, named: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every command reads the site file first (the settings): the program's own entry point
    prints one line and exits 2."""
    import sys

    from privrelease.cli import main

    site.SITE_FILE.write_text(text)
    monkeypatch.setattr(sys, "argv", ["privrelease", "ledger", "list"])
    with pytest.raises(SystemExit) as exited:
        main()
    error = capsys.readouterr().err
    assert exited.value.code == 2, error
    assert str(site.SITE_FILE) in error and named in error
    assert "Traceback" not in error and len(error.strip().splitlines()) == 1


@pytest.mark.parametrize("lost", ["the file", "its folder"])
def test_a_site_file_lost_behind_a_dangling_link_is_refused(
    work: Path, tmp_path: Path, lost: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A site path that is a symbolic link resolving to nothing (the file's, or a folder's on its
    path) is not "no site file": the pins it held would be gone without a word (issue 25, item
    23). Every command refuses to start, one line naming the link, exit 2; a missing target that
    is not behind a link is still no site file."""
    import sys

    from privrelease.cli import main

    custodians = tmp_path / "custodian"
    custodians.mkdir()
    write_site(production=True)
    site.SITE_FILE.rename(custodians / "site.yaml")
    if lost == "the file":
        link = site.SITE_FILE
        link.symlink_to(custodians / "site.yaml")
    else:
        link = tmp_path / "etc-privrelease"
        link.symlink_to(custodians, target_is_directory=True)
        monkeypatch.setattr(site, "SITE_FILE", link / "site.yaml")
    assert get_settings().production  # pinned through the link
    custodians.rename(tmp_path / "moved")
    with pytest.raises(UserError, match=f"{link}' is a symbolic link to .*custodian.*, which does not exist"):
        site.load()
    monkeypatch.setattr(sys, "argv", ["privrelease", "ledger", "list"])
    with pytest.raises(SystemExit) as exited:
        main()
    error = capsys.readouterr().err
    assert exited.value.code == 2 and "does not exist (it would pin nothing)" in error, error
    assert "Traceback" not in error and len(error.strip().splitlines()) == 1
    link.unlink()
    assert site.load() == site.Site()


def test_the_sites_registry_overrides_the_one_pinned_in_the_database(
    demo_dir: Path, work: Path, tmp_path: Path, keys: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner starts a fresh database and pins her own registry first (trust on first use:
    Mallory's key under Ada's name), then approves as "Ada": it counts by the database's pin,
    never against the site's registry."""
    from privrelease import demo
    from privrelease.flows.opening import approval_binding
    from privrelease.policies import load_policy

    monkeypatch.delenv("PRIVRELEASE_APPROVERS", raising=False)
    policy = demo_dir / demo.POLICY_FILE
    loaded = load_policy(policy)
    hers = approvers.load(write_registry(tmp_path / "hers.yaml", {"Ada": keys["public"]["Mallory"]}))
    with database.session(database.open_database()) as s:
        approvals.set_production_mode(s, True, by="Runner", registry=hers)
        approvals.approve_policy(
            s, approvals.policy_facts(loaded), "Ada", key=keys["Mallory"], binding=approval_binding(loaded)
        )
        assert approvals.effective_registry(s).sha256 == hers.sha256  # type: ignore[union-attr]
    write_site(approvers=write_registry(tmp_path / "site.yaml", {"Ada": keys["public"]["Ada"]}))
    with pytest.raises(UserError, match="has 0 current approver.*signed by their registered key.*does not verify"):
        release_plain(policy_path=str(policy))


@pytest.mark.parametrize("held", ["none", "another"])
def test_a_run_without_the_sites_service_key_is_refused_before_spending(
    demo_dir: Path, work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, held: str
) -> None:
    """Records a run writes must verify against the site's key, and the release heads are
    checked against it whatever the runner sets: without that key, nothing runs."""
    from privrelease import demo

    pinned = signing.generate(tmp_path / "agency.key")
    write_site(public_key=tmp_path / "agency.key.pub")
    if held == "another":
        signing.generate(tmp_path / "other.key")
        monkeypatch.setenv("PRIVRELEASE_SIGNING_KEY", str(tmp_path / "other.key"))
    else:
        monkeypatch.delenv("PRIVRELEASE_SIGNING_KEY", raising=False)
    with pytest.raises(AuditRefused, match=f"pins the service key {signing.fingerprint(pinned)}"):
        release_plain(policy_path=str(demo_dir / demo.POLICY_FILE))
    monkeypatch.setenv("PRIVRELEASE_SIGNING_KEY", str(tmp_path / "agency.key"))
    assert release_plain(policy_path=str(demo_dir / demo.POLICY_FILE)).run_id


def test_audit_verify_reads_the_witness(demo_dir: Path, work: Path, tmp_path: Path) -> None:
    """Without a site file too: a database put back to an older copy is flagged against the
    witness beside it, which `audit verify` now reads as every run does."""
    from privrelease import demo

    policy = demo_dir / demo.POLICY_FILE
    release_plain(policy_path=str(policy))
    copy_database(work / "audit.db", tmp_path / "copy.db")
    release_plain(policy_path=str(policy))
    put_back(work / "audit.db", tmp_path / "copy.db")
    result = CliRunner().invoke(app, ["audit", "verify", "--json", "--no-files"])
    assert result.exit_code == 1
    found = json.loads(result.stdout)["problems"]
    assert any(p["kind"] == "rolled_back" and "witness" in p["message"] for p in found), found


def test_a_draft_is_refused_on_a_production_site(demo_dir: Path, work: Path) -> None:
    write_site(production=True)
    with pytest.raises(UserError, match="is not approved"):
        release_plain(policy_path=str(flow_steps.variant(demo_dir, "draft")))


def test_a_fresh_database_is_refused_under_the_sites_witness(
    demo_dir: Path, work: Path, tmp_path: Path, service_key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner points PRIVRELEASE_DB_URL at a fresh database of her own, whose ledger has
    spent nothing: the site's witness names a head that database does not hold."""
    from privrelease import demo

    write_site(witness=tmp_path / "protected" / "audit.witness.json", public_key=service_key)
    policy = demo_dir / demo.POLICY_FILE
    release_plain(policy_path=str(policy))
    monkeypatch.setenv("PRIVRELEASE_DB_URL", f"sqlite:///{tmp_path / 'fresh.db'}")
    monkeypatch.setenv("PRIVRELEASE_AUTO_INIT", "true")
    with pytest.raises(AuditRefused, match="the log ends at record .* but the witness"):
        release_plain(policy_path=str(policy))


def test_audit_verify_flags_what_no_recorded_run_published_in_the_sites_folders(work: Path, tmp_path: Path) -> None:
    """A release made outside privrelease (a modified copy run with the service key writes no
    record) and copied to the share is flagged by `audit verify` on the custodian's host."""
    share = tmp_path / "share"
    (share / "census-v1-by-hand").mkdir(parents=True)
    (share / "census-v1-by-hand" / "counts.csv").write_text("age,count\n30-39,12\n")
    write_site(releases=share)
    CliRunner().invoke(app, ["audit", "init"])
    result = CliRunner().invoke(app, ["audit", "verify", "--json"])
    assert result.exit_code == 1
    found = json.loads(result.stdout)["problems"]
    assert [p["kind"] for p in found] == ["unrecorded_release"] and "census-v1-by-hand" in found[0]["message"]


def test_audit_mode_names_the_site_as_what_set_production(work: Path, tmp_path: Path) -> None:
    registry = write_registry(tmp_path / "approvers.yaml", {"Ada": signing.generate(tmp_path / "ada.key")})
    write_site(production=True, approvers=registry)
    CliRunner().invoke(app, ["audit", "init"])
    shown = CliRunner().invoke(app, ["audit", "mode"]).output
    assert f"mode: production (set by the site file {site.SITE_FILE})" in shown
    assert f"approver registry: {registry}, pinned by the site file" in shown
    for file in (site.SITE_FILE, registry):  # the suite's own files (as root, every file is writable)
        assert f"warning: this account can write {file}: the site file pins nothing against it" in shown
    document = json.loads(CliRunner().invoke(app, ["audit", "mode", "--json"]).stdout)
    assert document["mode"] == "production" and document["database"] == "development"
    assert document["site"] == {"file": str(site.SITE_FILE), "production": True, "approvers": str(registry)}


def test_the_readme_site_example_is_a_valid_site_file(tmp_path: Path) -> None:
    import re

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    (block,) = [b for b in re.findall(r"```yaml\n(.*?)```", readme, re.S) if b.startswith("production:")]
    public = signing.generate(tmp_path / "agency.key")
    site.SITE_FILE.write_text(block.replace("/etc/privrelease/agency.key.pub", str(tmp_path / "agency.key.pub")))
    pinned = site.load()
    assert pinned.production and pinned.releases == (Path("/srv/share/releases"),)
    assert signing.encode_public(pinned.verifying_key()) == public


def test_writable_names_the_pinned_files_this_account_could_change(
    work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each pinned file counts as writable when it, or its folder, is, through a symlink too
    (os.access decides: the suite runs as root, who may write anything)."""
    registry = write_registry(tmp_path / "approvers.yaml", {"Ada": signing.generate(tmp_path / "ada.key")})
    shared = tmp_path / "runners" / "agency.key.pub"
    shared.parent.mkdir()
    shared.write_text(signing.generate(tmp_path / "agency.key"))
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "agency.key.pub").symlink_to(shared)
    write_site(approvers=registry, public_key=tmp_path / "etc" / "agency.key.pub")
    runners = {shared.parent, registry}
    monkeypatch.setattr(site.os, "access", lambda path, mode: Path(path) in runners)
    assert site.load().writable() == [registry, tmp_path / "etc" / "agency.key.pub"]
    runners.clear()
    assert site.load().writable() == []


def test_the_site_pins_the_work_folder(work: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a pin the work folder follows the current directory and `audit init` says so (a
    second folder is a second ledger for the same dataset.id); with the site's `work:`, every
    folder a command starts in finds the one audit database there, a PRIVRELEASE_WORK_DIR naming
    another folder is one error naming it, and a PRIVRELEASE_DB_URL stays the user's (issue 25,
    item 15)."""
    monkeypatch.delenv("PRIVRELEASE_WORK_DIR")
    first, second, pinned = tmp_path / "first", tmp_path / "second", tmp_path / "site-work"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    result = CliRunner().invoke(app, ["audit", "init"])
    assert result.exit_code == 0, result.output
    assert f"the work folder {first / 'privrelease-work'} follows the current directory" in result.stderr
    database.dispose_engines()

    write_site(work=pinned)
    created = []
    for folder in (first, second):
        monkeypatch.chdir(folder)
        assert get_settings().work_dir == pinned and get_settings().db_url == f"sqlite:///{pinned / 'audit.db'}"
        result = CliRunner().invoke(app, ["audit", "init", "--json"])
        assert result.exit_code == 0 and "follows the current directory" not in result.stderr, result.output
        created.append(json.loads(result.stdout)["created"])
        database.dispose_engines()
    assert created == [True, False] and not (second / "privrelease-work").exists()

    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(pinned / ".." / "site-work"))
    assert get_settings().work_dir == pinned
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(second / "privrelease-work"))
    with pytest.raises(UserError, match="PRIVRELEASE_WORK_DIR=.* names another folder than the site file") as error:
        get_settings()
    assert error.value.field == "PRIVRELEASE_WORK_DIR"
    monkeypatch.delenv("PRIVRELEASE_WORK_DIR")
    monkeypatch.setenv("PRIVRELEASE_DB_URL", f"sqlite:///{tmp_path / 'mine.db'}")
    assert get_settings().db_url == f"sqlite:///{tmp_path / 'mine.db'}" and get_settings().work_dir == pinned
