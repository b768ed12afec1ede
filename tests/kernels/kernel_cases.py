"""Input builders and tolerances shared by the kernel tests.

Paged caches start as NaN and only the slots of live tokens get values, so a kernel that
reads a slot it should not (a partial block's tail, a gap block, a padding row) turns its
output into NaN. Block tables point at scattered blocks of a larger pool, leaving unused
gaps, and their unused entries hold an out-of-range block id that must never be read.
"""

import os

import pytest
import torch

RUN_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
TOLERANCE = {  # (atol, rtol) against the fp32 reference
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (2e-2, 2e-2),
}
UNUSED_BLOCK = 1 << 20


def gpu(test):
    """Mark a real-shape test: runs on CUDA with compiled Triton, skipped elsewhere."""
    reason = "needs CUDA and compiled Triton (TRITON_INTERPRET unset)"
    return pytest.mark.gpu(pytest.mark.skipif(not RUN_GPU, reason=reason)(test))


def randn(gen, *shape, dtype, device) -> torch.Tensor:
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)


def nan_like(t: torch.Tensor) -> torch.Tensor:
    """A NaN-poisoned output buffer: any element the kernel forgets to write stays NaN."""
    return torch.full_like(t, float("nan"))


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    atol, rtol = TOLERANCE[expected.dtype]
    assert actual.dtype == expected.dtype
    assert not actual.isnan().any(), "output has NaN (an element unwritten or a bad read)"
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)


def paged_kv(gen, seq_lens: list[int], block_size: int, num_kv_heads: int, head_dim: int,
             dtype, device, spare_blocks: int = 3, extra_cols: int = 2):
    """(k_cache, v_cache, block_tables int32, seq_lens int32) for sequences of seq_lens."""
    needed = [-(-n // block_size) for n in seq_lens]
    pool = sum(needed) + spare_blocks
    order = torch.randperm(pool, generator=gen)  # scattered ids; spare ones are gaps
    max_blocks = max(needed, default=0) + extra_cols
    tables = torch.full((len(seq_lens), max_blocks), UNUSED_BLOCK, dtype=torch.int32)
    shape = (pool, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(shape, float("nan"), dtype=dtype)
    v_cache = torch.full(shape, float("nan"), dtype=dtype)
    used = 0
    for b, n in enumerate(seq_lens):
        tables[b, :needed[b]] = order[used:used + needed[b]].int()
        used += needed[b]
        pos = torch.arange(n)
        blocks, offsets = tables[b, pos // block_size].long(), pos % block_size
        k_cache[blocks, offsets] = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
        v_cache[blocks, offsets] = torch.randn(n, num_kv_heads, head_dim, generator=gen).to(dtype)
    seq_lens_t = torch.tensor(seq_lens, dtype=torch.int32)
    return (k_cache.to(device), v_cache.to(device), tables.to(device), seq_lens_t.to(device))


def ragged(gen, seq_lens, q_lens, num_heads, num_kv_heads, head_dim, dtype, device,
           block_size, lead_rows=0):
    """Paged contexts plus q [lead_rows + sum(q_lens), H, D] and query_start_loc."""
    k_cache, v_cache, tables, lens = paged_kv(gen, seq_lens, block_size, num_kv_heads,
                                              head_dim, dtype, device)
    starts = torch.tensor([0] + q_lens).cumsum(0) + lead_rows
    q = randn(gen, lead_rows + sum(q_lens), num_heads, head_dim, dtype=dtype, device=device)
    return q, k_cache, v_cache, tables, starts.to(torch.int32).to(device), lens


def readable_by_torch_backend(k_cache, v_cache, tables):
    """The torch backend reads whole blocks up to the longest context, as the engine's
    tables allow (unused entries 0, every slot finite); it masks what it must not use.
    Undo paged_kv's NaN poison and out-of-range unused entries for it."""
    return (k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0),
            tables.where(tables < k_cache.shape[0], 0))


# Speculative decoding's verification steps: per sequence its last real token and 0-4
# proposed ones (1-5 queries, causal among themselves) over a cached context.
SPEC_SEQ_LENS = [300, 17, 64, 41, 5]
SPEC_Q_LENS = [5, 3, 1, 4, 2]


def verification_step(gen, num_heads: int, num_kv_heads: int, head_dim: int, scale: float):
    """A verification step's inputs (CPU, fp32, blocks of 16) with an earlier verification's
    rejected rows written past each context, and the reference output computed before
    they were written: (ragged args, expected)."""
    from kernels.paged_prefill_attention import paged_prefill_attention_ref

    args = ragged(gen, SPEC_SEQ_LENS, SPEC_Q_LENS, num_heads, num_kv_heads, head_dim,
                  torch.float32, "cpu", 16)
    expected = paged_prefill_attention_ref(*args, scale)
    _, k_cache, v_cache, tables, _, _ = args
    with_rejected_rows(gen, k_cache, v_cache, tables, SPEC_SEQ_LENS, 3)
    return args, expected


def with_rejected_rows(gen, k_cache, v_cache, tables, seq_lens: list[int], num_rejected: int):
    """Finite K/V (a verification's rejected proposed tokens, left in place by the rollback)
    in the num_rejected slots after each sequence's context, whose tables have room for
    them: a kernel must not read them. Returns the caches and tables with them written."""
    block_size = k_cache.shape[1]
    for b, n in enumerate(seq_lens):
        for p in range(n, n + num_rejected):
            block = int(tables[b, p // block_size])
            if block >= k_cache.shape[0]:  # past the sequence's blocks: nothing to write
                continue
            k_cache[block, p % block_size] = randn(gen, *k_cache.shape[2:], dtype=k_cache.dtype,
                                                   device=k_cache.device)
            v_cache[block, p % block_size] = randn(gen, *v_cache.shape[2:], dtype=v_cache.dtype,
                                                   device=v_cache.device)
    return k_cache, v_cache
