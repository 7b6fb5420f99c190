#!/usr/bin/env bash
# A local Prefect server on 127.0.0.1 (loopback only), its SQLite database under PREFECT_HOME.
#
#   deploy/server.sh [start]    start it in the background and wait until it answers (idempotent:
#                               a server these scripts started is left alone; any other server
#                               answering at the URL is refused, not reused)
#   deploy/server.sh stop       stop the server this script started
#   deploy/server.sh status     exit 0 when the API answers
#   deploy/server.sh foreground run it in the foreground (for systemd or a terminal)
#
# Port: PRIVRELEASE_PREFECT_PORT (default 4200). Log: $PREFECT_HOME/server.log. To use an existing
# Prefect server instead, do not run this script: export PREFECT_API_URL=<that server>/api.
# The API answers only requests carrying the auth string of $PREFECT_HOME/api-auth (common.sh; or
# PREFECT_API_AUTH_STRING): another local account reaches the port and gets 401 (only /api/health
# answers). Clients: export PREFECT_API_AUTH_STRING="$(cat $PREFECT_HOME/api-auth)".
# shellcheck source=deploy/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

PIDFILE="$PREFECT_HOME/server.pid"
LOGFILE="$PREFECT_HOME/server.log"
action="${1:-start}"

local_url_only() {
  [[ "${PREFECT_API_URL%/}" == "$LOCAL_API_URL" ]] ||
    die "PREFECT_API_URL is $PREFECT_API_URL, but this script serves $LOCAL_API_URL: unset PREFECT_API_URL (or set PRIVRELEASE_PREFECT_PORT) to run a local server; to use the server at $PREFECT_API_URL, do not start one"
}

port_free() {
  "$PYTHON" - "$PRIVRELEASE_PREFECT_PORT" <<'PY'
import socket, sys
with socket.socket() as probe:
    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: TIME_WAIT is no obstacle
    try:
        probe.bind(("127.0.0.1", int(sys.argv[1])))
    except OSError:
        sys.exit(1)
PY
}

export PREFECT_SERVER_API_AUTH_STRING="${PREFECT_API_AUTH_STRING:-}"
[[ -n "$PREFECT_SERVER_API_AUTH_STRING" ]] || unset PREFECT_SERVER_API_AUTH_STRING

case "$action" in
start)
  local_url_only
  if api_healthy; then
    alive "$PIDFILE" ||
      die "a Prefect server that these scripts did not start answers at $PREFECT_API_URL (another user's, or privrelease's own kept server: privrelease server status); not reusing it: stop it, choose another PRIVRELEASE_PREFECT_PORT, or export PREFECT_API_URL=$PREFECT_API_URL to deploy onto it on purpose"
    say "Prefect server already answering at $PREFECT_API_URL (pid $(cat "$PIDFILE"), started by these scripts)"
    exit 0
  fi
  if ! alive "$PIDFILE"; then
    port_free || die "port $PRIVRELEASE_PREFECT_PORT on 127.0.0.1 is in use by a program that is not a Prefect server answering at $PREFECT_API_URL: stop it or choose another PRIVRELEASE_PREFECT_PORT"
    mkdir -p "$PREFECT_HOME"
    start_detached "$PIDFILE" "$LOGFILE" "$PREFECT" server start --host 127.0.0.1 --port "$PRIVRELEASE_PREFECT_PORT"
    say "starting the Prefect server (pid $(cat "$PIDFILE"), home $PREFECT_HOME, log $LOGFILE)"
  else
    say "the Prefect server (pid $(cat "$PIDFILE")) is starting; waiting for it"
  fi
  began=$SECONDS
  until api_healthy; do
    if ! alive "$PIDFILE"; then
      rm -f "$PIDFILE"
      tail -n 20 "$LOGFILE" >&2 || true
      die "the Prefect server exited before it answered; its log: $LOGFILE"
    fi
    if ((SECONDS - began > PRIVRELEASE_PREFECT_START_TIMEOUT)); then
      die "the Prefect server did not answer at $PREFECT_API_URL within $PRIVRELEASE_PREFECT_START_TIMEOUT s (raise PRIVRELEASE_PREFECT_START_TIMEOUT); its log: $LOGFILE; stop it with: deploy/server.sh stop"
    fi
    sleep 0.2
  done
  say "Prefect server ready at $PREFECT_API_URL after $((SECONDS - began)) s (UI: ${PREFECT_API_URL%/api})"
  echo "export PREFECT_API_URL=$PREFECT_API_URL"
  [[ ! -s "$AUTH_FILE" ]] || echo "export PREFECT_API_AUTH_STRING=\"\$(cat '$AUTH_FILE')\""
  ;;
stop)
  stop_group "Prefect server" "$PIDFILE"
  ;;
status)
  if api_healthy; then
    say "Prefect API answering at $PREFECT_API_URL"
  else
    say "Prefect API not answering at $PREFECT_API_URL"
    exit 1
  fi
  ;;
foreground)
  local_url_only
  mkdir -p "$PREFECT_HOME"
  exec "$PREFECT" server start --host 127.0.0.1 --port "$PRIVRELEASE_PREFECT_PORT"
  ;;
*)
  die "unknown action '$action'; use start, stop, status or foreground"
  ;;
esac
