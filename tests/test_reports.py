"""The HTML disclosure report (``privrelease.reports``) and the ``privrelease report`` commands.

The report's numbers are checked against the calculus functions called here directly (and the
SPLU curve against scipy's binomial), its SVG is parsed as XML, its HTML for anything that could
load or run: no scripts, no external resources, every policy-supplied name escaped.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import xml.etree.ElementTree as ET
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import typer
from conftest import child_cpu_seconds
from scipy.stats import binom
from typer.testing import CliRunner

from privrelease.cli import report as report_cli
from privrelease.files import sha256_text
from privrelease.mechanisms import sdgs_math, splu_guarantees, splu_scope
from privrelease.mechanisms.events import SDGS, Laplace, leaves
from privrelease.policies import load_policy_text
from privrelease.reports import write_html
from privrelease.reports.charts import (
    decade_ticks,
    linear_ticks,
    nice_ceiling,
    snap_decades,
)
from privrelease.reports.context import EXAMPLES_DIR, ReportContext, example_context
from privrelease.reports.render import report_html, write_report

# --- policies ---------------------------------------------------------------------------------

DEMO_TEXT = (EXAMPLES_DIR / "demo.yaml").read_text(encoding="utf-8")

MIXED = """
name: mixed
version: "2"
dataset:
  path: mixed.csv
  rows: 20000
  columns:
    age: {type: integer}
    sex: {type: string, values: [Male, Female]}
    hours: {type: integer}
    occupation: {type: string, values: [a, b, c, d, e, f]}
generalization:
  age: {bins: [0, 30, 60, 120], labels: [young, middle, old]}
  sex: keep
mechanisms:
  - {name: micro, type: sdgs, columns: [age, sex], k: 20, beta: 0.1, epsilon: 1.0}
  - {name: counts, type: histogram, columns: [age], k: 10, beta: 0.25, epsilon: 0.6}
  - {name: mean-hours, type: identifiable_statistic, query: mean, column: hours, lower: 1, upper: 99, rho: 0.05}
  - {name: decoys, type: splu_gen, gamma: 5, sensitive: [occupation], columns: [age]}
targets:
  accounting: probabilistic
  delta: 1.0e-6
  splu_privacy: {epsilon: 0.3, t_p: 0.5, alpha: 3}
  splu_utility: {epsilon: 0.1, t_e: 0.05, t_f: 500}
"""

EVIL_NAME = "<script>alert(1)</script>"
EVIL_COLUMN = "<img src=x onerror=alert(2)>"
# mechanism names are output file names, so the schema allows letters, digits, - and _ only
EVIL_MECHANISM = "micro-b_onmouseover-alert5"
EVIL_SPLU = "splu-title-script-alert6"
EVIL = f"""
name: "{EVIL_NAME}"
version: "1\\"><svg onload=alert(3)>"
description: "names carrying HTML & JS: <iframe src=javascript:alert(4)>"
dataset:
  path: evil.csv
  rows: 1000
  columns:
    "{EVIL_COLUMN}": {{type: string, values: [a, "<i>b</i>"]}}
    age: {{type: integer}}
    occupation: {{type: string, values: [x, y, z, w, v]}}
generalization:
  "{EVIL_COLUMN}": {{map: {{a: "<u>A</u>"}}, default: "<s>other</s>"}}
  age: {{bins: [0, 50, 120], labels: ["<50", "50+"]}}
mechanisms:
  - {{name: "{EVIL_MECHANISM}", type: sdgs, columns: ["{EVIL_COLUMN}", age], k: 10, beta: 0.2, epsilon: 1.0}}
  - {{name: kdgs-counts, type: histogram, columns: [age], k: 10}}
  - {{name: "{EVIL_SPLU}", type: splu_gen, gamma: 5, sensitive: [occupation], columns: [age]}}
targets:
  accounting: approximate
  max_epsilon: 2
  delta: 1.0e-6
  splu_privacy: {{epsilon: 0.3, t_p: 0.5, alpha: 3}}
