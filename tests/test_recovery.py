"""Crash consistency (privrelease.flows.recovery): a release process killed (SIGKILL) at any
instant never leaves a visible release without a committed charge, and recovery settles every
run it leaves behind: rolled back (reservation released, nothing visible) or rolled forward
(charge committed, outputs visible and recorded); the chain stays intact and nothing visible
goes unrecorded.

Threat model: an unlucky operator (power cut, OOM killer, ``kill -9``), not an attacker; the
instants are every audit record, every database commit, every file rename, replace and fsync of
one release, before and after each.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy.orm import Session
from sqlmodel import select
from typer.testing import CliRunner

from privrelease import demo
from privrelease.audit import chain, verification
from privrelease.audit.database import dispose_engines, open_database, session
from privrelease.audit.models import LedgerEntry, Output, Run
from privrelease.cli import app
from privrelease.flows import recovery, steps

# Where a kill can land: before and after each of these calls.
KILL_POINTS = ((Session, "commit"), (os, "rename"), (os, "replace"), (os, "fsync"), (chain, "append"))


def _arm(kill_at: int | None) -> list[str]:
    """In a forked child: SIGKILL this process at the ``kill_at``-th kill point (never when
    None). Returns the list the points passed are appended to."""
    counter = itertools.count()
    passed: list[str] = []

    def point(where: str) -> None:
        if next(counter) == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        passed.append(where)

    for owner, name in KILL_POINTS:
        original = getattr(owner, name)

        def wrapped(*args, _original=original, _name=name, **kwargs):
            point(f"before {_name}")
            result = _original(*args, **kwargs)
            point(f"after {_name}")
            return result

        setattr(owner, name, wrapped)
    return passed


def _show_before_charging(root: Path) -> None:
    """The broken order the tests must catch: the release folder is made visible before the
    transaction that commits its charge, and the process dies in between."""
    from privrelease.audit import ledger

    def visible_first(*args, **kwargs):
        (staging,) = root.glob(".*.partial")
        recovery.make_visible(staging, root / staging.name[1 : -len(recovery.STAGING_SUFFIX)])
        os.kill(os.getpid(), signal.SIGKILL)

    ledger.commit = visible_first


def _release_in_child(policy: Path, kill_at: int | None, log: Path, *, broken: Path | None = None) -> int:
    """Fork; the child runs one release, killed at ``kill_at`` (when it runs to the end, it
    writes the kill points it passed to ``log``), or with the ``broken`` publishing order into
    that release root. Returns the child's killing signal, 0 when it
    ran to the end."""
    dispose_engines()
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            passed = _arm(kill_at)
            if broken is not None:
                _show_before_charging(broken)
            steps.release_plain(policy_path=str(policy))
            log.write_text(json.dumps(passed))
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return os.WTERMSIG(status)
    assert os.WEXITSTATUS(status) == 0, f"the release child failed (exit {os.WEXITSTATUS(status)})"
    return 0


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A demo folder and a work dir whose audit database is already migrated (copied per
    trial); one release in this process first, so that forked children start warm."""
    base = tmp_path_factory.mktemp("crash")
    demo.write_demo(base / "demo", seed=7)
    work = base / "work"
    work.mkdir()
    open_database(f"sqlite:///{work / 'audit.db'}")
    dispose_engines()
    shutil.copytree(work, base / "warm-up")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PRIVRELEASE_WORK_DIR", str(base / "warm-up"))
        patch.delenv("PRIVRELEASE_DB_URL", raising=False)
        steps.release_plain(policy_path=str(base / "demo" / demo.POLICY_FILE))
    dispose_engines()
    return base


def _visible(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if not p.name.startswith(".")) if root.exists() else []


def _state() -> tuple[dict[str, Run], dict[str, LedgerEntry], dict[str, str]]:
    """Runs and ledger entries by run id, and release folder name -> run id of its outputs."""
    with session(open_database(), readonly=True) as s:
        runs = {run.id: run for run in s.exec(select(Run))}
        entries = {entry.run_id: entry for entry in s.exec(select(LedgerEntry))}
        folders = {Path(o.path).parent.name: o.run_id for o in s.exec(select(Output))}
    return runs, entries, folders


