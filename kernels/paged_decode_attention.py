"""Paged decode attention, split-KV (flash-decoding): one query token per sequence.

    context of sequence b (ctx = seq_lens[b] tokens, in blocks listed by block_tables[b]):
    | unseen (window) |<- partition 0 ->| ... |<- partition L-1 ->|   L live of P launched
      tiles of BLOCK_N tokens; token n lives at slot block_tables[b, n // bs] * bs + n % bs
    With a sliding window W > 0 only the last W tokens are seen (and read): the span
    [max(0, ctx - W), ctx) is what the partitions split; W = 0 sees the whole context.

    P (the grid's third dim) comes from shapes; each sequence splits its own ctx at run
    time into L = min(P, cdiv(ctx, MIN_PARTITION)) partitions of equal length (rounded up
    to BLOCK_N), so short contexts are not cut finer than MIN_PARTITION and long ones use
    all P, whatever the block table's width.
    pass 1, grid (B, Hkv, P): all GROUP = H / Hkv query heads of one kv head share each K/V
            tile read; a program whose partition starts at or past ctx exits at once.
            Writes unnormalised acc [GROUP, D], running max m and sum l (log2 space).
    pass 2, grid (B, H): log-sum-exp merge of the live partitions.
When P == 1, pass 1 normalises and writes the output itself (no pass 2).
The grid and compile-time parameters depend only on tensor shapes, never on seq_lens
values, so a launch is CUDA-graph capturable, and a table width that changes from step
to step compiles no new variant (its integer arguments are not specialised).
"""

import math

import torch
import triton
import triton.language as tl

from kernels._attention_tile import load_kv_tile, online_softmax_step
from kernels._paged import gather_kv
from kernels._checks import (check_dim, check_head_dim, check_kv_cache, check_same,
                             check_tensor, dot_precision)

# Tokens per K/V tile = KV_TILE_ELEMS // head_dim (32 at D=64, 16 at D=128): the gathered
# tiles' addresses cost registers, and these sizes keep the kernel near 110 registers on
# sm_90 (several programs per SM in flight) where 64-token tiles need 200+ or spill.
KV_TILE_ELEMS = 2048
# Shortest partition worth a program of its own and a merge: 256 tokens of K and V are
# 64 KiB at D=64 in bf16, far more than the merge pass reads back per partition.
MIN_PARTITION_SIZE = 256
# Decode programs in flight per SM to aim for when splitting contexts: ~115 registers x
# 128 threads on sm_90 (see tests/kernels/sm90_build.py), so 4 fit in an SM's 64K.
PROGRAMS_PER_SM = 4


@triton.jit
def _partition_len(ctx_len, num_parts, MIN_PARTITION: tl.constexpr, BLOCK_N: tl.constexpr):
    """Tokens per partition of a ctx_len context split over at most num_parts programs
    (>= BLOCK_N, so cdiv(ctx_len, it) counts the live partitions, 0 for an empty row)."""
    live = tl.maximum(tl.minimum(num_parts, tl.cdiv(ctx_len, MIN_PARTITION)), 1)
    return tl.maximum(tl.cdiv(tl.cdiv(ctx_len, live), BLOCK_N), 1) * BLOCK_N


@triton.jit
def _seen_span(seq_lens_ptr, b, max_blocks, window, BLOCK_SIZE: tl.constexpr):
    """(first, end) of the tokens sequence b's query sees: its whole context, or its last
    `window` tokens (window > 0)."""
    # Clamp to the table's capacity so a bad seq_len can never read past block_tables.
    end = tl.minimum(tl.load(seq_lens_ptr + b), max_blocks * BLOCK_SIZE)
    first = tl.where(window > 0, tl.maximum(end - window, 0), 0)
    return first, end


@triton.jit(do_not_specialize=["max_blocks", "stride_bt", "window"],
            do_not_specialize_on_alignment=["block_tables_ptr", "seq_lens_ptr"])
