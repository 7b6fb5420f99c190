"""Every example policy releases as written, and every command of the README's command-line
tour runs as written (placeholders filled with the examples' own names and runs) with exit 0.

The Prefect commands (`run`, `rerun`, `reissue`) are run through the same release steps without
Prefect here (their Prefect path is tested in test_flow.py), `report open` would start a
browser and `server start` a Prefect server (tested in test_server.py, marked system): those
lines are skipped and named."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from privrelease.audit import signing
from privrelease.flows.steps import release_plain

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "policies" / "examples"
ADULT_POLICIES = sorted(p.name for p in EXAMPLES.glob("adult-*.yaml"))
# Both tests use the module's `released` (every Adult example released: 6-11 s): on one
# pytest-xdist worker under `make test`, so that it is built once, not once per worker.
pytestmark = pytest.mark.xdist_group("documented-examples")
SKIPPED = (
    "privrelease run ",
    "privrelease rerun ",
    "privrelease reissue ",
    "privrelease report open ",
    "privrelease server start",
)


def readme_commands() -> list[str]:
    """The README's `privrelease` lines: comments and [optional] parts removed, `a | b`
    alternatives split into commands of their own."""
    text = (REPO / "README.md").read_text()
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", text, re.S):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if not line.startswith("privrelease "):
                continue
            line = re.sub(r"\s*\[[^\]]*\]", "", line)
            first, *others = (part.strip() for part in line.split(" | "))
            commands += [first, *(f"privrelease {other}" for other in others)]
    return commands


@pytest.fixture(scope="module")
def released(adult_dir, tmp_path_factory):
    """Every Adult example released once, in one audit database (they share adult-census)."""
    folder = tmp_path_factory.mktemp("documented")
    signing.generate(folder / "agency.key")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PRIVRELEASE_WORK_DIR", str(folder / "work"))
        patch.setenv("PRIVRELEASE_SIGNING_KEY", str(folder / "agency.key"))
        for name in ("PRIVRELEASE_DB_URL", "PRIVRELEASE_PRODUCTION", "PRIVRELEASE_DEFAULT_LIFETIME_BUDGET"):
            patch.delenv(name, raising=False)
        published = {
            name: release_plain(
                policy_path=str(EXAMPLES / name), output_format="csv" if name == "adult-splu.yaml" else "parquet"
            )
            for name in ADULT_POLICIES
        }
    return folder / "work", published


def test_every_adult_example_releases_as_written(released) -> None:
    _, published = released
    assert sorted(published) == ADULT_POLICIES
    for summary in published.values():
        assert Path(summary.report).is_file() and summary.outputs


def test_every_readme_command_runs_as_written(released) -> None:
    work_dir, published = released
    run_id = published["adult-sdgs.yaml"].run_id
    (splu_output,) = published["adult-splu.yaml"].outputs
    approver_key = work_dir.parent / "approver.key"  # the approver's key and the registry declaring it
    registry = work_dir.parent / "approvers.yaml"
    registry.write_text(f"approvers:\n  Disclosure Review Board: {signing.generate(approver_key)}\n")
    fill = {
        "POLICY.yaml": str(EXAMPLES / "adult-sdgs.yaml"),
        "APPROVERS.yaml": str(registry),
        "APPROVER.key": str(approver_key),
        "COSIGNER.key": str(approver_key),
        "REQUEST.json": str(work_dir.parent / "request.json"),
        "NAME@VERSION": "adult-sdgs@3",
        "policy show NAME": "policy show adult-sdgs@3",
        "NAME": "'Disclosure Review Board'",
        "RUN_ID": run_id,
        "DATASET_ID": "adult-census",
        "DATA.csv": str(REPO.parent / "shared" / "data" / "adult" / "adult.csv"),
        "PUBLISHED.csv": splu_output["path"],
        "RELEASE_DIR": published["adult-sdgs.yaml"].release_dir,
        "KEY.pub": str(work_dir.parent / "agency.key.pub"),
        "CHARTS.html": str(work_dir.parent / "charts.html"),
    }
    ran = []
    for command in readme_commands():
        if command.startswith(SKIPPED):
            continue
        for placeholder, value in fill.items():
            command = command.replace(placeholder, value)
        args = shlex.split(command)[1:]
        result = subprocess.run(
            [sys.executable, "-m", "privrelease", *args],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
            env={**__import__("os").environ, "PRIVRELEASE_WORK_DIR": str(work_dir)},
        )
        assert result.returncode == 0, (command, result.stdout[-500:], result.stderr[-500:])
        assert "Traceback" not in result.stderr
        ran.append(args[0])
    assert {"plan", "guarantee", "calibrate", "policy", "ledger", "audit", "report", "estimate"} <= set(ran)


def _readme_snippet_is_the_mechanisms_of(intro: str, example: str) -> None:
    """The first YAML block of the README after ``intro`` is the mechanisms section of ``example``."""
    import yaml

    text = (REPO / "README.md").read_text()
    snippet = re.search(r"```yaml\n(.*?)```", text[text.index(intro) :], re.S)
    assert snippet is not None
    policy = yaml.safe_load((EXAMPLES / example).read_text())
    assert yaml.safe_load(snippet.group(1)) == {"mechanisms": policy["mechanisms"]}


def test_readme_noisy_counts_snippet_is_the_example_s_mechanisms() -> None:
    """The README's noisy-counts YAML is the mechanisms section of the example it names."""
    _readme_snippet_is_the_mechanisms_of(
        "`policies/examples/adult-noisy.yaml` is a complete policy:", "adult-noisy.yaml"
    )