"""


def context_of(text: str, tmp: Path, **changes: Any) -> ReportContext:
    context = example_context(load_policy_text(text, tmp))
    return replace(context, **changes) if changes else context


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("reports")


@pytest.fixture(scope="module")
def demo(folder: Path) -> tuple[ReportContext, str]:
    context = context_of(DEMO_TEXT, folder)
    return context, report_html(context)


@pytest.fixture(scope="module")
def mixed(folder: Path) -> tuple[ReportContext, str]:
    context = context_of(MIXED, folder)
    return context, report_html(context)


@pytest.fixture(scope="module")
def evil(folder: Path) -> tuple[ReportContext, str]:
    context = context_of(EVIL, folder, status="failed")
    return context, report_html(context)


# --- HTML helpers -----------------------------------------------------------------------------


class Page(HTMLParser):
    """Every start tag with its attributes, and every table as rows of cell texts (with the
    table's attributes and the ``id`` of the nearest enclosing element that has one)."""

    def __init__(self, html: str) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.tables: list[dict[str, Any]] = []
        self._ids: list[str | None] = []
        self._open: list[str] = []
        self._table: dict[str, Any] | None = None
        self._cell: list[str] | None = None
        self.feed(html)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if tag in ("meta", "br", "path", "line", "rect", "circle"):
            return
        self._open.append(tag)
        self._ids.append(attributes.get("id"))
        if tag == "table":
            owner = next((i for i in reversed(self._ids[:-1]) if i), None)
            self._table = {"attrs": attributes, "owner": owner, "rows": []}
            self.tables.append(self._table)
        elif tag == "tr" and self._table is not None:
            self._table["rows"].append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table is not None:
            self._table["rows"][-1].append("".join(self._cell).strip())
            self._cell = None
        if tag == "table":
            self._table = None
        while self._open:
            self._ids.pop()
            if self._open.pop() == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)

    def table(self, **attrs: str) -> list[list[str]]:
        found = [t for t in self.tables if all(t["attrs"].get(k) == v for k, v in attrs.items())]
        assert len(found) == 1, f"{len(found)} tables with {attrs}"
        return found[0]["rows"]

    def tables_in(self, owner: str) -> list[list[list[str]]]:
        return [t["rows"] for t in self.tables if t["owner"] == owner]


def public_part(html: str) -> str:
    return html.split('<section id="internal"', 1)[0]


def svgs(html: str) -> list[ET.Element]:
    return [ET.fromstring(match) for match in re.findall(r"<svg\b.*?</svg>", html, flags=re.S)]


def close(text: str, value: float, rel: float = 1e-5) -> bool:
    return math.isclose(float(text), value, rel_tol=rel, abs_tol=0.0)


def guarantees(page: Page, index: int) -> dict[str, tuple[str, str]]:
    """accountant -> (epsilon text, delta text) of mechanism card ``index`` (1-based)."""
    for rows in page.tables_in(f"mechanism-{index}"):
        if rows[0][:3] == ["accountant", "ε", "δ"]:
            return {row[0]: (row[1], row[2]) for row in rows[1:]}
    raise AssertionError(f"no guarantees table in mechanism {index}")


# --- structure --------------------------------------------------------------------------------


def test_two_sections_public_first_and_run_facts_only_internal(demo) -> None:
    context, html = demo
    assert html.startswith("<!DOCTYPE html>")
    assert "1. Public disclosure statement" in html
    assert "Internal review — not for publication" in html
    assert html.index('id="public"') < html.index('id="internal"')
    public = public_part(html)
    run_facts = [
        context.run_id,
        context.flow_run_id,
        context.code_version,
        context.dataset["sha256"],
        context.approval["approved_by"],
        context.approval["note"],
    ]
    for fact in run_facts:
        assert fact not in public, f"run fact {fact!r} leaked into the public statement"
        assert fact in html
    for step in context.timings:
        assert step in html.split('<section id="internal"', 1)[1]
    plan = context.plan
    for fact in (plan.loaded.policy.name, plan.loaded.sha256, "2026-01-13 12:00:00 UTC"):
        assert fact in public
    for output in context.outputs:
        assert output["sha256"] in public and output["path"] in public
    assert context.chain_head["hash"] in public


def test_public_only_has_no_run_facts(demo) -> None:
    context, _ = demo
    html = report_html(context, public_only=True)
    assert 'id="internal"' not in html and "not for publication" not in html.lower()
    for fact in (context.run_id, context.flow_run_id, context.dataset["sha256"]):
        assert fact not in html


def test_approval_before_data_read(demo) -> None:
    context, html = demo
    assert context.fixed_before_data_access is True
    assert "Generalization scheme fixed before data access." in html
    later = replace(context, data_read_at=context.approval["approved_at"] - timedelta(minutes=1))
    assert later.fixed_before_data_access is False
    assert "Not shown that the scheme was fixed before data access" in report_html(later)
    unknown = replace(context, approval=None, data_read_at=None)
    assert unknown.fixed_before_data_access is None
    assert "is not recorded for this run" in report_html(unknown)
    naive = replace(
        context,
        data_read_at=datetime(2030, 1, 1),
        approval={**context.approval, "approved_at": datetime(2029, 1, 1, tzinfo=UTC)},
    )
    assert naive.fixed_before_data_access is True


