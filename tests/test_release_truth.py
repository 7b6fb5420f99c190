"""No wrong words (issue 25, items 1, 2, 3 and 6): a release that publishes nothing, or one made
without a counting approval, says so on the first screen of its public statement and in
``release.json``; ``plan`` and ``policy init`` warn, before any data is read, when the cells
cannot reach k; the statement lists what each output publishes; a check failed by a rounding
margin prints the digits that decide it.

The discharge file is the issue's case: 20,000 rows of age 0-102, sex, zip3, diagnosis and
length of stay, drafted by ``policy init`` (every column kept raw), SDGS k 20, beta 0.1. Its
raw cells are nearly all distinct: with 103 x 2 x 900 x 300 x 59 possible cells, the chance
that any sampled cell holds k = 20 rows is below 1e-30, so the release publishes no row."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from privrelease import demo
from privrelease.audit import approvals, signing
from privrelease.audit.database import dispose_engines, open_database, session
from privrelease.flows import steps
from privrelease.flows.steps import release_plain
from privrelease.planning import plan_policy
from privrelease.policies import load_policy, load_policy_text
from privrelease.reports import example_context
from privrelease.reports.render import report_html

REPO = Path(__file__).resolve().parents[1]
ROWS = 20_000


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "privrelease", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def write_discharges(folder: Path) -> Path:
    """The issue's plain discharge file (made-up values; the release's content is not tested)."""
    rng = np.random.default_rng()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "discharges.csv"
    columns = (
        rng.integers(0, 103, ROWS).astype(str),
        rng.choice(["F", "M"], ROWS),
        rng.integers(100, 1000, ROWS).astype(str),
        np.char.add("D", rng.integers(0, 300, ROWS).astype(str)),
        rng.integers(1, 60, ROWS).astype(str),
    )
    lines = [",".join(row) for row in zip(*columns, strict=True)]
    path.write_text("age,sex,zip3,diagnosis,length_of_stay\n" + "\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def discharge_draft(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    folder = tmp_path_factory.mktemp("discharges")
    write_discharges(folder)
    made = cli("policy", "init", "discharges.csv", "--id", "discharges", "--out", "draft.yaml", cwd=folder)
    assert made.returncode == 0, made.stderr
    return folder / "draft.yaml", made


# --------------------------------------------------------------------------- 1. before the data


def test_policy_init_and_plan_warn_that_the_discharge_draft_keeps_every_column_raw(discharge_draft) -> None:
    """The draft of the issue's file: `policy init` says what to decide before a run, and
    `plan` warns before any data is read (its targets are met: a warning, not a failed plan)."""
    draft, made = discharge_draft
    assert "before a run, decide" in made.stderr
    assert "age, sex, zip3, diagnosis, length_of_stay kept raw with no declared domain" in made.stderr
    assert "coarsen" in draft.read_text(encoding="utf-8")
    planned = cli("plan", str(draft), "--json", cwd=draft.parent)
    assert planned.returncode == 0, planned.stderr
    (warning,) = json.loads(planned.stdout)["warnings"]
    assert warning.startswith("microdata: age, sex, zip3, diagnosis, length_of_stay kept raw")
    assert "k = 20" in warning and "may publish nothing" in warning
    shown = cli("plan", str(draft), cwd=draft.parent)
    assert "warning: microdata: age, sex, zip3" in " ".join(shown.stdout.split())
    assert "all targets met (but see the 1 warning(s) above)" in shown.stdout


@pytest.mark.parametrize("json_output", [False, True])
def test_run_warns_like_plan_before_reading_the_data(
    discharge_draft, json_output: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """`privrelease run` prints the plan's warnings on stderr (one line each) before the flow
    that reads the data starts (it printed them only after the charge, in the summary); with
    ``--json`` they are also in the document (``plan_warnings``) and stdout is that document only."""
    from privrelease.cli import main
    from privrelease.cli import run as run_cli

    draft, _ = discharge_draft
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.delenv("PRIVRELEASE_DB_URL", raising=False)
    monkeypatch.delenv("PRIVRELEASE_PRODUCTION", raising=False)
    seen_before_the_flow: list[str] = []

    def flow_reading_the_data(**_: Any) -> tuple[dict[str, Any], dict[str, float]]:
        seen_before_the_flow.append(capsys.readouterr().err)
        summary = {"release_dir": str(tmp_path), "outputs": [], "report": "r", "statement": "s", "run_id": "x"}
        return {**summary, "chain_head": {"seq": 1, "hash": "h"}}, {"flow": 1.0}

    monkeypatch.setattr(run_cli.prefect_server, "connect", lambda reuse: None)
    monkeypatch.setattr(run_cli, "run_flow", flow_reading_the_data)
    monkeypatch.setattr(sys, "argv", ["privrelease", "run", str(draft), *(["--json"] if json_output else [])])
    with pytest.raises(SystemExit) as stop:
        main()
    out, _ = capsys.readouterr()
    assert stop.value.code in (0, None)
    (before,) = seen_before_the_flow
    (line,) = [line for line in before.splitlines() if line.startswith("warning:")]
    assert (
        line.startswith("warning: microdata: age, sex, zip3, diagnosis, length_of_stay kept raw") and "k = 20" in line
    )
    if json_output:
        (warning,) = json.loads(out)["plan_warnings"]
        assert line == f"warning: {warning}"
    else:
        assert "kept raw" not in out


DECLARED = """
name: discharges-declared
version: "1"
dataset:
  id: discharges
  path: discharges.csv
  format: csv
  rows: 20000
  columns:
    age: {{type: integer}}
    sex: {{type: string, values: [F, M]}}
