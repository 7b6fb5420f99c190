"""``privrelease report index``: the static compliance index of every run in the audit database.

An audit database is built through the audit API (approvals, runs, guarantees as the flow records
them, reports rendered by ``report_html(example_context(...))``), the command is run, and the
page is checked: one row per run newest first (failed runs too), the guarantees beside the
policy's targets marked as the checks stored with each run (never recomputed), names escaped,
relative links to report files that exist beside the index with the recorded sha256, approvals
with the OS user, nothing that loads or runs. Then headless Chromium opens the index from ``file://`` and follows every link.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import shutil
import uuid
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import typer
from conftest import child_cpu_seconds
from test_audit_chain import BACKENDS, audit_database
from typer.testing import CliRunner

from privrelease.audit import approvals, database, records
from privrelease.audit.bindings import Account
from privrelease.cli import report as report_cli
from privrelease.planning import plan_policy
from privrelease.policies import load_policy_text
from privrelease.reports.context import EXAMPLES_DIR, example_context
from privrelease.reports.index import INDEX_FILE, report_file_name
from privrelease.reports.render import report_html

DEMO_TEXT = (EXAMPLES_DIR / "demo.yaml").read_text(encoding="utf-8")
UNAPPROVED_TEXT = DEMO_TEXT.replace('version: "1"', 'version: "2-draft"', 1)
EVIL_NAME = "<script>alert('index')</script> & co"
EVIL_VERSION = '1"><img src=x onerror=alert(2)>'
EVIL_BY = "<b onmouseover=alert(3)>Mallory</b>"
EVIL_ERROR = "DataStepError: column <i>age</i> is missing"
EVIL = f"""
name: "{EVIL_NAME}"
version: '{EVIL_VERSION}'
dataset:
  path: evil.csv
  rows: 1000
  columns:
    age: {{type: integer}}
    occupation: {{type: string, values: [x, y, z, w, v]}}
generalization:
  age: {{bins: [0, 50, 120], labels: ["<50", "50+"]}}
mechanisms:
  - {{name: micro, type: sdgs, columns: [age], k: 10, beta: 0.2, epsilon: 1.0}}
  - {{name: decoys, type: splu_gen, gamma: 5, sensitive: [occupation], columns: [age]}}
targets:
  accounting: approximate
  max_epsilon: 2
  delta: 1.0e-6
  splu_privacy: {{epsilon: 0.3, t_p: 0.5, alpha: 3}}
"""

app = typer.Typer()
report_cli.register(app)
runner = CliRunner()


def invoke(*args: str, code: int = 0) -> Any:
    """``privrelease report ARGS`` in-process."""
    result = runner.invoke(app, ["report", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == code, result.output
    return result


# --- building the audit database ---------------------------------------------------------------


@dataclass
class Built:
    """The database the tests read: run ids newest first, what each run is."""

    root: Path
    engine: Any
    runs: list[str] = field(default_factory=list)
    facts: dict[str, dict[str, Any]] = field(default_factory=dict)
    result: dict[str, Any] = field(default_factory=dict)
    """What the module's first ``report index --json`` printed."""

    @property
    def work(self) -> Path:
        return self.root / "work"


@functools.cache
def example_state(policy_text: str) -> dict[str, Any]:
    """What an example run of the policy is (:meth:`ReportContext.release_state`)."""
    return example_context(load_policy_text(policy_text, EXAMPLES_DIR)).release_state()


def record_like_the_flow(session: Any, run_id: str, policy_text: str) -> None:
    """The guarantees a successful run records, by the flow's own step."""
    from privrelease.flows import publishing, steps

    source = steps.PolicySource(text=policy_text, base_dir=str(EXAMPLES_DIR), source="test policy")
    run = SimpleNamespace(run_id=run_id, policy=source)
    publishing._record_guarantees(session, run, steps.plan_summary(source), example_state(policy_text))


