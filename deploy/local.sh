#!/usr/bin/env bash
# N tokenwire replicas + Redis + HAProxy on this host, in the foreground; Ctrl-C drains
# the replicas and stops everything.
#   bash deploy/local.sh [N=3] [extra `tokenwire serve` flags]
# LB on :8000 (TOKENWIRE_LB_PORT), replicas on 8001.., Redis on 6379 (TOKENWIRE_REDIS_PORT).
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-3}; shift || true
[ "$n" -ge 1 ] && [ "$n" -le 3 ] || { echo "N: 1 to 3 (add server lines for more)" >&2; exit 2; }
lb=${TOKENWIRE_LB_PORT:-8000}; redis_port=${TOKENWIRE_REDIS_PORT:-6379}
tw=${TOKENWIRE:-.venv/bin/tokenwire}
pids=()
stop() { kill -TERM "${pids[@]}" 2>/dev/null || true; wait; }
trap stop EXIT INT TERM
redis-server --bind 127.0.0.1 --port "$redis_port" --save "" --appendonly no & pids+=($!)
export TOKENWIRE_LB_BIND=0.0.0.0:$lb
for i in 1 2 3; do
  # Unused server lines name replica 1 again: HAProxy needs an address for each.
  export TOKENWIRE_REPLICA_$i=127.0.0.1:$((lb + (i <= n ? i : 1)))
done
for i in $(seq 1 "$n"); do
  "$tw" serve --host 127.0.0.1 --port $((lb + i)) --instance-id "r$i" \
    --session-store "redis://127.0.0.1:$redis_port/0" "$@" & pids+=($!)
done
haproxy -db -f deploy/haproxy/haproxy.cfg & pids+=($!)
echo "tokenwire: ws://127.0.0.1:$lb/v1/ws through HAProxy to $n replicas (models loading)"
wait -n
