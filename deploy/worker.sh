#!/usr/bin/env bash
# A Prefect process worker on the work pool PRIVRELEASE_WORK_POOL (default privrelease-process): it
# polls the server at PREFECT_API_URL and runs each scheduled or triggered flow run in a process of
# its own, which starts in PRIVRELEASE_REPO (the deployments' pull step) and inherits this
# environment: PRIVRELEASE_DB_URL (the audit database), PRIVRELEASE_PRODUCTION,
# PRIVRELEASE_WORK_DIR, PRIVRELEASE_RESERVATION_TTL_SECONDS.
#
#   deploy/worker.sh [start]    start it in the background (idempotent: one worker per PREFECT_HOME)
#   deploy/worker.sh stop       stop it (SIGTERM, then SIGKILL after 5 s: Prefect's worker does not
#                               exit on SIGTERM alone, measured; a flow run in progress goes on in
#                               its own process until it publishes or fails)
#   deploy/worker.sh status     exit 0 when it runs
#   deploy/worker.sh foreground run it in the foreground (for systemd or a terminal)
#   deploy/worker.sh run-once   run the flow runs due now, then exit
#
# Arguments after the action go to `prefect worker start` (e.g. --limit 2). Before it starts, the
# audit database schema is brought to the newest migration (privrelease audit migrate).
# shellcheck source=deploy/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PIDFILE="$PREFECT_HOME/worker-$PRIVRELEASE_WORK_POOL.pid"
LOGFILE="$PREFECT_HOME/worker-$PRIVRELEASE_WORK_POOL.log"
action="${1:-start}"
(($# > 0)) && shift

prepare() {
  require_api
  [[ -d "$PRIVRELEASE_REPO/flows" ]] || die "PRIVRELEASE_REPO=$PRIVRELEASE_REPO is not the privrelease checkout (no flows/ folder): flow runs start there"
  local privrelease="${PREFECT%/prefect}/privrelease"
  [[ -x "$privrelease" ]] || privrelease="$(command -v privrelease || true)"
  [[ -n "$privrelease" ]] || die "the privrelease command was not found beside $PREFECT nor on PATH"
  if [[ -n "${PRIVRELEASE_DB_URL:-}" ]]; then
    say "audit database: PRIVRELEASE_DB_URL (${PRIVRELEASE_DB_URL%%://*})"
  else
    say "audit database: PRIVRELEASE_DB_URL is not set: the default SQLite file under ${PRIVRELEASE_WORK_DIR:-$PRIVRELEASE_REPO/privrelease-work}"
  fi
  "$privrelease" audit migrate >&2 || die "could not migrate the audit database (message above); check PRIVRELEASE_DB_URL and that the database server answers"
}

worker_command=("$PREFECT" worker start --pool "$PRIVRELEASE_WORK_POOL" --type process)

case "$action" in
start)
  if alive "$PIDFILE"; then
    say "worker already running on pool '$PRIVRELEASE_WORK_POOL' (pid $(cat "$PIDFILE"), log $LOGFILE)"
    exit 0
  fi
  prepare
  start_detached "$PIDFILE" "$LOGFILE" "${worker_command[@]}" "$@"
  sleep 1
  alive "$PIDFILE" || {
    tail -n 20 "$LOGFILE" >&2 || true
    die "the worker exited at once; its log: $LOGFILE"
  }
  say "worker started on pool '$PRIVRELEASE_WORK_POOL' (pid $(cat "$PIDFILE"), log $LOGFILE)"
  ;;
stop)
  stop_group "worker" "$PIDFILE" 5
  ;;
status)
  if alive "$PIDFILE"; then
    say "worker running on pool '$PRIVRELEASE_WORK_POOL' (pid $(cat "$PIDFILE"))"
  else
    say "no worker running on pool '$PRIVRELEASE_WORK_POOL' ($PIDFILE)"
    exit 1
  fi
  ;;
foreground)
  prepare
  exec "${worker_command[@]}" "$@"
  ;;
run-once)
  prepare
  exec "${worker_command[@]}" --run-once "$@"
  ;;
*)
  die "unknown action '$action'; use start, stop, status, foreground or run-once"
  ;;
esac
