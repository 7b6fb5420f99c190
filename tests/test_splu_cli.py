"""``privrelease estimate`` and ``privrelease calibrate splu``: output with and without --json,
batch files, and user errors (exit 2, one line on stderr)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from typer.testing import CliRunner

from privrelease.cli import app
from privrelease.errors import UserError
from privrelease.mechanisms.splu import splu_gen
from privrelease.mechanisms.splu_scope import NO_UTILITY, UTILITY_SCOPE

REPO = Path(__file__).resolve().parents[1]
runner = CliRunner()


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Path:
    rows = 2000
    table = pa.table(
        {
            "age": pa.array(["20-29", "30-39", "40-49", "50-59"] * (rows // 4)),
            "sex": pa.array(["F", "M"] * (rows // 2)),
            "occupation": pa.array([f"job{i % 10}" for i in range(rows)]),
        }
    )
    path = tmp_path_factory.mktemp("splu") / "published.csv"
    pacsv.write_csv(splu_gen(table, "occupation", gamma=5).table, path)
    return path


def test_estimate_table_output(published: Path) -> None:
    result = runner.invoke(
        app,
        ["estimate", str(published), "--gamma", "5", "--where", "age=30-39", "--where", "sex=M",
         "--sensitive", "occupation=job3"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "age=30-39 & sex=M" in result.output and "occupation=job3" in result.output
    assert "Not differential" in result.output
    # a conjunction is reconstructed: no large-sum utility claimed for it
    words = " ".join(result.output.split())
    assert NO_UTILITY in words and "Large-sum utility (accurate" not in words
    assert "large counts are accurate" not in words.lower()


def test_estimate_says_which_rows_large_sum_utility_covers(published: Path, tmp_path: Path) -> None:
    """A lone sensitive value's row is covered (UTILITY_SCOPE); a batch with a conjunction says
    too that reconstructed counts are not (NO_UTILITY)."""
    alone = runner.invoke(app, ["estimate", str(published), "--gamma", "5", "--sensitive", "occupation=job3"])
    words = " ".join(alone.output.split())
    assert f"covers {UTILITY_SCOPE}: the rows with an interval" in words
    assert NO_UTILITY not in words
    queries = tmp_path / "mixed.csv"
    queries.write_text("where,sensitive\n,occupation=job1\nage=30-39,occupation=job1\n")
    both = runner.invoke(app, ["estimate", str(published), "--gamma", "5", "--queries", str(queries)]).output
    both = " ".join(both.split())
    assert UTILITY_SCOPE in both and NO_UTILITY in both


def test_estimate_json(published: Path) -> None:
    result = runner.invoke(
        app,
        [
            "estimate",
            str(published),
            "--gamma",
            "5",
            "--where",
            "age=30-39",
            "--sensitive",
            "occupation=job3",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["where"] == {"age": "30-39"} and document["sensitive"] == {"occupation": "job3"}
    assert document["gamma"] == 5 and document["rows"] == 2000
    assert document["converged"] is True and document["estimate"] >= 0
    # one sensitive value alone: the published count, no iteration (Theorem 2)
    alone = json.loads(
        runner.invoke(
            app, ["estimate", str(published), "--gamma", "5", "--sensitive", "occupation=job3", "--json"]
        ).output
    )
    assert alone["estimate"] == alone["observed"] and alone["iterations"] == 0
    # ... with its exact interval (a reconstructed conjunction has none)
    from privrelease.mechanisms.splu_guarantees import count_interval

    assert alone["interval"] == list(count_interval(alone["observed"], 5, 0.95, 2000)) and alone["confidence"] == 0.95
    assert document["interval"] is None and document["confidence"] is None
    narrow = runner.invoke(
        app, ["estimate", str(published), "--gamma", "5", "--sensitive", "occupation=job3", "--confidence", "0.5"]
    )
    assert narrow.exit_code == 0 and "50% interval" in narrow.output
    bad = runner.invoke(
        app, ["estimate", str(published), "--gamma", "5", "--sensitive", "occupation=job3", "--confidence", "1"]
    )
    assert isinstance(bad.exception, UserError) and "--confidence must be a number in [0.5, 1)" in str(bad.exception)


def test_batch_queries_jsonl_and_csv(published: Path, tmp_path: Path) -> None:
    jsonl = tmp_path / "queries.jsonl"
    jsonl.write_text(
        '{"id": "q1", "where": {"age": "30-39"}, "sensitive": {"occupation": "job1"}}\n\n'
        '{"where": {"age": "20-29", "sex": "F"}, "sensitive": {"occupation": "job2"}}\n'
    )
    documents = json.loads(
        runner.invoke(app, ["estimate", str(published), "--gamma", "5", "--queries", str(jsonl), "--json"]).output
    )
    assert [d.get("id") for d in documents] == ["q1", None]
    assert documents[1]["where"] == {"age": "20-29", "sex": "F"}
    table = tmp_path / "queries.csv"
    table.write_text("id,where,sensitive\nq1,age=30-39,occupation=job1\nq2,age=20-29;sex=F,occupation=job2\n")
    from_csv = json.loads(
        runner.invoke(app, ["estimate", str(published), "--gamma", "5", "--queries", str(table), "--json"]).output
    )
    assert [d["estimate"] for d in from_csv] == [d["estimate"] for d in documents]
    human = runner.invoke(app, ["estimate", str(published), "--gamma", "5", "--queries", str(table)])
    assert human.exit_code == 0 and "q2" in human.output


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--where", "age=30-39", "--sensitive", "occupation=nope"], "'nope' does not occur in column 'occupation'"),
        (["--where", "agx=1", "--sensitive", "occupation=job1"], "column 'agx' is not in the published table"),
        (["--where", "age", "--sensitive", "occupation=job1"], "--where must be COLUMN=VALUE"),
        (["--where", "age=30-39"], "at least one --sensitive"),
        (["--sensitive", "occupation=job1", "--queries", "q.jsonl"], "not both"),
        (["--sensitive", "occupation=job1", "--gamma", "1"], "gamma must be an integer >= 2"),
    ],
)
def test_user_errors(published: Path, arguments: list[str], message: str) -> None:
    result = runner.invoke(app, ["estimate", str(published), "--gamma", "5", *arguments])
    assert isinstance(result.exception, UserError)
    assert message in str(result.exception)


def test_bad_files_are_user_errors(published: Path, tmp_path: Path) -> None:
    missing = runner.invoke(app, ["estimate", str(tmp_path / "none.csv"), "--gamma", "5", "--sensitive", "a=b"])
    assert isinstance(missing.exception, UserError) and "not found" in str(missing.exception)
    bad = tmp_path / "bad.csv"
    bad.write_text("question,answer\nx,y\n")
    result = runner.invoke(app, ["estimate", str(published), "--gamma", "5", "--queries", str(bad)])
    assert isinstance(result.exception, UserError) and "'where' and 'sensitive'" in str(result.exception)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"where": {"age": "30-39"}, "sensitive": {"occupation": "job1"}}\n{oops\n')
    result = runner.invoke(app, ["estimate", str(published), "--gamma", "5", "--queries", str(broken)])
    assert isinstance(result.exception, UserError) and "line 2" in str(result.exception)


def test_exit_code_2_and_one_line_on_stderr(published: Path) -> None:
    command = [sys.executable, "-c", "from privrelease.cli import main; main()"]
    arguments = ["estimate", str(published), "--gamma", "5", "--where", "age=99", "--sensitive", "occupation=job1"]
    completed = subprocess.run([*command, *arguments], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert completed.returncode == 2
    assert completed.stderr.strip().startswith("error: value '99' does not occur in column 'age'")
    assert "Traceback" not in completed.stderr


def test_calibrate_splu_command(capsys: pytest.CaptureFixture[str]) -> None:
    from privrelease.cli.splu import calibrate_splu_command

    calibrate_splu_command(10, 0.3, 3, 0.05, True)
    document = json.loads(capsys.readouterr().out)
    assert document["t_p"] == pytest.approx(0.6126, abs=1e-4) and document["argmin_f"] == 1
    assert document["t_f"] == 41  # exact in the binomial model (Lemma 1 as printed: 4.7)
    assert document["large_sum_covers"] == UTILITY_SCOPE
    calibrate_splu_command(10, 0.3, 3, 0.05, False)
    assert UTILITY_SCOPE in " ".join(capsys.readouterr().out.replace("│", " ").split())
    calibrate_splu_command(10, 0.3, 3, None, True)
    assert "t_f" not in json.loads(capsys.readouterr().out)
    calibrate_splu_command(10, 0.3, 3, None, False)
    assert "T_p" in capsys.readouterr().out
    with pytest.raises(UserError, match="eps"):
        calibrate_splu_command(10, -1.0, 3, None, True)
