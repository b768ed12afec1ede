#!/usr/bin/env bash
# guidellm (vLLM's benchmark tool) in its default streaming mode against a live
# `tokenwire serve` on the default model: TTFT and ITL as guidellm measures them.
# Not run in CI (guidellm and its dependencies are large); figures go in docs/benchmarks.md.
#
#   bash scripts/guidellm_bench.sh                 # starts a server on a free port, stops it
#   TARGET=http://127.0.0.1:8000 bash scripts/guidellm_bench.sh   # an already running one
#
# Knobs (environment): GUIDELLM_VERSION (0.8.1), PROFILE (synchronous), MAX_REQUESTS (20),
# DATA (prompt_tokens=128,output_tokens=64), OUT (out/guidellm), SERVE_FLAGS.
set -euo pipefail
cd "$(dirname "$0")/.."
GUIDELLM_VERSION=${GUIDELLM_VERSION:-0.8.1}
PROFILE=${PROFILE:-synchronous}
MAX_REQUESTS=${MAX_REQUESTS:-20}
DATA=${DATA:-prompt_tokens=128,output_tokens=64}
OUT=${OUT:-out/guidellm}
VENV=${GUIDELLM_VENV:-.tools/guidellm-venv}  # its own venv: its pins are not ours

if [ ! -x "$VENV/bin/guidellm" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "guidellm==$GUIDELLM_VERSION"
fi

# guidellm counts synthetic prompt tokens with the served model's tokenizer: the default
# model's files, as the engine caches them (no hub download).
PROCESSOR=$(.venv/bin/python -c "from engine.loader import default_model_dir; print(default_model_dir())")

server_pid=""
cleanup() { if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi; }
trap cleanup EXIT
if [ -z "${TARGET:-}" ]; then
  port=$(.venv/bin/python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
  TARGET="http://127.0.0.1:$port"
  # shellcheck disable=SC2086  # SERVE_FLAGS is a list of flags
  .venv/bin/python -m gateway.cli serve --port "$port" ${SERVE_FLAGS:-} > "${OUT}.serve.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 600); do
    curl -sf "$TARGET/ready" > /dev/null && break
    kill -0 "$server_pid" 2>/dev/null || { cat "${OUT}.serve.log"; exit 1; }
    sleep 0.5
  done
fi
curl -sf "$TARGET/ready" > /dev/null || { echo "server at $TARGET is not ready" >&2; exit 1; }

mkdir -p "$OUT"
"$VENV/bin/guidellm" run --backend "kind=openai_http,target=$TARGET" \
  --profile "kind=$PROFILE" --constraint "kind=max_requests,count=$MAX_REQUESTS" \
  --data "kind=synthetic_text,$DATA" --tokenizer "kind=huggingface_auto,model=$PROCESSOR" \
  --output "kind=json,path=$OUT/report.json" --output kind=console --disable-progress
echo "commit $(git rev-parse --short HEAD); CPU: $(lscpu | sed -n 's/^Model name: *//p')"
