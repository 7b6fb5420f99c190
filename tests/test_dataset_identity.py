"""The lifetime budget belongs to the people (``dataset.id``), not to a file's bytes.

The attack a tester found: with a budget almost spent, append one row to the file (or edit one
cell of a copy) and point the release at it: a new fingerprint used to get a fresh budget. Here
the same releases go through the real steps (no Prefect) and the overspending one is refused."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_flow_steps import runs, verify_intact

from privrelease import demo
from privrelease.audit import identities, ledger
from privrelease.audit.database import open_database, session
from privrelease.errors import TargetNotMet, UserError
from privrelease.files import sha256_file
from privrelease.flows import steps
from privrelease.flows.steps import release_plain
from privrelease.mechanisms.accountants import account
from privrelease.mechanisms.events import event_from_json
from privrelease.policies import load_policy, load_policy_text


def charge_of(policy: Path) -> float:
    """Epsilon of one release of ``policy`` under its accountant (what the ledger is charged)."""
    plan = steps.plan_summary(steps.PolicySource.from_file(policy))
    assert plan.charged_event_json is not None
    return float(account(event_from_json(plan.charged_event_json), plan.notion).epsilon)


def policy_for(folder: Path, name: str, dataset_id: str | None, lifetime_epsilon: float) -> Path:
    """The demo policy without its declared row count (a file with a row appended must pass)
    and without the mean (which needs it) or its accuracy target, naming ``dataset_id`` and the
    lifetime budget."""
    text = (folder / demo.POLICY_FILE).read_text()
    text = re.sub(r"  # Lee & Clifton's own example.*?    rho: 0\.05\n", "", text, flags=re.DOTALL)
    text = re.sub(r"    - \{mechanism: mean-hours, .*\n", "", text)
    text = text.replace("  rows: 50000\n", "").replace("\n  rho: 0.05\n", "\n")
    text = text.replace("lifetime_budget: {epsilon: 20", f"lifetime_budget: {{epsilon: {lifetime_epsilon!r}")
    text = text.replace("  id: demo-census", f"  id: {dataset_id}" if dataset_id else "")
    text = text.replace('version: "1"', f'version: "{name}"')
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def files(folder: Path) -> tuple[Path, Path, Path]:
    """The demo data, a copy with one row appended, and a copy with one cell edited."""
    original = folder / demo.DATA_FILE
    text = original.read_text()
    lines = text.splitlines(keepends=True)
    appended = folder / "appended.csv"
    appended.write_text(text + lines[1])
    edited = folder / "edited.csv"
    age, rest = lines[2].split(",", 1)
    edited.write_text("".join(lines[:2]) + f"{int(age) + 1},{rest}" + "".join(lines[3:]))
    return original, appended, edited


def test_new_bytes_about_the_same_people_charge_the_same_budget(demo_dir, work):  # noqa: F811
    original, appended, edited = files(demo_dir)
    one = charge_of(policy_for(demo_dir, "probe", "probe", 100.0))
    policy = policy_for(demo_dir, "census", "census-people", 2.5 * one)

    first = release_plain(policy_path=str(policy), data_path=str(original))
    second = release_plain(policy_path=str(policy), data_path=str(appended))
    assert first.ledger_after["epsilon"] == pytest.approx(one, rel=1e-9)
    assert second.ledger_after["epsilon"] == pytest.approx(2 * one, rel=1e-9)  # one budget, composed
    with pytest.raises(TargetNotMet, match="would be exceeded") as refused:
        release_plain(policy_path=str(policy), data_path=str(edited))
    message = str(refused.value)
    assert "census-people" in message and sha256_file(edited)[:12] in message

    with session(open_database(), readonly=True) as s:
        status = ledger.ledger_status(s, "census-people")
        assert [status.effective_state(e) for e in status.entries] == ["committed", "committed"]
        assert status.spent.epsilon == pytest.approx(2 * one, rel=1e-9)
        vintages = identities.vintages_of(s, "census-people")
        assert [v.dataset.fingerprint for v in vintages] == [sha256_file(p) for p in (original, appended)]
        assert [v.runs for v in vintages] == [[first.run_id], [second.run_id]]
        assert [v.dataset.row_count for v in vintages] == [50_000, 50_001]
    # every run names the exact bytes it read; the refused one read nothing
    by_id = {run.id: run for run in runs()}
    assert by_id[first.run_id].dataset_fingerprint == sha256_file(original)
    assert by_id[second.run_id].dataset_fingerprint == sha256_file(appended)
    (refused_run,) = [run for run in by_id.values() if run.status == "failed"]
    assert refused_run.data_read_at is None and "would be exceeded" in (refused_run.error or "")
    verify_intact()


def test_two_ids_two_budgets_and_a_file_belongs_to_one(demo_dir, work):  # noqa: F811
    original, _appended, edited = files(demo_dir)
    one = charge_of(policy_for(demo_dir, "probe", "probe", 100.0))
    first = policy_for(demo_dir, "first", "people-a", 1.5 * one)
    second = policy_for(demo_dir, "second", "people-b", 1.5 * one)
    release_plain(policy_path=str(first), data_path=str(original))
    published = release_plain(policy_path=str(second), data_path=str(edited))
    assert published.ledger_after["epsilon"] == pytest.approx(one, rel=1e-9)  # a budget of its own
    with pytest.raises(UserError, match="already a vintage of dataset people-a"):
        release_plain(policy_path=str(second), data_path=str(original))
    with session(open_database(), readonly=True) as s:
        assert [i.id for i in identities.list_identities(s)] == ["people-a", "people-b"]
    verify_intact()


def test_a_changed_lifetime_budget_is_refused(demo_dir, work):  # noqa: F811
    release_plain(policy_path=str(policy_for(demo_dir, "v1", "census-people", 20.0)))
    raised = policy_for(demo_dir, "v2", "census-people", 40.0)
    with pytest.raises(UserError, match="lifetime budget cannot be changed") as refused:
        release_plain(policy_path=str(raised))
    assert "census-people already has lifetime budget epsilon=20" in str(refused.value)


def test_a_charging_release_without_dataset_id_is_refused_before_anything(demo_dir, work, monkeypatch):  # noqa: F811
    policy = policy_for(demo_dir, "anonymous", None, 20.0)

    def never(*args, **kwargs):
        raise AssertionError("the data was touched")

    monkeypatch.setattr(steps, "fingerprint_dataset", never)
    monkeypatch.setattr(steps, "read_data", never)
    with pytest.raises(UserError) as refused:
        release_plain(policy_path=str(policy))
    assert refused.value.exit_code == 2
    message = str(refused.value)
    assert "dataset.id is required" in message and "id: adult-census" in message
    assert "demo-census@anonymous" in message  # names the policy
    assert runs() == []  # nothing recorded either
    steps.plan_summary(steps.PolicySource.from_file(policy))  # planning does not need it


def test_dataset_id_is_validated_and_hashed():
    text = (Path(demo.__file__).resolve().parents[1] / "policies" / "examples" / "demo.yaml").read_text()
    base = Path(demo.__file__).resolve().parents[1] / "policies" / "examples"
    for bad in ("Demo Census", "-demo", "demo/census", "x" * 101):
        with pytest.raises(UserError) as refused:
            load_policy_text(text.replace("id: demo-census", f"id: {bad}"), base)
        message = str(refused.value)
        assert "dataset.id" in message and repr(bad)[:60] in message and "lowercase letters" in message
    with pytest.raises(UserError, match="dataset.id"):
        load_policy_text(text.replace("id: demo-census", "id: 5"), base)  # a number is not an id
    named = load_policy_text(text, base)
    other = load_policy_text(text.replace("id: demo-census", "id: demo-census-2"), base)
    anonymous = load_policy_text(re.sub(r"  id: demo-census.*\n", "", text), base)
    assert len({named.sha256, other.sha256, anonymous.sha256}) == 3
    assert '"id":"demo-census"' in named_canonical(named) and '"id"' not in named_canonical(anonymous)
    assert anonymous.policy.dataset.id is None and named.require_dataset_id() == "demo-census"


def test_a_release_charging_nothing_needs_no_dataset_id(adult_dir):
    splu = load_policy(Path(demo.__file__).resolve().parents[1] / "policies" / "examples" / "adult-splu.yaml")
    assert not splu.policy.charges_budget
    assert splu.require_dataset_id() == "adult-census"
    anonymous = load_policy_text(re.sub(r"  id: adult-census.*\n", "", splu.path.read_text()), splu.base_dir)
    assert anonymous.require_dataset_id() is None


def named_canonical(loaded) -> str:
    from privrelease.policies import canonical_json

    return canonical_json(loaded).split('"dataset":', 1)[1].split('"path"', 1)[0]
