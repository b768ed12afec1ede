"""Paged prefill attention over a ragged batch (chunked prefill, prefix-cache hits).

    q rows:  | seq 0: q_len_0 rows | seq 1: q_len_1 rows | ...   (query_start_loc [B+1])
    seq b's context: | cached prefix (seq_len - q_len) | new tokens (q_len) |
                                                         ^ query i sits at position
                                                           seq_len - q_len + i and sees
                                                           positions <= its own (causal)
                                                           and, with a sliding window W,
                                                           > its own - W
    K/V of every position (new tokens included) are read from the paged cache.

Grid (T // BLOCK_Q + B, Hkv): program p finds its sequence b by binary search over
q_block_start(b) = query_start_loc[b] // BLOCK_Q + b (an upper bound that never lets two
sequences share a program), then takes BLOCK_Q query tokens x GROUP query heads of one kv
head as the BLOCK_M = BLOCK_Q * GROUP_PAD rows of a flash-attention tile:
row r = token r // GROUP_PAD, head r % GROUP_PAD. Online softmax over BLOCK_N-token tiles.
"""

import math

import torch
import triton
import triton.language as tl

from kernels._checks import (check_dim, check_head_dim, check_kv_cache, check_same,
                             check_tensor, dot_precision)
from kernels._attention_tile import load_kv_tile, online_softmax_step
from kernels._paged import gather_kv

# Query rows per tile, and K/V tokens per tile = min(64, KV_TILE_BYTES // (head_dim *
# element size)): with 8 warps this stays at 150-175 registers on sm_90 for D=64 and
# D=128, bf16 and fp32, without spills (fp32 at 64 tokens x D=64 spilled at 255).
BLOCK_M = 64
KV_TILE_BYTES = 8192
NUM_WARPS = 8