def test_failed_run_and_empty_facts_render(demo) -> None:
    context, _ = demo
    bare = replace(
        context,
        status="failed",
        flow_run_id=None,
        approval=None,
        data_read_at=None,
        dataset={},
        budget=None,
        ledger_before=None,
        ledger_after=None,
        outputs=[],
        timings={},
        internal_facts={},
        chain_head=None,
    )
    html = report_html(bare)
    assert 'id="status-note"' in html and "<strong>failed</strong>" in html
    for text in ("No files were published", "No audit chain head", "No ledger entry", "No timings"):
        assert text in html


# --- numbers equal the calculus ---------------------------------------------------------------


def test_mechanism_and_composed_guarantees_equal_the_calculus(mixed) -> None:
    context, html = mixed
    page = Page(html)
    micro = guarantees(page, 1)
    t1 = sdgs_math.delta_theorem1(20, 0.1, 1.0).delta
    exact = sdgs_math.delta_exact(20, 0.1, 1.0).delta
    assert close(micro["probabilistic"][1], t1) and close(micro["approximate"][1], exact)
    assert micro["probabilistic"][0] == "1"
    counts = guarantees(page, 2)
    assert close(counts["probabilistic"][1], sdgs_math.delta_theorem1(10, 0.25, 0.6).delta)
    assert close(counts["approximate"][1], sdgs_math.delta_exact(10, 0.25, 0.6).delta)
    laplace = next(leaf for leaf in leaves(context.plan.event) if isinstance(leaf, Laplace))
    mean = guarantees(page, 3)
    assert close(mean["probabilistic"][0], laplace.sensitivity / laplace.scale)
    assert mean["probabilistic"][1] == "0"
    assert guarantees(page, 4)["probabilistic"] == ("none", "none")  # SPLU-Gen: not DP
    # the whole release is not DP; its DP releases alone are, composed
    rows = Page(html).table(id="composed-table")
    whole, alone = rows[1], rows[3]
    assert whole[0].startswith("probabilistic") and whole[1:3] == ["none", "none"]
    assert alone[0].startswith("probabilistic") and "SPLU-Gen excluded" in alone[0]
    epsilon = 1.0 + 0.6 + laplace.sensitivity / laplace.scale
    delta = t1 + sdgs_math.delta_theorem1(10, 0.25, 0.6).delta
    assert close(alone[1], epsilon) and close(alone[2], delta)
    assert "The differentially private releases alone (SPLU-Gen excluded)" in html
    # T_p and T_f shown for the SPLU release
    privacy = splu_guarantees.privacy_threshold(5, 0.3, 3)
    assert f"{privacy.t_p:.6g}" in html
    assert f"{splu_guarantees.utility_threshold(5, 0.1, 0.05):.6g}" in html


def test_composed_guarantee_is_the_sum_of_parts(demo) -> None:
    context, html = demo
    rows = {row[0].split(" ")[0]: row for row in Page(html).table(id="composed-table")[1:]}
    sdgs = [leaf for leaf in leaves(context.plan.event) if isinstance(leaf, SDGS)]
    laplace = [leaf for leaf in leaves(context.plan.event) if isinstance(leaf, Laplace)]
    epsilon = math.fsum([s.epsilon for s in sdgs] + [x.sensitivity / x.scale for x in laplace])
    delta = math.fsum(sdgs_math.delta_theorem1(s.k, s.beta, s.epsilon).delta for s in sdgs)
    assert close(rows["probabilistic"][1], epsilon) and close(rows["probabilistic"][2], delta)
    assert close(rows["probabilistic"][3], math.exp(epsilon), rel=1e-2)
    assert f"(ε = {epsilon:.6g}, δ = {delta:.6g})-differentially private" in html