def _check_visible_means_charged(root: Path) -> None:
    """The invariant, at the instant of the crash: a visible release folder has a committed
    charge and recorded outputs."""
    runs, entries, folders = _state()
    for folder in _visible(root):
        run_id = folders.get(folder.name)
        assert run_id is not None, f"{folder.name} is visible but no output of it is recorded"
        assert entries[run_id].state == "committed", f"{folder.name} is visible with charge {entries[run_id].state}"
        assert runs[run_id].status in ("publishing", "succeeded")


def _check_settled(root: Path) -> str:
    """After recovery: every run settled, charges match what is visible, the chain intact and
    nothing visible unrecorded. Returns the run's outcome."""
    runs, entries, folders = _state()
    if not runs:  # killed before the run was recorded
        assert _visible(root) == [] and entries == {}
        return "rolled back"
    (run,) = runs.values()
    assert run.status in ("succeeded", "failed"), run.status
    entry = entries.get(run.id)
    visible = _visible(root)
    if run.status == "succeeded":
        assert [p.name for p in visible] == [name for name, owner in folders.items() if owner == run.id]
        assert entry.state == "committed"
        outcome = "published"
    else:
        assert visible == []
        assert entry is None or entry.state in ("released", "committed")
        outcome = "rolled back" if entry is None or entry.state == "released" else "charged, not published"
    assert not list(root.glob(".*")) if root.exists() else True, "a staging folder was left"
    with session(open_database(), readonly=True) as s:
        result = verification.verify(s)
        assert result.ok, result.problems
        assert recovery.release_folder_problems(s, root) == []
    return outcome


def test_sigkill_at_every_instant_of_a_release(template, tmp_path, monkeypatch):
    policy = template / "demo" / demo.POLICY_FILE
    monkeypatch.delenv("PRIVRELEASE_DB_URL", raising=False)
    monkeypatch.delenv("PRIVRELEASE_PRODUCTION", raising=False)

    def fresh(name: str) -> Path:
        work = tmp_path / name
        shutil.copytree(template / "work", work)
        monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(work))
        return work

    fresh("count")
    log = tmp_path / "points.json"
    assert _release_in_child(policy, None, log) == 0
    points = json.loads(log.read_text())
    publishing = max(
        i for i, where in enumerate(points) if where == "before commit" and i < points.index("before rename")
    )
    # every instant from the publishing transaction on, and the earlier ones spread evenly: >= 50 in all
    earlier = list(range(0, publishing, max(1, publishing // max(1, 50 - (len(points) - publishing)))))
    trials = sorted(set(earlier) | set(range(publishing, len(points))))
    assert len(trials) >= 50 and trials[-1] == len(points) - 1

    outcomes: Counter[str] = Counter()
    for kill_at in trials:
        work = fresh(f"t{kill_at}")
        root = work / "releases"
        assert _release_in_child(policy, kill_at, log) == signal.SIGKILL, f"no kill at point {kill_at}"
        _check_visible_means_charged(root)
        unsettled = [run.id for run in _state()[0].values() if run.status in recovery.UNSETTLED]
        settled = recovery.recover(open_database())
        assert [done.run_id for done in settled] == unsettled
        outcomes[_check_settled(root)] += 1
        dispose_engines()
    # a kill never loses a committed release: its staged files are whole once the charge is
    # committed, so recovery rolls it forward; every earlier kill is rolled back
    assert outcomes["charged, not published"] == 0, outcomes
    assert outcomes["rolled back"] == sum(kill_at < publishing for kill_at in trials) + 1, outcomes


def test_recover_cli_rolls_forward_a_run_killed_inside_publish(template, tmp_path, monkeypatch):
    """Killed right after the publishing transaction: the folder is not visible yet; `privrelease
    audit recover` makes it visible and records the run succeeded, and says so."""
    policy = template / "demo" / demo.POLICY_FILE
    work = tmp_path / "work"
    shutil.copytree(template / "work", work)
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(work))
    monkeypatch.delenv("PRIVRELEASE_DB_URL", raising=False)
    log = tmp_path / "points.json"
    shutil.copytree(template / "work", tmp_path / "count")
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "count"))
    _release_in_child(policy, None, log)
    points = json.loads(log.read_text())
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(work))
    assert _release_in_child(policy, points.index("before rename"), log) == signal.SIGKILL
    root = work / "releases"
    assert _visible(root) == [] and len(list(root.glob(".*.partial"))) == 1
    (run,) = _state()[0].values()
    assert run.status == "publishing"

    result = CliRunner().invoke(app, ["audit", "recover", "--json"])
    assert result.exit_code == 0, result.output
    (done,) = json.loads(result.output)["settled"]
    assert (done["run_id"], done["was"], done["action"]) == (run.id, "publishing", "rolled forward")
    (folder,) = _visible(root)
    assert (folder / steps.CHAIN_HEAD_FILE).exists()
    assert _check_settled(root) == "published"
    again = CliRunner().invoke(app, ["audit", "recover"])
    assert again.exit_code == 0 and "nothing to recover" in again.output
    dispose_engines()


