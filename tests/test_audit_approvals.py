"""Policy versions and approvals: content-addressed, one hash per name@version, production mode
refusing unapproved or changed policies; lifetime budgets from the policy or the settings."""

from __future__ import annotations

import getpass
import hashlib
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_audit_chain import BACKENDS, audit_database, check

from privrelease.audit import approvals, database, ledger
from privrelease.errors import UserError

REPO = Path(__file__).resolve().parents[1]


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
            approvals.require_approved(s, first)
        approval = approvals.approve_policy(s, first, "  Ada  ", note="ok")
        assert approval.approved_by == "Ada" and approval.os_user == getpass.getuser()
        approvals.approve_policy(s, first, "Grace", os_user="grace")
    with database.session(engine, readonly=True) as s:
        assert approvals.require_approved(s, first).approved_by == "Ada"  # the earliest
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
            approvals.require_approved(s, edited)
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


def test_an_empty_approver_is_refused(engine: Any) -> None:
    with database.session(engine) as s, pytest.raises(UserError, match="--by"):
        approvals.approve_policy(s, facts(), "   ")


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
    stated = SimpleNamespace(epsilon=20.0, delta=1e-6)
    assert ledger.resolve_lifetime_budget(stated) == ledger.Budget(20.0, 1e-6)
    with pytest.raises(UserError, match="lifetime_budget"):
        ledger.resolve_lifetime_budget(None)
    monkeypatch.setenv("PRIVRELEASE_DEFAULT_LIFETIME_BUDGET", "[3, 0.0001]")
    assert ledger.resolve_lifetime_budget(None) == ledger.Budget(3.0, 1e-4)
