"""The Prefect flow ``release`` and the ``run``/``rerun``/``reissue``/``demo`` commands, against
Prefect's test harness (one temporary server for the whole session: the ``prefect_harness``
fixture). The faults themselves are tested without Prefect in test_flow_steps.py."""

from __future__ import annotations

import json
import re
import sys
import uuid
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import test_flow_steps as shared
from sqlmodel import select

from privrelease import demo
from privrelease.audit.database import open_database, session
from privrelease.audit.models import LedgerEntry
from privrelease.errors import TargetNotMet
from privrelease.flows import steps

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "policies" / "examples"

# the fixtures and helpers of the plain-step tests
runs, verify_intact = shared.runs, shared.verify_intact


def stored_results() -> set[Path]:
    from prefect.settings import PREFECT_LOCAL_STORAGE_PATH

    root = Path(PREFECT_LOCAL_STORAGE_PATH.value())
    return set(root.rglob("*")) if root.exists() else set()


def flow_run_facts(flow_run_id: str) -> tuple[str, list[str], str | None]:
    """The flow run's state, its task-run names, and the markdown of its report artifact."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import ArtifactSort, TaskRunSort

    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(uuid.UUID(flow_run_id))
        tasks = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])),
            sort=TaskRunSort.EXPECTED_START_TIME_ASC,
            limit=50,
        )
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id])),
            sort=ArtifactSort.CREATED_DESC,
            limit=10,
        )
    markdown = next((a.data for a in artifacts if a.key == "disclosure-report"), None)
    names = sorted(re.sub(r"-[0-9a-f]{3}$", "", t.name) for t in tasks)  # Prefect adds a suffix
    return flow_run.state.type.value, names, markdown


# --------------------------------------------------------------------------- the flow


def test_release_flow_on_demo_data(prefect_harness, demo_dir, work):
    from privrelease.flows.release import release

    before = stored_results()
    summary = release(policy_path=str(demo_dir / demo.POLICY_FILE))
    folder = Path(summary["release_dir"])
    assert {Path(o["path"]).name for o in summary["outputs"]} == {
        "microdata.parquet",
        "microdata.cells.parquet",
        "hours-by-sex.parquet",
        "mean-hours.parquet",
    }
    assert (folder / steps.REPORT_FILE).is_file() and (folder / steps.CHAIN_HEAD_FILE).is_file()
    (run,) = runs()
    assert run.status == "succeeded" and run.flow_run_id
    state, tasks, markdown = flow_run_facts(run.flow_run_id)
    assert state == "COMPLETED"
    assert tasks == sorted(
        [
            "verify-policy",
            "prepare-outputs",
            "fingerprint-dataset",
            "plan-release",
            "reserve-budget",
            "read-data",
            "mechanism-microdata",
            "mechanism-hours-by-sex",
            "mechanism-mean-hours",
            "render-report",
            "publish",
        ]
    )
    assert markdown is not None and (folder / steps.REPORT_FILE).as_uri() in markdown
    assert stored_results() == before  # Prefect persisted no task or flow result
    verify_intact(folder / steps.CHAIN_HEAD_FILE)


def test_release_flow_on_adult_data(prefect_harness, adult_dir, work):
    from privrelease.flows.release import release

    summary = release(policy_path=str(EXAMPLES / "adult-combined.yaml"))
    outputs = {Path(o["path"]).name: o for o in summary["outputs"]}
    assert set(outputs) == {"microdata.parquet", "microdata.cells.parquet", "counts.parquet", "mean-age.parquet"}
    microdata = pq.read_table(outputs["microdata.parquet"]["path"])
    assert microdata.column_names == ["age", "sex", "race", "education", "salary-class"]
    assert set(microdata.column("race").to_pylist()) == {"*"}  # suppressed by the policy
    mean_age = pq.read_table(outputs["mean-age.parquet"]["path"]).column("value")[0].as_py()
    assert 30 < mean_age < 48
    with session(open_database(), readonly=True) as s:
        (entry,) = s.exec(select(LedgerEntry)).all()
    assert entry.state == "committed"
    html = Path(summary["report"]).read_text()
    assert "adult-combined" in html and summary["run_id"] in html
    verify_intact(Path(summary["release_dir"]) / steps.CHAIN_HEAD_FILE)


def test_failed_flow_publishes_nothing(prefect_harness, demo_dir, work):
    from privrelease.flows.release import release

    strict = demo_dir / "strict.yaml"
    text = (demo_dir / demo.POLICY_FILE).read_text()
    strict.write_text(text.replace("max_epsilon: 4.5", "max_epsilon: 1.5").replace('version: "1"', 'version: "2"'))
    with pytest.raises(TargetNotMet):
        release(policy_path=str(strict))
    assert not (work / "releases").exists() or list((work / "releases").iterdir()) == []
    assert runs() == []  # a refused draft is not registered: one release_refused record names the flow run
    (refused,) = shared.refusals()
    assert refused["refusal"] == "TargetNotMet" and refused["flow_run"]
    state, _tasks, markdown = flow_run_facts(refused["flow_run"])
    assert state == "FAILED" and markdown is None


# --------------------------------------------------------------------------- the commands


@pytest.fixture
def cli(prefect_harness, monkeypatch, capsys, work):
    """``cli(*args) -> (exit code, stdout, stderr)``: the console script in this process, using
    the harness's server (so the command starts none of its own)."""
    from privrelease.cli import main

    monkeypatch.setenv("PREFECT_API_URL", prefect_harness)

    def invoke(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["privrelease", *args])
        with pytest.raises(SystemExit) as exit_info:
            main()
        out, err = capsys.readouterr()
        assert "Traceback" not in err
        return exit_info.value.code, out, err

    return invoke