def test_noisy_counts_half_widths_in_the_readme_and_the_example_come_from_the_code() -> None:
    """The figures the README and adult-noisy.yaml's comments state (each cell's 95% half-width,
    all cells at once) are the kind's, at the example's sigma and number of cells."""
    from privrelease.mechanisms.kinds.noisy_counts import all_cells_half_width, half_width
    from privrelease.planning import plan_policy
    from privrelease.policies import load_policy

    path = EXAMPLES / "adult-noisy.yaml"
    (table,) = plan_policy(load_policy(path)).mechanisms
    sigma, cells = 4.231, table.facts["cells"]
    each, together = half_width("gaussian", sigma, 0.95), all_cells_half_width("gaussian", sigma, 0.95, cells)
    readme = re.sub(r"\s+", " ", (REPO / "README.md").read_text())
    assert (
        f"--cells {cells}` finds the smallest sigma for a target ({sigma:g}: each cell within +-{each} of its "
        f"true count with probability 0.95, cell by cell; all {cells} cells at once only within +-{together})"
    ) in readme
    comments = re.sub(r"\s*\n\s*#\s*", " ", path.read_text())
    assert (
        f"each cell (cell by cell) within +-{each} people of its true count at 95%; all {cells} cells at once "
        in comments
    )
    assert f"within +-{together} (plan and the report state both)" in comments
    assert f"sigma: {sigma:g}" in path.read_text()


@pytest.mark.parametrize("name", ["prefect.yaml", "README.md"])
def test_the_scheduling_docs_say_every_extract_shares_the_dataset_budget(name: str) -> None:
    """The budget model (README): every file read for a dataset.id shares its one lifetime budget.
    The scheduling docs once said a new file had "its own budget" (a monthly schedule would seem
    to reset it)."""
    text = " ".join((REPO / "deploy" / name).read_text().replace("#", " ").split())
    assert "own budget" not in text and "budget of its own" not in text
    assert "shares that one budget" in text and "does not reset it" in text
    assert "every extract" in text.lower() or "each new extract" in text


def test_the_deploy_guide_s_budget_figures_are_the_ledger_s(adult_dir) -> None:
    """deploy/README.md's figures for the monthly Adult schedules are what the ledger composes (the
    smallest epsilon at the lifetime delta over the stored event trees): one round of the Adult
    deployments in schedule order, and which releases of a second round it refuses (a release is
    refused when adding its tree would exceed the lifetime epsilon; the next ones are still tried)."""
    import yaml

    from privrelease.mechanisms import composition
    from privrelease.mechanisms.events import is_dp
    from privrelease.planning import plan_policy
    from privrelease.policies import load_policy

    deployments = yaml.safe_load((REPO / "deploy" / "prefect.yaml").read_text())["deployments"]
    adult = [d for d in deployments if d["parameters"]["data_path"].endswith("adult/adult.csv")]
    minute, hour = zip(*(map(int, d["schedules"][0]["cron"].split()[:2]) for d in adult), strict=True)
    assert list(zip(hour, minute, strict=True)) == sorted(zip(hour, minute, strict=True))  # in schedule order
    loaded = [load_policy(REPO / d["parameters"]["policy_path"]) for d in adult]
    (budget,) = {p.policy.targets.lifetime_budget for p in loaded} - {None}
    charged = [(d["name"], plan_policy(p).event) for d, p in zip(adult, loaded, strict=True)]
    charged = [(name, tree) for name, tree in charged if is_dp(tree)]
    spent = [tree for _, tree in charged]
    one_round = composition.epsilon_at(spent, budget.delta).epsilon
    refused = {}
    for name, tree in charged:
        total = composition.epsilon_at([*spent, tree], budget.delta).epsilon
        if total > budget.epsilon:
            refused[name] = total
        else:
            spent.append(tree)
    guide = " ".join((REPO / "deploy" / "README.md").read_text().split())
    assert (len(adult), len(charged)) == (8, 7) and "round of the eight Adult deployments (seven charged" in guide
    assert f"spends epsilon {one_round:.2f} of the {budget.epsilon:g} at delta {budget.delta:g}" in guide
    assert list(refused) == ["adult-tables"] and f"bring the total to {refused['adult-tables']:.2f}" in guide
    assert f"the {len(deployments)} deployments of prefect.yaml" in guide
    assert all(f"| `release/{d['name']}` |" in guide for d in deployments)


def test_readme_noisy_sums_snippet_is_the_discharge_example_s_mechanisms() -> None:
    """The README's noisy-sums YAML is the mechanisms section of discharges.yaml, whose data file
    exists where the policy points (the generator's, byte for byte: tests/test_noisy_sums.py)."""
    from privrelease.policies import load_policy

    _readme_snippet_is_the_mechanisms_of(
        "`policies/examples/discharges.yaml` (a synthetic discharge file", "discharges.yaml"
    )
    assert load_policy(EXAMPLES / "discharges.yaml").dataset_path.is_file()
