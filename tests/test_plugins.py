"""A mechanism kind shipped outside privrelease, as an agency would: a package of its own with a
``pyproject.toml`` and an entry point in ``privrelease.mechanisms``, installed into a site folder
of its own (``agency_rr-1.0.dist-info`` written here as pip writes it, so ``importlib.metadata``
finds it) that only the subprocesses of these tests have on their path: the test process and
the shared virtual environment never see it (so, for the audit commands run here, the plugin is
"uninstalled").

Checked: a plugin that cannot be imported, and one redefining a built-in ``type``, fail every
command in one line with exit 2 naming the entry point and the distribution; a release with it
records the distribution and version of every kind it ran (the run's record, release.json, the
report) and of every plugin event in its stored trees; once it is uninstalled, ``audit verify``
says the chain is intact and which figures cannot be replayed (install what), and ``ledger
show`` shows the recorded charges. The kind imports only the public surface
(``privrelease.mechanisms.kinds``) and brings its own accuracy statement shape.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from typer.testing import CliRunner

from privrelease.mechanisms import kinds

PLUGIN = '''
"""Randomized response (Warner 1965) on one column with k declared values: each published answer
is the true one with probability e^eps / (e^eps + k - 1), each other value with 1 / (e^eps + k - 1),
so the likelihood ratio of any answer between two values of one person is at most e^eps."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import pyarrow as pa

from privrelease.mechanisms.kinds import (
    AccuracyStatement,
    ColumnRef,
    Epsilon,
    Event,
    MechanismKind,
    MechanismResult,
    Name,
    Planned,
    StatedAccuracy,
    bernoulli,
    permutation,
    pure,
    pure_dp_pld,
    uniform_below,
)


class RandomizedResponse(Event):
    kind: Literal["agency_randomized_response"] = "agency_randomized_response"
    epsilon: float
    values: int

    def guarantee(self, notion):
        return pure(notion, self.epsilon, f"randomized response over {self.values} values")

    def pld(self, discretization):
        return pure_dp_pld(self.epsilon, discretization)


def truthful(epsilon: float, values: int) -> float:
    return math.exp(epsilon) / (math.exp(epsilon) + values - 1)


class AgencyRandomizedResponse(MechanismKind):
    type: Literal["agency_rr"]
    column: Name
    epsilon: Epsilon

    label: ClassVar[str] = "randomized response (agency plugin)"
    in_process_only: ClassVar[str] = "a test plugin"

    def column_refs(self):
        return [ColumnRef(("column",), self.column, needs_domain=True)]

    def _values(self, loaded):
        return list(loaded.policy.dataset.columns[self.column].values)

    def plan(self, loaded):
        values = len(self._values(loaded))
        return Planned(RandomizedResponse(epsilon=self.epsilon, values=values), {"values": values})

    def accuracy(self, loaded, planned):
        share = truthful(self.epsilon, planned.facts["values"])
        return AccuracyStatement(
            "each published answer is the true one with the probability below",
            stated=(
                StatedAccuracy(
                    "agency_truthful",
                    "Randomized response: the probability that a published answer is the person's own.",
                    ("values", "P(published answer is the true one)"),
                    ((str(planned.facts["values"]), f"{share:.6f}"),),
                    {"values": planned.facts["values"], "truthful": share},
                ),
            ),
        )

    def run(self, loaded, table):
        values = self._values(loaded)
        true = table.column(self.column).to_pylist()
        size, spread = len(true), math.exp(self.epsilon) + len(values) - 1
        keep = bernoulli(size, (math.exp(self.epsilon) - 1) / spread)  # else a uniform value: the rest
        drawn = uniform_below(size, len(values))
        answers = [t if k else values[d] for t, k, d in zip(true, keep, drawn)]
        order = permutation(size)
        published = pa.table({self.column: [answers[i] for i in order]})
        return MechanismResult(published, self.plan(loaded).event, {"rows_published": size})