def add_run(
    built: Built,
    policy_text: str,
    *,
    status: str = "succeeded",
    html: str | None = None,
    report_path: Path | None = None,
    kind: str = "release",
    source: str | None = None,
    error: str | None = None,
    run_id: str | None = None,
) -> str:
    loaded = load_policy_text(policy_text, EXAMPLES_DIR)
    facts = approvals.policy_facts(loaded)
    fingerprint = hashlib.sha256(f"dataset of {facts.name}".encode()).hexdigest()
    with database.session(built.engine) as s:
        approvals.register_policy(s, facts)
        records.register_dataset(
            s,
            fingerprint,
            identity=f"dataset-of-{fingerprint[:12]}",
            size_bytes=1000,
            row_count=100,
            lifetime_epsilon=50,
            lifetime_delta=1e-6,
            notion="approximate",
        )
        run = records.start_run(
            s,
            policy_sha256=facts.sha256,
            code_version="0.1.0",
            dataset_fingerprint=fingerprint,
            kind=kind,
            source_run_id=source,
            run_id=run_id,
        )
        records.record_data_read(s, run)
        if status == "succeeded":
            record_like_the_flow(s, run.id, policy_text)
        if html is not None:
            if report_path is not None:
                report_path.parent.mkdir(parents=True, exist_ok=True)
                report_path.write_text(html, encoding="utf-8")
            records.store_report(s, run, html, path=report_path)
        records.finish_run(s, run, status, error=error)
    built.runs.insert(0, run.id)
    built.facts[run.id] = {
        "policy": facts,
        "loaded": loaded,
        "status": status,
        "html": html,
        "fingerprint": fingerprint,
    }
    return run.id


@functools.cache
def rendered(policy_text: str) -> str:
    """The report of an example run of the policy (rendered once per process)."""
    return report_html(example_context(load_policy_text(policy_text, EXAMPLES_DIR)))


def build(root: Path, engine: Any) -> Built:
    """Five runs of three policy versions: two demo releases (one a rerun, whose report is
    already in the index folder), a failed demo run without a report, a run of an unapproved
    draft, a run of a policy with HTML in its name (its SPLU-Gen half has no epsilon: the
    epsilon target is not met)."""
    built = Built(root, engine)
    demo = load_policy_text(DEMO_TEXT, EXAMPLES_DIR)
    evil = load_policy_text(EVIL, EXAMPLES_DIR)
    with database.session(built.engine) as s:
        approvals.approve_policy(
            s, approvals.policy_facts(demo), "Ada Lovelace", account=Account("ada"), note="board minutes 12"
        )
        approvals.approve_policy(s, approvals.policy_facts(demo), "Grace Hopper", account=Account("grace"))
        approvals.approve_policy(s, approvals.policy_facts(evil), EVIL_BY, account=Account("mallory"), note="<u>ok</u>")
    demo_html = rendered(DEMO_TEXT)
    first = add_run(built, DEMO_TEXT, html=demo_html)
    rerun_html = demo_html.replace("</body>", "<!-- rerun --></body>")
    rerun = uuid.uuid4().hex
    already = built.work / "reports" / f"{rerun}.html"
    add_run(built, DEMO_TEXT, html=rerun_html, report_path=already, kind="rerun", source=first, run_id=rerun)
    add_run(built, DEMO_TEXT, status="failed", error=EVIL_ERROR)
    add_run(built, UNAPPROVED_TEXT, html=rendered(UNAPPROVED_TEXT), report_path=root / "release" / "report.html")
    add_run(built, EVIL, html=rendered(EVIL))
    return built


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The database, the env pointing at it, ``report index --json`` run once."""
    root = tmp_path_factory.mktemp("index")
    with pytest.MonkeyPatch.context() as patch, audit_database("sqlite", root) as engine:
        yield built_in(root, engine, patch)


def built_in(root: Path, engine: Any, patch: pytest.MonkeyPatch) -> Built:
    """The database built on ``engine``, the environment pointing at it (cwd ``root``, work dir
    ``root/work``), ``report index --json`` run once."""
    patch.chdir(root)
    patch.setenv("PRIVRELEASE_WORK_DIR", str(root / "work"))
    patch.setenv("PRIVRELEASE_DB_URL", engine.url.render_as_string(hide_password=False))
    made = build(root, engine)
    made.result = json.loads(invoke("index", "--json").stdout)
    return made


# --- reading the page ---------------------------------------------------------------------------


class IndexPage(HTMLParser):
    """Every start tag with its attributes; each run row (``tr.run``) as its cells' texts by
    the cell's class, its links and the rows of its guarantees table; the policy cards' text."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.rows: list[dict[str, Any]] = []
        self.cards: dict[str, list[str]] = {}
        self._row: dict[str, Any] | None = None
        self._cell: str | None = None
        self._card: str | None = None
        self._depth = 0
        self._g: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.tags.append((tag, a))
        classes = (a.get("class") or "").split()
        if tag == "tr" and "run" in classes:
            self._row = {"id": a["data-run"], "class": classes, "cells": {}, "links": [], "g": []}
            self.rows.append(self._row)
        elif self._row is not None and tag == "td" and self._cell is None:
            self._cell = classes[0] if classes else str(len(self._row["cells"]))
            self._row["cells"][self._cell] = ""
        elif self._row is not None and tag == "tr" and "g" not in classes:
            self._g = []
            self._row["g"].append(self._g)
        elif self._row is not None and tag == "td" and self._g is not None:
            self._g.append("")
        if tag == "a" and self._row is not None:
            self._row["links"].append(a.get("href"))
        if tag == "div" and "policy" in classes:
            self._card = a["id"]
            self.cards[self._card] = []
            self._depth = 0
        if tag == "div" and self._card is not None:
            self._depth += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr" and self._g is not None:
            self._g = None
        elif tag == "tr" and self._row is not None:
            self._row = None
        elif tag == "td" and self._row is not None and self._g is None and self._cell is not None:
            self._cell = None
        if tag == "div" and self._card is not None:
            self._depth -= 1
            if self._depth == 0:
                self._card = None

    def handle_data(self, data: str) -> None:
        if self._row is not None and self._cell is not None:
            self._row["cells"][self._cell] += data
            if self._g is not None and self._g:
                self._g[-1] += data
        if self._card is not None:
            self.cards[self._card].append(data)

    def row(self, run_id: str) -> dict[str, Any]:
        return next(row for row in self.rows if row["id"] == run_id)


