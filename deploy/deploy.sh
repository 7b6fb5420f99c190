#!/usr/bin/env bash
# Create or update the deployments of deploy/prefect.yaml (PRIVRELEASE_PREFECT_FILE) on the Prefect
# server at PREFECT_API_URL, from the repository root (entrypoints and relative paths are relative
# to it). Idempotent: deploying again updates the deployments and their schedules.
#
#   deploy/deploy.sh                 all deployments
#   deploy/deploy.sh demo adult-sdgs only these (names as in prefect.yaml)
#
# The work pool must exist first (deploy/work-pool.sh).
# shellcheck source=deploy/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

[[ -f "$PRIVRELEASE_PREFECT_FILE" ]] || die "no deployment file at $PRIVRELEASE_PREFECT_FILE (PRIVRELEASE_PREFECT_FILE)"
require_api
if (($# == 0)); then
  selection=(--all)
else
  selection=()
  for name in "$@"; do
    selection+=(--name "$name")
  done
fi
cd "$PRIVRELEASE_REPO" || die "cannot enter PRIVRELEASE_REPO=$PRIVRELEASE_REPO"
if ! "$PREFECT" --no-prompt deploy --prefect-file "$PRIVRELEASE_PREFECT_FILE" "${selection[@]}"; then
  die "prefect deploy failed (output above); if the work pool does not exist, run deploy/work-pool.sh first"
fi
say "deployed ${*:-all deployments} from $PRIVRELEASE_PREFECT_FILE to $PREFECT_API_URL; a worker runs them: deploy/worker.sh"
