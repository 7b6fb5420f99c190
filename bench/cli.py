"""Benchmark of the command line as a user feels it (not a test): the wall time of each
non-flow command in a fresh process, and of `privrelease run` on a policy it refuses (before
Prefect starts), against a bare `python -c pass` and `python -c "import privrelease.cli"`
measured in the same run (the floor no command can go under). The median of 5 runs each.
Last line: one JSON object of the figures (seconds).

    python bench/cli.py
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "policies" / "examples" / "demo.yaml"
REPEATS = 5


def wall(args: list[str], env: dict[str, str], expect: int = 0) -> float:
    """Median wall seconds of ``args`` in a fresh process (the exit code must be ``expect``)."""
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        done = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO)
        times.append(time.perf_counter() - start)
        if done.returncode != expect:
            raise SystemExit(f"{' '.join(args)}: exit {done.returncode}, expected {expect}\n{done.stderr[-800:]}")
    return statistics.median(times)


def main() -> None:
    python = sys.executable
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "PRIVRELEASE_WORK_DIR": str(Path(folder) / "work")}
        env.pop("PRIVRELEASE_DB_URL", None)
        cli = [python, "-m", "privrelease"]
        subprocess.run([*cli, "audit", "init"], check=True, capture_output=True, env=env, cwd=REPO)
        subprocess.run([*cli, "audit", "mode", "production", "--by", "bench"], check=True, capture_output=True, env=env)
        figures = {
            "python_pass": wall([python, "-c", "pass"], env),
            "import_privrelease_cli": wall([python, "-c", "import privrelease.cli"], env),
            "plan": wall([*cli, "plan", str(DEMO)], env),
            "plan_json": wall([*cli, "plan", str(DEMO), "--json"], env),
            "policy_list": wall([*cli, "policy", "list"], env),
            "ledger_list": wall([*cli, "ledger", "list"], env),
            "audit_verify": wall([*cli, "audit", "verify"], env),
            "guarantee_sdgs": wall([*cli, "guarantee", "sdgs", "--k", "20", "--beta", "0.1", "--epsilon", "1"], env),
            "run_refused": wall([*cli, "run", str(DEMO)], env, expect=2),
        }
    width = max(map(len, figures))
    print(f"fresh process per command, median of {REPEATS} (seconds); baselines first")
    for name, seconds in figures.items():
        print(f"  {name:<{width}}  {seconds:6.3f}")
    slowest = max((s, n) for n, s in figures.items() if n not in ("python_pass", "import_privrelease_cli"))
    print(f"slowest command: {slowest[1]} {slowest[0]:.3f} s (import floor {figures['import_privrelease_cli']:.3f} s)")
    print(json.dumps({name: round(seconds, 3) for name, seconds in figures.items()}))


if __name__ == "__main__":
    main()
