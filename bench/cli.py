"""Benchmark of the command line as a user feels it (not a test): the wall time of each command
in a fresh process, against a bare `python -c pass`, `python -c "import privrelease.cli"` and
`privrelease plan` measured in the same run. Releases run on the demo's SYNTHETIC data in a
production-mode audit database: the first run (no Prefect server yet: it starts one and
keeps it; once on a fresh Prefect database, then with the server stopped before each run), a
warm run (server up), a rerun, a run with `--no-server-reuse` (a temporary server per run, as
before the kept server), and runs refused before Prefect (not approved, wrong data
path, budget exhausted). The median of 5 runs each (2 for server starts). With
`--before CHECKOUT` (older code: `git worktree add --detach /tmp/before COMMIT && make -C
/tmp/before setup`), plan, the warm run, the rerun and the refusals are measured again, this code
and that checkout (its own `.venv` and work folder) in turn, and the ratio now/before is the
median of the pairs' ratios. Bytecode is cached, as on a user's machine (PYTHONDONTWRITEBYTECODE
is not passed on).
A warm run goes to the runner kept in the work folder (privrelease/resident.py; the bench waits
until it serves); ``run_warm_own_process`` is the same run in its own process
(``PRIVRELEASE_RUNNER=false``). With ``../shared/data/adult`` present, ``plan`` and a warm run of
``policies/examples/adult-sdgs.yaml`` too (issue 28's goal: a warm run <= GOAL x plan).
Last line: one JSON object of the figures (seconds).

    python bench/cli.py [--before /tmp/before]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPEATS = 5
SERVER_STARTS = 2
GOAL = 3.0
"""A warm run of adult-sdgs.yaml (else of the demo) within this many times its plan (issue 28)."""
ADULT_SDGS = REPO / "policies" / "examples" / "adult-sdgs.yaml"
SHARED_DATA = REPO.parent / "shared" / "data"


def once(args: list[str], env: dict[str, str], expect: int = 0, cwd: Path = REPO) -> tuple[float, float]:
    """Wall and CPU (user + system) seconds of ``args`` in a fresh process, whose exit code must
    be ``expect``."""
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=cwd)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != expect:
        raise SystemExit(f"{' '.join(args)}: exit {done.returncode}, expected {expect}\n{done.stderr[-800:]}")
    return elapsed, (after.ru_utime - cpu.ru_utime) + (after.ru_stime - cpu.ru_stime)


def wall(
    args: list[str], env: dict[str, str], expect: int = 0, repeats: int = REPEATS, before=None, cwd: Path = REPO
) -> float:
    """Median wall seconds of ``args`` in a fresh process (the exit code must be ``expect``);
    ``before()`` runs ahead of each repetition, untimed."""
    times = []
    for _ in range(repeats):
        if before is not None:
            before()
        times.append(once(args, env, expect, cwd)[0])
    print(f"  {' '.join(args[3:5])}: {statistics.median(times):.3f} s", file=sys.stderr, flush=True)
    return statistics.median(times)


def paired(
    now: list[str], env: dict[str, str], before: list[str], env_before: dict[str, str], cwd_before: Path, expect: int
) -> dict[str, float]:
    """``now`` and ``before`` run in turn, REPEATS times each: their median wall seconds and the
    medians of the pairs' ratios now/before, of wall and of CPU seconds (taking them in turn keeps
    the ratios fair when other work on the machine changes its speed during the bench; the CPU
    ratio, of the command's own process, is the steadier of the two on a busy machine)."""
    pairs = [(once(now, env, expect), once(before, env_before, expect, cwd_before)) for _ in range(REPEATS)]
    figures = {
        "now": statistics.median(a[0] for a, _ in pairs),
        "before": statistics.median(b[0] for _, b in pairs),
        "wall_ratio": statistics.median(a[0] / b[0] for a, b in pairs),
        "cpu_ratio": statistics.median(a[1] / b[1] for a, b in pairs),
    }
    shown = ", ".join(f"{name} {value:.3f}" for name, value in figures.items())
    print(f"  {' '.join(now[3:5])}: {shown}", file=sys.stderr, flush=True)
    return {name: round(value, 3) for name, value in figures.items()}


