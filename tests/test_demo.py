"""The synthetic demo data (privrelease.demo): exactly what the demo policy declares."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest

from privrelease import demo
from privrelease.datasets import read_dataset
from privrelease.errors import UserError
from privrelease.planning import plan_policy
from privrelease.policies import load_policy


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    folder = tmp_path_factory.mktemp("demo")
    policy, data = demo.write_demo(folder, seed=11)
    return folder, policy, data


def test_files_are_labelled_synthetic(written):
    folder, policy, data = written
    assert "SYNTHETIC" in data.name
    assert (folder / demo.NOTE_FILE).read_text().startswith("SYNTHETIC DATA")
    assert "SYNTHETIC" in policy.read_text().splitlines()[1]


def test_data_matches_the_policy_declaration(written):
    _, policy_path, data = written
    loaded = load_policy(policy_path)
    assert loaded.dataset_path == data
    dataset = loaded.policy.dataset
    assert dataset.rows == demo.ROWS == 50_000
    read = read_dataset(
        data,
        format=dataset.format,
        columns={name: spec.type for name, spec in dataset.columns.items()},
        delimiter=dataset.csv.delimiter,
        missing=dataset.missing,
    )
    table = read.table
    assert table.num_rows == dataset.rows and read.rows_dropped == 0
    assert table.column_names == list(dataset.columns)
    for name, spec in dataset.columns.items():
        if spec.values is not None:
            present = set(pc.unique(table.column(name).cast("string")).to_pylist())
            assert present <= set(spec.values), name
            assert len(present) >= min(len(spec.values), 5), name  # not degenerate
    ages = table.column("age").to_numpy()
    hours = table.column("hours-per-week").to_numpy()
    assert ages.min() >= 17 and ages.max() <= 90
    assert hours.min() >= 1 and hours.max() <= 99
    # every declared value is inside the policy's bins (planning would fail otherwise)
    assert plan_policy(loaded).passed


def test_plausible_census_shape():
    table = demo.generate_table(50_000, seed=3)
    rich = np.mean(np.asarray(table.column("salary-class").to_pylist()) == ">50K")
    assert 0.15 < rich < 0.35
    forty = np.mean(table.column("hours-per-week").to_numpy() == 40)
    assert 0.4 < forty < 0.6
    young = table.filter(pc.less(table.column("age"), 25))
    never = np.mean(np.asarray(young.column("marital-status").to_pylist()) == "Never-married")
    assert never > 0.7


def test_fixed_seed_reproduces_and_default_seed_varies():
    assert demo.generate_table(500, seed=5).equals(demo.generate_table(500, seed=5))
    assert not demo.generate_table(500).equals(demo.generate_table(500))


def test_rows_must_be_positive():
    with pytest.raises(UserError, match="rows must be an integer >= 1"):
        demo.generate_table(0)


def test_unwritable_folder_is_a_user_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(UserError, match="cannot write the demo files"):
        demo.write_demo(blocker / "sub", rows=10)


@pytest.mark.parametrize("on_path", [False, True])
def test_demo_says_how_to_call_privrelease(tmp_path, monkeypatch, capsys, on_path):
    """After ``make demo`` the console script sits in ``.venv/bin``, not on ``PATH``: the demo's
    last lines name the command with its path and how to activate the environment; once it is on
    ``PATH``, the plain name (issue 25, item 16). The flow itself is replaced: this is about the
    words."""
    import os
    import sys
    from pathlib import Path

    from privrelease.cli import main
    from privrelease.cli import run as run_cli

    folder = Path(sys.executable).parent
    if not (folder / "privrelease").is_file() or not (folder / "activate").is_file():
        pytest.skip(f"the tests do not run in a virtual environment with the privrelease script ({folder})")
    summary = {"release_dir": str(tmp_path), "outputs": [], "report": "r", "statement": "s", "warnings": [],
               "chain_head": {"seq": 1, "hash": "h"}, "run_id": "0123456789abcdef"}  # fmt: skip
    monkeypatch.setattr(run_cli, "run_flow", lambda **parameters: (summary, {}))
    monkeypatch.setattr(run_cli.prefect_server, "connect", lambda reuse: None)
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("PATH", os.pathsep.join([str(folder)] * on_path + ["/usr/bin", "/bin"]))
    monkeypatch.setattr(sys, "argv", ["privrelease", "demo", "--seed", "1"])
    with pytest.raises(SystemExit) as exited:
        main()
    out, err = capsys.readouterr()
    assert exited.value.code in (0, None), out
    assert err.startswith("opening the audit database"), err  # its first line, before any work (item 17)
    if on_path:
        assert "open the report: privrelease report open 0123456789ab" in out and "PATH" not in out
    else:
        assert f"open the report: {folder}/privrelease report open 0123456789ab" in out.replace(
            os.path.relpath(folder), str(folder)
        )
        assert "privrelease is not on your PATH: run `. " in out and "activate` or use " in out
