"""Accessibility: axe-core, the standard accessibility engine, finds nothing on the three pages
privrelease writes, in headless Chromium (conftest's ``browser`` fixture; skipped only when
Chromium is absent).

axe-core comes from the pinned ``axe-playwright-python`` package of the ``test`` extra (its wheel
bundles ``axe.min.js``, axe-core 4.12.1, MPL-2.0; the Python wrapper is MIT), installed by
``make setup`` and ``.ci/run``: a missing package is an error, never a skip. Every rule axe runs
by default (WCAG 2.0-2.2 A/AA and best practices: contrast, landmarks, headings, tables, names)
is checked, and a violation of any impact fails the test with its id, impact, help and nodes.

The pages: the disclosure report and the public disclosure statement of the demo, of Adult
examples (``example_context``) and of a mixed SDGS + DP + SPLU-Gen release (``test_reports.MIXED``)
and a failed one with hostile names; the compliance index of ``test_report_index``'s audit
database (five runs, three policy versions, a failed run, HTML in names) and of an empty one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from axe_playwright_python.sync_playwright import Axe

from privrelease.policies import load_policy, load_policy_text
from privrelease.reports.context import EXAMPLES_DIR, example_context
from privrelease.reports.html import write_html
from privrelease.reports.render import report_pages

AXE_VERSION = "4.12.1"


def axe_violations(page: Any) -> list[dict[str, Any]]:
    """axe-core's violations on the page, every rule it runs by default (all impact levels)."""
    response = Axe().run(page, options={"resultTypes": ["violations"]}).response
    assert response["testEngine"]["version"] == AXE_VERSION, response["testEngine"]
    return list(response["violations"])


def describe(violations: list[dict[str, Any]]) -> str:
    """Each violation's id, impact and help, and its nodes' targets and HTML."""
    lines = [f"{len(violations)} axe-core violation(s):"]
    for v in violations:
        lines.append(f"- {v['id']} ({v['impact']}): {v['help']} [{v['helpUrl']}]")
        for node in v["nodes"]:
            lines.append(f"    {' '.join(map(str, node['target']))}: {node['html'][:160]}")
            lines.extend(f"      {node['failureSummary']}".splitlines())
    return "\n".join(lines)


def page_violations(browser: Any, path: Path) -> list[dict[str, Any]]:
    """axe-core's violations on the file opened in a fresh page (its own context), every
    ``<details>`` open (axe checks only what is rendered: the charts' values tables too)."""
    page = browser.new_context(viewport={"width": 1100, "height": 900}).new_page()
    try:
        page.goto(path.as_uri(), wait_until="load")
        page.evaluate("document.querySelectorAll('details').forEach(d => { d.open = true; })")
        return axe_violations(page)
    finally:
        page.context.close()


def _mixed() -> Any:
    from test_reports import MIXED

    return load_policy_text(MIXED, EXAMPLES_DIR)


def _evil() -> Any:
    from test_reports import EVIL

    return load_policy_text(EVIL, EXAMPLES_DIR)


RELEASES = {
    "demo": lambda: example_context(),
    "adult-combined": lambda: example_context(load_policy(EXAMPLES_DIR / "adult-combined.yaml")),
    "adult-splu": lambda: example_context(load_policy(EXAMPLES_DIR / "adult-splu.yaml")),
    "mixed": lambda: example_context(_mixed()),
    "hostile-failed": lambda: example_context(_evil(), status="failed"),
}


@pytest.mark.parametrize("release", list(RELEASES))
def test_report_and_statement_have_no_axe_violations(
    browser: Any, tmp_path: Path, release: str, request: pytest.FixtureRequest
) -> None:
    if release.startswith("adult"):  # the Adult examples read ARX's hierarchies from ../shared/data
        request.getfixturevalue("adult_dir")
    report, statement = report_pages(RELEASES[release]())
    found = {}
    for name, html in (("report.html", report), ("statement.html", statement)):
        write_html(html, tmp_path / name)
        found[name] = page_violations(browser, tmp_path / name)
    assert found == {"report.html": [], "statement.html": []}, "\n".join(
        f"{name}: {describe(violations)}" for name, violations in found.items() if violations
    )


@pytest.mark.parametrize("runs", [5, 0])
def test_index_has_no_axe_violations(browser: Any, tmp_path: Path, runs: int) -> None:
    """``test_report_index``'s five runs (failed and hostile ones too, with their reports
    beside the index), and the index of an empty audit database."""
    from test_audit_chain import audit_database
    from test_report_index import built_in

    from privrelease.reports.index import write_index

    with pytest.MonkeyPatch.context() as patch, audit_database("sqlite", tmp_path) as engine:
        if runs:
            built = built_in(tmp_path, engine, patch)
            result = built.result
            index = Path(result["path"])
        else:
            written = write_index(tmp_path / "empty", engine)
            result, index = {"runs": written.runs}, written.path
        assert result["runs"] == runs
        violations = page_violations(browser, index)
        assert violations == [], describe(violations)
