#!/usr/bin/env bash
# One command from nothing to a running server on the default model: bash scripts/serve.sh [serve flags]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/tokenwire serve "$@"