@triton.jit
def _find_sequence(query_start_loc_ptr, num_seqs, q_block, BLOCK_Q: tl.constexpr):
    """Largest b with query_start_loc[b] // BLOCK_Q + b <= q_block."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid <= q_block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


# The engine slices the per-sequence inputs past the decode rows and the batch changes
# every step: specialising on these integers or on the slices' 16-byte alignment would
# compile new variants mid-run (seconds each) for no gain (they are scalar loads).
@triton.jit(do_not_specialize=["num_seqs", "max_blocks", "window", "stride_bt"],
            do_not_specialize_on_alignment=["block_tables_ptr", "query_start_loc_ptr",
                                            "seq_lens_ptr"])
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, query_start_loc_ptr, seq_lens_ptr,
    out_ptr, qk_scale, num_seqs, max_blocks, window, stride_qt, stride_qh, stride_bt, stride_ot,
    stride_oh,
    NUM_KV_HEADS: tl.constexpr, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    q_block = tl.program_id(0)
    kvh = tl.program_id(1)
    # -1 (before sequence 0, when query_start_loc[0] > 0) clamps to 0 and exits below.
    b = tl.maximum(_find_sequence(query_start_loc_ptr, num_seqs, q_block, BLOCK_Q), 0)
    q_begin = tl.load(query_start_loc_ptr + b)
    q_len = tl.load(query_start_loc_ptr + b + 1) - q_begin
    first_q = (q_block - (q_begin // BLOCK_Q + b)) * BLOCK_Q  # index within the sequence
    if (first_q < 0) | (first_q >= q_len):
        return
    seq_len = tl.minimum(tl.load(seq_lens_ptr + b), max_blocks * BLOCK_SIZE)
    prefix_len = seq_len - q_len
    offs_m = tl.arange(0, BLOCK_Q * GROUP_PAD)
    offs_d = tl.arange(0, HEAD_DIM)
    q_idx = first_q + offs_m // GROUP_PAD
    heads = kvh * GROUP + offs_m % GROUP_PAD
    row_mask = ((q_idx < q_len) & (offs_m % GROUP_PAD < GROUP))[:, None]
    q_offs = (q_begin + q_idx)[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_mask, other=0.0)
    pos = prefix_len + q_idx  # each row's position in its context
    kv_end = prefix_len + tl.minimum(q_len, first_q + BLOCK_Q)  # past the tile's last query
    m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, HEAD_DIM], dtype=tl.float32)
    bt_row = block_tables_ptr + b * stride_bt
    # With a window (> 0), tiles wholly before the tile's first query's window are skipped.
    kv_first = tl.where(window > 0, tl.maximum(prefix_len + first_q - window + 1, 0), 0)
    for n0 in range(kv_first // BLOCK_N * BLOCK_N, kv_end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < kv_end
        k, v = load_kv_tile(k_cache_ptr, v_cache_ptr, bt_row, offs_n, n_mask, kvh,
                            NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE)
        # Causal. Position 0 sits in the first tile and every row sees it.
        visible = n_mask[None, :] & (offs_n[None, :] <= pos[:, None])
        visible &= (window <= 0) | (offs_n[None, :] > pos[:, None] - window)
        m_i, l_i, acc = online_softmax_step(q, k, v, visible, m_i, l_i, acc, qk_scale,
                                            DOT_PRECISION)
    out = acc / l_i[:, None]
    o_offs = (q_begin + q_idx)[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :]
    tl.store(out_ptr + o_offs, out.to(out_ptr.dtype.element_ty), mask=row_mask)


def prefill_constexprs(num_heads: int, num_kv_heads: int, head_dim: int, block_size: int,
                       dtype: torch.dtype) -> dict:
    """Compile-time parameters of the prefill kernel (also used by the sm_90 build test)."""
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    return dict(
        NUM_KV_HEADS=num_kv_heads, GROUP=group, GROUP_PAD=group_pad, HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size, BLOCK_Q=max(1, BLOCK_M // group_pad),
        BLOCK_N=max(16, min(64, KV_TILE_BYTES // (head_dim * dtype.itemsize))),
        DOT_PRECISION=dot_precision(dtype),
    )


def _check_args(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out,
                window) -> None:
    check_tensor("q", q, 3)
    check_kv_cache(k_cache, v_cache)
    check_same("k_cache", k_cache, "q", q)
    check_tensor("block_tables", block_tables, 2, (torch.int32,))
    check_tensor("query_start_loc", query_start_loc, 1, (torch.int32,))
    check_tensor("seq_lens", seq_lens, 1, (torch.int32,))
    for name, t in (("block_tables", block_tables), ("query_start_loc", query_start_loc),
                    ("seq_lens", seq_lens)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    batch = seq_lens.shape[0]
    check_dim("block_tables", block_tables, 0, batch)
    check_dim("query_start_loc", query_start_loc, 0, batch + 1)
    check_dim("k_cache", k_cache, 3, q.shape[2])
    check_head_dim(q.shape[2])
    if q.shape[1] % k_cache.shape[2]:
        raise ValueError(f"num_heads {q.shape[1]} is not a multiple of num_kv_heads {k_cache.shape[2]}")
    if window is not None and (not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be a positive int or None, got {window!r}")
    if out is not None:
        check_tensor("out", out, 3)
        check_same("out", out, "q", q)
        if out.shape != q.shape:
            raise ValueError(f"out shape {tuple(out.shape)} != q shape {tuple(q.shape)}")


def paged_prefill_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                            block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                            seq_lens: torch.Tensor, scale: float,
                            out: torch.Tensor | None = None, *,
                            window: int | None = None) -> torch.Tensor:
    """Causal attention of the ragged queries q [T, H, D] over their paged contexts (each
    query over the last `window` positions up to its own, with a sliding window).

    query_start_loc [B+1] int32, non-decreasing, query_start_loc[B] <= T (rows outside
    [query_start_loc[0], query_start_loc[B]) are left untouched, so decode rows may sit in
    front); seq_lens [B] int32 (>= each sequence's q_len); block_tables [B, max_blocks]
    int32. Returns out [T, H, D].
    """
    _check_args(q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out, window)
    num_tokens, num_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    batch = seq_lens.shape[0]
    if out is None:
        out = torch.empty_like(q)
    if num_tokens == 0 or batch == 0:
        return out
    constexprs = prefill_constexprs(num_heads, num_kv_heads, head_dim, block_size, q.dtype)
    _prefill_kernel[(num_tokens // constexprs["BLOCK_Q"] + batch, num_kv_heads)](
        q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, out,
        scale * math.log2(math.e), batch, block_tables.shape[1], window or 0, q.stride(0),
        q.stride(1),
        block_tables.stride(0), out.stride(0), out.stride(1), **constexprs,
        num_warps=NUM_WARPS,
    )
    return out


def paged_prefill_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                block_tables: torch.Tensor, query_start_loc: torch.Tensor,
                                seq_lens: torch.Tensor, scale: float,
                                out: torch.Tensor | None = None,
                                window: int | None = None) -> torch.Tensor:
    """Plain-torch paged_prefill_attention (fp32 math); same arguments and result."""
    if out is None:
        out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    for b, seq_len in enumerate(seq_lens.tolist()):
        begin, end = starts[b], starts[b + 1]
        if end == begin:
            continue
        k, v = gather_kv(k_cache, v_cache, block_tables[b], seq_len, q.shape[1])  # [H, S, D]
        scores = torch.einsum("lhd,hsd->hls", q[begin:end].float(), k) * scale
        pos = torch.arange(seq_len - (end - begin), seq_len, device=q.device)  # [L]
        keys = torch.arange(seq_len, device=q.device)[None, :]
        visible = keys <= pos[:, None]  # [L, S]
        if window is not None:
            visible &= keys > pos[:, None] - window
        scores = scores.masked_fill(~visible, float("-inf"))
        out[begin:end] = torch.einsum("hls,hsd->lhd", scores.softmax(-1), v).to(q.dtype)
    return out
