"""The Triton backend (engine.triton_backend) against the plain-torch one, fp32.

Unit level: TritonAttention/TritonOps give TorchAttention/TorchOps's results for a mixed
step (decodes with split contexts, a fresh prompt, a prefix-cache extend, a prefill chunk),
on CPU under Triton's interpreter (TRITON_INTERPRET=1, as scripts/test.sh sets) or
compiled on CUDA; on CUDA also without host syncs and replayed from a CUDA graph.
Engine level (interpreter): LLM greedy tokens are the same with attention_backend="triton"
and "torch"; tests/engine/test_triton_gpu.py does the same on the GPU.
"""
import os

import pytest
import torch

from engine import LLM, SamplingParams
from engine.attention import AttentionMetadata, TorchAttention
from engine.ops import TorchOps, build_cos_sin_cache

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
RUN_GPU = torch.cuda.is_available() and not INTERPRET


def gpu(test):
    """Runs on CUDA with compiled Triton, skipped elsewhere."""
    skip = pytest.mark.skipif(not RUN_GPU, reason="needs CUDA and compiled Triton")
    return pytest.mark.gpu(skip(test))


BLOCK = 4
HEADS, KV_HEADS, DIM = 6, 2, 16


@pytest.fixture
def device() -> str:
    if INTERPRET:
        return "cpu"
    if RUN_GPU:
        return "cuda"
    pytest.skip("the Triton backend needs TRITON_INTERPRET=1 (CPU) or a CUDA GPU")


def step_inputs(gen, steps: list[tuple[int, int]], device="cpu", width: int = 0,
                num_blocks: int = 400):
    """q, k, v, caches and metadata for one step; steps = [(prefix_len, q_len)], decodes
    (q_len 1) first. Prefix K/V are random in the cache; blocks are scattered; block
    tables are padded with block 0 (as ModelRunner pads) to at least `width` columns."""
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
    width = max(width, *map(len, tables))
    tables = [t + [0] * (width - len(t)) for t in tables]
    num_tokens = sum(q_lens)
    q = torch.randn(num_tokens, HEADS, DIM, generator=gen)
    k = torch.randn(num_tokens, KV_HEADS, DIM, generator=gen)
    v = torch.randn(num_tokens, KV_HEADS, DIM, generator=gen)
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots, device=device),
        block_tables=torch.tensor(tables, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        query_start_loc=torch.tensor([0] + q_lens).cumsum(0).int().to(device),
        num_decodes=q_lens.count(1), max_seq_len=max(seq_lens), query_lens_host=q_lens,
        seq_lens_host=seq_lens)
    tensors = [t.to(device) for t in (q, k, v, k_cache, v_cache)]
    return tensors[0], tensors[1], tensors[2], (tensors[3], tensors[4]), meta


def run_both(q, k, v, kv_cache, meta, **triton_kwargs):
    from engine.triton_backend import TritonAttention
    torch_cache = tuple(c.clone() for c in kv_cache)
    expected = TorchAttention(HEADS, KV_HEADS, DIM)(q, k, v, torch_cache, meta)
    triton_cache = tuple(c.clone() for c in kv_cache)
    out = TritonAttention(HEADS, KV_HEADS, DIM, **triton_kwargs)(q, k, v, triton_cache, meta)
    for got, want in zip(triton_cache, torch_cache):
        assert torch.equal(got, want), "K/V stored in different slots"
    return out, expected


def test_attention_mixed_step_matches_torch_backend(device):
    gen = torch.Generator().manual_seed(0)
    # decodes: a 700-token context (split into 256-token partitions), 1 token, 37 tokens;
    # then a fresh prompt, an extend after a 20-token cached prefix, a 16-token chunk.
    steps = [(699, 1), (0, 1), (36, 1), (0, 9), (20, 13), (32, 16)]
    out, expected = run_both(*step_inputs(gen, steps, device), target_programs=64)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("steps", [[(5, 1), (40, 1)], [(0, 7), (12, 5)]],
                         ids=["decode-only", "prefill-only"])