def text(value: str) -> str:
    return " ".join(value.split())


@pytest.fixture(scope="module")
def page(built: Built) -> tuple[str, IndexPage]:
    html = (built.work / "reports" / INDEX_FILE).read_text(encoding="utf-8")
    return html, IndexPage(html)


# --- the command --------------------------------------------------------------------------------


def test_json_names_the_index_and_counts_the_runs(built: Built) -> None:
    result = built.result
    folder = built.work / "reports"
    assert result["path"] == str(folder / INDEX_FILE) and result["runs"] == 5
    assert result["reports_linked"] == 4 and result["problems"] == []
    rerun = built.runs[3]
    # the rerun's report was already there, intact: not rewritten; the other three were written
    assert sorted(result["reports_written"]) == sorted(
        report_file_name(run) for run in built.runs if built.facts[run]["html"] is not None and run != rerun
    )
    for run in built.runs:
        html = built.facts[run]["html"]
        file = folder / report_file_name(run)
        assert (file.read_bytes() == html.encode("utf-8")) if html is not None else not file.exists()


def test_plain_output_prints_the_path_and_a_second_run_writes_nothing(built: Built) -> None:
    printed = invoke("index").stdout.strip()
    assert printed == str(built.work / "reports" / INDEX_FILE)
    again = json.loads(invoke("index", "--json").stdout)
    assert again["reports_written"] == [] and again["runs"] == 5


def test_rows_newest_first_one_per_run_failed_included(built: Built, page: tuple[str, IndexPage]) -> None:
    _, parsed = page
    assert [row["id"] for row in parsed.rows] == built.runs
    started = [text(row["cells"]["when"])[:19] for row in parsed.rows]
    assert started == sorted(started, reverse=True)
    evil, draft, failed, rerun, first = (parsed.row(run) for run in built.runs)
    assert text(failed["cells"]["status"]).startswith("failed") and "status-failed" in failed["class"]
    assert EVIL_ERROR in text(failed["cells"]["status"])
    assert text(failed["cells"]["guarantees"]) == "none recorded"
    assert text(failed["cells"]["verdict"]) == "not recorded"
    assert "no report stored" in failed["cells"]["report"]
    assert "rerun of" in text(rerun["cells"]["policy"]) and built.runs[4][:12] in rerun["cells"]["policy"]
    for row in (first, rerun, failed):
        assert text(row["cells"]["policy"]).startswith("demo-census") and text(row["cells"]["version"]) == "1"
    assert text(draft["cells"]["version"]) == "2-draft"
    assert "not approved before data read" in draft["cells"]["status"]
    assert "approved before data read" in first["cells"]["status"]
    assert "not approved" not in first["cells"]["status"]
    for run in built.runs:
        row, facts = parsed.row(run), built.facts[run]
        assert text(row["cells"]["hashes"]) == f"{facts['policy'].sha256[:12]} {facts['fingerprint'][:12]}"


