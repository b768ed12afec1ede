"""Time the attention kernels on realistic shapes (CUDA only): python -m kernels.bench

Decode reports achieved GB/s (K/V bytes read + q read + out written) beside the GB/s of a
large device-to-device copy (read + write) on the same GPU, and their ratio; prefill
reports TFLOP/s of causal attention (4 * visible query-key pairs * H * D). Times are
triton.testing.do_bench medians (L2 flushed between runs).
"""

import argparse
from dataclasses import dataclass

import torch
from triton.testing import do_bench

from kernels.paged_decode_attention import (PROGRAMS_PER_SM, paged_decode_attention,
                                           split_num_partitions)
from kernels.paged_prefill_attention import paged_prefill_attention


@dataclass(frozen=True)
class Shape:
    """One model's attention shape and a batch of equal-length contexts."""

    name: str
    batch: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    context: int
    block_size: int = 16


DECODE_SHAPES = [
    Shape("Llama-3.2-1B decode", 256, 32, 8, 64, 768),
    Shape("SmolLM2-135M decode", 256, 9, 3, 64, 768),
    Shape("Llama-3.2-1B decode, long", 16, 32, 8, 64, 8192),
    Shape("head_dim 128 decode", 128, 32, 8, 128, 1024),
]
PREFILL_SHAPES = [
    Shape("Llama-3.2-1B prefill", 8, 32, 8, 64, 1024),
    Shape("SmolLM2-135M prefill", 8, 9, 3, 64, 1024),
    Shape("head_dim 128 prefill", 4, 32, 8, 128, 2048),
]


def paged_inputs(s: Shape, num_queries: int, dtype=torch.bfloat16):
    """Random q and caches; each sequence's blocks scattered through the pool."""
    blocks_per_seq = -(-s.context // s.block_size)
    pool = s.batch * blocks_per_seq
    shape = (pool, s.block_size, s.num_kv_heads, s.head_dim)
    k_cache = torch.randn(shape, dtype=dtype, device="cuda")
    v_cache = torch.randn(shape, dtype=dtype, device="cuda")
    tables = torch.randperm(pool, device="cuda").view(s.batch, blocks_per_seq).int()
    seq_lens = torch.full((s.batch,), s.context, dtype=torch.int32, device="cuda")
    q = torch.randn(num_queries, s.num_heads, s.head_dim, dtype=dtype, device="cuda")
    return q, k_cache, v_cache, tables, seq_lens


def copy_gbps(num_bytes: int = 1 << 30) -> float:
    src = torch.empty(num_bytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), return_mode="median")
    return 2 * num_bytes / ms / 1e6


def auto_num_partitions(s: Shape) -> int:
    """The count the engine's TritonAttention picks for this shape on this GPU."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return split_num_partitions(s.batch, s.num_kv_heads, s.context, PROGRAMS_PER_SM * sms)


def bench_decode(s: Shape, num_partitions: int, copy: float) -> None:
    q, k_cache, v_cache, tables, seq_lens = paged_inputs(s, s.batch)
    out = torch.empty_like(q)
    ms = do_bench(lambda: paged_decode_attention(q, k_cache, v_cache, tables, seq_lens,
                                                 s.head_dim ** -0.5, out=out,
                                                 num_partitions=num_partitions),
                  return_mode="median")
    kv_bytes = 2 * s.batch * s.context * s.num_kv_heads * s.head_dim * k_cache.element_size()
    gbps = (kv_bytes + 2 * q.numel() * q.element_size()) / ms / 1e6
    print(f"{s.name:28s} B={s.batch} H={s.num_heads} Hkv={s.num_kv_heads} D={s.head_dim} "
          f"ctx={s.context} parts={num_partitions}: {ms * 1e3:8.1f} us  {gbps:7.0f} GB/s  "
          f"{gbps / copy:5.2f} x copy")


def bench_prefill(s: Shape) -> None:
    q, k_cache, v_cache, tables, seq_lens = paged_inputs(s, s.batch * s.context)
    starts = torch.arange(0, s.batch + 1, device="cuda", dtype=torch.int32) * s.context
    out = torch.empty_like(q)
    ms = do_bench(lambda: paged_prefill_attention(q, k_cache, v_cache, tables, starts, seq_lens,
                                                  s.head_dim ** -0.5, out=out),
                  return_mode="median")
    pairs = s.batch * s.context * (s.context + 1) // 2  # causal query-key pairs
    tflops = 4 * pairs * s.num_heads * s.head_dim / ms / 1e9
    print(f"{s.name:28s} B={s.batch} H={s.num_heads} Hkv={s.num_kv_heads} D={s.head_dim} "
          f"q_len=ctx={s.context}: {ms * 1e3:8.1f} us  {tflops:6.1f} TFLOP/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-partitions", type=int, nargs="+", default=[],
                        help="decode split-KV partition counts to time besides the "
                             "engine's automatic choice")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("kernels.bench needs a CUDA GPU")
    copy = copy_gbps()
    print(f"{torch.cuda.get_device_name()}: device-to-device copy {copy:.0f} GB/s")
    for shape in DECODE_SHAPES:
        for num_partitions in dict.fromkeys([auto_num_partitions(shape)] + args.num_partitions):
            bench_decode(shape, num_partitions, copy)
    for shape in PREFILL_SHAPES:
        bench_prefill(shape)


if __name__ == "__main__":
    main()