def test_sdgs_chart_values_equal_theorem1_and_exact(mixed) -> None:
    _, html = mixed
    page = Page(html)
    for chart, (k, beta, release) in (("chart-sdgs-1", (20, 0.1, 1.0)), ("chart-sdgs-2", (10, 0.25, 0.6))):
        rows = page.table(**{"data-chart": chart})
        assert rows[0] == ["ε", "δ Theorem 1", "δ exact", "release"]
        threshold = -math.log1p(-beta)  # its row prints it to 6 digits, as every epsilon
        eps = [threshold if close(row[0], threshold) else float(row[0]) for row in rows[1:]]
        theorem1 = sdgs_math.theorem1_grid(k, beta, eps)
        exact = sdgs_math.exact_grid(k, beta, eps)
        for row, t1, ex, e in zip(rows[1:], theorem1, exact, eps, strict=True):
            if e < threshold - 1e-6:
                assert row[1] == "n/a"
            elif t1.delta is not None:
                assert close(row[1], t1.delta)
            assert close(row[2], ex.delta)
            assert row[1] == "n/a" or float(row[2]) <= float(row[1]) * (1 + 1e-5)
        assert any(close(row[0], release) and row[3] for row in rows[1:])
    # the marked release points carry the exact values
    marks = [el for svg in svgs(html) for el in svg.iter("circle") if el.get("class") == "mark"]
    micro = {m.get("data-curve"): m for m in marks if m.get("data-release") == "micro"}
    assert float(micro["Theorem 1"].get("data-delta")) == sdgs_math.delta_theorem1(20, 0.1, 1.0).delta
    assert float(micro["exact"].get("data-delta")) == sdgs_math.delta_exact(20, 0.1, 1.0).delta


def test_fsmooth_chart_composes_the_sdgs_releases(mixed) -> None:
    _, html = mixed
    smooth = sdgs_math.FSmooth(((20, 0.1, 1.0), (10, 0.25, 0.6)))
    rows = Page(html).table(**{"data-chart": "chart-fsmooth"})
    assert rows[0] == ["x", "ε = x ε0", "δ0 f(x)", "f(x)"]
    for row in rows[1:]:
        x = float(row[0])
        assert close(row[1], 1.6 * x)
        expected = sdgs_math.fsmooth_delta(20, 0.1, x * 1.0) + sdgs_math.fsmooth_delta(10, 0.25, x * 0.6)
        assert close(row[2], expected) and close(row[2], smooth.delta_at(x))
        assert close(row[3], smooth.f(x))
    marks = [
        el
        for svg in svgs(html)
        if svg.get("id") == "chart-fsmooth"
        for el in svg.iter("circle")
        if el.get("class") == "mark"
    ]
    assert [float(m.get("data-delta")) for m in marks] == [smooth.delta0, smooth.delta_at(2.0)]


def test_splu_chart_equals_privacy_curve_and_scipy(mixed) -> None:
    _, html = mixed
    rows = Page(html).table(**{"data-chart": "chart-splu-1"})
    assert rows[0] == ["f", "probability", "f ≤ α"]
    counts, probability = splu_guarantees.privacy_curve(5, 0.3, 30)
    assert [int(row[0]) for row in rows[1:]] == counts.tolist()
    for row, p, f in zip(rows[1:], probability, counts, strict=True):
        assert close(row[1], float(p))
        n = 5 * f  # independent: the published count of a value seen f times is Bin(5f, 1/5)
        inside = binom.cdf(math.floor(1.3 * f + 1e-9), n, 0.2) - binom.cdf(math.ceil(0.7 * f - 1e-9) - 1, n, 0.2)
        assert math.isclose(float(p), 1 - inside, rel_tol=1e-9) and close(row[1], 1 - inside)
        assert (row[2] == "yes") == (f <= 3)
    tp = splu_guarantees.privacy_threshold(5, 0.3, 3)
    mark = next(el for svg in svgs(html) for el in svg.iter("circle") if el.get("data-t-p"))
    assert float(mark.get("data-t-p")) == tp.t_p and float(mark.get("data-f")) == tp.argmin_f


def test_kdgs_and_splu_are_said_not_to_be_dp(evil) -> None:
    _, html = evil
    public = public_part(html)
    assert public.count("Not differential privacy.") == 2  # the k-DGS and the SPLU-Gen card
    assert "k-DGS without sampling is not differential privacy" in public
    assert "SPLU-Gen is not differential privacy" in public
    assert "no (ε, δ)-differential-privacy guarantee" in public
    assert "Proposition 4" in public
    # no delta curve for beta = 1: only the sampled SDGS release has one (both have a frontier over beta)
    assert [svg.get("id") for svg in svgs(html)] == [
        "chart-sdgs-1",
        "chart-fsmooth",
        "chart-publication-1",
        "chart-splu-1",
        "chart-frontier-1-privacy",
        "chart-frontier-1-accuracy",
        "chart-frontier-2-privacy",
        "chart-frontier-2-accuracy",
    ]


# --- SVG and self-containment ------------------------------------------------------------------


