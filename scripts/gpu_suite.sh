#!/usr/bin/env bash
# The GPU proof, run on a lent H100 through the device tool (docs/gpu_proof.md).
# That machine has torch, transformers and triton but no internet: the kit that
# scripts/gpu_kit.py builds here travels in .carry/ (wheels, and the default model's
# tokenizer for dummy:NAME models, found through TOKENWIRE_CACHE_DIR).
#   usage: bash scripts/gpu_suite.sh tests          collection, gpu tests, small shapes on CUDA
#          bash scripts/gpu_suite.sh kernels        the attention kernels' bench
#          bash scripts/gpu_suite.sh bench MODEL    one dummy model per call (llama-3.2-1b, ...)
# Every step runs even if one before it failed; each step's full log is written to
# $OUT/STEP.log and its exit code to $OUT/summary.txt; the script exits 1 if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:?usage: gpu_suite.sh tests|kernels|bench MODEL}
case $what in
tests | kernels | bench) ;;
*) echo "unknown step set: $what (tests, kernels or bench MODEL)" >&2; exit 2 ;;
esac
out=${OUT:-$PWD/out}
kit=${GPU_KIT:-$PWD/.carry}
site=${GPU_KIT_SITE:-/tmp/tokenwire-kit}  # where the wheels are unpacked
mkdir -p "$out"
unset TRITON_INTERPRET  # compiled Triton on CUDA
export PYTHONUNBUFFERED=1 TOKENWIRE_CACHE_DIR=$kit/cache
shopt -s nullglob
wheels=("$kit"/wheels/*.whl)
if [ ${#wheels[@]} = 0 ]; then
    echo "no wheels in $kit/wheels: build the kit first (python scripts/gpu_kit.py)" >&2
    exit 1
fi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "${wheels[@]}"
export PYTHONPATH=$site:$PWD
failed=()

step() {  # step NAME CMD...: run CMD, its output to the screen and $OUT/NAME.log
    local name=$1 rc=0
    shift
    echo "=== $name: $*"
    "$@" 2>&1 | tee "$out/$name.log" || rc=$?
    echo "$name: exit $rc" | tee -a "$out/summary.txt"
    if [ "$rc" != 0 ]; then failed+=("$name"); fi
}

pytest_run() {  # -rs: a skipped test on the GPU machine is a finding, so say why
    python3 -m pytest -q -rs -p no:cacheprovider --timeout 480 "$@"
}

device() {  # the image's versions against what the kit's wheels need; what ran where
    local rc=0
    python3 scripts/gpu_kit.py --check-installed "$site" || rc=1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || rc=1
    python3 -c "import torch, triton, transformers; print(torch.__version__, \
triton.__version__, transformers.__version__, torch.cuda.get_device_name())" || rc=1
    return $rc
}

step device device
case $what in
tests)
    step gpu_tests pytest_run -m gpu tests
    if grep -q " skipped" "$out/gpu_tests.log"; then  # on the GPU machine none may skip
        echo "gpu_tests: some skipped (the SKIPPED lines in gpu_tests.log say why)" \
            | tee -a "$out/summary.txt"
        failed+=("gpu_tests_skipped")
    fi
    step cuda_small pytest_run -m "not gpu" tests/kernels/test_paged_decode_attention.py \
        tests/kernels/test_paged_prefill_attention.py tests/kernels/test_pointwise.py \
        tests/kernels/test_store_kv_cache.py tests/engine/test_triton_backend.py
    ;;
kernels)
    step kernels_bench python3 -m kernels.bench
    ;;
bench)
    model=${2:?usage: gpu_suite.sh bench MODEL (a dummy shape: llama-3.2-1b, smollm2-135m)}
    step "bench_$model" python3 -m gateway.cli bench --model "dummy:$model" --dtype bfloat16 \
        --num-prompts 256 --input-len 512 --output-len 256 --peers "${PEERS:-auto}" \
        --result-json "$out/bench_$model.json"
    ;;
esac
if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED: ${failed[*]}" | tee -a "$out/summary.txt"
    exit 1
fi
