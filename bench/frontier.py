"""Benchmark of the privacy-accuracy frontier (not a test): for every example policy, the CPU
seconds of its plan and of its frontier charts (each mechanism's Frontier and its SVG), the PLD
cache cleared first (as in a fresh ``privrelease plan --chart``). Last line: one JSON object of
the figures. Run with ``PRIVRELEASE_DATA_ROOTS`` naming ../shared/data."""

from __future__ import annotations

import json
import time
from pathlib import Path

from privrelease.mechanisms import pld
from privrelease.planning import plan_policy
from privrelease.policies import load_policy
from privrelease.reports.charts import frontier_charts

EXAMPLES = Path(__file__).resolve().parents[1] / "policies" / "examples"


def main() -> None:
    figures = {}
    for path in sorted(EXAMPLES.glob("*.yaml")):
        pld._cached_pld.cache_clear()
        loaded = load_policy(path)
        start = time.process_time()
        plan = plan_policy(loaded)
        planned = time.process_time() - start
        start = time.process_time()
        charts = frontier_charts(plan)
        drawn = time.process_time() - start
        figures[path.stem] = {"plan_s": round(planned, 3), "frontier_s": round(drawn, 3), "charts": len(charts)}
        print(f"{path.stem:20s} plan {planned:6.3f} s   frontier {drawn:6.3f} s   {len(charts)} chart(s)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
