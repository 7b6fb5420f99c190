"""Hostile input: policies built to exhaust the parser, the calculus or the terminal, and user
text built to look like Rich markup. Each is a clear error (exit 2) in about a second, or, for
text, printed as written; nothing is recorded for a refused policy."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import pytest
import yaml
from conftest import cpu_seconds
from sqlmodel import select
from typer.testing import CliRunner

from privrelease import demo
from privrelease.cli import app
from privrelease.errors import UserError
from privrelease.flows.steps import release_plain

runner = CliRunner()


@pytest.fixture
def demo_policy(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("PRIVRELEASE_WORK_DIR", str(tmp_path / "work"))
    monkeypatch.delenv("PRIVRELEASE_DB_URL", raising=False)
    monkeypatch.delenv("PRIVRELEASE_PRODUCTION", raising=False)
    policy, _ = demo.write_demo(tmp_path / "demo", seed=3)
    return policy


def _alias_bomb(levels: int = 8) -> str:
    """~300 bytes of YAML that expand to 9**levels strings."""
    anchors = ['&a0 ["x","x","x","x","x","x","x","x","x"]']
    anchors += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    return "[" + ", ".join(anchors) + "]"


def _variant(policy: Path, pattern: str, replacement: str) -> Path:
    text, count = re.subn(pattern, replacement, policy.read_text(), count=1, flags=re.M)
    assert count == 1, pattern
    path = policy.with_name("hostile.yaml")
    path.write_text(text)
    return path


def _plan(path: Path | str) -> tuple[int, str, float]:
    """Exit code and message of `privrelease plan PATH` (as `main` turns a user error into
    them; tested end to end in test_cli_calculus), and the CPU seconds it took (CPU time, not wall
    time: see :func:`conftest.cpu_seconds`)."""
    result, seconds = cpu_seconds(lambda: runner.invoke(app, ["plan", str(path)]))
    if isinstance(result.exception, UserError):
        return result.exception.exit_code, str(result.exception), seconds
    return result.exit_code, result.output, seconds


def _parse_seconds(path: Path) -> float:
    """CPU seconds PyYAML alone takes to compose ``path`` into nodes (aliases are not expanded)."""

    def compose() -> None:
        with contextlib.suppress(yaml.YAMLError, RecursionError):
            yaml.compose(path.read_text(), Loader=yaml.SafeLoader)

    return cpu_seconds(compose)[1]


@pytest.mark.parametrize(
    "pattern, replacement, expected",
    [
        (r"^version:", f"description: {_alias_bomb()}\nversion:", "expands to more than 100000 values"),
        (r"^version:", f"nonsense: {_alias_bomb()}\nversion:", "expands to more than 100000 values"),
        (r"^version:", "description: &r [x, *r]\nversion:", "a node that contains it"),
        (r"^version:", "description: " + "[" * 3000 + "]" * 3000 + "\nversion:", "nested deeper than 50 levels"),
        (r"^    k: 20$", "    k: 1000000000000000000000000000000", "mechanisms[0].k: k must be an integer in [1, 100000]"),
        (r"^    k: 20$", "    k: 10000000", "k must be an integer in [1, 100000]"),
        (r"^    epsilon: 1.0$", "    epsilon: 1e308", "mechanisms[0].epsilon: epsilon must be in [0, 100]"),
        (r"^    lower: 1$", "    lower: -1e308", "mechanisms[2].lower: lower must be a number within ±1e15"),
        (r"^    upper: 99$", "    upper: 1e300", "upper must be a number within ±1e15"),
        (r"^  lifetime_budget: \{epsilon: 20", "  lifetime_budget: {epsilon: 1e200", "epsilon must be in (0, 100]"),
    ],
    ids=["alias bomb", "alias bomb in an unknown field", "recursive alias", "deep nesting", "k 1e30", "k 1e7",
         "epsilon 1e308", "lower -1e308", "upper 1e300", "lifetime epsilon 1e200"],
)  # fmt: skip
def test_hostile_policy_is_refused_at_once(demo_policy, pattern, replacement, expected):
    """Refused within a few times what planning a benign policy or merely parsing this text
    takes (both measured next, under the same load; 3000 brackets take PyYAML a second): an
    alias bomb expanded would take minutes."""
    hostile = _variant(demo_policy, pattern, replacement)
    _plan(demo_policy)  # warm-up, not measured: the first plan in a process imports what later ones reuse
    code, output, seconds = _plan(hostile)  # (a pytest-xdist worker may run any case first)
    assert code == 2, output
    assert expected in output and "Traceback" not in output
    seconds = min(seconds, _plan(hostile)[2])  # the better of two: a refusal that is slow is slow twice
    benign_code, _, benign = _plan(demo_policy)
    baseline = max(benign, _parse_seconds(hostile))
    assert benign_code == 0 and seconds < 10 * baseline, f"{seconds:.2f} s; baseline {baseline:.2f} s"


def test_oversized_and_special_policy_files(demo_policy, tmp_path):
    big = tmp_path / "big.yaml"
    big.write_text(demo_policy.read_text() + "#" * (1 << 20) + "\n")
    code, output, _ = _plan(big)
    assert code == 2 and "at most 1048576 (1 MiB)" in output
    code, output, _ = _plan("/dev/zero")
    assert code == 2 and "not a regular file" in output


def test_markup_in_user_text_prints_as_written(demo_policy, monkeypatch):
    """`[/x]` (a closing tag Rich cannot match) in a policy name, an approver and a note, shown
    by every command that prints them: as written, exit 0, nothing half-done."""
    from privrelease.cli.output import console

    monkeypatch.setattr(console, "width", 200)  # table cells unwrapped
    policy = _variant(demo_policy, r"^name: .*$", 'name: "census[/x][bold]"')
    result = runner.invoke(app, ["policy", "approve", str(policy), "--by", "[/x] Chief", "--note", "[/red] ok"])
    assert result.exit_code == 0, result.output
    assert "census[/x][bold]" in result.output and "[/x] Chief" in result.output
    listed = runner.invoke(app, ["policy", "list"])
    assert listed.exit_code == 0 and "census[/x][bold]" in listed.output and "[/x] Chief" in listed.output
    shown = runner.invoke(app, ["policy", "show", "census[/x][bold]"])
    assert shown.exit_code == 0 and "[/red] ok" in shown.output, shown.output
    planned = runner.invoke(app, ["plan", str(policy)])
    assert planned.exit_code == 0 and "census[/x][bold]" in planned.output
    release_plain(policy_path=str(policy))
    reports = runner.invoke(app, ["report", "list"])
    assert reports.exit_code == 0 and "census[/x][bold]" in reports.output, reports.output
    approvals = json.loads(runner.invoke(app, ["policy", "list", "--json"]).output)
    assert len(approvals) == 1


# --------------------------------------------------------------------------- paths


@pytest.mark.parametrize(
    "target, expected",
    [
        ("/proc/self/environ", "is outside the folders data may be read from"),
        ("/etc/passwd", "is outside the folders data may be read from"),
        ("link-to-passwd", "is outside the folders data may be read from"),
        ("fifo", "not a regular file"),
        ("folder", "is a folder"),
    ],
)
def test_data_paths_are_confined(demo_policy, target, expected, monkeypatch):
    """`--data` naming a file outside the policy's folder and the data roots (directly or
    through a symlink), a pipe or a folder: refused before anything is recorded or read, and
    the message quotes nothing from the file."""
    import os

    from privrelease.audit.database import open_database, session
    from privrelease.audit.models import Run

    monkeypatch.setenv("PRIVRELEASE_DATA_ROOTS", "")
    folder = demo_policy.parent
    (folder / "link-to-passwd").symlink_to("/etc/passwd")
    os.mkfifo(folder / "fifo")
    (folder / "folder").mkdir()
    path = target if target.startswith("/") else str(folder / target)
    with pytest.raises(UserError, match=expected) as caught:
        release_plain(policy_path=str(demo_policy), data_path=path)
    assert "root:" not in str(caught.value) and "PATH=" not in str(caught.value)
    with session(open_database(), readonly=True) as s:
        assert list(s.exec(select(Run))) == []


def test_hierarchy_outside_the_roots_is_refused_without_its_content(demo_policy, tmp_path, monkeypatch):
    monkeypatch.setenv("PRIVRELEASE_DATA_ROOTS", "")
    text = demo_policy.read_text()
    policy = demo_policy.with_name("passwd-hierarchy.yaml")
    policy.write_text(text.replace("  sex: keep\n", "  sex: {hierarchy: /etc/passwd, level: 1}\n", 1))
    code, output, _ = _plan(policy)
    assert code == 2 and "hierarchy file '/etc/passwd' is outside the folders" in output
    assert "root:" not in output


def test_a_declared_data_root_may_be_read(demo_policy, tmp_path, monkeypatch):
    """Data kept apart from the policy (the usual layout) is read once its folder is declared."""
    elsewhere = tmp_path / "vault"
    elsewhere.mkdir()
    data = elsewhere / "census.csv"
    data.write_bytes((demo_policy.parent / demo.DATA_FILE).read_bytes())
    monkeypatch.setenv("PRIVRELEASE_DATA_ROOTS", "")
    with pytest.raises(UserError, match="add its folder to PRIVRELEASE_DATA_ROOTS"):
        release_plain(policy_path=str(demo_policy), data_path=str(data))
    monkeypatch.setenv("PRIVRELEASE_DATA_ROOTS", f"/nonexistent:{elsewhere}")
    published = release_plain(policy_path=str(demo_policy), data_path=str(data))
    assert Path(published.release_dir).is_dir()


# --------------------------------------------------------------------------- the calculus at extremes

BIG = "1000000000000000000"  # 1e18, past every bound (an integer option takes it as an integer)
COUNT_LIMIT = "1000000000000000"  # 1e15: the largest count a policy may name, answered exactly


_EXTREMES = [
        (("calibrate", "noisy-counts", "--epsilon", "1e-300"), 2, "--epsilon must be in [1e-06, 100] for discrete Laplace"),
        (("calibrate", "noisy-counts", "--epsilon", "1e-300", "--delta", "1e-6"), 0, "sigma: 398942.2809"),
        (("calibrate", "noisy-counts", "--epsilon", "1e-300", "--delta", "1e-9"), 1, "no discrete Gaussian sigma up to 1e+06"),
        (("calibrate", "noisy-counts", "--epsilon", "1e300", "--delta", "1e-6"), 2, "--epsilon must be in (0, 100]; got 1e+300"),
        (("calibrate", "sdgs", "--k", "20", "--beta", "1e-300", "--delta", "1e-9"), 2, "--beta must be in [0.0001, 1]; got 1e-300"),
        (("calibrate", "sdgs", "--k", "20", "--beta", "auto", "--epsilon", "1e-300"), 2, "--beta auto (1 - e^-epsilon) must be in [0.0001, 1]; got 1e-300"),
        (("calibrate", "sdgs", "--k", "20", "--epsilon", "1", "--delta", "1e-300"), 1, "no beta in [0.0001, 1] (the range a policy allows) reaches delta 1e-300"),
        (("guarantee", "accuracy", "sdgs", "--k", "20", "--beta", "0.1", "--observed", BIG), 2, f"--observed must be an integer in [1, 1e15]; got {BIG}"),
        (("guarantee", "accuracy", "sdgs", "--k", "20", "--beta", "0.1", "--observed", COUNT_LIMIT), 0, "estimate c/beta"),
        (("guarantee", "accuracy", "sdgs", "--k", "20", "--beta", "0.1", "--count", BIG), 2, f"--count must be an integer in [1, 1e15]; got {BIG}"),
        (("guarantee", "accuracy", "sdgs", "--k", "20", "--beta", "0.1", "--count", COUNT_LIMIT), 0, "95% interval"),
        (("calibrate", "accuracy", "--k", "20", "--count", BIG, "--relative-error", "0.1"), 2, "--count must be an integer in [1, 1e15]"),
        (("calibrate", "accuracy", "--k", "20", "--count", COUNT_LIMIT, "--relative-error", "0.1"), 0, "beta = 0.0001"),
        (("guarantee", "accuracy", "sdgs", "--k", "20", "--beta", "1e-300", "--observed", "25"), 2, "--beta must be in [0.0001, 1]"),
        (("guarantee", "accuracy", "sdgs", "--k", "20", "--beta", "0.1", "--count", "100", "--relative-error", "inf"), 2, "--relative-error must be > 0; got inf"),
        (("calibrate", "accuracy", "--k", "20", "--count", "100", "--relative-error", "inf"), 2, "--relative-error must be > 0; got inf"),
        (("guarantee", "accuracy", "noisy-counts", "--distribution", "gaussian", "--sigma", "1e-300"), 2, "--sigma must be a number in [0.01, 1e+06]; got 1e-300"),
        (("calibrate", "accuracy", "--k", "20", "--count", "1000", "--relative-error", "0.1", "--accounting", "probabilistic", "--delta", "1e-300"), 1, "no epsilon up to 60 reaches delta 1e-300"),
        (("guarantee", "sdgs", "--k", BIG, "--beta", "0.1", "--epsilon", "1"), 2, f"--k must be an integer in [1, 100000]; got {BIG}"),
        (("guarantee", "sdgs", "--k", "20", "--beta", "1e-300", "--epsilon", "1e300"), 2, "must be in"),
        (("guarantee", "sdgs", "--k", "100000", "--beta", "0.01", "--epsilon", "0.02"), 0, "3378000"),
        (("guarantee", "sdgs", "--k", "100000", "--beta", "0.0001", "--epsilon", "0.000100006", "--json"), 0, '"log10_delta_theorem1": -8390.98'),
        (("guarantee", "sdgs", "--k", "100000", "--beta", "0.0001", "--epsilon", "0.001", "--json"), 0, '"log10_delta_exact": -64667.32'),
        (("guarantee", "sdgs", "--k", "100000", "--beta", "0.5", "--epsilon", "0", "--json"), 0, '"delta_exact": 0.000892065'),
        (("calibrate", "sdgs", "--k", "20", "--beta", "1e-5", "--delta", "1e-9", "--accounting", "approximate"), 2, "--beta must be in [0.0001, 1]; got 1e-05"),
        (("calibrate", "splu", "--gamma", "10", "--eps", "1e-300", "--alpha", "3", "--t-e", "1e-300"), 2, "--eps must be in [1e-06, 100]; got 1e-300"),
        (("calibrate", "splu", "--gamma", BIG, "--eps", "0.3", "--alpha", BIG), 2, f"--gamma must be an integer in [2, 100000]; got {BIG}"),
        (("calibrate", "splu", "--gamma", "10", "--eps", "0.3", "--alpha", BIG), 2, f"--alpha must be an integer in [1, 1000000]; got {BIG}"),
        (("guarantee", "accuracy", "laplace", "--scale", "1e308", "--confidence", "0.9999999999999999"), 2, "--scale must be a number in (0, 1e+300]; got 1e+308"),
]  # fmt: skip

_RUN_EACH = """
import contextlib, io, json, sys, time
from privrelease.cli import main
done = {}
for args in json.loads(sys.argv[1]):
    out, err = io.StringIO(), io.StringIO()
    sys.argv = ["privrelease", *args]
    start = time.process_time()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
            code = 0
        except SystemExit as stop:
            code = stop.code or 0
    seconds = time.process_time() - start
    done[" ".join(args)] = {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "seconds": seconds}