KINDS = (AgencyRandomizedResponse,)
'''

PYPROJECT = """
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "{version}"
dependencies = ["privrelease"]

[project.entry-points."privrelease.mechanisms"]
{point} = "{module}"
"""

POLICY = """
name: rr-survey
version: "1"
dataset:
  id: rr-population
  path: answers.parquet
  columns:
    answer: {type: string, values: ["yes", "no", "maybe"]}
mechanisms:
  - {name: answers, type: agency_rr, column: answer, epsilon: 1.5}
targets:
  accounting: approximate
  delta: 1.0e-6
  lifetime_budget: {epsilon: 10, delta: 1.0e-3}
"""

COUNTS_FROM = "{name: answers, type: agency_rr, column: answer, epsilon: 1.5}"
COUNTS = "{name: table, type: noisy_counts, columns: [answer], noise: {distribution: laplace, scale: 2}}"
"""The survey's mechanism, and a built-in one charging the same population."""

RELEASE = """
from privrelease.flows.steps import release_plain
print(release_plain(policy_path="rr.yaml").release_dir)
"""
"""One release of an outside kind without a Prefect server (CONTRIBUTING, "Adding a mechanism")."""


def install(site: Path, name: str, version: str, module: str, source: str, point: str = "") -> Path:
    """Install a one-module package ``name`` ``version`` into ``site`` as pip does: the module, its
    ``pyproject.toml`` (as its source tree has it) and a ``.dist-info`` whose ``entry_points.txt``
    names it in ``privrelease.mechanisms``."""
    point = point or module
    package = site / module
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(textwrap.dedent(source), encoding="utf-8")
    (package / "pyproject.toml").write_text(
        PYPROJECT.format(name=name, version=version, point=point, module=module), encoding="utf-8"
    )
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n", encoding="utf-8")
    (info / "entry_points.txt").write_text(f"[{kinds.ENTRY_POINT_GROUP}]\n{point} = {module}\n", encoding="utf-8")
    (info / "top_level.txt").write_text(f"{module}\n", encoding="utf-8")
    files = [f"{module}/__init__.py", f"{module}/pyproject.toml", *(f"{info.name}/{f.name}" for f in info.iterdir())]
    (info / "RECORD").write_text("".join(f"{f},,\n" for f in [*files, f"{info.name}/RECORD"]), encoding="utf-8")
    return site


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A work folder with the survey policy and its data (120 answers), signed records, and
    the environment every command here reads (this process's and the subprocesses')."""
    from privrelease.audit import signing

    key = tmp_path / "agency.key"
    signing.generate(key)
    for name in list(os.environ):
        if name.startswith("PRIVRELEASE_") and name not in ("PRIVRELEASE_DATA_ROOTS", "PRIVRELEASE_AUTO_INIT"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.setenv("PRIVRELEASE_SIGNING_KEY", str(key))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rr.yaml").write_text(POLICY, encoding="utf-8")
    pq.write_table(pa.table({"answer": ["yes", "no", "maybe"] * 40}), tmp_path / "answers.parquet")
    return tmp_path


def with_plugins(site: Path, *args: str, code: str | None = None) -> subprocess.CompletedProcess[str]:
    """``privrelease ARGS`` (or the Python ``code``) in a process that has ``site`` on its path."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    command = ["-c", code] if code is not None else ["-c", "from privrelease.cli import main; main()", *args]
    return subprocess.run([sys.executable, *command], env=env, capture_output=True, text=True, timeout=300)


def one_line_refusal(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    return lines[0]


def test_a_plugin_that_cannot_be_imported_fails_every_command_in_one_line(workdir: Path) -> None:
    """Before: a 69-line traceback for every command and every policy."""
    site = install(workdir / "site", "agency-rr", "1.0", "agency_rr", PLUGIN)
    install(site, "agency-broken", "0.3", "agency_broken", "import agency_missing_dependency\n", point="broken")
    for args in (("policy", "schema"), ("plan", "rr.yaml"), ("run", "rr.yaml")):
        line = one_line_refusal(with_plugins(site, *args))
        assert "mechanism plugin 'broken' = 'agency_broken'" in line, line
        assert "distribution agency-broken 0.3" in line and "cannot be imported" in line, line
        assert "ModuleNotFoundError: No module named 'agency_missing_dependency'" in line, line


def test_a_plugin_redefining_a_built_in_type_is_refused_in_one_line(workdir: Path) -> None:
    """Before: a 57-line traceback and exit 1 (the code for "target not met")."""
    impostor = PLUGIN.replace('Literal["agency_rr"]', 'Literal["noisy_counts"]').replace("agency_random", "dup_random")
    site = install(workdir / "site", "agency-dup", "2.0", "agency_dup", impostor, point="counts")
    line = one_line_refusal(with_plugins(site, "plan", "rr.yaml"))
    assert "mechanism plugin 'counts' = 'agency_dup'" in line and "distribution agency-dup 2.0" in line, line
    assert "mechanism type 'noisy_counts' is defined twice" in line, line


audit_app = typer.Typer()


def audit_cli(*args: str) -> tuple[int, str, Any]:
    """An audit command in this process, which does not have the plugin (uninstalled): its
    exit code, its text and its ``--json`` document."""
    from privrelease.audit import database
    from privrelease.cli import audit

    if not audit_app.registered_groups:
        audit.register(audit_app)
    found = []
    for extra in ([], ["--json"]):
        result = CliRunner().invoke(audit_app, [*args, *extra])
        database.dispose_engines()
        assert result.exception is None or isinstance(result.exception, SystemExit), result.output
        found.append((result.exit_code, result.output))
    (code, text), (json_code, document) = found
    assert code == json_code, found
    return code, text, json.loads(document)


def test_a_release_records_its_plugin_and_survives_its_uninstall(workdir: Path) -> None:
    """The run's record, release.json and the report name the distribution and version of each
    kind; the stored trees name the plugin defining their events. Uninstalled: audit verify says
    intact with the figures it cannot replay and what to install (before: BROKEN, "unknown event
    kind"); ledger show shows the recorded charge (before: a traceback)."""
    from sqlmodel import select

    from privrelease.audit import chain, database
    from privrelease.audit.models import LedgerEntry

    site = install(workdir / "site", "agency-rr", "1.0", "agency_rr", PLUGIN)
    done = with_plugins(site, code=RELEASE)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = Path(done.stdout.strip().splitlines()[-1])
    plugin, own = {"distribution": "agency-rr", "version": "1.0"}, "privrelease"

    facts = json.loads((folder / "release.json").read_text(encoding="utf-8"))
    assert facts["kinds"] == {"agency_rr": plugin}
    (output,) = facts["outputs"]
    assert output["accuracy"]["agency_truthful"]["truthful"] == math.exp(1.5) / (math.exp(1.5) + 2)
    report = (folder / "report.html").read_text(encoding="utf-8")
    assert "agency_rr: <code>agency-rr 1.0</code>" in report
    assert "P(published answer is the true one)" in report and "noise within" not in report
    assert f"{math.exp(1.5) / (math.exp(1.5) + 2):.6f}" in report

    with database.session(database.get_engine(), readonly=True) as s:
        started = [r for r in chain.records(s) if r.kind == "run_started"]
        (entry,) = s.exec(select(LedgerEntry)).all()
    database.dispose_engines()
    assert [json.loads(r.payload_json)["kinds"] for r in started] == [{"agency_rr": plugin}]
    assert json.loads(entry.event_json)["defined_by"] == {"agency_randomized_response": plugin}
    assert own not in entry.event_json

    code, text, verified = audit_cli("audit", "verify")
    assert code == 0 and verified["ok"] and text.startswith("intact: "), text
    assert "BROKEN" not in text and text.count("not replayed: ") == 3, text
    assert verified["problems"] == [] and len(verified["cannot_replay"]) == 3  # 2 guarantees, 1 charge
    assert all("install agency-rr==1.0" in p["message"] for p in verified["cannot_replay"])
    code, text, ledger = audit_cli("ledger", "show", "rr-population")
    assert code == 0 and ledger["spent"] is None and "install agency-rr==1.0" in ledger["cannot_compose"]
    (shown,) = ledger["entries"]
    assert (shown["epsilon"], shown["delta"]) == (entry.epsilon, entry.delta) and entry.epsilon > 0
    assert "not composed here" in text and f"{entry.epsilon:.6g}" in text, text
    code, text, listed = audit_cli("ledger", "list")
    assert code == 0 and listed["datasets"][0]["spent"] is None and "not composed here" in text, text

    from privrelease.errors import UserError
    from privrelease.flows.steps import release_plain

    counts = workdir / "counts.yaml"
    counts.write_text(POLICY.replace("rr-survey", "rr-counts").replace(COUNTS_FROM, COUNTS), encoding="utf-8")
    refusal = r"ledger entry 1 of dataset rr-population \(run \w+\): cannot replay .* install agency-rr==1\.0$"
    with pytest.raises(UserError, match=refusal):  # the budget cannot be checked without the plugin
        release_plain(policy_path=str(counts))
    with database.session(database.get_engine(), readonly=True) as s:
        assert [r.kind for r in chain.records(s)].count("data_read") == 1, "refused before reading its data"
    database.dispose_engines()


def test_kinds_use_one_public_surface() -> None:
    """Every name of ``privrelease.mechanisms.kinds.__all__`` resolves; the built-in kinds and the
    outside one take those names from that module alone (never from the internal modules that
    define them), and the outside one imports nothing else of privrelease."""
    import ast

    surface = set(kinds.__all__)
    assert all(getattr(kinds, name) is not None for name in surface)
    assert "stable" in (kinds.__doc__ or "") and "LoadedPolicy" in (kinds.__doc__ or "")
    built_in = sorted(Path(kinds.__file__).parent.glob("*.py"))
    sources = {path.name: path.read_text(encoding="utf-8") for path in built_in if path.name != "__init__.py"}
    sources["the outside plugin"] = PLUGIN
    for where, source in sources.items():
        for node in ast.walk(ast.parse(source)):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("privrelease")):
                continue
            if node.module == "privrelease.mechanisms.kinds":
                continue
            assert where != "the outside plugin", f"the plugin imports {node.module}"
            around = sorted(alias.name for alias in node.names if alias.name in surface)
            assert not around, f"{where} imports {around} from {node.module}, not privrelease.mechanisms.kinds"


def test_built_in_kinds_are_recorded_as_privrelease_code() -> None:
    """A policy of built-in kinds: every type is privrelease's own at its version, in the plan
    and the report's internal part (which says which code ran, beside the code version); its
    event tree's JSON is as before (no ``defined_by``), so stored trees and chains keep their bytes."""
    from privrelease.mechanisms.events import event_to_json
    from privrelease.reports.context import example_context
    from privrelease.reports.render import report_html
    from privrelease.version import VERSION

    context = example_context()
    types = {spec.type for spec in context.plan.loaded.policy.mechanisms}
    assert context.plan.kinds == {t: {"distribution": "privrelease", "version": VERSION} for t in sorted(types)}
    report = report_html(context)
    assert all(f"{t}: <code>privrelease {VERSION}</code>" in report for t in types), types
    assert "Mechanism code" not in report_html(context, public_only=True)
    assert set(json.loads(event_to_json(context.plan.event))) == {"schema_version", "event"}