def test_attention_single_kind_steps(device, steps):
    out, expected = run_both(*step_inputs(torch.Generator().manual_seed(1), steps, device))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_ops_match_torch_ops(device):
    from engine.triton_backend import TritonOps
    gen = torch.Generator().manual_seed(2)

    def rand(*shape):
        return torch.randn(*shape, generator=gen).to(device)

    x, residual, weight = rand(5, 96), rand(5, 96), rand(96)
    torch.testing.assert_close(TritonOps.rms_norm(x, weight, 1e-5), TorchOps.rms_norm(x, weight, 1e-5))
    out, new_residual = TritonOps.rms_norm(x, weight, 1e-5, residual)
    out_ref, residual_ref = TorchOps.rms_norm(x, weight, 1e-5, residual)
    torch.testing.assert_close(out, out_ref)
    assert torch.equal(new_residual, residual_ref)
    heads, head_weight = rand(5, HEADS, DIM), rand(DIM)  # Qwen3's per-head q/k norm
    torch.testing.assert_close(TritonOps.rms_norm(heads, head_weight, 1e-6),
                               TorchOps.rms_norm(heads, head_weight, 1e-6))
    cache = build_cos_sin_cache(64, DIM, 10000.0, None, torch.float32, device)
    positions = torch.tensor([0, 3, 63, 7, 1], device=device)
    q, k = rand(5, HEADS, DIM), rand(5, KV_HEADS, DIM)
    q_ref, k_ref = q.clone(), k.clone()
    TritonOps.rotary(q, k, positions, cache)
    TorchOps.rotary(q_ref, k_ref, positions, cache)
    torch.testing.assert_close((q, k), (q_ref, k_ref))
    gate_up = rand(5, 2 * 48)
    torch.testing.assert_close(TritonOps.silu_and_mul(gate_up), TorchOps.silu_and_mul(gate_up))


def test_cpu_tensors_without_interpreter_get_a_clear_error(monkeypatch):
    import triton

    from engine.triton_backend import TritonAttention
    monkeypatch.setattr(triton.knobs.runtime, "interpret", False)
    inputs = step_inputs(torch.Generator().manual_seed(5), [(3, 1)])
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        TritonAttention(HEADS, KV_HEADS, DIM)(*inputs)


@gpu
def test_mixed_step_makes_no_host_sync():
    from engine.triton_backend import TritonAttention, TritonOps
    gen = torch.Generator().manual_seed(3)
    q, k, v, kv_cache, meta = step_inputs(gen, [(40, 1), (0, 1), (10, 7)], "cuda")
    attention = TritonAttention(HEADS, KV_HEADS, DIM, target_programs=64)
    x = torch.randn(8, 96, device="cuda")
    attention(q, k, v, kv_cache, meta)  # compile first: the launcher may sync
    TritonOps.rms_norm(x, x[0], 1e-5, x)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        attention(q, k, v, kv_cache, meta)
        TritonOps.rms_norm(x, x[0], 1e-5, x)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@gpu
def test_changing_batches_compile_no_new_kernel_variants():
    """Mixed steps with other decode counts (so other slice alignments), batch sizes and
    table widths reuse the compiled kernels: a compile mid-run would stall it for seconds."""
    from importlib import import_module

    from engine.triton_backend import TritonAttention
    decode = import_module("kernels.paged_decode_attention")
    prefill = import_module("kernels.paged_prefill_attention")
    kernels = (decode._decode_partition_kernel, decode._decode_merge_kernel,
               prefill._prefill_kernel)
    gen = torch.Generator().manual_seed(6)
    attention = TritonAttention(HEADS, KV_HEADS, DIM, target_programs=64)

    def variants():
        return [len(k.device_caches[torch.cuda.current_device()][0]) for k in kernels]

    # Tables of 70-120 blocks (280-480 tokens) keep 2 decode partitions throughout.
    attention(*step_inputs(gen, [(40, 1), (10, 7)], "cuda", width=70))
    before = variants()
    for steps, width in (([(3, 1), (0, 1), (70, 1), (5, 9)], 90),
                         ([(100, 1), (1, 1), (2, 1), (0, 5), (9, 3)], 101),
                         ([(17, 1), (30, 16)], 120), ([(8, 1)] * 4 + [(0, 2)], 77)):
        attention(*step_inputs(gen, steps, "cuda", width=width))
    assert variants() == before