generalization:
  age: {{bins: {bins}}}
  sex: keep
mechanisms:
  - {{name: microdata, type: sdgs, columns: [age, sex], beta: 0.1, k: 20, epsilon: 1.0}}
targets: {{accounting: approximate, max_epsilon: 1.0, delta: 1.0e-9}}
"""


def test_plan_compares_the_expected_sample_with_the_declared_cells(tmp_path: Path) -> None:
    """Ages in 103 one-year bins by 2 sexes: 206 cells for 20,000 x 0.1 = 2,000 sampled rows,
    2000 / 206 = 9.71 a cell, under k = 20, and at most 2000 / 20 = 100 cells reach k. In
    ten-year bins (11 x 2 = 22 cells, 90.9 a cell) nothing is warned."""
    fine = load_policy_text(DECLARED.format(bins=list(range(0, 104))), tmp_path)
    (warning,) = plan_policy(fine).warnings
    cells = 103 * 2
    assert f"{cells:,} generalized cells (103 (age) x 2 (sex))" in warning
    assert "2,000 sampled rows" in warning and f"{ROWS * 0.1 / cells:.3g} a cell on average" in warning
    assert f"at most about {math.floor(ROWS * 0.1 / 20)} of the {cells} cells can reach k" in warning
    coarse = load_policy_text(DECLARED.format(bins=[*range(0, 110, 10)]), tmp_path)
    assert plan_policy(coarse).warnings == ()
    # a sample smaller than k: no cell can reach it, however the people crowd
    (warning,) = plan_policy(
        load_policy_text(DECLARED.format(bins=[0, 200]).replace("k: 20", "k: 5000"), tmp_path)
    ).warnings
    assert warning.endswith(
        "below k = 5000, the whole expected sample is below k = 5000: the release will almost surely publish nothing: "
        "coarsen the scheme, or see `privrelease calibrate sdgs` (a larger beta or a smaller k)"
    )
    # with a person column dataset.rows counts people, and the sample is of people (one row each)
    person = DECLARED.replace("  rows: 20000\n", "  rows: 20000\n  person: {{column: id, max_rows: 3}}\n").replace(
        "    age: {{type: integer}}\n", "    age: {{type: integer}}\n    id: {{type: integer}}\n"
    )
    (warning,) = plan_policy(load_policy_text(person.format(bins=list(range(0, 104))), tmp_path)).warnings
    assert "20,000 people x beta 0.1 = 2,000 sampled people expected" in warning and "most people will be" in warning


# --------------------------------------------------------------------------- 1. and 2. after the run


@pytest.fixture(scope="module")
def releases(discharge_draft, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Three releases, their records signed: the discharge draft (development mode: a draft, and
    empty), the demo in development mode (a draft) and the demo approved, in production mode."""
    base = tmp_path_factory.mktemp("releases")
    public = signing.generate(base / "agency.key")
    assert public
    policy, _ = demo.write_demo(base / "demo", seed=5)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PRIVRELEASE_WORK_DIR", str(base / "work"))
        patch.setenv("PRIVRELEASE_SIGNING_KEY", str(base / "agency.key"))  # every record is signed
        for name in ("PRIVRELEASE_DB_URL", "PRIVRELEASE_PRODUCTION"):
            patch.delenv(name, raising=False)
        empty = release_plain(policy_path=str(discharge_draft[0]))
        draft = release_plain(policy_path=str(policy))
        loaded = load_policy(policy)
        with session(open_database()) as s:
            facts = approvals.policy_facts(loaded)
            approvals.approve_policy(s, facts, "Reviewer", binding=steps.approval_binding(loaded, "data"))
        approved = release_plain(policy_path=str(policy), production=True)
    dispose_engines()
    return {name: Path(r.release_dir) for name, r in (("empty", empty), ("draft", draft), ("approved", approved))}