def test_verify_flags_a_release_folder_no_run_published(template, tmp_path, monkeypatch):
    """A folder copied into the release root, or a file added to a published folder, makes
    `privrelease audit verify` fail naming it."""
    work = tmp_path / "work"
    shutil.copytree(template / "work", work)
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(work))
    monkeypatch.delenv("PRIVRELEASE_DB_URL", raising=False)
    published = steps.release_plain(policy_path=str(template / "demo" / demo.POLICY_FILE))
    runner = CliRunner()
    assert runner.invoke(app, ["audit", "verify"]).exit_code == 0
    (Path(published.release_dir) / "extra.csv").write_text("x\n1\n")
    forged = work / "releases" / "forged-release"
    forged.mkdir()
    (forged / "microdata.csv").write_text("age\n37\n")
    result = runner.invoke(app, ["audit", "verify", "--json"])
    assert result.exit_code == 1
    messages = [p["message"] for p in json.loads(result.output)["problems"] if p["kind"] == "unrecorded_release"]
    assert any("forged-release" in m and "published by no succeeded run" in m for m in messages), messages
    assert any("extra.csv" in m and "not one of its recorded outputs" in m for m in messages), messages
    dispose_engines()


def test_the_checks_catch_a_folder_shown_before_its_charge(template, tmp_path, monkeypatch):
    """The broken variant: a publish that shows the folder first and dies before committing
    the charge. The invariant check fails on it, recovery keeps the charge rather than give
    it back (the outputs may have been seen) and `audit verify` names the folder."""
    work = tmp_path / "work"
    shutil.copytree(template / "work", work)
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(work))
    monkeypatch.delenv("PRIVRELEASE_DB_URL", raising=False)
    root = work / "releases"
    policy = template / "demo" / demo.POLICY_FILE
    assert _release_in_child(policy, None, tmp_path / "log", broken=root) == signal.SIGKILL
    with pytest.raises(AssertionError, match="no output of it is recorded"):
        _check_visible_means_charged(root)
    (done,) = recovery.recover(open_database())
    assert (done.was, done.action) == ("running", "failed, charge kept")
    (entry,) = _state()[1].values()
    assert entry.state == "committed"
    result = CliRunner().invoke(app, ["audit", "verify", "--json"])
    assert result.exit_code == 1
    (problem,) = json.loads(result.output)["problems"]
    assert problem["kind"] == "unrecorded_release" and "published by no succeeded run" in problem["message"]
    dispose_engines()


