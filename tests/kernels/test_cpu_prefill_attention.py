"""The C++ paged prefill/extend attention (kernels/cpu/prefill_attention.cpp) against the
plain-torch reference and the engine's torch backend, on NaN-poisoned paged caches."""

import pytest
import torch

from engine.attention import AttentionMetadata, TorchAttention
from engine.cpu_backend import CpuAttention
from kernel_cases import (assert_close, nan_like, paged_kv, ragged, randn,
                          readable_by_torch_backend, verification_step)
from kernels.paged_prefill_attention import paged_prefill_attention_ref


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (9, 3), (8, 1)])
@pytest.mark.parametrize("block_size", [16, 5])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_matches_reference_ragged(gen, kernels, num_heads, num_kv_heads, block_size, head_dim):
    # an extend over a cached prefix, whole prompts (one spanning several 16-token query
    # chunks and key tiles), one-token extends and prompts, partial last blocks; three
    # decode rows ahead of them that must stay untouched.
    args = ragged(gen, [70, 37, 9, 1, 200, 33], [30, 37, 1, 1, 45, 33], num_heads,
                  num_kv_heads, head_dim, torch.float32, "cpu", block_size, lead_rows=3)
    q, k_cache, v_cache, tables, starts, lens = args
    out = nan_like(q)
    kernels.paged_prefill_attention(out, q, k_cache, v_cache, tables, starts, lens,
                                    head_dim ** -0.5)
    assert out[:3].isnan().all()
    assert_close(out[3:], paged_prefill_attention_ref(*args, head_dim ** -0.5)[3:])


def test_no_sequences_or_empty_queries_write_nothing(gen, kernels):
    q, k_cache, v_cache, tables, starts, lens = ragged(gen, [20, 9], [0, 9], 4, 2, 64,
                                                       torch.float32, "cpu", 16)
    out = nan_like(q)
    kernels.paged_prefill_attention(out, q, k_cache, v_cache, tables[:0], starts[:1], lens[:0], 0.1)
    assert out.isnan().all()
    kernels.paged_prefill_attention(out, q, k_cache, v_cache, tables, starts, lens, 0.1)
    assert_close(out, paged_prefill_attention_ref(q, k_cache, v_cache, tables, starts, lens, 0.1))


def _mixed_step(gen, seq_lens: list[int], q_lens: list[int], heads=(9, 3, 64)):
    """A step as the engine builds it (the first two sequences decode): (q, k, v, k_cache,
    v_cache, block_tables, metadata), the caches readable by the torch backend. heads:
    (query heads, KV heads, head_dim)."""
    num_heads, num_kv_heads, head_dim = heads
    k_cache, v_cache, tables, lens = paged_kv(gen, seq_lens, 16, num_kv_heads, head_dim,
                                              torch.float32, "cpu", extra_cols=0)
    k_cache, v_cache, tables = readable_by_torch_backend(k_cache, v_cache, tables)
    tokens = sum(q_lens)
    q = randn(gen, tokens, num_heads, head_dim, dtype=torch.float32, device="cpu")
    k, v = (randn(gen, tokens, num_kv_heads, head_dim, dtype=torch.float32, device="cpu")
            for _ in range(2))
    slots = [int(tables[b, p // 16]) * 16 + p % 16 for b, (s, n) in enumerate(zip(seq_lens, q_lens))
             for p in range(s - n, s)]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots), block_tables=tables, seq_lens=lens,
        query_start_loc=torch.tensor([0] + q_lens).cumsum(0).int(), num_decodes=2,
        max_seq_len=max(seq_lens), query_lens_host=q_lens, seq_lens_host=seq_lens)
    return q, k, v, k_cache, v_cache, tables, meta


def test_mixed_step_agrees_with_torch_backend(gen, kernels):
    """A step as the engine builds it (two decodes, a whole prompt, an extend over a cached
    prefix) through both backends' __call__: the torch one runs SDPA per request."""
    seq_lens, q_lens = [40, 7, 50, 90], [1, 1, 50, 20]
    q, k, v, k_cache, v_cache, tables, meta = _mixed_step(gen, seq_lens, q_lens)
    expected = TorchAttention(9, 3, 64)(q, k, v, (k_cache.clone(), v_cache.clone()), meta)
    out = CpuAttention(9, 3, 64, kernels)(q, k, v, (k_cache, v_cache), meta)
    assert_close(out, expected)