@pytest.mark.parametrize("which", ["demo", "mixed", "evil"])
def test_svg_well_formed_titled_with_axes_and_legend(which: str, request: pytest.FixtureRequest) -> None:
    _, html = request.getfixturevalue(which)
    charts = svgs(html)
    assert charts
    for svg in charts:
        assert svg.get("role") == "img" and svg.get("aria-label")
        title = svg.find("title")
        assert title is not None and title.text and title.text == svg.get("aria-label")
        assert svg.find("desc") is not None and svg.find("desc").text
        assert svg.get("viewBox", "").startswith("0 0 ")
        groups = {g.get("class"): g for g in svg.iter("g")}
        for axis in ("axis x-axis", "axis y-axis"):
            texts = ["".join(t.itertext()) for t in groups[axis].iter("text")]
            assert len(texts) >= 4, f"{axis} needs ticks and a label"
        assert len(list(groups["legend"].iter("text"))) >= 1
        curves = [p for p in svg.iter("path") if p.get("class") == "series"]
        assert curves and all(re.fullmatch(r"M[\d. ML-]+", p.get("d")) for p in curves)
        for element in svg.iter():
            for name in element.attrib:
                assert not name.lower().startswith("on")
            assert "href" not in element.attrib


@pytest.mark.parametrize("which", ["demo", "mixed", "evil"])
def test_self_contained_no_scripts_no_external_resources(which: str, request: pytest.FixtureRequest) -> None:
    _, html = request.getfixturevalue(which)
    page = Page(html)
    tags = {tag for tag, _ in page.tags}
    assert not tags & {"script", "link", "iframe", "img", "object", "embed", "base", "form"}
    for tag, attrs in page.tags:
        for name, value in attrs.items():
            assert not name.startswith("on"), f"event handler {name} on <{tag}>"
            if name in ("href", "src", "xlink:href", "action"):
                assert value and value.startswith("#"), f"<{tag} {name}={value!r}>"
    assert "http://" not in html and "https://" not in html
    assert "url(" not in html and "@import" not in html
    assert "<style>" in html  # the CSS is inline


def test_policy_mechanism_and_column_names_are_escaped(evil) -> None:
    _, html = evil
    for raw in (EVIL_NAME, EVIL_COLUMN, "<iframe", "<svg onload", "<u>A</u>"):
        assert raw not in html, f"{raw!r} reached the HTML unescaped"
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<title>Disclosure report: &lt;script&gt;alert(1)&lt;/script&gt; version 1&#34;&gt;" in html
    assert "&lt;img src=x onerror=alert(2)&gt;" in html
    # parsed as HTML, the names are text: no tag but the report's own
    page = Page(html)
    assert not {tag for tag, _ in page.tags} & {"script", "img", "b", "iframe", "u", "s", "i"}
    # and inside the SVG (titles, legends, tooltips, data attributes) too
    texts = [t for svg in svgs(html) for el in svg.iter() for t in [el.text or "", *el.attrib.values()]]
    assert any(EVIL_MECHANISM in t for t in texts)


# --- writing ---------------------------------------------------------------------------------


def test_write_report_is_deterministic_and_returns_the_sha256(demo, tmp_path: Path) -> None:
    context, html = demo
    assert report_html(context) == html
    digest = write_report(context, tmp_path / "sub" / "report.html")
    data = (tmp_path / "sub" / "report.html").read_bytes()
    assert digest == hashlib.sha256(data).hexdigest() == sha256_text(html)
    assert data.decode("utf-8") == html
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["report.html"]  # no temp left


def test_template_ships_as_package_data() -> None:
    templates = resources.files("privrelease.reports") / "templates"
    assert (templates / "report.html.j2").is_file() and (templates / "report.css").is_file()


def test_tick_helpers() -> None:
    assert linear_ticks(0, 2) == [0, 0.5, 1, 1.5, 2]
    assert linear_ticks(0, 1) == [0, 0.2, 0.4, 0.6, 0.8, 1]
    assert decade_ticks(-19, 0) == [-15, -10, -5, 0]
    assert decade_ticks(-2, 0) == [-2, -1, 0]
    assert snap_decades(-19, -2) == (-20, 0) and snap_decades(-4, -2) == (-4, -2)
    assert nice_ceiling(2.0) == 2 and nice_ceiling(2.1) == 2.5 and nice_ceiling(0.27) == 0.3


# --- the report commands ---------------------------------------------------------------------

app = typer.Typer()
report_cli.register(app)
runner = CliRunner()