def statement(folder: Path) -> str:
    return (folder / steps.STATEMENT_FILE).read_text(encoding="utf-8")


def test_a_release_of_nothing_says_so_in_public_and_in_release_json(releases) -> None:
    """The issue's case: no green badge, no "safe to publish", the plan's warning, and
    ``release.json`` says no row was published (and that it is a draft)."""
    described = json.loads((releases["empty"] / "release.json").read_text(encoding="utf-8"))
    assert [output["rows"] for output in described["outputs"]] == [0]
    assert described["release"]["published_rows"] == 0 and described["release"]["published_nothing"]
    assert described["release"]["draft"] and not described["release"]["approved"]
    assert [short["mechanism"] for short in described["release"]["short_of_plan"]] == ["microdata"]
    assert "kept raw with no declared domain" in described["release"]["plan_warnings"][0]
    html = statement(releases["empty"])
    assert "PUBLISHED NO ROWS" in html and "published no rows</span>" in html
    assert "all targets met" not in html and "safe to publish" not in html
    assert 'id="plan-warnings"' in html


def test_a_reissue_of_a_release_of_nothing_says_so(
    releases, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """``privrelease reissue`` of the empty release warns that it published no rows, as run, the
    report and the index do (audit 8: it ended on "checksums verified" with only a 0 in a column);
    ``--json`` says ``published_nothing``; a release with rows gets no such line. On a copy of the
    work folder: a reissue is a run of its own, which the other tests' audit database lacks."""
    import shutil

    from privrelease.cli import main

    work = shutil.copytree(releases["empty"].parent.parent, tmp_path / "work")
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(work))
    monkeypatch.delenv("PRIVRELEASE_DB_URL", raising=False)
    try:
        for name, empty in (("empty", True), ("draft", False)):
            run = releases[name].name.rsplit("-", 1)[1]  # the run id's prefix ends the folder's name
            for flags in ([], ["--json"]):
                monkeypatch.setattr(sys, "argv", ["privrelease", "reissue", run, *flags])
                with pytest.raises(SystemExit) as stop:
                    main()
                assert stop.value.code in (0, None)
                out = capsys.readouterr().out
                if flags:
                    assert json.loads(out)["published_nothing"] is empty
                else:
                    said = f"warning: run {run}" in out and "published no rows: every file handed back is empty" in out
                    assert said is empty, out
    finally:
        dispose_engines()