@gpu
def test_decode_step_replays_from_a_cuda_graph():
    """Captured once for a batch of 4 and 200 block-table columns, the step follows new
    q/k/v, slots, seq_lens and block tables written into the same tensors; a padding row
    (slot -1, seq_len 0) stores nothing and gives zeros."""
    from engine.triton_backend import TritonAttention
    gen = torch.Generator().manual_seed(4)
    attention = TritonAttention(HEADS, KV_HEADS, DIM, target_programs=64)
    q, k, v, kv_cache, meta = step_inputs(gen, [(699, 1), (3, 1), (50, 1), (8, 1)], "cuda",
                                          width=200)
    attention(q, k, v, kv_cache, meta)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention(q, k, v, kv_cache, meta)
    new = step_inputs(gen, [(20, 1), (799, 1), (0, 1), (0, 1)], "cuda", width=200)
    for dst, src in zip((q, k, v, *kv_cache), (*new[:3], *new[3])):
        dst.copy_(src)
    for name in ("slot_mapping", "block_tables", "seq_lens"):
        getattr(meta, name).copy_(getattr(new[4], name))
    meta.slot_mapping[3], meta.seq_lens[3] = -1, 0  # padding row
    live = AttentionMetadata(
        meta.slot_mapping[:3], meta.block_tables[:3], meta.seq_lens[:3],
        meta.query_start_loc[:4], 3, 800, [1, 1, 1], [21, 800, 1])
    expected_cache = tuple(c.clone() for c in kv_cache)
    expected = TorchAttention(HEADS, KV_HEADS, DIM)(q[:3], k[:3], v[:3], expected_cache, live)
    graph.replay()
    torch.testing.assert_close(out[:3], expected, atol=1e-5, rtol=1e-5)
    assert torch.equal(out[3], torch.zeros_like(out[3]))
    for got, want in zip(kv_cache, expected_cache):
        assert torch.equal(got, want)


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


@pytest.mark.skipif(not INTERPRET, reason="CPU engine run under TRITON_INTERPRET=1")
def test_llm_greedy_tokens_match_torch_backend():
    triton_outs, torch_outs = greedy("triton"), greedy("torch")
    assert all(o.num_cached_tokens >= 32 for o in (triton_outs[1], triton_outs[3]))
    for i, (got, want) in enumerate(zip(triton_outs, torch_outs)):
        assert len(got.token_ids) == 16
        assert got.token_ids == want.token_ids, f"request {i} diverged"
        assert got.num_cached_tokens == want.num_cached_tokens


@pytest.mark.skipif(not INTERPRET, reason="CPU engine run under TRITON_INTERPRET=1")
def test_speculative_verification_rows_on_the_decode_kernel_keep_greedy_tokens():
    """A verifying request's 1 + k tokens are decode rows, each seeing its context up to
    itself (engine.model_runner): on the Triton decode kernel, mixed with prefill chunks,
    they give plain decoding's tokens and logprobs (a row that saw the proposed tokens
    after it moved them by ~1e-2 here)."""
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, logprobs=0)
    outs = {}
    for backend, config in (("triton", {"speculative": "ngram"}), ("torch", {})):
        llm = LLM(model="dummy:tiny", device="cpu", attention_backend=backend, num_threads=1,
                  max_num_batched_tokens=24, max_num_seqs=8, num_kv_blocks=64, **config)
        outs[backend] = llm, llm.generate(PROMPTS, params)
    (spec, got), (_, want) = outs["triton"], outs["torch"]
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    torch.testing.assert_close([lp.logprob for o in got for lp in o.logprobs],
                               [lp.logprob for o in want for lp in o.logprobs],
                               atol=1e-4, rtol=0)
    stats = spec.core.stats()
    assert stats.spec_accepted_tokens > 0 and stats.num_free_blocks == stats.num_total_blocks
