"""`privrelease run` answers a release it would refuse in about a second, before Prefect starts:
missing data, a missing column, a missed target, no approval in production mode, an exhausted
budget. No server is started (no server log is written) and no run is recorded; a refusal of
the release itself (a missed target, no approval, a name@version taken, the budget) leaves one
``release_refused`` audit record, as a run refused at its start does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from privrelease import demo
from privrelease.audit import approvals, database, ledger
from privrelease.audit.records import register_dataset, start_run
from privrelease.planning import plan_policy
from privrelease.policies import load_policy

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def demo_policy(tmp_path: Path) -> Path:
    demo.write_demo(tmp_path / "demo", seed=3)
    return tmp_path / "demo" / demo.POLICY_FILE


def run(policy: Path, work: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    return privrelease("run", str(policy), *args, work=work, **env)


def quick(seconds: float, policy: Path, work: Path) -> bool:
    """``seconds`` is within 8x of `privrelease plan` on ``policy`` (measured now, under the same
    load; it reads no data and starts nothing): a run that waited for Prefect's start (20-30 s)
    takes 15-30x."""
    planned, baseline = privrelease("plan", str(policy), work=work)
    assert planned.returncode == 0, planned.stderr
    return seconds < 8 * baseline


def privrelease(*args: str, work: Path, **env: str) -> tuple[subprocess.CompletedProcess, float]:
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "privrelease", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "PRIVRELEASE_WORK_DIR": str(work), "PREFECT_API_URL": "", **env},
    )
    return result, time.perf_counter() - start


def no_server_and_no_run(work: Path) -> None:
    assert not list(work.rglob("prefect-server*.log")), "Prefect was started"
    if (work / "audit.db").exists():
        engine = database.open_database(f"sqlite:///{work / 'audit.db'}")
        with database.session(engine, readonly=True) as s:
            from sqlmodel import select

            from privrelease.audit.models import Run

            assert s.exec(select(Run)).all() == []


def refused(work: Path) -> list[str]:
    """The ``refusal`` of each ``release_refused`` record (none without a database)."""
    if not (work / "audit.db").exists():
        return []
    with database.session(database.open_database(f"sqlite:///{work / 'audit.db'}"), readonly=True) as s:
        from privrelease.audit import chain

        return [json.loads(r.payload_json)["refusal"] for r in chain.records(s) if r.kind == "release_refused"]


@pytest.mark.parametrize(
    ("how", "message"),
    [
        ("missing file", "does not exist or is not a file"),
        ("missing column", "has no column 'education'"),
        ("empty file", "has no header and no rows"),
        ("missed target", "does not meet its targets"),
    ],
)
def test_refused_before_prefect_starts(demo_policy: Path, tmp_path: Path, how: str, message: str) -> None:
    args: list[str] = []
    policy = demo_policy
    if how == "missing file":
        args = ["--data", str(demo_policy.parent / "nope.csv")]
    elif how == "missing column":
        data = demo_policy.parent / demo.DATA_FILE
        renamed = demo_policy.parent / "renamed.csv"
        renamed.write_text(
            data.read_text().replace('"education"', '"schooling"', 1).replace("education", "schooling", 1)
        )
        args = ["--data", str(renamed)]
    elif how == "empty file":  # not "has no column ...; its columns are: " (none)
        empty = demo_policy.parent / "empty.csv"
        empty.write_bytes(b"")
        args = ["--data", str(empty)]
    else:
        policy = demo_policy.with_name("strict.yaml")
        policy.write_text(demo_policy.read_text().replace("max_epsilon: 4.5", "max_epsilon: 0.5"))
    result, seconds = run(policy, tmp_path / "work", *args)
    assert result.returncode in (1, 2) and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and quick(seconds, demo_policy, tmp_path / "work")
    no_server_and_no_run(tmp_path / "work")
    assert refused(tmp_path / "work") == (["TargetNotMet"] if how == "missed target" else [])


def test_unapproved_and_exhausted_are_refused_before_prefect_starts(demo_policy: Path, tmp_path: Path) -> None:
    work = tmp_path / "work"
    result, _ = run(demo_policy, work, PRIVRELEASE_PRODUCTION="true")
    assert result.returncode == 2 and "is not approved" in result.stderr
    no_server_and_no_run(work)
    assert refused(work) == ["UserError"]

    loaded = load_policy(demo_policy)
    plan = plan_policy(loaded)
    stated = loaded.policy.targets.lifetime_budget
    engine = database.open_database(f"sqlite:///{work / 'audit.db'}")
    database.migrate(engine)
    with database.session(engine) as s:  # spend the budget with earlier runs of the same policy
        approvals.register_policy(s, approvals.policy_facts(loaded))
        register_dataset(
            s, "cd" * 32, identity=loaded.policy.dataset.id, size_bytes=1, row_count=1,
            lifetime_epsilon=stated.epsilon, lifetime_delta=stated.delta, notion=plan.notion,
        )  # fmt: skip
        status = ledger.ledger_status(s, loaded.policy.dataset.id)
        for _ in range(ledger.runway(status, plan.event).runs):
            run_id = start_run(s, policy_sha256=loaded.sha256, code_version="test").id
            ledger.commit(s, ledger.reserve(s, loaded.policy.dataset.id, run_id, plan.event, plan.notion))
    result, seconds = run(demo_policy, work)
    assert result.returncode == 1 and "would be exceeded" in result.stderr, result.stderr
    assert "; nothing was charged or published" in " ".join(result.stderr.split())
    assert quick(seconds, demo_policy, work) and not list(work.rglob("prefect-server*.log"))
    assert refused(work) == ["UserError", "TargetNotMet"]


def test_a_version_registered_with_other_content_is_refused_before_prefect_starts(
    demo_policy: Path, tmp_path: Path
) -> None:
    """Issue 18, item 2: a draft under a name@version approved (or published) with other content
    is refused with what `plan` warns, before Prefect starts: no run, one ``release_refused`` record."""
    work = tmp_path / "work"
    work.mkdir()
    engine = database.open_database(f"sqlite:///{work / 'audit.db'}", create=True)
    with database.session(engine) as s:
        approvals.approve_policy(s, approvals.policy_facts(load_policy(demo_policy)), "Ada")
    database.dispose_engines()
    edited = demo_policy.with_name("edited.yaml")
    edited.write_text(demo_policy.read_text().replace("k: 20", "k: 25", 1))
    result, seconds = run(edited, work)
    assert result.returncode == 2, result.stderr
    assert "demo-census@1 is registered with other content" in result.stderr
    assert 'give this draft a new `version`, e.g. version: "2"' in result.stderr
    assert quick(seconds, demo_policy, work)
    no_server_and_no_run(work)
    assert refused(work) == ["UserError"]


def test_an_unapproved_policy_contacts_no_scheduler(demo_policy: Path, tmp_path: Path) -> None:
    """Issue 15, item 9: in production, an unapproved draft whose `engine:` section names a Dask
    scheduler is refused for its approval, and nothing connects to the scheduler's address (a
    socket listening there): neither the pre-flight nor the run's opening, which checks the
    approval before it fingerprints (where the run connects)."""
    import socket

    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq

    from privrelease.errors import UserError
    from privrelease.flows.steps import release_plain

    folder = demo_policy.parent
    pq.write_table(pcsv.read_csv(folder / demo.DATA_FILE), folder / "demo.parquet")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.setblocking(False)
        port = listener.getsockname()[1]
        policy = folder / "dask.yaml"
        text = demo_policy.read_text().replace(f"path: {demo.DATA_FILE}", "path: demo.parquet")
        text = "\n".join(line for line in text.splitlines() if not line.strip().startswith("csv:")) + "\n"
        policy.write_text(
            text.replace("format: csv", "format: parquet")
            + f"engine: {{name: dask, address: 'tcp://127.0.0.1:{port}'}}\n"
        )
        work = tmp_path / "work"
        result, _ = run(policy, work, PRIVRELEASE_PRODUCTION="true")
        assert result.returncode == 2 and "is not approved" in result.stderr, result.stderr
        no_server_and_no_run(work)
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("PRIVRELEASE_WORK_DIR", str(work))
            patch.setenv("PRIVRELEASE_PRODUCTION", "true")
            with pytest.raises(UserError, match="is not approved"):
                release_plain(policy_path=str(policy))
        with pytest.raises(BlockingIOError):
            listener.accept()  # no connection is waiting: nothing contacted the scheduler


def test_a_run_says_what_it_does_before_it_checks_or_imports_prefect(demo_policy, tmp_path):
    """The first line on stderr (a pipe: no spinner is drawn) says the run is checking, and comes
    before Prefect's first import (``-X importtime`` lines interleave on the same stream); each
    step after it prints its own line as it starts (issue 25, item 17). The Prefect API is a
    closed port, so no server starts and the run ends at the API check, exit 2."""
    work = tmp_path / "work"
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "privrelease", "run", str(demo_policy), "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        env={**os.environ, "PRIVRELEASE_WORK_DIR": str(work), "PRIVRELEASE_AUTO_INIT": "true",
             "PREFECT_API_URL": "http://127.0.0.1:9/api"},
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "cannot reach Prefect's API at http://127.0.0.1:9/api" in json.loads(result.stdout)["error"]
    lines = result.stderr.splitlines()
    ours = [number for number, line in enumerate(lines) if not line.startswith("import time:")]
    assert ours, "stderr holds nothing but import times"
    prefect = next(n for n, line in enumerate(lines) if line.split("|")[-1].strip().split(".")[0] == "prefect")
    assert lines[ours[0]].startswith("checking the policy, the data file, the audit chain"), lines[ours[0]]
    assert ours[0] < prefect
    assert any(lines[n].startswith("importing Prefect") for n in ours), [lines[n] for n in ours]
