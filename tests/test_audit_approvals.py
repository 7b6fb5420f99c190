"""Policy versions and approvals: content-addressed, one hash per name@version, production mode
refusing unapproved or changed policies; lifetime budgets from the policy or the settings."""

from __future__ import annotations

import hashlib
import os
import pwd
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from sqlmodel import select
from test_audit_chain import BACKENDS, audit_database, check

from privrelease.audit import approvals, bindings, database, ledger
from privrelease.audit.bindings import Account, Binding
from privrelease.errors import UserError
from privrelease.policies.schema import LifetimeBudget

REPO = Path(__file__).resolve().parents[1]
DATA = "/data/census.csv"
BOUND = Binding(bindings.DATA, DATA, "ab" * 32)
"""What the approvals of these tests bind: the bytes with that sha256, first seen at ``DATA``."""


def facts(version: str = "1", content: str = "a") -> approvals.PolicyFacts:
    text = f'{{"content":"{content}","version":"{version}"}}'
    return approvals.PolicyFacts("census", version, hashlib.sha256(text.encode()).hexdigest(), text)


@pytest.fixture(params=BACKENDS)
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    with audit_database(request.param, tmp_path) as engine:
        yield engine


def test_approve_and_require(engine: Any) -> None:
    first = facts()
    with database.session(engine) as s:
        with pytest.raises(UserError, match="is not approved"):
            approvals.require_approved(s, first, data_path=DATA)
        approval = approvals.approve_policy(s, first, "  Ada  ", note="ok", binding=BOUND)
        assert approval.approved_by == "Ada" and approval.os_user == pwd.getpwuid(os.geteuid()).pw_name
        assert approval.os_uid == os.geteuid()
        approvals.approve_policy(s, first, "Grace", binding=BOUND, account=Account("grace"))
    with database.session(engine, readonly=True) as s:
        assert approvals.require_approved(s, first, data_path=DATA).approved_by == "Ada"  # the earliest
        assert [a.approved_by for a in approvals.approvals_of(s, first.sha256)] == [
            "Ada",
            "Grace",
        ]
        assert len(approvals.list_policies(s)) == 1
    assert check(engine).ok


def test_a_changed_policy_is_refused(engine: Any) -> None:
    with database.session(engine) as s:
        approvals.approve_policy(s, facts(), "Ada")
    edited = facts(content="b")
    with database.session(engine) as s:
        with pytest.raises(UserError, match="was changed"):
            approvals.require_approved(s, edited, data_path=DATA)
        with pytest.raises(UserError, match="new `version`"):
            approvals.approve_policy(s, edited, "Mallory")
    with database.session(engine) as s:
        approvals.approve_policy(s, facts(version="2", content="b"), "Ada")
    with database.session(engine, readonly=True) as s:
        assert approvals.find_policy(s, "census").version == "2"  # the newest
        assert approvals.find_policy(s, "census@1").sha256 == facts().sha256
        assert approvals.find_policy(s, facts().sha256[:8]).version == "1"
        with pytest.raises(UserError, match="no registered policy"):
            approvals.find_policy(s, "census@3")


def test_drafts_claim_no_version_and_one_content_is_registered_per_version(engine: Any) -> None:
    """Issue 18, item 2: drafts (the content of runs that did not publish) of one name@version
    may be many and claim nothing; registering (an approval, a publication) freezes one of them
    and refuses every other content, and the database itself refuses a second registered row
    (a unique index over the registered rows), while the chain still verifies."""
    import sqlalchemy as sa

    from privrelease.audit.models import PolicyVersion

    a, b, c = facts(content="a"), facts(content="b"), facts(content="c")
    with database.session(engine) as s:
        drafted = [approvals.record_draft(s, f) for f in (a, b, a)]
        assert [v.draft for v in drafted] == [True, True, True] and drafted[0] is drafted[2]
        assert approvals.list_policies(s) == [] and approvals.version_clash(s, c) is None
    with database.session(engine) as s:
        registered = approvals.register_policy(s, b)  # e.g. b's run published
        assert (registered.id, registered.draft) == (drafted[1].id, False)
        assert approvals.author_of(s, b.sha256) == bindings.os_account()  # who recorded the draft
    with database.session(engine) as s:
        for attempt in (approvals.register_policy, approvals.record_draft):
            with pytest.raises(UserError, match=r"census@1 is registered with other content .*version: \"2\""):
                attempt(s, c)
        with pytest.raises(UserError, match="census@1 is registered with other content"):
            approvals.approve_policy(s, a, "Ada")
        assert approvals.record_draft(s, b).id == registered.id and approvals.version_clash(s, b) is None
    with database.session(engine) as s:  # written past the functions: the database refuses it
        s.add(PolicyVersion(name="census", version="1", sha256=c.sha256, canonical_json=c.canonical_json))
        with pytest.raises(sa.exc.IntegrityError):
            s.flush()
        s.rollback()
    with database.session(engine, readonly=True) as s:
        assert [(v.sha256, v.draft) for v in s.exec(select(PolicyVersion).order_by(PolicyVersion.id))] == [
            (a.sha256, True),
            (b.sha256, False),
        ]
        assert approvals.find_policy(s, "census@1").sha256 == b.sha256
    assert check(engine).ok


