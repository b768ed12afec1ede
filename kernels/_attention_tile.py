"""Triton building blocks shared by the paged attention kernels.

    token n of a sequence -> slot = block_table[n // BLOCK_SIZE] * BLOCK_SIZE + n % BLOCK_SIZE
    a cache viewed as [num_slots, NUM_KV_HEADS, HEAD_DIM]; a K/V tile = BLOCK_N slots of one
    kv head ([BLOCK_N, HEAD_DIM]), gathered token by token so tiles may span blocks.
"""

import triton
import triton.language as tl


@triton.jit
def load_kv_tile(k_cache_ptr, v_cache_ptr, block_table_row_ptr, offs_n, n_mask, kvh,
                 NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    """K and V [BLOCK_N, HEAD_DIM] of tokens offs_n (zeros where ~n_mask, never read)."""
    block_ids = tl.load(block_table_row_ptr + offs_n // BLOCK_SIZE, mask=n_mask, other=0)
    slots = block_ids.to(tl.int64) * BLOCK_SIZE + offs_n % BLOCK_SIZE
    offs = slots[:, None] * (NUM_KV_HEADS * HEAD_DIM) + kvh * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    k = tl.load(k_cache_ptr + offs, mask=n_mask[:, None], other=0.0)
    v = tl.load(v_cache_ptr + offs, mask=n_mask[:, None], other=0.0)
    return k, v


@triton.jit
def online_softmax_step(q, k, v, visible, m_i, l_i, acc, qk_scale, DOT_PRECISION: tl.constexpr):
    """One flash-attention step of rows q [M, D] over a tile k, v [N, D].

    Scores are in log2 units (qk_scale includes log2(e)); m_i is the running row max,
    l_i the running sum of exp2, acc the unnormalised output. visible [M, N] masks
    scores to -inf. A row that has seen nothing yet (a sliding window that starts past
    this tile) keeps m_i = -inf and adds nothing: exponents are taken against a finite
    stand-in, so exp2(-inf) = 0 rather than NaN.
    """
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * qk_scale
    s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2(m_i - m_ref)
    p = tl.exp2(s - m_ref[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc
