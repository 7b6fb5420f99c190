#!/usr/bin/env bash
# Create the process work pool the deployments run on (PRIVRELEASE_WORK_POOL, default
# privrelease-process) on the Prefect server at PREFECT_API_URL. Idempotent: an existing pool of
# type process is left as it is (its concurrency limit and job template are kept); a pool of that
# name with another type is an error.
# shellcheck source=deploy/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

require_api
if output="$("$PREFECT" --no-prompt work-pool create "$PRIVRELEASE_WORK_POOL" --type process 2>&1)"; then
  say "created work pool '$PRIVRELEASE_WORK_POOL' (type process) on $PREFECT_API_URL"
  exit 0
fi
if ! grep -qi "already exists" <<<"$output"; then
  echo "$output" >&2
  die "could not create work pool '$PRIVRELEASE_WORK_POOL' on $PREFECT_API_URL (output above)"
fi
details="$("$PREFECT" work-pool inspect "$PRIVRELEASE_WORK_POOL" 2>&1)" ||
  die "work pool '$PRIVRELEASE_WORK_POOL' exists but cannot be inspected: $details"
if ! grep -q "type='process'" <<<"$details"; then
  kind="$(grep -o "type='[^']*'" <<<"$details" | head -n 1)"
  die "work pool '$PRIVRELEASE_WORK_POOL' already exists on $PREFECT_API_URL with ${kind:-another type}, not type='process': delete it (prefect work-pool delete '$PRIVRELEASE_WORK_POOL') or set PRIVRELEASE_WORK_POOL and the work_pool names in $PRIVRELEASE_PREFECT_FILE"
fi
say "work pool '$PRIVRELEASE_WORK_POOL' (type process) already exists on $PREFECT_API_URL"
