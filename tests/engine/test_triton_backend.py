"""The Triton backend (engine.triton_backend) against the plain-torch one, on CPU under
Triton's interpreter (TRITON_INTERPRET=1, as scripts/test.sh sets), fp32.

Unit level: TritonAttention/TritonOps give TorchAttention/TorchOps's results for a mixed
step (decodes with split contexts, a fresh prompt, a prefix-cache extend, a prefill chunk).
Engine level: LLM greedy tokens are the same with attention_backend="triton" and "torch".
"""
import os

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention import AttentionMetadata, TorchAttention
from engine.ops import TorchOps, build_cos_sin_cache

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="CPU Triton needs TRITON_INTERPRET=1")

BLOCK = 4
HEADS, KV_HEADS, DIM = 6, 2, 16


def step_inputs(gen, steps: list[tuple[int, int]], num_blocks: int = 400):
    """q, k, v, caches and metadata for one step; steps = [(prefix_len, q_len)], decodes
    (q_len 1) first. Prefix K/V are random in the cache; blocks are scattered."""
    shape = (num_blocks, BLOCK, KV_HEADS, DIM)
    k_cache, v_cache = torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)
    free = torch.randperm(num_blocks, generator=gen).tolist()
    tables, slots, seq_lens, q_lens = [], [], [], []
    for prefix, q_len in steps:
        seq_len = prefix + q_len
        blocks = [free.pop() for _ in range(-(-seq_len // BLOCK))]
        tables.append(blocks)
        slots += [blocks[p // BLOCK] * BLOCK + p % BLOCK for p in range(prefix, seq_len)]
        seq_lens.append(seq_len)
        q_lens.append(q_len)
    width = max(map(len, tables))
    tables = [t + [0] * (width - len(t)) for t in tables]  # as ModelRunner pads
    num_tokens = sum(q_lens)
    q = torch.randn(num_tokens, HEADS, DIM, generator=gen)
    k = torch.randn(num_tokens, KV_HEADS, DIM, generator=gen)
    v = torch.randn(num_tokens, KV_HEADS, DIM, generator=gen)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots), block_tables=torch.tensor(tables, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        query_start_loc=torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).int(),
        num_decodes=q_lens.count(1), max_seq_len=max(seq_lens), query_lens_host=q_lens,
        seq_lens_host=seq_lens)
    return q, k, v, (k_cache, v_cache), meta


def run_both(q, k, v, kv_cache, meta, **triton_kwargs):
    from engine.triton_backend import TritonAttention
    torch_cache = tuple(c.clone() for c in kv_cache)
    expected = TorchAttention(HEADS, KV_HEADS, DIM)(q, k, v, torch_cache, meta)
    triton_cache = tuple(c.clone() for c in kv_cache)
    out = TritonAttention(HEADS, KV_HEADS, DIM, **triton_kwargs)(q, k, v, triton_cache, meta)
    for got, want in zip(triton_cache, torch_cache):
        assert torch.equal(got, want), "K/V stored in different slots"
    return out, expected


def test_attention_mixed_step_matches_torch_backend():
    gen = torch.Generator().manual_seed(0)
    # decodes: a 700-token context (split into 256-token partitions), 1 token, 37 tokens;
    # then a fresh prompt, an extend after a 20-token cached prefix, a 16-token chunk.
    steps = [(699, 1), (0, 1), (36, 1), (0, 9), (20, 13), (32, 16)]
    out, expected = run_both(*step_inputs(gen, steps), target_programs=64)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("steps", [[(5, 1), (40, 1)], [(0, 7), (12, 5)]],
                         ids=["decode-only", "prefill-only"])
def test_attention_single_kind_steps(steps):
    out, expected = run_both(*step_inputs(torch.Generator().manual_seed(1), steps))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_ops_match_torch_ops():
    from engine.triton_backend import TritonOps
    gen = torch.Generator().manual_seed(2)
    x, residual = torch.randn(5, 96, generator=gen), torch.randn(5, 96, generator=gen)
    weight = torch.randn(96, generator=gen)
    torch.testing.assert_close(TritonOps.rms_norm(x, weight, 1e-5), TorchOps.rms_norm(x, weight, 1e-5))
    out, new_residual = TritonOps.rms_norm(x, weight, 1e-5, residual)
    out_ref, residual_ref = TorchOps.rms_norm(x, weight, 1e-5, residual)
    torch.testing.assert_close(out, out_ref)
    assert torch.equal(new_residual, residual_ref)
    heads = torch.randn(5, HEADS, DIM, generator=gen)  # Qwen3's per-head q/k norm
    head_weight = torch.randn(DIM, generator=gen)
    torch.testing.assert_close(TritonOps.rms_norm(heads, head_weight, 1e-6),
                               TorchOps.rms_norm(heads, head_weight, 1e-6))
    cache = build_cos_sin_cache(64, DIM, 10000.0, None, torch.float32, "cpu")
    positions = torch.tensor([0, 3, 63, 7, 1])
    q, k = torch.randn(5, HEADS, DIM, generator=gen), torch.randn(5, KV_HEADS, DIM, generator=gen)
    q_ref, k_ref = q.clone(), k.clone()
    TritonOps.rotary(q, k, positions, cache)
    TorchOps.rotary(q_ref, k_ref, positions, cache)
    torch.testing.assert_close((q, k), (q_ref, k_ref))
    gate_up = torch.randn(5, 2 * 48, generator=gen)
    torch.testing.assert_close(TritonOps.silu_and_mul(gate_up), TorchOps.silu_and_mul(gate_up))


# Prompts as token ids: different lengths, three sharing a 40-token prefix.
PREFIX = [(17 * i + 5) % 3000 + 100 for i in range(40)]
PROMPTS = [PREFIX + [7, 8, 9], [11, 12, 13, 14, 15], PREFIX + list(range(500, 523)),
           list(range(900, 958)), PREFIX[:21]]


def greedy(backend: str) -> list:
    # A 24-token budget chunks every prompt over 20 tokens and mixes decodes with
    # prefill chunks; the first call leaves PREFIX's blocks in the prefix cache.
    llm = LLM(model="dummy:tiny", device="cpu", attention_backend=backend, num_threads=1,
              max_num_batched_tokens=24, max_num_seqs=8, num_kv_blocks=64)
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    warm = llm.generate([PREFIX + [1, 2]], params)
    outs = llm.generate(PROMPTS, params)
    return warm + outs


def test_llm_greedy_tokens_match_torch_backend():
    triton_outs, torch_outs = greedy("triton"), greedy("torch")
    assert all(o.num_cached_tokens >= 32 for o in (triton_outs[1], triton_outs[3]))
    for i, (got, want) in enumerate(zip(triton_outs, torch_outs)):
        assert len(got.token_ids) == 16
        assert got.token_ids == want.token_ids, f"request {i} diverged"
        assert got.num_cached_tokens == want.num_cached_tokens