def test_cli_run_rerun_and_reissue(cli, demo_dir, tmp_path):
    code, out, err = cli("run", str(demo_dir / demo.POLICY_FILE), "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert "read data" in err  # progress on stderr
    assert Path(summary["report"]).is_file() and summary["timings"]["flow"] > 0

    code, out, err = cli("rerun", summary["run_id"][:8], "--format", "csv")
    assert code == 0, err
    assert "released to:" in out and "microdata.csv" in out

    code, out, err = cli("reissue", summary["run_id"], "--out", str(tmp_path / "handed"), "--json")
    assert code == 0, err
    assert json.loads(out)["source_run_id"] == summary["run_id"]
    assert [r.kind for r in runs()] == ["release", "rerun", "reissue"]


def test_cli_exit_codes(cli, demo_dir, work, monkeypatch):
    policy = demo_dir / demo.POLICY_FILE
    text = policy.read_text()

    code, _, err = cli("run", str(demo_dir / "missing.yaml"))
    assert code == 2 and "policy file not found" in err

    strict = demo_dir / "strict.yaml"
    strict.write_text(text.replace("max_epsilon: 4.5", "max_epsilon: 1.5").replace('version: "1"', 'version: "2"'))
    code, _, err = cli("run", str(strict))
    assert code == 1 and "does not meet its targets" in err

    small = demo_dir / "small.yaml"
    small.write_text(  # its own population: the budget of demo-census stays 20
        text.replace("lifetime_budget: {epsilon: 20", "lifetime_budget: {epsilon: 5")
        .replace('version: "1"', 'version: "3"')
        .replace("id: demo-census", "id: demo-census-small")
    )
    assert cli("run", str(small))[0] == 0
    code, _, err = cli("run", str(small))
    assert code == 1 and "would be exceeded" in err

    renamed = demo_dir / "renamed.csv"
    renamed.write_text((demo_dir / demo.DATA_FILE).read_text().replace('"education"', '"schooling"', 1))
    code, _, err = cli("run", str(policy), "--data", str(renamed))
    assert code == 2 and "has no column 'education'" in err

    bad = demo_dir / "bad.csv"
    lines = (demo_dir / demo.DATA_FILE).read_text().splitlines(keepends=True)
    lines[3] = "forty" + lines[3][lines[3].index(",") :]
    bad.write_text("".join(lines))
    code, _, err = cli("run", str(policy), "--data", str(bad))
    assert code == 2 and "'forty'" in err  # the operator sees the value; the audit does not
    assert "forty" not in runs()[-1].error

    anonymous = demo_dir / "anonymous.yaml"
    anonymous.write_text(re.sub(r"  id: demo-census.*\n", "", text).replace('version: "1"', 'version: "4"'))
    before = len(runs())
    code, _, err = cli("run", str(anonymous))
    assert code == 2 and "dataset.id is required" in err and "id: adult-census" in err
    assert len(runs()) == before  # refused before any run, read or record

    code, _, err = cli("run", str(policy), "--production")
    assert code == 2 and "is not approved" in err

    code, _, err = cli("run", str(policy), "--format", "xlsx")
    assert code == 2 and "--format must be parquet or csv" in err

    assert all(r.status in ("succeeded", "failed") for r in runs())
    verify_intact()


def test_cli_demo(cli, tmp_path):
    code, out, err = cli("demo", "--dir", str(tmp_path / "demo"), "--seed", "1", "--json")
    assert code == 0, err
    summary = json.loads(out)
    assert Path(summary["data"]).name == demo.DATA_FILE
    assert Path(summary["report"]).is_file()
    assert summary["release_dir"].startswith(str(tmp_path / "demo" / "releases"))
    (run,) = runs()
    assert run.status == "succeeded"
    assert "approved demo-census@1" in err and "SYNTHETIC" in err


def test_python_api_runs_the_audited_flow(prefect_harness, demo_dir, work, monkeypatch, capsys):
    """``privrelease.run`` is the same audited flow as ``privrelease run``: the release is
    charged, recorded and verifiable, and Prefect prints nothing to stdout."""
    import privrelease

    monkeypatch.setenv("PREFECT_API_URL", prefect_harness)
    published = privrelease.run(demo_dir / demo.POLICY_FILE)
    assert Path(published.report).is_file() and published.outputs  # typed: flows.context.Published
    assert capsys.readouterr().out == ""
    assert privrelease.verify().ok
    (run,) = runs()
    assert run.status == "succeeded" and run.id == published.run_id
    with session(open_database(), readonly=True) as s:
        (entry,) = s.exec(select(LedgerEntry)).all()
    assert entry.state == "committed"


def test_recovery_marks_the_flow_runs_of_dead_runs_crashed(prefect_harness):
    """A flow run left RUNNING by a killed process (its audit run is settled by recovery) is
    marked Crashed; one already final, or unknown to Prefect, is left alone."""
    import uuid

    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.states import Completed, Running

    from privrelease.flows import recovery

    @flow(name="stand-in")
    def stand_in() -> None:
        """Never run: only its flow runs are made."""

    with get_client(sync_client=True) as client:
        left_running = client.create_flow_run(stand_in, state=Running())
        finished = client.create_flow_run(stand_in, state=Completed())
    settled = [
        recovery.Settled("a" * 32, "running", "rolled back", "", str(left_running.id)),
        recovery.Settled("b" * 32, "running", "rolled back", "", str(finished.id)),
        recovery.Settled("c" * 32, "pending", "rolled back", "", str(uuid.uuid4())),
        recovery.Settled("d" * 32, "pending", "rolled back", "", None),
    ]
    assert recovery.crash_flow_runs(settled) == [str(left_running.id)]
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(left_running.id).state.type.value == "CRASHED"
        assert client.read_flow_run(finished.id).state.type.value == "COMPLETED"
