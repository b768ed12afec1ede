#!/usr/bin/env bash
# N tokenwire replicas + Redis + HAProxy on this host, in the foreground. A replica that
# dies is started again (after 1 s, doubling to 30 s while it keeps dying young) and the
# others serve on; Ctrl-C or SIGTERM drains every replica, then stops HAProxy and Redis.
#   bash deploy/local.sh [N=3] [extra `tokenwire serve` flags]
# Environment: TOKENWIRE_LB_PORT (8000; replicas on the ports after it),
# TOKENWIRE_LB_HOST (0.0.0.0), TOKENWIRE_REDIS_PORT (6379), TOKENWIRE_TLS_CERT (a PEM:
# HAProxy speaks TLS), TOKENWIRE_RUN_DIR (HAProxy's config and admin socket; default a
# new temporary directory, removed at exit).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-3}; shift || true
[[ "$n" =~ ^[1-9][0-9]*$ ]] || { echo "N: a positive number of replicas" >&2; exit 2; }
lb=${TOKENWIRE_LB_PORT:-8000}; redis_port=${TOKENWIRE_REDIS_PORT:-6379}
tw=${TOKENWIRE:-.venv/bin/tokenwire}
if [ -n "${TOKENWIRE_RUN_DIR:-}" ]; then run=$TOKENWIRE_RUN_DIR; mkdir -p "$run"
else run=$(mktemp -d); trap 'rm -rf "$run"' EXIT; fi

# One replica, started again whenever it exits until this subshell gets SIGTERM, which
# it passes on (a second one skips the replica's drain wait). setsid: Ctrl-C reaches only
# this script, which drains the replicas before it stops what they depend on.
supervise() {
  local i=$1 delay=1 child="" started rc stopping=""; shift
  trap 'stopping=1; [ -z "$child" ] || kill -TERM "$child" 2>/dev/null' TERM
  trap "" HUP  # a closed terminal is the main script's to handle
  while [ -z "$stopping" ]; do
    started=$SECONDS
    setsid "$tw" serve --host 127.0.0.1 --port $((lb + i)) --instance-id "r$i" \
      --session-store "redis://127.0.0.1:$redis_port/0" "$@" & child=$!
    # wait returns early when a trapped signal arrives; the replica is still draining
    rc=0; wait "$child" || rc=$?
    while kill -0 "$child" 2>/dev/null; do rc=0; wait "$child" || rc=$?; done
    child=""
    [ -z "$stopping" ] || break
    (( SECONDS - started < 60 )) || delay=1
    echo "local.sh: replica r$i exited (status $rc); starting it again in ${delay}s" >&2
    sleep "$delay" & child=$!
    wait "$child" || true; child=""
    delay=$(( delay < 16 ? delay * 2 : 30 ))
  done
}

# Waits out every pid given, through interruptions by trapped signals.
wait_all() {
  local pid
  for pid; do while kill -0 "$pid" 2>/dev/null; do wait "$pid" || true; done; done
}

# Replicas first, so their in-flight turns still reach Redis and their `draining` frames
# still reach clients through HAProxy. Another Ctrl-C meanwhile cuts the drains short.
stop() {
  trap 'kill -TERM "${supervisors[@]}" 2>/dev/null || true' INT TERM HUP
  echo "local.sh: draining ${#supervisors[@]} replicas" >&2
  kill -TERM "${supervisors[@]}" 2>/dev/null || true
  wait_all "${supervisors[@]}"
  kill -TERM "${services[@]}" 2>/dev/null || true
  wait_all "${services[@]}"
  exit "$1"
}

supervisors=(); services=(); signalled=""
# Only noted here: stop() runs outside the trap, where a second signal can interrupt it.
trap 'signalled=1' INT TERM HUP
setsid redis-server --bind 127.0.0.1 --port "$redis_port" --dir "$run" \
  --save "" --appendonly no & services+=($!)
{ cat deploy/haproxy/haproxy.cfg
  for i in $(seq 1 "$n"); do echo "    server r$i 127.0.0.1:$((lb + i))"; done
  printf '\nglobal\n    stats socket %s/admin.sock level admin\n' "$run"
} > "$run/haproxy.cfg"
export TOKENWIRE_LB_BIND=${TOKENWIRE_LB_HOST:-0.0.0.0}:$lb
setsid haproxy -db -f "$run/haproxy.cfg" & services+=($!)
for i in $(seq 1 "$n"); do
  supervise "$i" "$@" & supervisors+=($!)
done
scheme=ws; [ -z "${TOKENWIRE_TLS_CERT:-}" ] || scheme=wss
echo "tokenwire: $scheme://127.0.0.1:$lb/v1/ws through HAProxy to $n replicas (models" \
  "loading); HAProxy's admin socket: $run/admin.sock"
# A signal, or the end of Redis or HAProxy (the cluster cannot serve without either),
# ends this wait.
[ -n "$signalled" ] || wait -n "${services[@]}" || true
[ -n "$signalled" ] || { echo "local.sh: redis-server or haproxy exited" >&2; stop 1; }
stop 0
