#!/usr/bin/env bash
# The GPU proof, run on a lent H100 through the device tool (docs/gpu_proof.md).
# That machine has torch, transformers and triton but no internet: the kit that
# scripts/gpu_kit.py builds here travels in .carry/ (wheels, and the default model's
# tokenizer for dummy:NAME models, found through TOKENWIRE_CACHE_DIR).
#   usage: bash scripts/gpu_suite.sh all            everything below in one call, by value
#          bash scripts/gpu_suite.sh tests          collection, gpu tests, small shapes on CUDA
#          bash scripts/gpu_suite.sh kernels        the attention kernels' bench
#          bash scripts/gpu_suite.sh bench MODEL    one dummy model per call (llama-3.2-1b, ...)
#          bash scripts/gpu_suite.sh compare        online vs offline, prefix cache off vs on
# Every step runs even if one before it failed; each step's full log is written to
# $OUT/STEP.log and its exit code to $OUT/summary.txt; the script exits 1 if any failed.
# SUITE_BUDGET_S (default 540, under the device tool's 600 s a command) bounds the whole
# call: a step gets what is left of it (less SUITE_RESERVE_S, default 15, to write the
# summary) and is stopped there; a step with under SUITE_MIN_STEP_S (default 30) left is
# not started. Either is a failure in the summary. (The tests set all three small.)
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:?usage: gpu_suite.sh all|tests|kernels|bench MODEL|compare}
case $what in
all | tests | kernels | bench | compare) ;;
*) echo "unknown step set: $what (all, tests, kernels, bench MODEL or compare)" >&2; exit 2 ;;
esac
deadline=$((SECONDS + ${SUITE_BUDGET_S:-540}))
reserve=${SUITE_RESERVE_S:-15} min_step=${SUITE_MIN_STEP_S:-30}
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

step() {  # step NAME CMD...: CMD within the budget, output to the screen and $OUT/NAME.log
    local name=$1 rc=0 left=$((deadline - SECONDS - reserve)) limit=()
    shift
    if ! declare -F "$1" >/dev/null; then  # this script's own functions (device) are quick
        if [ "$left" -lt "$min_step" ]; then
            echo "$name: not started, ${left}s of the budget left" | tee -a "$out/summary.txt"
            failed+=("$name")
            return
        fi
        limit=(timeout -s INT -k 10 "$left")
    fi
    echo "=== $name${limit:+ (at most ${left}s)}: $*"
    "${limit[@]}" "$@" 2>&1 | tee "$out/$name.log" || rc=$?
    if [ "$rc" = 124 ]; then
        echo "$name: stopped at the budget after ${left}s" | tee -a "$out/summary.txt"
    else
        echo "$name: exit $rc" | tee -a "$out/summary.txt"
    fi
    if [ "$rc" != 0 ]; then failed+=("$name"); fi
}

# -rs: a skipped test on the GPU machine is a finding, so say why. --timeout: one hung test
# (a graph capture, say) fails alone instead of spending the whole call's budget.
PYTEST=(python3 -m pytest -q -rs -p no:cacheprovider --timeout 180)

device() {  # the image's versions against what the kit's wheels need; what ran where
    local rc=0
    python3 scripts/gpu_kit.py --check-installed "$site" || rc=1
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv || rc=1
    python3 -c "import torch, triton, transformers; print(torch.__version__, \
triton.__version__, transformers.__version__, torch.cuda.get_device_name())" || rc=1
    return $rc
}

gpu_tests() {
    step gpu_tests "${PYTEST[@]}" -m gpu tests
    if grep -q " skipped" "$out/gpu_tests.log" 2>/dev/null; then  # on the GPU none may skip
        echo "gpu_tests: some skipped (the SKIPPED lines in gpu_tests.log say why)" \
            | tee -a "$out/summary.txt"
        failed+=("gpu_tests_skipped")
    fi
}

cuda_small() {
    step cuda_small "${PYTEST[@]}" -m "not gpu" tests/kernels/test_paged_decode_attention.py \
        tests/kernels/test_paged_prefill_attention.py tests/kernels/test_pointwise.py \
        tests/kernels/test_store_kv_cache.py tests/engine/test_triton_backend.py
}

bench() {  # bench MODEL [JSON]: tokenwire bench with the HF peers on dummy:MODEL
    local json=()
    if [ -n "${2:-}" ]; then json=(--result-json "$2"); fi
    step "bench_$1" python3 -m gateway.cli bench --model "dummy:$1" --dtype bfloat16 \
        --num-prompts 256 --input-len 512 --output-len 256 --peers "${PEERS:-auto}" "${json[@]}"
}

compare() {  # online vs offline, then the prefix cache, on the 1B shape: both run, either fails
    step compare bash -c 'python3 -m loadtest.compare offline --model dummy:llama-3.2-1b \
        --device cuda --dtype bfloat16 --concurrency 64,256 --input-len 512 --output-len 256
        offline=$?
        python3 -m loadtest.compare prefix-cache --model dummy:llama-3.2-1b \
        --device cuda --dtype bfloat16 --history-len 2048 --turns 3 && exit $offline'
}

step device device
case $what in
all)  # most telling first; 8 logs, the most files a device call brings back
    gpu_tests
    bench llama-3.2-1b
    step kernels_bench python3 -m kernels.bench
    bench smollm2-135m
    compare
    cuda_small
    ;;
tests)
    gpu_tests
    cuda_small
    ;;
kernels)
    step kernels_bench python3 -m kernels.bench
    ;;
bench)
    model=${2:?usage: gpu_suite.sh bench MODEL (a dummy shape: llama-3.2-1b, smollm2-135m)}
    bench "$model" "$out/bench_$model.json"
    ;;
compare)
    compare
    ;;
esac
if [ ${#failed[@]} -gt 0 ]; then
    echo "FAILED: ${failed[*]}" | tee -a "$out/summary.txt"
    exit 1
fi
