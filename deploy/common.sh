# shellcheck shell=bash
# Sourced by deploy/server.sh, work-pool.sh, deploy.sh and worker.sh: paths and defaults, each
# overridable from the environment. Not a script of its own.
#
#   PRIVRELEASE_REPO          the checkout (default: the folder above deploy/); flow runs start here
#   PRIVRELEASE_PREFECT_PORT  port of the local server that deploy/server.sh starts (default 4200)
#   PREFECT_API_URL           the Prefect API (default: that local server, http://127.0.0.1:PORT/api)
#   PREFECT_HOME              Prefect's files: the local server's SQLite database, logs, pid files
#                             (default: <repo>/privrelease-work/prefect; kept 0700)
#   PREFECT_API_AUTH_STRING   the API's auth string (Prefect's basic authentication); for the local
#                             server, default: the content of $PREFECT_HOME/api-auth (0600), made
#                             with a random string the first time: server.sh starts the server with
#                             it (PREFECT_SERVER_API_AUTH_STRING), the other scripts send it
#   PRIVRELEASE_WORK_POOL     the process work pool (default privrelease-process, as in prefect.yaml)
#   PRIVRELEASE_PREFECT_FILE  the deployments (default <repo>/deploy/prefect.yaml)
#   PRIVRELEASE_PREFECT_START_TIMEOUT  seconds to wait for the local server to answer (default 120)
#
# Only the environment is read: a PREFECT_API_URL kept in a Prefect profile is not consulted
# (export it instead).

set -euo pipefail

DEPLOY_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PRIVRELEASE_REPO="${PRIVRELEASE_REPO:-$(cd "$DEPLOY_DIR/.." && pwd)}"
export PRIVRELEASE_REPO
PRIVRELEASE_PREFECT_PORT="${PRIVRELEASE_PREFECT_PORT:-4200}"
LOCAL_API_URL="http://127.0.0.1:${PRIVRELEASE_PREFECT_PORT}/api"
export PREFECT_API_URL="${PREFECT_API_URL:-$LOCAL_API_URL}"
export PREFECT_HOME="${PREFECT_HOME:-$PRIVRELEASE_REPO/privrelease-work/prefect}"
export PREFECT_SERVER_ANALYTICS_ENABLED="${PREFECT_SERVER_ANALYTICS_ENABLED:-false}"
PRIVRELEASE_WORK_POOL="${PRIVRELEASE_WORK_POOL:-privrelease-process}"
PRIVRELEASE_PREFECT_FILE="${PRIVRELEASE_PREFECT_FILE:-$DEPLOY_DIR/prefect.yaml}"
PRIVRELEASE_PREFECT_START_TIMEOUT="${PRIVRELEASE_PREFECT_START_TIMEOUT:-120}"

say() { echo "privrelease deploy: $*" >&2; }
die() {
  echo "privrelease deploy: error: $*" >&2
  exit 1
}

# PREFECT_HOME holds the local server's database (every flow run's parameters, logs, artifacts) and
# its auth string: private to this account.
mkdir -p "$PREFECT_HOME" && chmod 700 "$PREFECT_HOME" ||
  die "cannot make PREFECT_HOME=$PREFECT_HOME a folder private to this account (mode 0700)"
AUTH_FILE="$PREFECT_HOME/api-auth"
if [[ -z "${PREFECT_API_AUTH_STRING:-}" && "${PREFECT_API_URL%/}" == "$LOCAL_API_URL" ]]; then
  if [[ ! -s "$AUTH_FILE" ]]; then
    (umask 077 && head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$AUTH_FILE") ||
      die "cannot write the API auth string to $AUTH_FILE"
  fi
  PREFECT_API_AUTH_STRING="$(cat "$AUTH_FILE")"
fi
export PREFECT_API_AUTH_STRING="${PREFECT_API_AUTH_STRING:-}"
[[ -n "$PREFECT_API_AUTH_STRING" ]] || unset PREFECT_API_AUTH_STRING

# The project's virtual environment first, then PATH (PREFECT and PYTHON are used by the scripts).
# shellcheck disable=SC2034
if [[ -x "$PRIVRELEASE_REPO/.venv/bin/prefect" ]]; then
  PREFECT="$PRIVRELEASE_REPO/.venv/bin/prefect"
  PYTHON="$PRIVRELEASE_REPO/.venv/bin/python"
elif command -v prefect >/dev/null 2>&1; then
  PREFECT="$(command -v prefect)"
  PYTHON="$(command -v python3 || command -v python)"
else
  die "the prefect command was found neither in $PRIVRELEASE_REPO/.venv/bin nor on PATH; run 'make setup' in $PRIVRELEASE_REPO (or activate the environment privrelease is installed in)"
fi

# api_healthy [URL]: 0 when GET URL/health answers 200 within 3 s (a local server is up).
api_healthy() {
  "$PYTHON" - "${1:-$PREFECT_API_URL}" <<'PY'
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1].rstrip("/") + "/health", timeout=3) as answer:
        sys.exit(0 if answer.status == 200 else 1)
except Exception:
    sys.exit(1)
PY
}

# api_answers [URL]: 0 when anything answers HTTP at URL/health within 5 s (an error status too:
# an API behind authentication answers 401 without a key, and is reachable).
api_answers() {
  "$PYTHON" - "${1:-$PREFECT_API_URL}" <<'PY'
import sys, urllib.error, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1].rstrip("/") + "/health", timeout=5):
        pass
except urllib.error.HTTPError:
    pass
except Exception:
    sys.exit(1)
PY
}

# require_api: stop with a clear message when the Prefect API does not answer.
require_api() {
  api_answers || die "Prefect's API at $PREFECT_API_URL does not answer (GET $PREFECT_API_URL/health): start the local server with deploy/server.sh, or export PREFECT_API_URL=<your server>/api"
}

# alive PIDFILE: 0 when the pid file names a running process.
alive() {
  [[ -s "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

# stop_group NAME PIDFILE [SECONDS]: SIGTERM the process group the pid file names, SIGKILL after
# SECONDS (default 20).
stop_group() {
  local name="$1" pidfile="$2" grace="${3:-20}" pid
  if ! alive "$pidfile"; then
    rm -f "$pidfile"
    say "no $name started by these scripts is running ($pidfile)"
    return 0
  fi
  pid="$(cat "$pidfile")"
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1 $((grace * 10))); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then
    say "$name (pid $pid) did not stop within $grace s: killing it"
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$pidfile"
  say "stopped the $name (pid $pid)"
}

# start_detached PIDFILE LOGFILE COMMAND...: run COMMAND in a session of its own (so stop_group
# ends it and its children), stdin closed, output appended to LOGFILE; writes its pid.
start_detached() {
  local pidfile="$1" logfile="$2"
  shift 2
  command -v setsid >/dev/null 2>&1 || die "setsid (util-linux) is missing: install it, or run the foreground variant of this command"
  mkdir -p "$(dirname "$pidfile")" "$(dirname "$logfile")"
  setsid "$@" </dev/null >>"$logfile" 2>&1 &
  echo "$!" >"$pidfile"
}