def test_guarantees_against_targets_equal_the_calculus(built: Built, page: tuple[str, IndexPage]) -> None:
    _, parsed = page
    first = parsed.row(built.runs[4])
    plan = plan_policy(built.facts[built.runs[4]]["loaded"])
    rows = {text(g[0]).removesuffix(" (targets)"): [text(c) for c in g[1:]] for g in first["g"] if g}
    assert list(rows) == ["probabilistic DP", "approximate DP"]  # the deciding notion first
    epsilon, delta, rho = rows["probabilistic DP"]
    composed = plan.composed["probabilistic"]
    assert math.isclose(float(epsilon.split()[0]), composed.epsilon, rel_tol=1e-5) and epsilon.endswith("≤ 4.5 ✓")
    assert math.isclose(float(delta.split()[0]), composed.delta, rel_tol=1e-5) and delta.endswith("≤ 1e-09 ✓")
    assert math.isclose(float(rho.split()[0]), plan.facts["rho_composed_statistics"], rel_tol=1e-5)
    assert rho.endswith("≤ 0.05 ✓")
    reference = rows["approximate DP"]
    assert math.isclose(float(reference[1]), plan.composed["approximate"].delta, rel_tol=1e-5)
    assert "✓" not in "".join(reference), "the other notion is shown for reference only"
    assert text(first["cells"]["verdict"]).startswith("targets met")
    assert f"{len(plan.checks)} of {len(plan.checks)} passed" in text(first["cells"]["verdict"])
    published = example_state(DEMO_TEXT)["published_rows"]
    assert f"rows in the published files (all outputs, a table's cells counted as rows): {published:,}" in text(
        first["cells"]["verdict"]
    )
    # SPLU-Gen has no (eps, delta) guarantee: the epsilon target is not met, rho has no statistic
    evil = parsed.row(built.runs[0])
    rows = {text(g[0]).removesuffix(" (targets)"): [text(c) for c in g[1:]] for g in evil["g"] if g}
    assert list(rows)[0] == "approximate DP"
    assert rows["approximate DP"][:2] == ["none ≤ 2 ✗", "none ≤ 1e-06 ✗"]
    assert rows["approximate DP"][2] == "—"
    assert text(evil["cells"]["verdict"]).startswith("targets not met")


def test_verdict_rules() -> None:
    """The verdict and each target's mark are the checks the run stored, never recomputed: a
    stored check is shown as stored even where the value beside it would say otherwise; the
    other notion is not checked; a run that stored no checks is "not recorded" (its targets
    marked "not recorded"), one whose plan had none "no targets"; no guarantee under the
    notion is "not recorded"."""
    from privrelease.reports import index

    def check(target: str, passed: bool) -> dict[str, Any]:
        return {"target": target, "required": "<= 1", "achieved": "1", "passed": passed}

    def stored(notion: str, epsilon: float | None, delta: float | None, rho: float | None = None, **details) -> Any:
        details = json.dumps({"supported": epsilon is not None, "detail": "why", **details})
        return SimpleNamespace(notion=notion, epsilon=epsilon, delta=delta, rho=rho, details_json=details)

    targets = {"accounting": "approximate", "max_epsilon": 1.0, "delta": 1e-6, "rho": 0.1}
    checks = [
        check("max_epsilon (approximate)", True),
        check("delta (approximate)", True),
        check("count: rho", False),
        check("mean: rho", True),
        check("decoys: SPLU T_p (eps 0.3, alpha 3)", True),
    ]
    met = [stored("probabilistic", 5.0, 0.5), stored("approximate", 9.0, 1e-6, 0.1, checks=checks)]
    rows = index._guarantee_rows(met, targets)
    assert [row.notion for row in rows] == ["approximate", "probabilistic"]
    assert [cell.passed for cell in rows[0].cells] == [True, True, False], "as stored (epsilon 9 > 1 is not re-judged)"
    assert [cell.passed for cell in rows[1].cells] == [None, None, None], "the other notion is not checked"
    stored_checks = index._stored_checks(met, "approximate")
    assert index._verdict(rows, stored_checks) == "fail" and index._recorded_checks(stored_checks) == (4, 5)
    composed = [*checks, check("rho (statistics composed)", True)]
    rows = index._guarantee_rows([stored("approximate", 1.0, 1e-6, 0.1, checks=composed)], targets)
    assert [cell.passed for cell in rows[0].cells] == [True, True, True], "the composed rho check decides rho"
    passing = [c for c in checks if c["target"] != "count: rho"]
    assert index._verdict(rows, passing) == "pass"
    # an older run: guarantees without stored checks; nothing is recomputed
    assert index._stored_release([stored("approximate", 0.5, 0.0)], "approximate") is None, "older runs: not stored"
    older = index._guarantee_rows([stored("approximate", 0.5, 0.0, 0.05)], targets)
    assert [(cell.passed, cell.note) for cell in older[0].cells] == [(None, "not recorded")] * 3
    assert index._verdict(older, index._stored_checks([stored("approximate", 0.5, 0.0)], "approximate")) == (
        "not recorded"
    )
    unsupported = index._guarantee_rows([stored("approximate", None, None, checks=[])], targets)
    assert unsupported[0].detail == "why" and index._verdict(unsupported, []) == "no targets"
    assert index._verdict(index._guarantee_rows([stored("probabilistic", 0.1, 0.0)], targets), checks) == "not recorded"
    assert index._verdict([], None) == "not recorded"
    assert report_file_name("ab" * 16) == "ab" * 16 + ".html"
    for odd in ("index", "../x", "A/B"):
        assert "/" not in report_file_name(odd) and report_file_name(odd) != INDEX_FILE