@pytest.mark.parametrize("refused", ["pre-flight of `privrelease run`", "draft refused by the run's opening"])
def test_a_run_refused_for_budget_settles_a_run_killed_in_the_publish_window(template, tmp_path, monkeypatch, refused):
    """Issue 15, item 10: a release killed right after its folder became visible (its run still
    ``publishing``) leaves `audit verify` BROKEN; the next run is refused for budget (the dead
    run's charge exhausted it). Every run's start settles dead runs before any check, so the
    refused run rolls the dead one forward and `audit verify` is intact after it."""
    import subprocess
    import sys

    from privrelease.errors import TargetNotMet

    policy = template / "demo" / demo.POLICY_FILE
    monkeypatch.delenv("PRIVRELEASE_DB_URL", raising=False)
    monkeypatch.delenv("PRIVRELEASE_PRODUCTION", raising=False)
    work = tmp_path / "work"
    shutil.copytree(template / "work", work)
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(work))
    for _ in range(4):  # the demo's lifetime budget fits five releases
        steps.release_plain(policy_path=str(policy))
    dispose_engines()
    shutil.copytree(work, tmp_path / "count")
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "count"))
    log = tmp_path / "points.json"
    _release_in_child(policy, None, log)
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(work))
    assert _release_in_child(policy, json.loads(log.read_text()).index("after rename"), log) == signal.SIGKILL
    runner = CliRunner()
    broken = runner.invoke(app, ["audit", "verify"])  # a visible folder of a run still publishing
    assert broken.exit_code == 1
    (run,) = [run for run in _state()[0].values() if run.status == "publishing"]
    assert f"belongs to run {run.id[:12]} whose publishing was interrupted (charge committed, outputs recorded): " in (
        broken.output
    )
    assert "`privrelease audit recover` settles it" in broken.output and "not a recorded release" not in broken.output
    if refused.startswith("pre-flight"):
        result = subprocess.run(
            [sys.executable, "-m", "privrelease", "run", str(policy)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PREFECT_API_URL": ""},
        )
        assert result.returncode == 1 and "would be exceeded" in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    else:
        draft = policy.with_name("draft.yaml")
        draft.write_text(policy.read_text().replace('version: "1"', 'version: "draft"'))
        with pytest.raises(TargetNotMet, match="would be exceeded"):
            steps.release_plain(policy_path=str(draft))
    dispose_engines()
    assert [run.status for run in _state()[0].values()].count("succeeded") == 5
    result = runner.invoke(app, ["audit", "verify"])
    assert result.exit_code == 0, result.output
    dispose_engines()


@pytest.mark.parametrize("where", ["settling at the run's start", "publishing, in the Prefect flow"])
def test_an_os_error_is_one_line_and_exit_1(template, tmp_path, monkeypatch, where):
    """Issue 15, item 10: the system refusing an fsync (``OSError: [Errno 22]``, no file name)
    while a run's start settles a run killed in the publish window, or a write while the flow
    publishes: `privrelease run` prints one error line (naming the run to settle), exits 1, no
    traceback; the next start settles what is left."""
    import subprocess
    import sys

    policy = template / "demo" / demo.POLICY_FILE
    monkeypatch.delenv("PRIVRELEASE_DB_URL", raising=False)
    monkeypatch.delenv("PRIVRELEASE_PRODUCTION", raising=False)
    shutil.copytree(template / "work", tmp_path / "count")
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "count"))
    log = tmp_path / "points.json"
    _release_in_child(policy, None, log)
    work = tmp_path / "work"
    shutil.copytree(template / "work", work)
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(work))
    if where.startswith("settling"):
        assert _release_in_child(policy, json.loads(log.read_text()).index("before rename"), log) == signal.SIGKILL
        (dead,) = _state()[0].values()
        target, expected = "os.fsync", f"cannot settle run {dead.id}"
    else:
        target, expected = "privrelease.audit.chain.write_head", "Errno 22"
    dispose_engines()
    owner, name = target.rsplit(".", 1)
    injected = (
        f"import errno, os, sys, importlib\n"
        f"def refused(*args, **kwargs): raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))\n"
        f"setattr(importlib.import_module({owner!r}), {name!r}, refused)\n"
        "from privrelease.cli import main\n"
        "sys.argv = ['privrelease', 'run', sys.argv[1]]\n"
        "main()\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", injected, str(policy)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PREFECT_API_URL": ""},
    )
    assert result.returncode == 1, result.stderr
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in result.stderr and "OSError" not in result.stderr, result.stderr
    assert expected in error and "Errno 22" in error and result.stderr.count("Errno") == 1, result.stderr
    recovery.recover(open_database())
    assert _check_settled(work / "releases") in ("published", "rolled back")
    dispose_engines()