def run(*args: str, code: int = 0) -> Any:
    """``privrelease report ARGS``; the result (``.stdout`` holds stdout alone)."""
    result = runner.invoke(app, ["report", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    assert result.exit_code == code, result.output
    return result


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A fresh audit database and work dir for the commands, the cwd elsewhere."""
    from test_audit_chain import fresh_engine

    from privrelease.audit import database

    engine = fresh_engine(tmp_path)
    monkeypatch.setenv("PRIVRELEASE_DB_URL", engine.url.render_as_string(hide_password=False))
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "work"))
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    yield engine
    database.dispose_engines()


def store(engine: Any, html: str, path: Path | str | None, *, status: str = "succeeded") -> str:
    """A run of the demo policy with a stored report (written to ``path`` when given)."""
    from privrelease.audit import approvals, records
    from privrelease.audit.database import session
    from privrelease.policies import load_policy

    facts = approvals.policy_facts(load_policy(EXAMPLES_DIR / "demo.yaml"))
    with session(engine) as s:
        approvals.approve_policy(s, facts, "Ada")
        run_ = records.start_run(s, policy_sha256=facts.sha256, code_version="test")
        if status == "failed":
            records.finish_run(s, run_, "failed", error="boom")
        else:
            records.record_data_read(s, run_)
            records.finish_run(s, run_, status)
        if path is not None:
            write_html(html, path)
        records.store_report(s, run_, html, path=path)
    return run_.id


HTML = "<!DOCTYPE html><html><head><title>r</title></head><body>report é</body></html>"


def test_report_list(db: Any, tmp_path: Path) -> None:
    assert json.loads(run("list", "--json").stdout) == {"reports": []}
    assert "no stored reports" in run("list").stdout
    first = store(db, HTML, tmp_path / "out" / "report.html")
    second = store(db, HTML + " ", None)
    rows = json.loads(run("list", "--json").stdout)["reports"]
    assert [row["run_id"] for row in rows] == [first, second]
    assert rows[0]["policy"] == "demo-census" and rows[0]["version"] == "1"
    assert rows[0]["status"] == "succeeded" and rows[0]["created_at"]
    assert rows[0]["sha256"] == sha256_text(HTML)
    table = run("list").stdout
    assert first[:12] in table and second[:12] in table and "demo-census" in table


def test_report_show_prints_the_intact_file(db: Any, tmp_path: Path) -> None:
    path = tmp_path / "out" / "report.html"
    run_id = store(db, HTML, path)
    assert run("show", run_id).stdout.strip() == str(path)
    shown = json.loads(run("show", run_id[:8], "--json").stdout)
    assert shown["path"] == str(path) and shown["source"] == "file" and shown["note"] is None


def test_report_show_restores_a_missing_or_changed_file(db: Any, tmp_path: Path) -> None:
    path = tmp_path / "out" / "report.html"
    run_id = store(db, HTML, path)
    restored = tmp_path / "work" / "reports" / f"{run_id}.html"
    path.unlink()
    result = run("show", run_id)
    assert result.stdout.strip() == str(restored)
    assert restored.read_text(encoding="utf-8") == HTML
    shown = json.loads(run("show", run_id, "--json").stdout)
    assert shown["source"] == "audit-db" and "missing" in shown["note"]
    path.write_text(HTML.replace("report", "edited"), encoding="utf-8")
    shown = json.loads(run("show", run_id, "--json").stdout)
    assert shown["path"] == str(restored) and "changed" in shown["note"]
    no_path = store(db, HTML + "\n", None)
    shown = json.loads(run("show", no_path, "--json").stdout)
    assert Path(shown["path"]).read_bytes() == (HTML + "\n").encode("utf-8")


def test_report_show_relative_path_against_the_work_dir(db: Any, tmp_path: Path) -> None:
    (tmp_path / "work" / "runs").mkdir(parents=True)
    write_html(HTML, tmp_path / "work" / "runs" / "r.html")
    run_id = store(db, HTML, None)
    from sqlmodel import select

    from privrelease.audit.database import session
    from privrelease.audit.models import Report

    with session(db) as s:  # a relative recorded path (bypassing the chain on purpose)
        report = s.exec(select(Report).where(Report.run_id == run_id)).one()
        report.path = "runs/r.html"
    shown = json.loads(run("show", run_id, "--json").stdout)
    assert shown["path"] == str(tmp_path / "work" / "runs" / "r.html") and shown["source"] == "file"


def test_report_show_errors(db: Any) -> None:
    from sqlmodel import select

    from privrelease.audit.database import session
    from privrelease.audit.models import Report
    from privrelease.errors import UserError

    with pytest.raises(UserError, match="no run with id"):
        run("show", "ffff")
    failed = store(db, HTML, None, status="failed")
    with session(db) as s:
        s.delete(s.exec(select(Report).where(Report.run_id == failed)).one())
    with pytest.raises(UserError, match="has no stored report"):
        run("show", failed)
    tampered = store(db, HTML, None)
    with session(db) as s:
        s.exec(select(Report).where(Report.run_id == tampered)).one().html = "<p>forged</p>"
    with pytest.raises(UserError, match="does not match its recorded sha256"):
        run("show", tampered)


def test_report_open_uses_the_default_browser(db: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    opened: list[str] = []
    monkeypatch.setattr(report_cli.webbrowser, "open", lambda url: opened.append(url) or True)
    path = tmp_path / "out" / "report.html"
    run_id = store(db, HTML, path)
    assert "opened" in run("open", run_id).stdout
    document = json.loads(run("open", run_id, "--json").stdout)
    assert document["opened"] is True and opened == [path.as_uri()] * 2
    monkeypatch.setattr(report_cli.webbrowser, "open", lambda url: False)
    assert "no web browser could be started" in run("open", run_id).stdout


def test_report_commands_never_import_prefect_and_are_quick(db: Any, tmp_path: Path) -> None:
    """CPU time of the whole CLI, within 3x of merely importing it (measured now)."""
    path = tmp_path / "out" / "report.html"
    run_id = store(db, HTML, path)
    path.unlink()  # show writes it out again
    script = (
        "import sys\n"
        "from privrelease.cli import app\n"
        f"for args in (['report', 'list', '--json'], ['report', 'show', '{run_id}', '--json']):\n"
        "    app(args, standalone_mode=False)\n"
        "assert 'prefect' not in sys.modules, 'prefect was imported'\n"
        "assert 'jinja2' not in sys.modules, 'the renderer was imported'\n"
    )
    done, cpu, baseline = child_cpu_seconds(script)
    assert done.returncode == 0, done.stderr
    assert cpu < 3 * baseline, f"report list + show took {cpu:.2f} s of CPU; importing the CLI {baseline:.2f} s"
    assert (tmp_path / "work" / "reports" / f"{run_id}.html").read_text(encoding="utf-8") == HTML


def test_the_report_reads_as_prose_and_says_how_its_accountant_composes(demo) -> None:
    """No raw Python structure in the report (the composition's methods in words, labels in
    words), and "what these guarantees mean" matches the accountant: probabilistic adds up
    (Theorem 2); approximate names its tightest method and never claims the epsilons add up."""
    examples = Path(EXAMPLES_DIR)
    combined = report_html(example_context(load_policy_text((examples / "adult-combined.yaml").read_text(), examples)))
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", combined))
    assert "under the approximate accountant they are composed by the tightest sound method" in text
    assert "add up" not in text
    assert (
        "privacy loss distribution of 3 releases (SDGS microdata, SDGS histogram, Laplace noise), the tightest; compared:"
        in text
    )
    for raw in ("candidates =", "approximate_delta_at_max_epsilon", "{'", "': "):
        assert raw not in text, raw
    _, probabilistic = demo
    assert "their ε and δ add up (sequential composition, Li, Qardaji, Su, Theorem 2)" in re.sub(
        r"\s+", " ", re.sub(r"<[^>]+>", " ", probabilistic)
    )


def test_report_and_statement_share_one_view(demo, monkeypatch) -> None:
    """The report and the public statement of a release come from one view of its context
    (charts and figures computed once), and are the pages report_html renders."""
    from privrelease.reports import render

    context, _ = demo
    calls = []
    original = render.view
    monkeypatch.setattr(render, "view", lambda c: calls.append(1) or original(c))
    report, statement = render.report_pages(context)
    assert len(calls) == 1
    assert (report, statement) == (render.report_html(context), render.report_html(context, public_only=True))


def test_each_sdgs_and_histogram_output_says_how_to_read_its_count_intervals(mixed) -> None:
    """One sentence per SDGS / histogram mechanism, in the public statement: the histogram's
    interval columns, the microdata's command (with its k and beta), both conditional on
    publication and free of privacy cost; none for the other kinds."""
    _, html = mixed
    public = re.sub(r"\s+", " ", public_part(html))
    sentences = re.findall(r'<p class="scope published-counts">(.*?)</p>', public)
    assert len(sentences) == 2
    histogram, microdata = sorted(sentences)
    assert "columns estimate (c/β" in histogram and "lower and upper" in histogram
    assert "--k 20 --beta 0.1 --observed c --confidence 0.95" in microdata
    assert "the companion file (this output&#39;s name with .cells) lists each published cell" in microdata
    for sentence in sentences:
        assert "exact 95% confidence interval" in sentence and "given that it was published" in sentence
        assert "no privacy cost" in sentence


def test_previews_publish_as_many_rows_as_each_kind_would(adult_dir: Path) -> None:
    """A preview's made-up outputs come from the kinds (``example_run``): noisy counts publish
    every cell of the declared domain, a histogram fewer rows than it kept, microdata the rows
    kept after sampling."""
    from privrelease.policies import load_policy
    from privrelease.reports.context import EXAMPLES_DIR, example_context

    for example in ("adult-noisy.yaml", "adult-histogram.yaml", "adult-sdgs.yaml", "adult-tables.yaml"):
        loaded = load_policy(EXAMPLES_DIR / example)
        context = example_context(loaded)
        for spec in loaded.policy.mechanisms:
            if spec.type == "noisy_tables":  # one file per table
                files = [(o["path"], o["rows"]) for o in context.outputs if o["mechanism"] == spec.name]
                names = ("age-sex-race", "age", "sex", "race", "total")
                assert files == [(f"tables-{n}.csv", c) for n, c in zip(names, (100, 10, 2, 5, 1), strict=True)]
                assert "tables publishes 5 tables, one file each: age-sex-race (" in report_html(context)
                continue
            (output,) = [o for o in context.outputs if o["mechanism"] == spec.name]
            facts = context.internal_facts[spec.name]
            if spec.type == "noisy_counts":
                assert output["rows"] == math.prod(len(v) for v in loaded.labels(spec.columns).values())
            elif spec.type == "histogram":
                assert 1 <= output["rows"] < facts["rows_sampled"] - facts["rows_suppressed"]
            elif spec.type == "sdgs":
                assert output["rows"] == facts["rows_sampled"] - facts["rows_suppressed"]


def test_noisy_counts_accuracy_says_each_cell_and_all_cells_at_once() -> None:
    """adult-noisy (sigma 4.231, 20 cells): the public statement's table gives each cell's
    half-width and the wider one of all 20 cells at once, from the kind's functions, and says
    the output's lower/upper columns hold each cell's true count cell by cell, not all at once."""
    from privrelease.mechanisms.kinds.noisy_counts import all_cells_half_width, half_width
    from privrelease.policies import load_policy

    html = report_html(example_context(load_policy(EXAMPLES_DIR / "adult-noisy.yaml")))
    public = re.sub(r"\s+", " ", public_part(html))
    assert 'each cell\'s noise within ±</th><th class="num">all 20 cells at once within ±' in public
    for confidence in (0.9, 0.95, 0.99):
        each, together = (
            half_width("gaussian", 4.231, confidence),
            all_cells_half_width("gaussian", 4.231, confidence, 20),
        )
        row = f'<tr><td>{confidence:.0%}</td><td class="num">{each}</td><td class="num">{together}</td></tr>'
        assert row in public
    (sentence,) = re.findall(r'<p class="scope all-cells">(.*?)</p>', public)
    assert "columns lower and upper" in sentence and "cell by cell, not all at once" in sentence


def test_splu_large_sum_utility_says_what_it_covers(mixed) -> None:
    """The public statement gives large-sum utility for a lone sensitive value's count only
    (splu_scope.UTILITY_SCOPE) and says reconstructed conjunctions have none (NO_UTILITY),
    under the SPLU output's accuracy and in "What these guarantees mean"."""
    _, html = mixed
    public = re.sub(r"\s+", " ", public_part(html))
    t_f = splu_guarantees.utility_threshold(5, 0.1, 0.05)
    assert (
        f'<p class="scope large-sum">Large-sum utility: {splu_scope.UTILITY_SCOPE}, if at least T_f = {t_f}, '
        f"is estimated within relative error 0.1 except with probability at most 0.05. "
        f"{splu_scope.NO_UTILITY}</p>"
    ) in public
    assert public.count(splu_scope.UTILITY_SCOPE) == public.count(splu_scope.NO_UTILITY) == 2
    assert "every count of at least" not in html and "counts of at least T_f" not in html


def test_a_mean_says_it_divides_by_the_declared_rows(mixed) -> None:
    """The public statement's accuracy of a mean and its chart caption name what is published:
    the clamped sum over the declared dataset.rows, the mean only for a file of that size."""
    _, html = mixed
    public = re.sub(r"\s+", " ", public_part(html))
    quantity = (
        "clamped sum of hours divided by the declared dataset.rows = 20000 "
        "(the mean only if the data has exactly 20000 rows)"
    )
    assert f"estimate = the published value of the {quantity}." in public
    assert f"the published value is within ± the half-width of the true {quantity} with probability 95%" in public
    assert "the half-width of the true one" not in html
