#!/usr/bin/env bash
# Build llama.cpp's llama-server, the peer of `tokenwire bench --peer llama.cpp`, from the
# source vendored in PyPI's llama-cpp-python sdist, cached outside the repo. Idempotent:
# prints the binary's path; a second run finds it built.
#
#   bash scripts/build_llama_server.sh            # -> ~/.cache/tokenwire/llama.cpp/.../llama-server
#
# ISA flags are named one by one (GGML_NATIVE=OFF): a GGML_NATIVE=ON build can segfault
# (docs/quantization.md), and named flags build the same binary on every host. Set
# LLAMA_ISA_FLAGS to override (say, "-DGGML_AVX512=OFF ..." for a CPU without AVX-512).
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="${TOKENWIRE_CACHE_DIR:-$HOME/.cache/tokenwire}/llama.cpp"
SRC="$ROOT/llama_cpp_python-$VERSION/vendor/llama.cpp"
BUILD="$ROOT/build-$VERSION"
BIN="$BUILD/bin/llama-server"
if [ -x "$BIN" ]; then echo "$BIN"; exit 0; fi
mkdir -p "$ROOT"
PY="${PYTHON:-$(dirname "$0")/../.venv/bin/python}"
[ -x "$PY" ] || PY=python3
if [ ! -d "$SRC" ]; then
  "$PY" -m pip download --no-deps --no-binary :all: --dest "$ROOT" \
    "llama-cpp-python==$VERSION" >&2
  tar -xzf "$ROOT/llama_cpp_python-$VERSION.tar.gz" -C "$ROOT"
fi
ISA_FLAGS="${LLAMA_ISA_FLAGS:--DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
-DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON -DGGML_AMX_TILE=OFF \
-DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF}"
# shellcheck disable=SC2086
cmake -S "$SRC" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
  $ISA_FLAGS -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >&2
cmake --build "$BUILD" --target llama-server -j "${JOBS:-2}" >&2
echo "$BIN"