def test_the_release_index_says_a_release_published_nothing_where_its_verdict_is(
    releases, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compliance index carries what each release is, in the verdict cell: the empty
    release reads "published no rows" (red), never a green "targets met"; the others their rows."""
    from test_report_index import IndexPage, text

    from privrelease.reports.index import write_index

    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(releases["empty"].parent.parent))
    monkeypatch.delenv("PRIVRELEASE_DB_URL", raising=False)
    try:
        written = write_index(tmp_path / "index", open_database())
    finally:
        dispose_engines()
    html = written.path.read_text(encoding="utf-8")
    verdicts = {}
    for row in IndexPage(html).rows:
        verdicts.setdefault(text(row["cells"]["policy"]).split()[0], []).append(text(row["cells"]["verdict"]))
    empty = json.loads((releases["empty"] / "release.json").read_text(encoding="utf-8"))
    (verdict,) = verdicts[empty["policy"]["name"]]
    assert verdict.startswith("published no rows") and "targets met" not in verdict
    assert "microdata published 0 rows." in verdict  # the draft declares no rows: nothing to expect
    assert '<span class="badge fail">published no rows</span>' in html
    for name in ("draft", "approved"):
        state = json.loads((releases[name] / "release.json").read_text(encoding="utf-8"))["release"]
        assert any(
            f"rows in the published files (all outputs, a table's cells counted as rows): {state['published_rows']:,}"
            in v
            for v in verdicts["demo-census"]
        )
    assert all(v.startswith("targets met") for v in verdicts["demo-census"])


def test_a_development_run_is_a_draft_and_a_production_run_is_approved(releases) -> None:
    draft, approved = statement(releases["draft"]), statement(releases["approved"])
    assert "DRAFT — not an approved release" in draft and "safe to publish" not in draft
    assert "APPROVED RELEASE" not in draft and "PUBLISHED NO ROWS" not in draft
    assert "APPROVED RELEASE" in approved and "are signed" in approved and "DRAFT" not in approved
    assert "safe to publish" in approved and "all targets met" in approved
    for name, approved_flag in (("draft", False), ("approved", True)):
        state = json.loads((releases[name] / "release.json").read_text(encoding="utf-8"))["release"]
        assert state["approved"] is approved_flag and state["published_rows"] > 0
        assert (
            not state["published_nothing"] and state["short_of_plan"] == []
        )  # the cells companion is no output of its own


def test_each_statement_says_what_it_is_on_its_first_screen(releases, browser: Any, tmp_path: Path) -> None:
    """In headless Chromium at 1100 x 900: the state line is inside the first screen and says
    which release it is; a screenshot of that screen is kept under ``tmp_path``."""
    expected = {"empty": "PUBLISHED NO ROWS", "draft": "DRAFT", "approved": "APPROVED RELEASE"}
    for name, folder in releases.items():
        page = browser.new_context(viewport={"width": 1100, "height": 900}).new_page()
        try:
            page.goto((folder / steps.STATEMENT_FILE).as_uri(), wait_until="load")
            state = page.locator("#release-state")
            assert state.is_visible()
            box = state.bounding_box()
            assert box is not None and box["y"] + box["height"] <= 900, (name, box)
            assert state.inner_text().startswith(expected[name])
            badges = page.locator("header .badge").all_inner_texts()
            assert ("all targets met" in badges) == (name == "approved"), (name, badges)
            shot = tmp_path / f"{name}.png"
            page.screenshot(path=str(shot))  # the first screen only
            assert shot.stat().st_size > 10_000
        finally:
            page.context.close()


# --------------------------------------------------------------------------- 3. columns published


def test_the_statement_lists_the_columns_each_output_publishes() -> None:
    """The demo declares race, marital-status and occupation, which no mechanism publishes."""
    html = report_html(example_context(), public_only=True)
    listed = html.split('id="published-columns">', 1)[1].split("</ul>", 1)[0]
    assert "<li>microdata: age, sex, education, salary-class</li>" in listed
    assert "<li>hours-by-sex: hours-per-week, sex</li>" in listed
    assert "<li>mean-hours: hours-per-week</li>" in listed
    for declared_only in ("race", "marital-status", "occupation"):
        assert declared_only not in listed
    assert "Columns used" not in html


# --------------------------------------------------------------------------- 6. figures


def test_a_check_failed_by_a_rounding_margin_prints_the_deciding_digits(tmp_path: Path) -> None:
    """epsilon 1.000000001 against a maximum of 1: "1.000000001", never "1 ... FAIL"; a check
    passed within the rho tolerance keeps its short form."""
    text = DECLARED.format(bins=[*range(0, 110, 10)]).replace("epsilon: 1.0}", "epsilon: 1.000000001}")
    text = text.replace("accounting: approximate", "accounting: probabilistic")
    check = next(c for c in plan_policy(load_policy_text(text, tmp_path)).checks if c.target.startswith("max_epsilon"))
    assert not check.passed and check.achieved == "1.000000001" and check.required == "<= 1"
    rho = next(c for c in plan_policy(load_policy(REPO / "policies/examples/demo.yaml")).checks if "rho" in c.target)
    assert rho.passed and rho.achieved == "0.05" and rho.value != 0.05


def test_the_statement_says_why_one_mechanism_shows_several_epsilons() -> None:
    """The lifetime budget is charged at its δ under the approximate accountant only; under the
    probabilistic one (the demo's) the ledger adds up the stated (ε, δ) of every release."""
    html = report_html(example_context(), public_only=True)
    said = html.split('id="epsilon-readings">', 1)[1].split("</p>", 1)[0]
    assert "target δ = 1e-09" in said and "one guarantee read at different δ" in said
    assert "the lifetime budget adds up the stated (ε, δ) of every release" in said and "charged at" not in said
    text = (
        (REPO / "policies/examples/demo.yaml")
        .read_text()
        .replace("accounting: probabilistic", "accounting: approximate")
    )
    approximate = report_html(example_context(load_policy_text(text, REPO / "policies/examples")), public_only=True)
    said = approximate.split('id="epsilon-readings">', 1)[1].split("</p>", 1)[0]
    assert "the lifetime budget is charged at its δ = 1e-06" in said and "adds up" not in said


def test_a_draft_context_is_marked_draft() -> None:
    html = report_html(replace(example_context(), production=False), public_only=True)
    assert "DRAFT — not an approved release" in html and "safe to publish" not in html


def test_figures_are_named_and_rounded_as_a_reader_can_reconcile_them() -> None:
    """zCDP's rho is named apart from the identifiability rho; the discernibility metric says
    what it is, with thousands grouped; every chart table reads to at most 6 digits, and a
    frontier's policy row has the caption's 4-digit epsilon."""
    import re

    from privrelease.reports.charts import all_charts

    noisy = report_html(example_context(load_policy(REPO / "policies/examples/adult-noisy.yaml")))
    assert "zCDP ρ of the Gaussian noise" in noisy and "zcdp rho" not in noisy
    facts = replace(example_context(), internal_facts={"microdata": {"discernibility": 2996710}})
    assert re.search(r"discernibility \(Bayardo &amp; Agrawal.*?</td><td class=\"num\">2,996,710<", report_html(facts))
    charts = all_charts(plan_policy(load_policy(REPO / "policies/examples/demo.yaml")))
    for chart in charts:
        for row in chart.rows:
            for cell in row:
                number = re.fullmatch(r"-?([\d.]+)(e[-+]?\d+)?", cell)
                digits = 0 if number is None else len(number.group(1).replace(".", "").lstrip("0"))
                assert digits <= 6, (chart.title, row)
    frontier = next(chart for chart in charts if chart.title.startswith("Privacy-accuracy frontier of microdata"))
    policy_row = next(row for row in frontier.rows if row[3] == "policy")
    assert f"gives ε = {policy_row[1]} and" in frontier.caption


def test_a_release_far_short_of_its_plan_says_so() -> None:
    """The demo declares 50,000 rows and samples with beta 0.1: about 5,000 rows before
    suppression. 37 published microdata rows are under a tenth of that (the other files as
    planned): the first screen says so, with no green badge and no "safe to publish"."""
    context = example_context()
    outputs = [{**output, "rows": 37} if output["mechanism"] == "microdata" else output for output in context.outputs]
    short = replace(context, outputs=outputs)
    assert short.release_state()["short_of_plan"] == [{"mechanism": "microdata", "rows": 37, "expected": 50_000 * 0.1}]
    html = report_html(short, public_only=True)
    assert "FAR FEWER ROWS THAN PLANNED" in html and "microdata published 37 rows" in html and "about 5,000" in html
    assert "all targets met" not in html and "safe to publish" not in html
    assert context.release_state()["short_of_plan"] == []  # 4,949 rows: as planned
    (micro,) = [o for o in context.outputs if o["mechanism"] == "microdata" and not o.get("companion")]
    rows = micro["rows"]
    parts = [
        {**micro, "path": f"microdata-part{j:04d}.parquet", "rows": rows // 16 + (j < rows % 16)} for j in range(16)
    ]
    split = replace(context, outputs=[o for o in context.outputs if o is not micro] + parts)
    assert split.release_state()["short_of_plan"] == []  # 16 files of ~309 rows: 4,949 together, as planned
    assert f"The output of microdata is 16 files, {rows} rows together" in report_html(split)
