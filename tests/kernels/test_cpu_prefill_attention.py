"""The C++ paged prefill/extend attention (kernels/cpu/prefill_attention.cpp) against the
plain-torch reference and the engine's torch backend, on NaN-poisoned paged caches."""

import pytest
import torch

from engine.attention import AttentionMetadata, TorchAttention
from engine.cpu_backend import CpuAttention
from kernel_cases import (assert_close, nan_like, paged_kv, ragged, randn,
                          readable_by_torch_backend, verification_step)
from kernels.cpu import (PREFILL_ATTENTION_ENV, QUANT_ISA_ENV, QUANT_ISAS, load_quant,
                         prefill_attention_bf16)
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


@pytest.fixture(scope="module")
def bf16_kernels(kernels):
    """The kernels module where its prefill attention has the bf16 path (AVX-512 BF16)."""
    if not kernels.prefill_attention_has_bf16():
        pytest.skip("this CPU has no AVX-512 BF16")
    return kernels


def _far_tiles_rounded_ref(q, k_cache, v_cache, tables, starts, lens, scale):
    """The fp32 reference with the bf16 path's operands rounded where it rounds them: the
    scaled queries, keys and values of the far key tiles (64 keys; not the first, nor one
    reaching the first position of the query's 16-token chunk). The softmax weights'
    rounding is left out: the tolerance covers it."""
    def bf16(t):
        return t.bfloat16().float()

    out = torch.full_like(q, float("nan"))
    block, group = k_cache.shape[1], q.shape[1] // k_cache.shape[2]
    for b, length in enumerate(lens.tolist()):
        first_row, n = int(starts[b]), int(starts[b + 1] - starts[b])
        pos = torch.arange(length)
        rows = tables[b, pos // block].long(), pos % block
        k = k_cache[rows].repeat_interleave(group, dim=1)  # [L, H, D]
        v = v_cache[rows].repeat_interleave(group, dim=1)
        for i in range(n):
            at = length - n + i
            chunk_first = length - n + i // 16 * 16
            far = ((pos >= 64) & (pos // 64 * 64 + 64 <= chunk_first))[:, None, None]
            qi = q[first_row + i] * scale
            scores = torch.where(far, bf16(qi) * bf16(k), qi * k).sum(-1)  # [L, H]
            weights = scores.masked_fill((pos > at)[:, None], float("-inf")).softmax(0)
            out[first_row + i] = (weights[..., None] * torch.where(far, bf16(v), v)).sum(0)
    return out


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_bf16_rounds_only_the_far_tiles(gen, bf16_kernels, head_dim):
    """A ragged step: prompts and extends whose queries see no far tile (their results
    must be the fp32 path's, bit for bit) and long ones that see several; decode rows ahead
    left alone. Against the reference rounded as the kernel rounds (up to the weights'
    rounding) and, looser, the plain fp32 one."""
    seq_lens, q_lens = [70, 37, 9, 300, 260, 130], [30, 37, 1, 300, 45, 2]
    args = ragged(gen, seq_lens, q_lens, 9, 3, head_dim, torch.float32, "cpu", 16,
                  lead_rows=3)
    q, k_cache, v_cache, tables, starts, lens = args
    k_cache[tables[:, 0].long(), 0] *= 8  # each first key an attention sink: large scores
    scale = head_dim ** -0.5
    fp32, bf16 = nan_like(q), nan_like(q)
    bf16_kernels.paged_prefill_attention(fp32, q, k_cache, v_cache, tables, starts, lens, scale)
    bf16_kernels.paged_prefill_attention(bf16, q, k_cache, v_cache, tables, starts, lens, scale,
                                         0, True)
    assert bf16[:3].isnan().all()
    near_only = starts[3]  # the first three sequences: contexts of 70 keys at most
    assert torch.equal(bf16[3:near_only], fp32[3:near_only])
    assert not torch.equal(bf16[near_only:], fp32[near_only:])  # the far tiles were bf16
    rounded = _far_tiles_rounded_ref(q, k_cache.nan_to_num(0.0), v_cache.nan_to_num(0.0),
                                     tables.where(tables < k_cache.shape[0], 0), starts,
                                     lens, scale)
    torch.testing.assert_close(bf16[3:], rounded[3:], atol=4e-3, rtol=1e-2)
    expected = paged_prefill_attention_ref(*args, scale)
    torch.testing.assert_close(bf16[3:], expected[3:], atol=2e-2, rtol=2e-2)


def test_bf16_keeps_a_sliding_window(gen, bf16_kernels):
    """With a window, keys before it are never read (their slots hold NaN) on either path."""
    args = ragged(gen, [300, 200], [100, 1], 4, 1, 256, torch.float32, "cpu", 16)
    q, k_cache, v_cache, tables, starts, lens = args
    expected = paged_prefill_attention_ref(*args, 0.0625, window=150)
    for b, (s, n) in enumerate(zip(lens.tolist(), starts.diff().tolist())):
        for p in range(max(0, s - n - 150 + 1)):
            k_cache[tables[b, p // 16], p % 16] = v_cache[tables[b, p // 16], p % 16] = float("nan")
    out = nan_like(q)
    bf16_kernels.paged_prefill_attention(out, q, k_cache, v_cache, tables, starts, lens, 0.0625,
                                         150, True)
    torch.testing.assert_close(out, expected, atol=2e-2, rtol=2e-2)


def test_bf16_by_default_only_for_quantized_models_unless_the_environment_says(
        bf16_kernels, monkeypatch):
    """Unset: an fp32 model keeps fp32 products (its logits stay within 1e-4 of
    transformers'), a quantized one whose dots read two activation levels takes bf16
    where the CPU has no AMX."""
    monkeypatch.delenv(PREFILL_ATTENTION_ENV, raising=False)
    monkeypatch.delenv(QUANT_ISA_ENV, raising=False)
    amx = load_quant() is not None and load_quant().isa_supported(QUANT_ISAS["amx"])
    assert prefill_attention_bf16(bf16_kernels, quantized_model=False) is False
    assert prefill_attention_bf16(bf16_kernels, quantized_model=True) is not amx
    monkeypatch.setenv(QUANT_ISA_ENV, "portable")  # three levels: held to 5e-4
    assert prefill_attention_bf16(bf16_kernels, quantized_model=True) is False
    for name, bf16 in (("fp32", False), ("bf16", True)):
        monkeypatch.setenv(PREFILL_ATTENTION_ENV, name)
        for quantized in (False, True):
            assert prefill_attention_bf16(bf16_kernels, quantized) is bf16
    monkeypatch.setenv(PREFILL_ATTENTION_ENV, "fp16")
    with pytest.raises(ValueError, match="expected fp32 or bf16"):
        prefill_attention_bf16(bf16_kernels, True)
