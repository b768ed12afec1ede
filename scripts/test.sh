#!/usr/bin/env bash
# One command from nothing to the full CPU test suite: bash scripts/test.sh [pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
. .venv/bin/activate
# Triton kernels run under its interpreter on CPU tensors.
export TRITON_INTERPRET=1
# Unbuffered: a run cut off from outside still leaves its progress in the log.
export PYTHONUNBUFFERED=1
# The slowest tests are listed at the end, so a run that grew shows where.
exec python -m pytest -q --durations=30 "$@"