def _decode_partition_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, seq_lens_ptr,
    out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr,
    qk_scale, max_blocks, window, stride_qb, stride_qh, stride_bt, stride_ob, stride_oh,
    NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, MIN_PARTITION: tl.constexpr, DIRECT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    part = tl.program_id(2)
    offs_g = tl.arange(0, GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    heads = kvh * GROUP + offs_g
    g_mask = (offs_g < GROUP)[:, None]
    first, ctx_len = _seen_span(seq_lens_ptr, b, max_blocks, window, BLOCK_SIZE)
    part_len = _partition_len(ctx_len - first, tl.num_programs(2), MIN_PARTITION, BLOCK_N)
    start = first + part * part_len
    out_offs = b * stride_ob + heads[:, None] * stride_oh + offs_d[None, :]
    if start >= ctx_len:
        if DIRECT:  # the only partition of an empty (padding) row: write zeros
            zeros = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=out_ptr.dtype.element_ty)
            tl.store(out_ptr + out_offs, zeros, mask=g_mask)
        return
    end = tl.minimum(ctx_len, start + part_len)
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + offs_d[None, :],
                mask=g_mask, other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    bt_row = block_tables_ptr + b * stride_bt
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < end  # every tile holds >= 1 live token
        k, v = load_kv_tile(k_cache_ptr, v_cache_ptr, bt_row, offs_n, n_mask, kvh,
                            NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)
        m_i, l_i, acc = online_softmax_step(q, k, v, n_mask[None, :], m_i, l_i, acc,
                                            qk_scale, DOT_PRECISION)
    if DIRECT:
        out = acc / l_i[:, None]
        tl.store(out_ptr + out_offs, out.to(out_ptr.dtype.element_ty), mask=g_mask)
    else:
        rows = (b * NUM_HEADS + heads) * tl.num_programs(2) + part  # [B, H, P] index
        tl.store(part_max_ptr + rows, m_i, mask=offs_g < GROUP)
        tl.store(part_sum_ptr + rows, l_i, mask=offs_g < GROUP)
        tl.store(part_acc_ptr + rows[:, None] * HEAD_DIM + offs_d[None, :], acc, mask=g_mask)


@triton.jit(do_not_specialize=["max_blocks", "num_parts", "window"],
            do_not_specialize_on_alignment=["seq_lens_ptr"])
