"""Compile every kernel for sm_90 (H100) without a GPU; print JSON of ptxas register and
spill counts per case. Run as a script, with TRITON_INTERPRET unset (compiled mode).
The interpreter accepts code that the compiler rejects: this catches that in CI."""

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
    src = ASTSource(fn=fn, signature=signature(fn, dtype, constexprs), constexprs=constexprs)
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as ptx:
        ptx.write(kernel.asm["ptx"])
        ptx.flush()
        log = subprocess.run([PTXAS, "-v", "--gpu-name=sm_90a", ptx.name, "-o", os.devnull],
                             capture_output=True, text=True, check=True).stderr
    return {"registers": int(re.search(r"Used (\d+) registers", log).group(1)),
            "spill_bytes": int(re.search(r"(\d+) bytes spill stores", log).group(1))}


def cases():
    """(name, jit fn, dtype, constexprs, num_warps) as the wrappers launch them."""
    bf16 = torch.bfloat16
    for heads, kv_heads, dim in ((32, 8, 64), (9, 3, 64), (32, 8, 128)):
        for direct in (False, True):
            yield (f"decode H{heads}/{kv_heads} D{dim} direct={direct}", decode._decode_partition_kernel,
                   bf16, decode.partition_constexprs(heads, kv_heads, dim, 16, 256, direct, bf16), 4)
        yield (f"prefill H{heads}/{kv_heads} D{dim}", prefill._prefill_kernel, bf16,
               prefill.prefill_constexprs(heads, kv_heads, dim, 16, bf16), prefill.NUM_WARPS)
    yield ("decode fp32", decode._decode_partition_kernel, torch.float32,
           decode.partition_constexprs(32, 8, 64, 16, 256, False, torch.float32), 4)
    yield ("merge D128", decode._decode_merge_kernel, bf16,
           decode.merge_constexprs(32, 128, 16, 256), 4)
    yield ("store_kv_cache", store_kv_cache._store_kv_cache_kernel, bf16,
           dict(NUM_KV_HEADS=8, HEAD_DIM=64, BLOCK_H=8), 4)
    yield ("rms_norm fused", rms_norm._rms_norm_kernel, bf16,
           dict(N=2048, BLOCK=2048, HAS_RESIDUAL=True), 8)
    yield ("rotary", rotary._rotary_kernel, bf16,
           dict(NUM_HEADS=32, NUM_KV_HEADS=8, HEADS_PAD=32, KV_HEADS_PAD=8, HALF=32), 4)
    yield ("silu_and_mul", silu_and_mul._silu_and_mul_kernel, bf16, dict(BLOCK=1024), 4)


if __name__ == "__main__":
    if triton.knobs.runtime.interpret:
        sys.exit("run with TRITON_INTERPRET unset: the interpreter does not compile")
    print(json.dumps({name: build(fn, dtype, ce, warps) for name, fn, dtype, ce, warps in cases()}))