print(json.dumps(done))
"""


@pytest.fixture(scope="module")
def extremes() -> tuple[dict, float]:
    """Every command of :data:`_EXTREMES` run in one fresh process (each through ``main``, as
    the console script runs it: exit code, stdout, stderr, CPU seconds), and the CPU seconds a
    fresh process takes to import the CLI (measured now: a slower machine is slower at both)."""
    from conftest import child_cpu_seconds

    cases = json.dumps([list(args) for args, _, _ in _EXTREMES])
    done, _, baseline = child_cpu_seconds(f"import sys\nsys.argv[1:] = [{cases!r}]\n" + _RUN_EACH)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), baseline


@pytest.mark.parametrize("args, code, expected", _EXTREMES)
def test_calculus_at_extremes_answers_at_once(extremes, args, code, expected):
    """Each command with an extreme argument answers in one line (exit 2 naming the option, the
    value and the range a policy allows; exit 1 for a target no parameter meets) or with a
    finite answer, in less CPU time than a fresh process takes to import the CLI (measured in
    the same test): before, some ran for minutes, asked for 53 GiB or ended in a traceback."""
    done, baseline = extremes
    result = done[" ".join(args)]
    output = result["stdout"] + result["stderr"]
    assert result["code"] == code, output
    assert expected in output and "Traceback" not in output and "inf" not in result["stdout"], output
    if code:
        assert len(result["stderr"].strip().splitlines()) == 1, result["stderr"]
    assert result["seconds"] < 3 * baseline, f"{result['seconds']:.2f} s of CPU; importing the CLI {baseline:.2f} s"


def test_policy_noise_and_count_at_extremes(demo_policy, tmp_path):
    """A noisy-counts policy with sigma 1e-300 is refused by the schema (it crashed `plan` and
    `run` dividing by sigma^2); a target count of 1e15 (the largest allowed) plans as fast as the
    demo (it took 256 s and 5.6 GB, then a MemoryError: the binomial support was materialized)."""
    noisy = (Path(__file__).resolve().parents[1] / "policies" / "examples" / "adult-noisy.yaml").read_text()
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(noisy.replace("sigma: 4.231", "sigma: 1.0e-300"))
    code, output, _ = _plan(tiny)
    assert code == 2 and "noise.sigma: sigma must be a number in [0.01, 1e+06]; got 1e-300" in output
    huge = _variant(demo_policy, r"count: 1000, relative_error", "count: 1000000000000000, relative_error")
    _plan(demo_policy)  # warm-up, not measured
    code, output, seconds = _plan(huge)
    assert code == 0, output
    benign_code, _, benign = _plan(demo_policy)
    assert benign_code == 0 and seconds < 5 * benign, f"{seconds:.2f} s; the demo {benign:.2f} s"
