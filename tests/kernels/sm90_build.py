"""Compile every kernel for sm_90 (H100) without a GPU, in every variant the engine
launches (bf16 and fp32; decode split and direct, merge, prefill; D=16 and real head
sizes); print a table of ptxas registers and spill bytes and Triton's shared memory per
case to stderr, and the same as JSON to stdout. Run as a script, with TRITON_INTERPRET
unset (compiled mode). The interpreter accepts code that the compiler rejects: this
catches that in CI."""

import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import kernels.paged_decode_attention as decode
import kernels.paged_prefill_attention as prefill
import kernels.rms_norm as rms_norm
import kernels.rotary as rotary
import kernels.silu_and_mul as silu_and_mul
import kernels.store_kv_cache as store_kv_cache

TYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
POINTERS = {"block_tables_ptr": "*i32", "seq_lens_ptr": "*i32", "query_start_loc_ptr": "*i32",
            "part_acc_ptr": "*fp32", "part_max_ptr": "*fp32", "part_sum_ptr": "*fp32",
            "slot_mapping_ptr": "*i64", "positions_ptr": "*i64"}
FLOATS = {"qk_scale", "eps"}
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def signature(fn, dtype, constexprs: dict) -> dict:
    def kind(name):
        if name in constexprs:
            return "constexpr"
        if name.endswith("_ptr"):
            return POINTERS.get(name, "*" + TYPE_NAMES[dtype])
        return "fp32" if name in FLOATS else "i32"
    return {name: kind(name) for name in fn.arg_names}


def build(fn, dtype, constexprs: dict, num_warps: int = 4) -> dict:
    """ptxas's registers and spill stores, and the shared memory Triton asks at launch."""
    src = ASTSource(fn=fn, signature=signature(fn, dtype, constexprs), constexprs=constexprs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(kernel.asm["ptx"])
        ptx.flush()
        log = subprocess.run([PTXAS, "-v", "--gpu-name=sm_90a", ptx.name, "-o", os.devnull],
                             capture_output=True, text=True, check=True).stderr
    return {"registers": int(re.search(r"Used (\d+) registers", log).group(1)),
            "spill_bytes": int(re.search(r"(\d+) bytes spill stores", log).group(1)),
            "shared_bytes": kernel.metadata.shared, "num_warps": num_warps}


# (heads, kv_heads, head_dim) of the shapes the engine runs: dummy:tiny (the CPU tests' D=16),
# SmolLM2-135M, Qwen2.5-0.5B (group 7, padded), Llama-3.2-1B, Llama-3-8B (D=128).
ATTENTION_SHAPES = ((4, 2, 16), (9, 3, 64), (14, 2, 64), (32, 8, 64), (32, 8, 128))
DTYPES = (torch.bfloat16, torch.float32)  # the engine's CUDA default, and the parity runs'


def cases():
    """(name, jit fn, dtype, constexprs, num_warps) as the wrappers launch them."""
    for dtype in DTYPES:
        yield from attention_cases(dtype)
        yield from pointwise_cases(dtype)


def attention_cases(dtype):
    t = TYPE_NAMES[dtype]
    for heads, kv_heads, dim in ATTENTION_SHAPES:
        shape = f"H{heads}/{kv_heads} D{dim}"
        for direct in (False, True):
            yield (f"decode {t} {shape} direct={direct}", decode._decode_partition_kernel,
                   dtype, decode.partition_constexprs(heads, kv_heads, dim, 16, 256, direct,
                                                      dtype), 4)
        yield (f"merge {t} {shape}", decode._decode_merge_kernel, dtype,
               decode.merge_constexprs(heads, dim, 16, 256), 4)
        yield (f"prefill {t} {shape}", prefill._prefill_kernel, dtype,
               prefill.prefill_constexprs(heads, kv_heads, dim, 16, dtype), prefill.NUM_WARPS)


def pointwise_cases(dtype):
    t = TYPE_NAMES[dtype]
    yield (f"store_kv_cache {t}", store_kv_cache._store_kv_cache_kernel, dtype,
           dict(NUM_KV_HEADS=8, HEAD_DIM=64, BLOCK_H=8), 4)
    yield (f"rms_norm fused {t}", rms_norm._rms_norm_kernel, dtype,
           dict(N=2048, BLOCK=2048, HAS_RESIDUAL=True), 8)
    yield (f"rotary {t}", rotary._rotary_kernel, dtype,
           dict(NUM_HEADS=32, NUM_KV_HEADS=8, HEADS_PAD=32, KV_HEADS_PAD=8, HALF=32), 4)
    yield (f"silu_and_mul {t}", silu_and_mul._silu_and_mul_kernel, dtype, dict(BLOCK=1024), 4)


def table(report: dict) -> str:
    rows = [f"{'kernel':44} {'regs':>5} {'spill B':>8} {'smem B':>8} {'warps':>5}"]
    rows += [f"{name:44} {r['registers']:5} {r['spill_bytes']:8} {r['shared_bytes']:8} "
             f"{r['num_warps']:5}" for name, r in report.items()]
    return "\n".join(rows)


if __name__ == "__main__":
    if triton.knobs.runtime.interpret:
        sys.exit("run with TRITON_INTERPRET unset: the interpreter does not compile")
    result = {name: build(fn, dtype, ce, warps) for name, fn, dtype, ce, warps in cases()}
    print(table(result), file=sys.stderr)  # for people; the JSON below is for the test
    print(json.dumps(result))