def _decode_merge_kernel(
    out_ptr, part_acc_ptr, part_max_ptr, part_sum_ptr, seq_lens_ptr,
    max_blocks, num_parts, window, stride_ob, stride_oh,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    BLOCK_N: tl.constexpr, MIN_PARTITION: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_d = tl.arange(0, HEAD_DIM)
    first, end = _seen_span(seq_lens_ptr, b, max_blocks, window, BLOCK_SIZE)
    span = end - first
    live_parts = tl.cdiv(span, _partition_len(span, num_parts, MIN_PARTITION, BLOCK_N))
    row0 = (b * NUM_HEADS + h) * num_parts
    m = float("-inf")
    l = 0.0
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for p in range(0, live_parts):
        m_p = tl.load(part_max_ptr + row0 + p)
        m_new = tl.maximum(m, m_p)
        alpha = tl.exp2(m - m_new)
        beta = tl.exp2(m_p - m_new)
        l = l * alpha + tl.load(part_sum_ptr + row0 + p) * beta
        acc = acc * alpha + tl.load(part_acc_ptr + (row0 + p) * HEAD_DIM + offs_d) * beta
        m = m_new
    # seq_len 0 (graph padding): no live partition, l == 0, acc == 0 -> output zeros.
    out = acc / tl.where(l > 0.0, l, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + offs_d, out.to(out_ptr.dtype.element_ty))


def partition_constexprs(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                         min_partition: int, direct: bool, dtype: torch.dtype) -> dict:
    """Compile-time parameters of the partition kernel (also used by the sm_90 build test)."""
    group = num_heads // num_kv_heads
    return dict(
        NUM_HEADS=num_heads, NUM_KV_HEADS=num_kv_heads, GROUP=group,
        GROUP_PAD=max(16, triton.next_power_of_2(group)), HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_N=_block_n(head_dim, min_partition),
        MIN_PARTITION=min_partition, DIRECT=direct, DOT_PRECISION=dot_precision(dtype),
    )


def merge_constexprs(num_heads: int, head_dim: int, block_size: int, min_partition: int) -> dict:
    """Compile-time parameters of the merge kernel; BLOCK_N must match the partition pass."""
    return dict(NUM_HEADS=num_heads, HEAD_DIM=head_dim, BLOCK_SIZE=block_size,
                BLOCK_N=_block_n(head_dim, min_partition), MIN_PARTITION=min_partition)


def _block_n(head_dim: int, min_partition: int) -> int:
    return max(16, min(KV_TILE_ELEMS // head_dim, min_partition))


def split_num_partitions(batch: int, num_kv_heads: int, max_context: int, target_programs: int,
                         min_partition: int = MIN_PARTITION_SIZE) -> int:
    """Partitions per sequence to launch, from shapes only (fixed for a captured CUDA graph).

    batch * num_kv_heads programs already fill the GPU at large batch: one partition, no
    merge pass. Smaller batches launch enough partitions for about target_programs
    programs (a few per SM), but no more than a max_context-token context can use.
    """
    wanted = -(-target_programs // max(1, batch * num_kv_heads))
    return max(1, min(wanted, -(-max_context // min_partition)))


def _check_args(q, k_cache, v_cache, block_tables, seq_lens, out, num_partitions,
                min_partition, window) -> None:
    check_tensor("q", q, 3)
    check_kv_cache(k_cache, v_cache)
    check_same("k_cache", k_cache, "q", q)
    check_tensor("block_tables", block_tables, 2, (torch.int32,))
    check_tensor("seq_lens", seq_lens, 1, (torch.int32,))
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    check_dim("block_tables", block_tables, 0, batch)
    check_dim("seq_lens", seq_lens, 0, batch)
    check_dim("k_cache", k_cache, 3, head_dim)
    check_head_dim(head_dim)
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if min_partition < 16 or min_partition & (min_partition - 1):
        raise ValueError(f"min_partition must be a power of two >= 16, got {min_partition}")
    if num_partitions is not None and (not isinstance(num_partitions, int) or num_partitions < 1):
        raise ValueError(f"num_partitions must be a positive int or None, got {num_partitions!r}")
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive int or None, got {window!r}")
    if out is not None:
        check_tensor("out", out, 3)
        check_same("out", out, "q", q)
        if out.shape != q.shape:
            raise ValueError(f"out shape {tuple(out.shape)} != q shape {tuple(q.shape)}")


def paged_decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           out: torch.Tensor | None = None, *, num_partitions: int | None = None,
                           min_partition: int = MIN_PARTITION_SIZE,
                           window: int | None = None) -> torch.Tensor:
    """Attention of q [B, H, D] over each sequence's first seq_lens[b] cached tokens (the
    last `window` of them with a sliding window; the others are never read).

    block_tables [B, max_blocks] int32, seq_lens [B] int32 (0 gives a zero row);
    returns out [B, H, D] in q's dtype. num_partitions: partitions launched per sequence
    (None: as many as a full block table can use, cdiv(max_blocks * block_size,
    min_partition)); each sequence splits its context into at most that many, each at
    least min_partition tokens (a power of two >= 16) unless the context is shorter.
    """
    _check_args(q, k_cache, v_cache, block_tables, seq_lens, out, num_partitions, min_partition,
                window)
    batch, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    max_blocks = block_tables.shape[1]
    if out is None:
        out = torch.empty_like(q)
    if batch == 0:
        return out
    if num_partitions is None:
        num_partitions = max(1, triton.cdiv(max_blocks * block_size, min_partition))
    direct = num_partitions == 1
    part_shape = (batch, num_heads, num_partitions) if not direct else (1,)
    part_acc = q.new_empty(part_shape + (head_dim,), dtype=torch.float32)
    part_max = q.new_empty(part_shape, dtype=torch.float32)
    part_sum = q.new_empty(part_shape, dtype=torch.float32)
    _decode_partition_kernel[(batch, num_kv_heads, num_partitions)](
        q, k_cache, v_cache, block_tables, seq_lens, out, part_acc, part_max, part_sum,
        scale * math.log2(math.e), max_blocks, window or 0, q.stride(0), q.stride(1),
        block_tables.stride(0), out.stride(0), out.stride(1),
        **partition_constexprs(num_heads, num_kv_heads, head_dim, block_size, min_partition,
                               direct, q.dtype),
    )
    if not direct:
        _decode_merge_kernel[(batch, num_heads)](
            out, part_acc, part_max, part_sum, seq_lens, max_blocks, num_partitions,
            window or 0, out.stride(0), out.stride(1),
            **merge_constexprs(num_heads, head_dim, block_size, min_partition),
        )
    return out


def paged_decode_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               block_tables: torch.Tensor, seq_lens: torch.Tensor,
                               scale: float, out: torch.Tensor | None = None,
                               window: int | None = None) -> torch.Tensor:
    """Plain-torch paged_decode_attention (fp32 math); same arguments and result."""
    if out is None:
        out = torch.empty_like(q)
    for b in range(q.shape[0]):
        seq_len = int(seq_lens[b])
        if seq_len == 0:
            out[b] = 0
            continue
        k, v = gather_kv(k_cache, v_cache, block_tables[b], seq_len, q.shape[1])  # [H, L, D]
        if window is not None:
            k, v = k[:, -window:], v[:, -window:]
        scores = torch.einsum("hd,hld->hl", q[b].float(), k) * scale
        out[b] = torch.einsum("hl,hld->hd", scores.softmax(-1), v).to(q.dtype)
    return out