def test_report_links_are_relative_and_point_at_the_stored_bytes(built: Built, page: tuple[str, IndexPage]) -> None:
    html, parsed = page
    folder = built.work / "reports"
    for run in built.runs:
        row, stored = parsed.row(run), built.facts[run]["html"]
        reports = [href for href in row["links"] if not href.startswith("#")]
        if stored is None:
            assert reports == []
            continue
        assert reports == [report_file_name(run)]
        assert (folder / reports[0]).read_bytes() == stored.encode("utf-8")
        assert row["links"][0] == f"#policy-{built.facts[run]['policy'].sha256}"
    ids = {a.get("id") for _, a in parsed.tags}
    for _, attrs in parsed.tags:
        href = attrs.get("href")
        if href is not None:
            assert href.startswith("#") and href[1:] in ids or (folder / href).is_file(), href
    # still readable after the folder is copied elsewhere (a file share)
    copy = built.root / "share" / "reports"
    shutil.copytree(folder, copy)
    for _, attrs in parsed.tags:
        href = attrs.get("href") or "#"
        assert href.startswith("#") or (copy / href).is_file()


def test_policy_versions_with_approvals_and_os_users(built: Built, page: tuple[str, IndexPage]) -> None:
    _, parsed = page
    demo = text(" ".join(parsed.cards[f"policy-{built.facts[built.runs[4]]['policy'].sha256}"]))
    assert "Ada Lovelace ada" in demo and "Grace Hopper grace" in demo and "board minutes 12" in demo
    assert demo.index("Ada Lovelace") < demo.index("Grace Hopper")  # oldest approval first
    assert "no data (approved before approvals bound it)" in demo  # what each approval binds
    assert "runs 3" in demo and "ε ≤ 4.5; δ ≤ 1e-09; ρ ≤ 0.05" in demo
    draft = text(" ".join(parsed.cards[f"policy-{built.facts[built.runs[1]]['policy'].sha256}"]))
    assert "not approved" in draft and "runs 1" in draft
    evil = text(" ".join(parsed.cards[f"policy-{built.facts[built.runs[0]]['policy'].sha256}"]))
    assert EVIL_BY in evil and "mallory" in evil and "<u>ok</u>" in evil


def test_names_are_escaped_and_nothing_loads_or_runs(built: Built, page: tuple[str, IndexPage]) -> None:
    html, parsed = page
    for raw in (EVIL_NAME, EVIL_VERSION, EVIL_BY, EVIL_ERROR, "<u>ok</u>", "<img", "<b ", "<i>"):
        assert raw not in html, f"{raw!r} reached the page unescaped"
    assert "&lt;script&gt;alert(&#39;index&#39;)&lt;/script&gt; &amp; co" in html
    assert "1&#34;&gt;&lt;img src=x onerror=alert(2)&gt;" in html
    assert text(parsed.row(built.runs[0])["cells"]["policy"]).startswith(EVIL_NAME)
    assert text(parsed.row(built.runs[0])["cells"]["version"]) == EVIL_VERSION
    tags = {tag for tag, _ in parsed.tags}
    assert not tags & {"script", "link", "iframe", "img", "object", "embed", "base", "form", "b", "i", "u"}
    for tag, attrs in parsed.tags:
        for name in attrs:
            assert not name.startswith("on"), f"event handler {name} on <{tag}>"
    assert "http://" not in html and "https://" not in html and "url(" not in html and "@import" not in html
    assert "<style>" in html


