#!/usr/bin/env bash
# bench/scale.py on a many-core machine without network (../shared/notes/many-cores.md, issue 28).
#
#   bash bench/many_cores.sh KIT        (KIT: a folder holding whl/ and adult/, see below)
#
# KIT/whl: the wheels of bench/many_cores.txt (gathered where pip reaches an index: the command is
# in that file); KIT/adult: a copy of ../shared/data/adult. This checkout is installed as is (its
# package folders copied into the install target as pyproject.toml maps them: no build, no git).
# Runs, each as one line of JSON (bench/scale.py's last line) on stdout and in $OUT/scale.jsonl:
# 100 M rows with 16 workers against the in-process run, then 20 M rows with 2, 4, 8, 16 workers
# while BUDGET_S (default 420 s from the start) allows; a run that cannot finish in the time left
# is skipped with a line saying so. Knobs: PY (python3), SITE, SCRATCH, OUT, BUDGET_S, BIG_ROWS, ROWS,
# BIG_WORKERS, WORKERS.
set -u
KIT=$(cd "${1:?usage: many_cores.sh KIT}" && pwd)
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PY:-python3}
SITE=${SITE:-/tmp/privrelease-site}
SCRATCH=${SCRATCH:-/tmp/privrelease-many-cores}  # the bench's data and work folders
OUT=${OUT:-$SCRATCH/out}  # only env.txt, log.txt, run.log and scale.jsonl
BUDGET_S=${BUDGET_S:-420}
BIG_ROWS=${BIG_ROWS:-100000000}
ROWS=${ROWS:-20000000}
BIG_WORKERS=${BIG_WORKERS-16}
WORKERS=${WORKERS-2 4 8 16}
START=$(date +%s)
mkdir -p "$OUT"
echo "$(nproc) cores; $("$PY" --version)" | tee "$OUT/env.txt"

rm -rf "$SITE" && mkdir -p "$SITE"
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$KIT"/whl/*.whl \
  || { echo "pip install failed"; exit 1; }
"$PY" - "$REPO" "$SITE" <<'EOF' || exit 1
import shutil, sys, tomllib
from pathlib import Path
repo, site = Path(sys.argv[1]), Path(sys.argv[2])
mapping = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
for package, folder in sorted(mapping.items(), key=lambda item: item[0].count(".")):
    target = site.joinpath(*package.split("."))
    shutil.copytree(repo / folder, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
EOF
export PYTHONPATH="$SITE" DASK_LOGGING__DISTRIBUTED=error
export PRIVRELEASE_WORK_DIR="$SCRATCH/work" TMPDIR="$SCRATCH/tmp" PREFECT_HOME="$SCRATCH/prefect"
mkdir -p "$TMPDIR" "$REPO/../shared/data"
[ -f "$REPO/../shared/data/adult/adult.csv" ] || cp -r "$KIT/adult" "$REPO/../shared/data/adult" || exit 1
cd "$SCRATCH" || exit 1  # not the checkout: python imports the installed copy
"$PY" -c "import privrelease.flows.scaled, dask, distributed, dp_accounting, sqlmodel; print('imports ok:', privrelease.flows.scaled.__file__)" \
  | tee -a "$OUT/env.txt" || exit 1

run() {  # rows workers seconds_it_may_take [more bench/scale.py arguments]
  local rows=$1 workers=$2 need=$3 left
  shift 3
  left=$((BUDGET_S - $(date +%s) + START))
  if ((left < need)); then
    echo "{\"rows\": $rows, \"workers\": $workers, \"skipped\": \"${left} s of the budget left, a run takes ~${need} s\"}"
  else
    timeout "$left" "$PY" "$REPO/bench/scale.py" --rows "$rows" --workers "$workers" "$@" > "$OUT/run.log" 2>&1
    local rc=$? last
    last=$(tail -n 1 "$OUT/run.log")
    cat "$OUT/run.log" >> "$OUT/log.txt"
    if [ "$rc" = 0 ] && [ "${last:0:1}" = "{" ]; then echo "$last"; else
      echo "{\"rows\": $rows, \"workers\": $workers, \"failed\": \"exit $rc ($(tail -n 2 "$OUT/run.log" | tr -d '"\n'))\"}"
    fi
  fi | tee -a "$OUT/scale.jsonl"
}

for workers in $BIG_WORKERS; do run "$BIG_ROWS" "$workers" 120; done
for workers in $WORKERS; do run "$ROWS" "$workers" 45; done
echo "done after $(($(date +%s) - START)) s"