def policies(folder: Path) -> dict[str, Path]:
    """The demo policy with room for the bench's runs, an unapproved version and one whose
    lifetime budget is smaller than one release (each its own file)."""
    from privrelease import demo

    policy, _data = demo.write_demo(folder, seed=1)
    text = policy.read_text().replace("lifetime_budget: {epsilon: 20", "lifetime_budget: {epsilon: 100")
    policy.write_text(text)
    unapproved = folder / "unapproved.yaml"
    unapproved.write_text(text.replace('version: "1"', 'version: "unapproved"'))
    poor = folder / "poor.yaml"
    poor.write_text(
        text.replace("lifetime_budget: {epsilon: 100", "lifetime_budget: {epsilon: 1")
        .replace('version: "1"', 'version: "poor"')
        .replace("id: demo-census", "id: demo-census-poor")
    )
    return {"policy": policy, "unapproved": unapproved, "poor": poor}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="a checkout of older code (with its .venv) to measure too")
    arguments = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory() as temp:
        folder = Path(temp)
        # as on a user's machine, Python caches bytecode: PYTHONDONTWRITEBYTECODE (set on some CI
        # machines) would make every process compile privrelease's modules from source again
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PREFECT_", "PRIVRELEASE_")) and k != "PYTHONDONTWRITEBYTECODE"
        }
        env.update(
            PRIVRELEASE_WORK_DIR=str(folder / "work"),
            PRIVRELEASE_SERVER_IDLE_SECONDS="300",  # a bench killed midway leaves nothing for long
            PREFECT_HOME=str(folder / "prefect-home"),
        )
        adult = (SHARED_DATA / "adult" / "adult.csv").is_file()
        if adult:
            env["PRIVRELEASE_DATA_ROOTS"] = str(SHARED_DATA)
        cli = [python, "-m", "privrelease"]
        files = policies(folder / "demo")
        policy = str(files["policy"])

        def setup(cli: list[str], env: dict[str, str], *args: str, cwd: Path = REPO) -> str:
            return subprocess.run([*cli, *args], check=True, capture_output=True, text=True, env=env, cwd=cwd).stdout

        def prepare(cli: list[str], env: dict[str, str], cwd: Path = REPO) -> str:
            """A production audit database with the policies approved; its first run's id."""
            setup(cli, env, "audit", "init", cwd=cwd)
            setup(cli, env, "audit", "mode", "production", "--by", "bench", cwd=cwd)
            for name in ("policy", "poor"):
                setup(cli, env, "policy", "approve", str(files[name]), "--by", "bench", cwd=cwd)
            if adult:
                setup(cli, env, "policy", "approve", str(ADULT_SDGS), "--by", "bench", cwd=cwd)
            return json.loads(setup(cli, env, "run", policy, "--json", cwd=cwd))["run_id"]

        def stop_server() -> None:
            setup(cli, env, "server", "stop")

        def runner_up() -> None:
            """Wait until a runner serves this environment's runs (its imports take seconds)."""
            deadline = time.monotonic() + 120
            while not json.loads(setup(cli, env, "server", "status", "--json"))["runners"]:
                if time.monotonic() > deadline:
                    raise SystemExit("no runner was kept in the work folder within 120 s")
                time.sleep(0.2)

        began = time.perf_counter()
        first_run_id = prepare(cli, env)  # its run creates Prefect's database
        fresh = time.perf_counter() - began
        refusals = {
            "run_refused_unapproved": (["run", str(files["unapproved"])], 2),
            "run_refused_data_path": (["run", policy, "--data", str(folder / "missing.csv")], 2),
            "run_refused_budget": (["run", str(files["poor"])], 1),
        }
        figures = {
            "python_pass": wall([python, "-c", "pass"], env),
            "import_privrelease_cli": wall([python, "-c", "import privrelease.cli"], env),
            "plan": wall([*cli, "plan", policy], env),
            "policy_list": wall([*cli, "policy", "list"], env),
            "audit_verify": wall([*cli, "audit", "verify"], env),
            "server_status": wall([*cli, "server", "status"], env),
            "run_first_fresh_home": fresh,  # once: a new server on a new Prefect database (with the setup)
            "run_first": wall([*cli, "run", policy], env, repeats=SERVER_STARTS, before=stop_server),
            "run_warm": wall([*cli, "run", policy], env, before=runner_up),
            "run_warm_own_process": wall([*cli, "run", policy], {**env, "PRIVRELEASE_RUNNER": "false"}),
            "rerun_warm": wall([*cli, "rerun", first_run_id], env, before=runner_up),
            "run_no_server_reuse": wall([*cli, "run", policy, "--no-server-reuse"], env, repeats=SERVER_STARTS),
            **{name: wall([*cli, *args], env, expect) for name, (args, expect) in refusals.items()},
        }
        if adult:
            figures["plan_adult_sdgs"] = wall([*cli, "plan", str(ADULT_SDGS)], env)
            figures["run_warm_adult_sdgs"] = wall([*cli, "run", str(ADULT_SDGS)], env, before=runner_up)
        stop_server()
        ratios: dict[str, dict[str, float]] = {}
        if arguments.before:
            old = arguments.before.resolve()
            interpreter = old / ".venv" / "bin" / "python"
            if not interpreter.is_file():
                raise SystemExit(f"{interpreter} is missing: run make setup in {old}")
            cli_before = [str(interpreter), "-m", "privrelease"]
            # its own work folder: an older schema cannot open the newer code's database
            env_before = {**env, "PRIVRELEASE_WORK_DIR": str(folder / "work-before")}
            before_run_id = prepare(cli_before, env_before, cwd=old)
            setup(cli, env, "server", "start")  # both warm: each side's kept server is up
            compared = {
                "plan": (["plan", policy], ["plan", policy], 0),
                "run": (["run", policy], ["run", policy], 0),
                "rerun": (["rerun", first_run_id], ["rerun", before_run_id], 0),
                **{name: (args, args, expect) for name, (args, expect) in refusals.items()},
            }
            for name, (args, args_before, expect) in compared.items():
                ratios[name] = paired([*cli, *args], env, [*cli_before, *args_before], env_before, old, expect)
                figures[f"now_{name}"], figures[f"before_{name}"] = ratios[name]["now"], ratios[name]["before"]
            stop_server()
            setup(cli_before, env_before, "server", "stop", cwd=old)
    plan = figures["plan"]
    width = max(map(len, figures))
    print(f"fresh process per command, median of {REPEATS} ({SERVER_STARTS} for server starts); seconds, x plan")
    for name, seconds in figures.items():
        print(f"  {name:<{width}}  {seconds:7.3f}  {seconds / plan:6.1f}x")
    for run_name, plan_name in (("run_warm", "plan"), ("run_warm_adult_sdgs", "plan_adult_sdgs")):
        if run_name in figures:
            times = figures[run_name] / figures[plan_name]
            verdict = "within" if times <= GOAL else "NOT within"
            print(f"{run_name} {figures[run_name]:.2f} s = {times:.1f}x {plan_name} ({verdict} the {GOAL:g}x goal)")
    if ratios:
        print("now / before, run in turn (now, before, now, ...): medians of the pairs' ratios, wall and CPU")
        for name, ratio in ratios.items():
            print(f"  {name:<{width}}  wall {ratio['wall_ratio']:6.3f}  cpu {ratio['cpu_ratio']:6.3f}")
    print(json.dumps({**{name: round(seconds, 3) for name, seconds in figures.items()}, "ratios": ratios}))


if __name__ == "__main__":
    main()