def test_missing_or_changed_files_are_written_again_and_a_forged_copy_is_not_linked(built: Built) -> None:
    from sqlmodel import select

    from privrelease.audit.models import Report

    folder = built.work / "reports"
    first, draft, evil = built.runs[4], built.runs[1], built.runs[0]
    (folder / report_file_name(first)).unlink()
    (folder / report_file_name(draft)).write_text("<p>edited</p>", encoding="utf-8")
    with database.session(built.engine) as s:  # forge the database copy (bypassing the chain)
        s.exec(select(Report).where(Report.run_id == evil)).one().html = "<p>forged</p>"
    (folder / report_file_name(evil)).unlink()
    try:
        result = invoke("index", "--json")
        document = json.loads(result.stdout)
        assert sorted(document["reports_written"]) == sorted([report_file_name(first), report_file_name(draft)])
        for run in (first, draft):
            assert (folder / report_file_name(run)).read_text(encoding="utf-8") == built.facts[run]["html"]
        assert not (folder / report_file_name(evil)).exists()
        assert document["reports_linked"] == 3 and len(document["problems"]) == 1
        assert evil in document["problems"][0] and "does not match" in document["problems"][0]
        warned = invoke("index")
        assert "warning:" in warned.stderr and evil in warned.stderr
        parsed = IndexPage((folder / INDEX_FILE).read_text(encoding="utf-8"))
        assert [href for href in parsed.row(evil)["links"] if not href.startswith("#")] == []
        assert "does not match" in parsed.row(evil)["cells"]["report"]
        assert any(a.get("id") == "problems" for _, a in parsed.tags)
    finally:
        with database.session(built.engine) as s:
            s.exec(select(Report).where(Report.run_id == evil)).one().html = built.facts[evil]["html"]
        invoke("index", "--json")


def test_out_folder_and_empty_database(tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as patch, audit_database("sqlite", tmp_path) as engine:
        patch.setenv("PRIVRELEASE_DB_URL", engine.url.render_as_string(hide_password=False))
        patch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "work"))
        patch.chdir(tmp_path)
        document = json.loads(invoke("index", "--out", "share/index", "--json").stdout)
    assert document["path"] == str(tmp_path / "share" / "index" / INDEX_FILE) and document["runs"] == 0
    html = Path(document["path"]).read_text(encoding="utf-8")
    assert "No runs are recorded" in html and "<title>Release index: 0 runs</title>" in html
    assert not (tmp_path / "work" / "reports").exists()


def test_a_succeeded_reissue_shows_the_guarantees_verdict_and_report_it_handed_back(tmp_path: Path) -> None:
    """A reissue publishes its source's outputs and report unchanged and stores no guarantee of
    its own: its row says so, links the source's report and carries the source's guarantees
    and verdict (audit 5, item 7; was "none recorded · not recorded · no report stored")."""
    with pytest.MonkeyPatch.context() as patch, audit_database("sqlite", tmp_path) as engine:
        patch.setenv("PRIVRELEASE_DB_URL", engine.url.render_as_string(hide_password=False))
        patch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "work"))
        patch.chdir(tmp_path)
        made = Built(tmp_path, engine)
        source = add_run(made, DEMO_TEXT, html=rendered(DEMO_TEXT))
        with database.session(engine) as s:
            handed = records.start_run(
                s,
                policy_sha256=made.facts[source]["policy"].sha256,
                code_version="0.1.0",
                dataset_fingerprint=made.facts[source]["fingerprint"],
                kind="reissue",
                source_run_id=source,
            )
            records.finish_run(s, handed, "succeeded")
        document = json.loads(invoke("index", "--json").stdout)
    parsed = IndexPage(Path(document["path"]).read_text(encoding="utf-8"))
    row, original = parsed.row(handed.id), parsed.row(source)
    assert f"reissue of {source[:12]}: its outputs, guarantees and report are that run's (no new charge)" in text(
        row["cells"]["status"]
    )
    assert f"#run-{source}" in row["links"] and report_file_name(source) in row["links"]
    assert row["g"] == original["g"] and row["g"]
    assert text(row["cells"]["verdict"]) == text(original["cells"]["verdict"])
    for missing in ("none recorded", "not recorded", "no report stored"):
        assert missing not in text(" ".join(row["cells"].values()))
    assert document["reports_linked"] == 2