@pytest.mark.parametrize(
    ("version", "taken", "expected"),
    [
        ("3", {"3"}, "4"),
        ("3", {"3", "4", "5"}, "6"),
        ("1.2", {"1.2"}, "1.3"),
        ("v7", {"v7"}, "v8"),
        ("beta", {"beta"}, "beta-2"),
    ],
)
def test_the_suggested_version_is_free(version: str, taken: set[str], expected: str) -> None:
    assert approvals.next_version(version, taken) == expected


def test_an_empty_approver_is_refused(engine: Any) -> None:
    with database.session(engine) as s, pytest.raises(UserError, match="--by"):
        approvals.approve_policy(s, facts(), "   ")


def test_an_approval_counts_only_for_the_data_it_binds(engine: Any, tmp_path: Path) -> None:
    """Issue 15 item 1: binding the data, any path holding the approved bytes counts (and, before
    they are fingerprinted, provisionally); other bytes do not. Binding the path, only that
    resolved path counts, whatever it holds. An approval binding nothing (made before revision
    0005) never counts: the refusal says which approval bound what."""
    folder = os.path.realpath(tmp_path)
    monthly, elsewhere = f"{folder}/monthly.csv", f"{folder}/other/monthly.csv"
    with database.session(engine) as s:
        approvals.approve_policy(s, facts(), "Ada", binding=BOUND)
        approvals.approve_policy(s, facts("2"), "Ada", binding=Binding(bindings.PATH, monthly, None))
        approvals.approve_policy(s, facts("3"), "Ada")  # binds nothing
    with database.session(engine, readonly=True) as s:
        for path, sha256 in ((DATA, None), (elsewhere, None), (elsewhere, "ab" * 32)):
            assert approvals.require_approved(s, facts(), data_path=path, data_sha256=sha256).approved_by == "Ada"
        with pytest.raises(UserError, match=rf"\(it binds the data with sha256 {'ab' * 6}, but {DATA} has sha256 "):
            approvals.require_approved(s, facts(), data_path=DATA, data_sha256="cd" * 32)
        for sha256 in (None, "cd" * 32):
            assert approvals.require_approved(s, facts("2"), data_path=monthly, data_sha256=sha256)
        with pytest.raises(UserError, match=f"it binds the path {monthly}, not {elsewhere}"):
            approvals.require_approved(s, facts("2"), data_path=elsewhere)
        with pytest.raises(UserError, match=r"approval 3 by 'Ada' \(it binds no data .*approve it again"):
            approvals.require_approved(s, facts("3"), data_path=DATA)


def test_independence_goes_by_the_account_not_the_environment(engine: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 15 item 3: with LOGNAME and USER naming someone else at approval and at run time,
    an approval made by the runner's own account (by name, or by uid under another name) still
    does not count towards an independent approval; another account's does."""
    me = Account(pwd.getpwuid(os.geteuid()).pw_name, os.geteuid())
    assert bindings.os_account() == me
    independent = SimpleNamespace(approvers=1, independent=True)
    for variable in ("LOGNAME", "USER", "USERNAME", "LNAME"):
        monkeypatch.setenv(variable, "someone-else")
    with database.session(engine) as s:
        approval = approvals.approve_policy(s, facts(), "Ada", binding=BOUND)  # spoofed at approval
        approvals.approve_policy(s, facts(), "Ada Alias", binding=BOUND, account=Account("alias", me.uid))
    assert (approval.os_user, approval.os_uid) == (me.name, me.uid)
    with database.session(engine, readonly=True) as s:
        with pytest.raises(UserError, match=rf"other than the runner's OS user '{me.name}'.*"
                           rf"'Ada' \(OS user '{me.name}' is the runner\).*'alias' is the runner"):  # fmt: skip
            approvals.require_approved(s, facts(), independent, data_path=DATA)  # spoofed at run time
        assert approvals.require_approved(s, facts(), data_path=DATA).approved_by == "Ada"  # not independent
    with database.session(engine) as s:
        approvals.approve_policy(s, facts(), "Grace", binding=BOUND, account=Account("grace", me.uid + 1))
    with database.session(engine, readonly=True) as s:
        assert approvals.require_approved(s, facts(), independent, data_path=DATA).approved_by == "Grace"


def test_policy_facts_of_a_loaded_policy() -> None:
    from privrelease.policies import load_policy

    loaded = load_policy(REPO / "policies" / "examples" / "demo.yaml")
    found = approvals.policy_facts(loaded)
    assert (found.name, found.version, found.sha256) == (
        loaded.policy.name,
        loaded.policy.version,
        loaded.sha256,
    )
    assert hashlib.sha256(found.canonical_json.encode()).hexdigest() == loaded.sha256


def test_lifetime_budget_from_the_policy_or_the_settings(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("PRIVRELEASE_DEFAULT_LIFETIME_BUDGET", raising=False)
    stated = LifetimeBudget(epsilon=20.0, delta=1e-6)
    assert ledger.resolve_lifetime_budget(stated) == ledger.Budget(20.0, 1e-6)
    with pytest.raises(UserError, match="lifetime_budget"):
        ledger.resolve_lifetime_budget(None)
    monkeypatch.setenv("PRIVRELEASE_DEFAULT_LIFETIME_BUDGET", "[3, 0.0001]")
    assert ledger.resolve_lifetime_budget(None) == ledger.Budget(3.0, 1e-4)
