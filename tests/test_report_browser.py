"""The disclosure report in a real browser: headless Chromium (``chromium`` on PATH: Debian's
``/usr/bin/chromium``; conftest's ``browser`` fixture) driven by Playwright opens the rendered
file offline, the charts are visible, nothing is logged to the console, nothing is fetched but
the file itself, no script runs, and it prints to PDF. A full-page screenshot is saved under
pytest's ``tmp_path``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest


def test_chromium_is_looked_up_when_a_test_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Installed after the session started (here: put on PATH now), it is found."""
    import conftest
    from conftest import find_chromium

    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(conftest, "CHROMIUM_PATHS", (str(tmp_path / "absent" / "chromium"),))
    with pytest.raises(pytest.skip.Exception):
        find_chromium()
    (tmp_path / "chromium").write_text("#!/bin/sh\n")
    (tmp_path / "chromium").chmod(0o755)
    assert find_chromium() == str(tmp_path / "chromium")


def test_chromium_is_found_at_the_package_path_off_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian's ``/usr/bin/chromium`` (here: a stand-in) is found when ``PATH`` does not name its folder."""
    import conftest
    from conftest import find_chromium

    assert conftest.CHROMIUM_PATHS[0] == "/usr/bin/chromium"
    installed = tmp_path / "usr-bin" / "chromium"
    installed.parent.mkdir()
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(conftest, "CHROMIUM_PATHS", (str(tmp_path / "absent" / "chromium"), str(installed)))
    with pytest.raises(pytest.skip.Exception):
        find_chromium()
    installed.write_text("#!/bin/sh\n")
    installed.chmod(0o755)
    assert find_chromium() == str(installed)


def render(policy_text: str, folder: Path, **changes: Any) -> Path:
    from dataclasses import replace

    from privrelease.policies import load_policy_text
    from privrelease.reports import example_context, write_report

    context = example_context(load_policy_text(policy_text, folder))
    path = folder / "report.html"
    write_report(replace(context, **changes), path)
    return path


def open_report(browser: Any, path: Path) -> tuple[Any, dict[str, list[str]]]:
    """A fresh page (its own context) on the file, recording console messages, page errors,
    dialogs (an alert would mean injected script ran) and every request."""
    page = browser.new_context(viewport={"width": 1100, "height": 900}).new_page()
    seen: dict[str, list[str]] = {"console": [], "errors": [], "dialogs": [], "requests": []}
    page.on("console", lambda m: seen["console"].append(f"{m.type}: {m.text}"))
    page.on("pageerror", lambda e: seen["errors"].append(str(e)))
    page.on("dialog", lambda d: (seen["dialogs"].append(d.message), d.dismiss()))
    page.on("request", lambda r: seen["requests"].append(r.url))
    page.goto(path.as_uri(), wait_until="load")
    return page, seen


def test_report_renders_with_visible_charts(browser: Any, tmp_path: Path) -> None:
    from test_reports import MIXED

    path = render(MIXED, tmp_path)
    page, seen = open_report(browser, path)
    try:
        assert page.title() == "Disclosure report: mixed version 2"
        assert page.locator("h2#public-title").is_visible()
        assert page.locator("h2#internal-title").is_visible()
        charts = page.locator("svg.chart")
        # two (k, beta) delta charts, f-smooth, two publication curves, SPLU, and a privacy-accuracy
        # frontier (two panels) for each of the three mechanisms with a parameter
        assert charts.count() == 6 + 3 * 2
        for i in range(charts.count()):
            chart = charts.nth(i)
            chart.scroll_into_view_if_needed()
            assert chart.is_visible()
            box = chart.bounding_box()
            assert box is not None and box["width"] > 300 and box["height"] > 200, box
            curve = chart.locator("path.series").first.bounding_box()
            assert curve is not None and curve["width"] > 50, "a curve is drawn inside the chart"
            assert chart.get_attribute("aria-label")
        assert page.locator("table.accuracy-cells").first.is_visible()  # each SDGS card's accuracy
        # the values tables open on demand
        page.locator("#chart-splu-1-figure summary").click()
        assert page.locator('table[data-chart="chart-splu-1"]').is_visible()
        screenshot = Path(os.environ.get("PRIVRELEASE_TEST_SCREENSHOT", tmp_path / "report.png"))
        page.screenshot(path=str(screenshot), full_page=True)
        assert screenshot.stat().st_size > 50_000
        pdf = page.pdf(path=str(tmp_path / "report.pdf"))
        assert pdf.startswith(b"%PDF")
        assert seen["console"] == [] and seen["errors"] == [] and seen["dialogs"] == []
        assert seen["requests"] == [path.as_uri()], "the report fetches nothing but itself"
    finally:
        page.context.close()


def test_hostile_names_stay_text_in_the_browser(browser: Any, tmp_path: Path) -> None:
    from test_reports import EVIL, EVIL_MECHANISM, EVIL_NAME

    path = render(EVIL, tmp_path, status="failed")
    page, seen = open_report(browser, path)
    try:
        assert page.locator("h1").inner_text().startswith(EVIL_NAME)
        assert page.locator("script, iframe, img").count() == 0
        assert page.get_by_text(EVIL_MECHANISM, exact=False).first.is_visible()
        assert page.locator("svg.chart").count() == 4 + 2 * 2  # and two frontiers of two panels
        page.screenshot(path=str(tmp_path / "hostile.png"), full_page=True)
        assert seen["dialogs"] == [], "injected script ran"
        assert seen["console"] == [] and seen["errors"] == []
        assert seen["requests"] == [path.as_uri()]
    finally:
        page.context.close()
