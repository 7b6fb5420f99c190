"""Help writing policies (issue 18, item 4): the JSON Schema editors read, the generated field
reference, and `policy init`, which drafts a policy from a data file's header and types only."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from privrelease import demo
from privrelease.policies import reference

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "policies" / "examples"


def cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "privrelease", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_the_generated_files_are_in_sync_with_the_schema() -> None:
    """docs/policy.schema.json and docs/policy-reference.md are what the schema generates now
    (`python -m privrelease.policies.reference` rewrites both)."""
    assert (REPO / reference.SCHEMA_FILE).read_text(encoding="utf-8") == reference.schema_text()
    assert (REPO / reference.REFERENCE_FILE).read_text(encoding="utf-8") == reference.reference_markdown()


def test_the_reference_says_what_absolute_error_covers_and_when_dataset_id_is_required() -> None:
    """``absolute_error`` is named for every kind that checks it (noisy counts too, cell by cell);
    ``dataset.id``, optional in the schema, is shown as required for a charging release (the
    run refuses one without it), not as a plain "default null"."""
    from privrelease.mechanisms.kinds import all_kinds

    text = reference.reference_markdown()
    section = text.split("## AccuracyTarget", 1)[1].split("\n## ", 1)[0]
    checking = sorted(name for name, kind in all_kinds().items() if "absolute_error" in kind.accuracy_fields)
    assert checking == ["identifiable_statistic", "noisy_counts", "noisy_sums", "noisy_tables"]
    assert "identifiable statistics (``absolute_error``)" in section
    assert "noisy counts (``absolute_error``): each cell's published count" in section
    assert "noisy sums (``absolute_error`` and ``statistic``: ``total`` or ``count``)" in section
    assert "cell by cell, not all cells at once" in section
    assert "noisy tables (``absolute_error``, optional ``table`` and ``cells``)" in section
    row = next(line for line in text.split("## Dataset", 1)[1].splitlines() if line.startswith("| `id` |"))
    assert "required when the release charges the lifetime budget" in row


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_example_validates_against_the_json_schema(name: str) -> None:
    """What an editor checks: every example policy is valid under the published JSON Schema, and
    the adult examples name it in the language server's comment."""
    text = (EXAMPLES / name).read_text(encoding="utf-8")
    jsonschema.validate(yaml.safe_load(text), reference.json_schema())
    if name != "demo.yaml":  # `privrelease demo` copies the demo policy elsewhere
        first = text.splitlines()[0]
        assert first == "# yaml-language-server: $schema=../../docs/policy.schema.json"
        assert (EXAMPLES / "../../docs/policy.schema.json").resolve() == (REPO / reference.SCHEMA_FILE)


def test_the_schema_rejects_what_the_policy_rejects() -> None:
    """Misspelt fields and unknown mechanism types are flagged by the editor too."""
    policy = yaml.safe_load((EXAMPLES / "demo.yaml").read_text(encoding="utf-8"))
    for broken in ({**policy, "mechanims": []}, {**policy, "mechanisms": [{"name": "x", "type": "magic"}]}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(broken, reference.json_schema())


def test_policy_schema_command() -> None:
    result = cli("policy", "schema")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == reference.json_schema()


def test_policy_init_drafts_a_plannable_policy_from_a_csv_header_only(tmp_path: Path) -> None:
    """The draft of the demo CSV plans (every target met). Only the header line is read: the
    file's second line is not even valid text, and the draft is the same."""
    policy_path, data_path = demo.write_demo(tmp_path / "data", seed=3)
    draft = tmp_path / "draft.yaml"
    made = cli("policy", "init", str(data_path), "--id", "synthetic-census", "--out", str(draft))
    assert made.returncode == 0, made.stderr
    text = draft.read_text(encoding="utf-8")
    header = data_path.read_text(encoding="utf-8").splitlines()[0].replace('"', "").split(",")
    assert list(yaml.safe_load(text)["dataset"]["columns"]) == header
    planned = cli("plan", str(draft), "--json")
    assert planned.returncode == 0, planned.stderr + planned.stdout
    assert json.loads(planned.stdout)["passed"]
    garbled = tmp_path / "garbled.csv"
    garbled.write_bytes(data_path.read_bytes().split(b"\n", 1)[0] + b"\n\xff\xfe not text\n")
    again = cli("policy", "init", str(garbled), "--id", "synthetic-census", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.replace("garbled.csv", "X") == cli(
        "policy", "init", str(data_path), "--id", "synthetic-census", cwd=tmp_path
    ).stdout.replace(data_path.name, "X").replace("data/X", "X")


def test_policy_init_takes_parquet_types_from_the_schema(tmp_path: Path) -> None:
    table = pa.table({"age": pa.array([30], pa.int16()), "income": pa.array([1.5]), "city": pa.array(["x"])})
    pq.write_table(table, tmp_path / "people.parquet")
    result = cli("policy", "init", "people.parquet", "--id", "people", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    columns = yaml.safe_load(result.stdout)["dataset"]["columns"]
    assert columns == {"age": {"type": "integer"}, "income": {"type": "float"}, "city": {"type": "string"}}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nowhere.csv", "--id", "x"], "does not exist"),
        (["data.csv", "--id", "Bad Id"], "--id must be a short slug"),
        (["data.csv", "--id", "x", "--out", "data.csv"], "exists: the draft never overwrites"),
        (["data.csv", "--id", "x", "--out", "no/such/d.yaml"], "--out 'no/such/d.yaml': its folder 'no/such' does not"),
    ],
)
def test_policy_init_bad_input_is_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "data.csv").write_text("a,b\n1,2\n", encoding="utf-8")
    result = cli("policy", "init", *args, cwd=tmp_path)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("target", ["link.csv", "/proc/self/environ", "outside/secret.csv"])
def test_policy_init_reads_only_where_run_may(tmp_path: Path, target: str) -> None:
    """`policy init` is confined as `run` is (issue 25, item 22): a file outside the draft's
    folder and PRIVRELEASE_DATA_ROOTS, a symlink leading out of them, or a pseudo file system
    (`/proc/self/environ`: the process environment) is refused, one line quoting nothing of it."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.csv").write_text("TOKEN_7f3a,b\n1,2\n", encoding="utf-8")
    folder = tmp_path / "drafts"
    folder.mkdir()
    (folder / "link.csv").symlink_to(outside / "secret.csv")
    path = target if target.startswith("/") else str(tmp_path / target)
    result = cli("policy", "init", path if target != "link.csv" else target, "--id", "x", cwd=folder)
    assert result.returncode == 2, result.stdout
    assert "is outside the folders data may be read from" in result.stderr and "Traceback" not in result.stderr
    assert "TOKEN_7f3a" not in result.stdout + result.stderr and "PATH=" not in result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
