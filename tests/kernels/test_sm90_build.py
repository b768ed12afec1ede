"""Every kernel compiles for sm_90 (H100) with ptxas, in every variant the engine launches
(bf16 and fp32; decode split and direct, merge, prefill; D=16 and real head sizes), and
spills no registers and fits the shared memory of one block, without a GPU.

The interpreter runs code the compiler rejects (and cannot show register pressure), so
this builds each kernel as its wrapper launches it; see sm90_build.py, which also prints
the table (`python tests/kernels/sm90_build.py` with TRITON_INTERPRET unset).
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
SCRIPT = HERE / "sm90_build.py"
REPO = HERE.parent.parent
H100_SHARED_PER_BLOCK = 227 * 1024  # bytes, with the opt-in Triton makes
SHAPES = ("H4/2 D16", "H9/3 D64", "H14/2 D64", "H32/8 D64", "H32/8 D128")


@pytest.fixture(scope="module")
def report() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, str(SCRIPT)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    print(done.stderr)  # the table, shown with -s
    return json.loads(done.stdout)


@pytest.mark.timeout(600)
def test_every_variant_is_built(report):
    for dtype in ("bf16", "fp32"):
        for shape in SHAPES:
            for kernel in ("decode {} {} direct=False", "decode {} {} direct=True",
                           "merge {} {}", "prefill {} {}"):
                assert kernel.format(dtype, shape) in report
        for kernel in ("store_kv_cache", "rms_norm fused", "rotary", "silu_and_mul"):
            assert f"{kernel} {dtype}" in report


def test_no_variant_spills_registers(report):
    spilled = {name: r for name, r in report.items() if r["spill_bytes"]}
    assert not spilled, f"register spills on sm_90: {spilled}"


def test_every_variant_fits_a_blocks_shared_memory(report):
    over = {name: r["shared_bytes"] for name, r in report.items()
            if r["shared_bytes"] > H100_SHARED_PER_BLOCK}
    assert not over, f"more shared memory than an H100 block has: {over}"


def test_16_bit_attention_tiles_leave_room_for_several_programs(report):
    heavy = {name: r["registers"] for name, r in report.items()
             if name.startswith(("decode bf16", "prefill bf16")) and r["registers"] > 192}
    assert not heavy, f"more registers than the tile sizes were chosen for: {heavy}"