@pytest.mark.parametrize("window,heads", [(1, (9, 3, 64)), (7, (9, 3, 64)), (20, (9, 3, 64)),
                                          (64, (9, 3, 64)), (1000, (9, 3, 64)),
                                          (20, (4, 1, 256))])  # Gemma 3's heads
def test_a_sliding_window_agrees_with_torch_backend_and_reads_nothing_older(gen, kernels,
                                                                          window, heads):
    """A mixed step (decodes, whole prompts over several query chunks and key tiles, an
    extend) with a window: the torch backend's result (held to transformers' by the family
    parity), and every cache slot before the first position a sequence's queries may see
    is NaN for the C++ backend, so reading one would show."""
    seq_lens, q_lens = [40, 7, 50, 90, 150], [1, 1, 50, 20, 150]
    q, k, v, k_cache, v_cache, tables, meta = _mixed_step(gen, seq_lens, q_lens, heads)
    expected = TorchAttention(*heads, window=window)(
        q, k, v, (k_cache.clone(), v_cache.clone()), meta)
    for b, (s, n) in enumerate(zip(seq_lens, q_lens)):
        for p in range(max(0, s - n - window + 1)):
            block, offset = int(tables[b, p // 16]), p % 16
            k_cache[block, offset] = v_cache[block, offset] = float("nan")
    out = CpuAttention(*heads, kernels, window=window)(q, k, v, (k_cache, v_cache), meta)
    assert_close(out, expected)


def test_rejects_bad_arguments(gen, kernels):
    q, k_cache, v_cache, tables, starts, lens = ragged(gen, [20, 4], [3, 4], 4, 2, 64,
                                                       torch.float32, "cpu", 16)
    out = torch.empty_like(q)
    call = kernels.paged_prefill_attention
    with pytest.raises(RuntimeError, match="float32"):
        call(out, q.double(), k_cache, v_cache, tables, starts, lens, 1.0)
    with pytest.raises(RuntimeError, match="int32"):
        call(out, q, k_cache, v_cache, tables, starts.long(), lens, 1.0)
    with pytest.raises(RuntimeError, match="batch \\+ 1 entries"):
        call(out, q, k_cache, v_cache, tables, starts[:2], lens, 1.0)
    with pytest.raises(RuntimeError, match="outside q"):
        call(out[:5], q[:5], k_cache, v_cache, tables, starts, lens, 1.0)
    with pytest.raises(RuntimeError, match="shorter than its queries"):
        call(out, q, k_cache, v_cache, tables, starts, torch.tensor([2, 4], dtype=torch.int32), 1.0)
    bad = tables.clone()
    bad[0, 1] = k_cache.shape[0]  # the second block of 20 tokens, in use
    with pytest.raises(RuntimeError, match="block id .* of sequence 0 is outside the cache"):
        call(out, q, k_cache, v_cache, bad, starts, lens, 1.0)
    with pytest.raises(RuntimeError, match="head_dim must be 64, 128 or 256"):
        call(out[..., :32].contiguous(), q[..., :32].contiguous(), k_cache[..., :32].contiguous(),
             v_cache[..., :32].contiguous(), tables, starts, lens, 1.0)
    with pytest.raises(RuntimeError, match="head counts"):
        call(torch.empty(7, 3, 64), q[:, :3].contiguous(), k_cache, v_cache, tables, starts,
             lens, 1.0)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(9, 3), (4, 4)])
def test_multi_query_decode_of_speculative_verification(gen, kernels, num_heads, num_kv_heads):
    """Verification steps (1-5 queries per sequence over a long cached context) run on
    this kernel, with the rejected slots of an earlier verification still holding K/V."""
    args, expected = verification_step(gen, num_heads, num_kv_heads, 64, 0.125)
    q, k_cache, v_cache, tables, starts, lens = args
    out = nan_like(q)
    kernels.paged_prefill_attention(out, q, k_cache, v_cache, tables, starts, lens, 0.125)
    assert_close(out, expected)