@pytest.mark.parametrize("backend", BACKENDS[1:])  # PostgreSQL (SQLite is the module's database)
def test_the_same_index_from_postgresql(backend: str, built: Built, tmp_path: Path) -> None:
    with pytest.MonkeyPatch.context() as patch, audit_database(backend, tmp_path) as engine:
        made = built_in(tmp_path, engine, patch)
    assert made.result["path"] == str(tmp_path / "work" / "reports" / INDEX_FILE)
    assert made.result["runs"] == 5 and made.result["reports_linked"] == 4 and made.result["problems"] == []
    here = IndexPage(Path(made.result["path"]).read_text(encoding="utf-8"))
    there = IndexPage((built.work / "reports" / INDEX_FILE).read_text(encoding="utf-8"))
    assert [row["id"] for row in here.rows] == made.runs
    for mine, theirs in zip(here.rows, there.rows, strict=True):  # same content, other ids and times
        for cell in ("policy", "version", "guarantees", "verdict"):
            assert text(mine["cells"][cell]).split(" run ")[0] == text(theirs["cells"][cell]).split(" run ")[0]
        assert mine["g"] == theirs["g"]
    for run in made.runs:
        stored = made.facts[run]["html"]
        file = tmp_path / "work" / "reports" / report_file_name(run)
        assert (file.read_bytes() == stored.encode("utf-8")) if stored is not None else not file.exists()


def test_index_never_imports_prefect_or_the_calculus_and_is_quick(built: Built) -> None:
    """CPU time of the whole CLI in a fresh process, within 3x of merely importing it."""
    script = (
        "import sys\n"
        "from privrelease.cli import app\n"
        "app(['report', 'index', '--json'], standalone_mode=False)\n"
        "assert 'prefect' not in sys.modules, 'prefect was imported'\n"
        "assert 'privrelease.reports.charts' not in sys.modules, 'the chart code was imported'\n"
        "assert 'privrelease.mechanisms.accountants' not in sys.modules, 'the calculus was imported'\n"
    )
    done, cpu, baseline = child_cpu_seconds(script, cwd=built.root)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["runs"] == 5
    assert cpu < 3 * baseline, f"report index took {cpu:.2f} s of CPU; importing the CLI {baseline:.2f} s"


# --- in a real browser --------------------------------------------------------------------------


def test_index_in_chromium_every_link_resolves(built: Built, browser: Any, tmp_path: Path) -> None:
    from test_report_browser import open_report

    folder = built.work / "reports"
    index = folder / INDEX_FILE
    page, seen = open_report(browser, index)
    try:
        assert page.title() == "Release index: 5 runs"
        assert page.locator("h1").inner_text() == "Release index"
        assert page.locator("tr.run").count() == 5
        assert page.locator("tr.run").first.get_attribute("data-run") == built.runs[0]
        screenshot = tmp_path / "index.png"
        page.screenshot(path=str(screenshot), full_page=True)
        assert screenshot.stat().st_size > 30_000
        # the in-page links land on their targets
        for anchor in page.locator("a[href^='#']").all():
            target = anchor.get_attribute("href")
            assert page.locator(f"[id='{target[1:]}']").count() == 1, target
        links = page.locator("a.report")
        hrefs = [links.nth(i).get_attribute("href") for i in range(links.count())]
        assert len(hrefs) == 4
        for i, href in enumerate(hrefs):
            run = page.locator("tr.run").filter(has=page.locator(f"a[href='{href}']")).get_attribute("data-run")
            page.locator("a.report").nth(i).click()
            page.wait_for_load_state("load")
            assert page.url == (folder / href).as_uri()
            heading = page.locator("h1").inner_text()
            assert heading.startswith(built.facts[run]["policy"].name), heading
            assert page.title().startswith("Disclosure report: ")
            page.go_back(wait_until="load")
            assert page.url == index.as_uri()
        assert seen["console"] == [] and seen["errors"] == [] and seen["dialogs"] == []
        assert all(url.startswith(folder.as_uri() + "/") for url in seen["requests"]), seen["requests"]
        assert {url.rsplit("/", 1)[1] for url in seen["requests"]} == {INDEX_FILE, *hrefs}
    finally:
        page.context.close()
