"""The C++ CPU kernels (kernels/cpu, through engine.cpu_backend) against the plain-torch
references, on NaN-poisoned paged caches with gaps, ragged and empty contexts."""

import datetime

import pytest
import torch

from engine.attention import AttentionMetadata, TorchAttention
from engine.cpu_backend import CpuAttention, CpuOps
from engine.ops import TorchOps, build_cos_sin_cache
from kernel_cases import (assert_close, nan_like, paged_kv, randn, readable_by_torch_backend,
                          with_rejected_rows)
import kernels.cpu as cpu_kernels
from kernels.paged_decode_attention import paged_decode_attention_ref


def decode_meta(block_tables, seq_lens) -> AttentionMetadata:
    lens = seq_lens.tolist()
    return AttentionMetadata(
        slot_mapping=torch.empty(0, dtype=torch.int64), block_tables=block_tables,
        seq_lens=seq_lens, query_start_loc=torch.arange(len(lens) + 1, dtype=torch.int32),
        num_decodes=len(lens), max_seq_len=max(lens), query_lens_host=[1] * len(lens),
        seq_lens_host=lens)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(4, 4), (9, 3), (8, 1)])
@pytest.mark.parametrize("block_size", [16, 5])
@pytest.mark.parametrize("head_dim", [64, 128, 256, 32])  # 32: not built, the torch path
def test_decode_attention_matches_reference(gen, kernels, num_heads, num_kv_heads, block_size,
                                            head_dim):
    seq_lens = [1, 37, block_size, 3 * block_size + 1, 200]  # partial and exact last blocks
    k_cache, v_cache, tables, lens = paged_kv(gen, seq_lens, block_size, num_kv_heads, head_dim,
                                              torch.float32, "cpu")
    if head_dim not in cpu_kernels.ATTENTION_HEAD_DIMS:  # not built: the torch path
        k_cache, v_cache, tables = readable_by_torch_backend(k_cache, v_cache, tables)
    q = randn(gen, len(seq_lens), num_heads, head_dim, dtype=torch.float32, device="cpu")
    attention = CpuAttention(num_heads, num_kv_heads, head_dim, kernels)
    out = attention._decode(q, k_cache, v_cache, decode_meta(tables, lens))
    assert_close(out, paged_decode_attention_ref(q, k_cache, v_cache, tables, lens,
                                                 attention.scale))


@pytest.mark.parametrize("head_dim", [64, 256])
@pytest.mark.parametrize("window", [1, 16, 40, 500])
def test_decode_attention_reads_only_the_window(gen, kernels, window, head_dim):
    """A sliding window: the torch reference's result (which the family parity holds to
    transformers'), and tokens before the window are never read: NaN there changes
    nothing."""
    seq_lens = [1, 16, 37, 200]
    k_cache, v_cache, tables, lens = paged_kv(gen, seq_lens, 16, 1, head_dim, torch.float32,
                                              "cpu")
    k_cache, v_cache, tables = readable_by_torch_backend(k_cache, v_cache, tables)
    q = randn(gen, len(seq_lens), 4, head_dim, dtype=torch.float32, device="cpu")
    meta = decode_meta(tables, lens)
    expected = TorchAttention(4, 1, head_dim, window=window)._decode(q, k_cache, v_cache, meta)
    for b, n in enumerate(seq_lens):  # poison every slot before the window
        for t in range(max(0, n - window)):
            block, offset = tables[b, t // 16].item(), t % 16
            k_cache[block, offset] = v_cache[block, offset] = float("nan")
    out = CpuAttention(4, 1, head_dim, kernels, window=window)._decode(q, k_cache, v_cache, meta)
    assert_close(out, expected)


@pytest.mark.parametrize("threads", [2, 3, 4])
@pytest.mark.parametrize("seq_lens", [[200], [0], [37, 1]])
def test_decode_attention_splits_the_heads_of_fewer_sequences_than_threads(gen, kernels,
                                                                           threads, seq_lens):
    """Fewer sequences than threads: each one's query heads are split into parts (here 1 to
    9 heads, the parts' edges inside a KV group) run by the quantized module's worker pool,
    which load() hands over (quant_exports.h); the same results as the reference."""
    k_cache, v_cache, tables, lens = paged_kv(gen, seq_lens, 16, 3, 64, torch.float32, "cpu")
    q = randn(gen, len(seq_lens), 9, 64, dtype=torch.float32, device="cpu")
    out = torch.full_like(q, float("nan"))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens, 0.125)
    finally:
        torch.set_num_threads(before)
    assert_close(out, paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.125))


def test_decode_attention_without_the_worker_pool_runs_on_openmp(gen, kernels):
    quant = cpu_kernels.load_quant()
    k_cache, v_cache, tables, lens = paged_kv(gen, [45, 3, 0], 16, 3, 64, torch.float32, "cpu")
    q = randn(gen, 3, 9, 64, dtype=torch.float32, device="cpu")
    out = torch.full_like(q, float("nan"))
    kernels.use_quant_exports(None)
    try:
        kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens, 0.125)
    finally:
        kernels.use_quant_exports(quant.exports())
    assert_close(out, paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.125))
    with pytest.raises(RuntimeError, match="not the quant module's exports"):
        kernels.use_quant_exports(datetime.datetime_CAPI)  # another module's capsule


def test_decode_attention_zero_length_rows_give_zeros(gen, kernels):
    k_cache, v_cache, tables, lens = paged_kv(gen, [0, 20], 16, 2, 64, torch.float32, "cpu")
    q = randn(gen, 2, 4, 64, dtype=torch.float32, device="cpu")
    out = torch.full_like(q, float("nan"))
    kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens, 0.125)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert_close(out[1:], paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.125)[1:])


def test_decode_attention_agrees_with_torch_backend(gen, kernels):
    """Same metadata through both engine backends (the torch one gathers rows)."""
    k_cache, v_cache, tables, lens = paged_kv(gen, [17, 64, 5], 16, 3, 64, torch.float32, "cpu",
                                              extra_cols=0)
    k_cache, v_cache, tables = readable_by_torch_backend(k_cache, v_cache, tables)
    q = randn(gen, 3, 9, 64, dtype=torch.float32, device="cpu")
    meta = decode_meta(tables, lens)
    expected = TorchAttention(9, 3, 64)._decode(q, k_cache, v_cache, meta)
    assert_close(CpuAttention(9, 3, 64, kernels)._decode(q, k_cache, v_cache, meta), expected)


def verification_rows(gen, runs: list[tuple[int, int]], block_size: int):
    """Decode rows as the engine lays out verifications (engine.speculative): for each
    (context, rows) a sequence whose rows attend context, context + 1, ... tokens through
    copies of one block-table row, with K/V written 3 slots past the last (a rejected
    proposal's, which no row may read). Returns (k_cache, v_cache, tables, lens)."""
    k_cache, v_cache, tables, lens = paged_kv(gen, [n + rows - 1 for n, rows in runs],
                                              block_size, 3, 64, torch.float32, "cpu")
    with_rejected_rows(gen, k_cache, v_cache, tables, lens.tolist(), 3)
    pick = [b for b, (_, rows) in enumerate(runs) for _ in range(rows)]
    row_lens = [n + i for n, rows in runs for i in range(rows)]
    return k_cache, v_cache, tables[pick].contiguous(), torch.tensor(row_lens, dtype=torch.int32)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("block_size", [16, 5])
def test_decode_attention_runs_a_verifications_rows_together(gen, kernels, threads, block_size):
    """A verification's rows (one sequence, one token more each, the same blocks) attend as
    one run that reads the context once: each row's result is the reference's, and what the
    row gives alone up to the last bits (-ffast-math's vectorized sums split differently
    where a row's scores sit at another offset). Beside them: a lone row, a run crossing a
    block edge, and two sequences whose lengths follow on but whose blocks differ (not one
    run)."""
    runs = [(300, 5), (17, 1), (block_size - 1, 3), (40, 1), (41, 1), (1, 2)]
    k_cache, v_cache, tables, lens = verification_rows(gen, runs, block_size)
    q = randn(gen, len(lens), 9, 64, dtype=torch.float32, device="cpu")
    out = nan_like(q)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens, 0.125)
        alone = torch.cat([kernels_row(kernels, q, k_cache, v_cache, tables, lens, b)
                           for b in range(len(lens))])
    finally:
        torch.set_num_threads(before)
    assert_close(out, paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.125))
    torch.testing.assert_close(out, alone, rtol=0, atol=1e-6)


def kernels_row(kernels, q, k_cache, v_cache, tables, lens, b):
    """Row b through paged_decode_attention alone."""
    out = nan_like(q[b:b + 1])
    kernels.paged_decode_attention(out, q[b:b + 1].contiguous(), k_cache, v_cache,
                                   tables[b:b + 1].contiguous(), lens[b:b + 1].contiguous(),
                                   0.125)
    return out


def test_decode_attention_rejects_bad_arguments(gen, kernels):
    k_cache, v_cache, tables, lens = paged_kv(gen, [20], 16, 2, 64, torch.float32, "cpu")
    q = randn(gen, 1, 4, 64, dtype=torch.float32, device="cpu")
    out = torch.empty_like(q)
    with pytest.raises(RuntimeError, match="float32"):
        kernels.paged_decode_attention(out, q.double(), k_cache, v_cache, tables, lens, 1.0)
    with pytest.raises(RuntimeError, match="int32"):
        kernels.paged_decode_attention(out, q, k_cache, v_cache, tables.long(), lens, 1.0)
    with pytest.raises(RuntimeError, match="does not fit the block table"):
        kernels.paged_decode_attention(out, q, k_cache, v_cache, tables[:, :1], lens, 1.0)
    for bad_id in (-1, k_cache.shape[0]):  # the second block of 20 tokens, in use
        bad = tables.clone()
        bad[0, 1] = bad_id
        with pytest.raises(RuntimeError, match=f"block id {bad_id} of sequence 0 is outside"):
            kernels.paged_decode_attention(out, q, k_cache, v_cache, bad, lens, 1.0)
    with pytest.raises(RuntimeError, match="head_dim must be 64, 128 or 256"):
        kernels.paged_decode_attention(out[..., :32].contiguous(), q[..., :32].contiguous(),
                                       k_cache[..., :32].contiguous(), v_cache[..., :32].contiguous(),
                                       tables, lens, 1.0)
    with pytest.raises(RuntimeError, match="head counts"):
        kernels.paged_decode_attention(torch.empty(1, 3, 64), q[:, :3].contiguous(), k_cache,
                                       v_cache, tables, lens, 1.0)


# Rows: a decode step's few, on the calling thread, and a prefill's many, in chunks of at
# least common.h's kMinChunkFloats over the worker pool (the last chunk shorter).
@pytest.mark.parametrize("tokens", [7, 301])
def test_store_kv_writes_strided_rows_to_their_slots_and_skips_padding(gen, kernels, tokens):
    # k and v as the model has them: views into one fused qkv row per token (strided).
    qkv = randn(gen, tokens, (4 + 2 + 2) * 64, dtype=torch.float32, device="cpu")
    k = qkv[:, 4 * 64:6 * 64].view(tokens, 2, 64)
    v = qkv[:, 6 * 64:].view(tokens, 2, 64)
    blocks = (tokens + 13) // 4  # a few slots to spare
    slots = torch.randperm(blocks * 4, generator=gen)[:tokens]
    slots[3] = -1  # padding: not stored
    shape = (blocks, 4, 2, 64)
    k_cache, v_cache = (randn(gen, *shape, dtype=torch.float32, device="cpu") for _ in range(2))
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    kept = slots >= 0
    TorchAttention(4, 2, 64)._store(k[kept], v[kept], k_ref, v_ref, slots[kept])
    CpuAttention(4, 2, 64, kernels)._store(k, v, k_cache, v_cache, slots)
    # Bit-exact: written slots hold the new rows, every other slot is untouched.
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_store_kv_rejects_bad_arguments(gen, kernels):
    k = randn(gen, 3, 2, 64, dtype=torch.float32, device="cpu")
    k_cache = torch.zeros(2, 4, 2, 64)
    v_cache = torch.zeros_like(k_cache)
    slots = torch.tensor([0, 1, 2])
    for bad_slot in (-2, 8):
        with pytest.raises(RuntimeError, match=f"slot {bad_slot} is outside the cache"):
            kernels.store_kv(k, k, k_cache, v_cache, torch.tensor([0, bad_slot, 2]))
    with pytest.raises(RuntimeError, match="int64"):
        kernels.store_kv(k, k, k_cache, v_cache, slots.int())
    with pytest.raises(RuntimeError, match="one slot per k/v row"):
        kernels.store_kv(k, k, k_cache, v_cache, slots[:2])
    with pytest.raises(RuntimeError, match="heads must be contiguous"):
        kernels.store_kv(k.transpose(1, 2).contiguous().transpose(1, 2), k, k_cache, v_cache, slots)
    with pytest.raises(RuntimeError, match="float32"):
        kernels.store_kv(k.double(), k, k_cache, v_cache, slots)
    assert not k_cache.any() and not v_cache.any()  # nothing written by a refused call


@pytest.mark.parametrize("shape", [(5, 96), (33, 576), (7, 3, 64), (301, 576)])
def test_rms_norm_matches_torch_ops(gen, kernels, shape):
    x, residual = (randn(gen, *shape, dtype=torch.float32, device="cpu") for _ in range(2))
    weight = randn(gen, shape[-1], dtype=torch.float32, device="cpu")
    ops = CpuOps(kernels)
    assert_close(ops.rms_norm(x, weight, 1e-5), TorchOps.rms_norm(x, weight, 1e-5))
    out, new_residual = ops.rms_norm(x, weight, 1e-6, residual)
    out_ref, residual_ref = TorchOps.rms_norm(x, weight, 1e-6, residual)
    assert torch.equal(new_residual, residual_ref)
    assert_close(out, out_ref)


@pytest.mark.parametrize("tokens", [11, 301])
def test_rotary_matches_torch_ops_in_place(gen, kernels, tokens):
    cache = build_cos_sin_cache(512, 64, 10000.0, None, torch.float32, "cpu")
    positions = torch.randint(0, 512, (tokens,), generator=gen)
    q, k = randn(gen, tokens, 9, 64, dtype=torch.float32, device="cpu"), \
        randn(gen, tokens, 3, 64, dtype=torch.float32, device="cpu")
    q_ref, k_ref = q.clone(), k.clone()
    CpuOps(kernels).rotary(q, k, positions, cache)
    TorchOps.rotary(q_ref, k_ref, positions, cache)
    assert_close(q, q_ref)
    assert_close(k, k_ref)
    with pytest.raises(RuntimeError, match="out of range"):
        kernels.rotary(q, torch.full((tokens,), 512), cache)


@pytest.mark.parametrize("tokens", [7, 301])
def test_qkv_rope_store_matches_split_rotary_and_store(gen, kernels, tokens):
    """The fused path from the qkv projection: the same q, and the same cache contents, as
    splitting it, rotating q and k (TorchOps) and storing k/v (TorchAttention)."""
    heads, kv_heads, dim = 9, 3, 64
    cache = build_cos_sin_cache(512, dim, 10000.0, None, torch.float32, "cpu")
    qkv = randn(gen, tokens, (heads + 2 * kv_heads) * dim, dtype=torch.float32, device="cpu")
    positions = torch.randint(0, 512, (tokens,), generator=gen)
    blocks = (tokens + 13) // 4
    slots = torch.randperm(blocks * 4, generator=gen)[:tokens]
    slots[2] = -1  # padding: not stored
    shape = (blocks, 4, kv_heads, dim)
    k_cache, v_cache = (randn(gen, *shape, dtype=torch.float32, device="cpu") for _ in range(2))
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    q, k, v = (t.reshape(tokens, -1, dim).clone()
               for t in qkv.split([heads * dim, kv_heads * dim, kv_heads * dim], dim=-1))
    TorchOps.rotary(q, k, positions, cache)
    kept = slots >= 0
    TorchAttention(heads, kv_heads, dim)._store(k[kept], v[kept], k_ref, v_ref, slots[kept])
    q_out = kernels.qkv_rope_store(qkv, positions, cache, k_cache, v_cache, slots, heads)
    assert_close(q_out, q)
    assert_close(k_cache, k_ref)
    assert torch.equal(v_cache, v_ref)
    with pytest.raises(RuntimeError, match="out of range"):
        kernels.qkv_rope_store(qkv, torch.full((tokens,), 512), cache, k_cache, v_cache, slots,
                               heads)
    with pytest.raises(RuntimeError, match="qkv must be"):
        kernels.qkv_rope_store(qkv, positions, cache, k_cache, v_cache, slots, heads + 1)
    with pytest.raises(RuntimeError, match="outside the cache"):
        kernels.qkv_rope_store(qkv, positions, cache, k_cache, v_cache, slots + 4 * blocks,
                               heads)


def test_qkv_decode_attention_is_rope_store_then_paged_attention(gen, kernels):
    """A decode-only step's one call: the same output and cache contents as qkv_rope_store
    followed by paged_decode_attention, for sequences of different lengths."""
    heads, kv_heads, dim, block = 9, 3, 64, 16
    cos_sin = build_cos_sin_cache(512, dim, 10000.0, None, torch.float32, "cpu")
    seq_lens = torch.tensor([1, 17, 40], dtype=torch.int32)
    tables = torch.randperm(12, generator=gen)[:9].int().view(3, 3)
    positions = seq_lens.long() - 1
    slots = tables.long().gather(1, (positions // block)[:, None]).squeeze(1) * block + positions % block
    qkv = randn(gen, 3, (heads + 2 * kv_heads) * dim, dtype=torch.float32, device="cpu")
    k_cache, v_cache = (randn(gen, 12, block, kv_heads, dim, dtype=torch.float32, device="cpu")
                        for _ in range(2))
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    q = kernels.qkv_rope_store(qkv, positions, cos_sin, k_ref, v_ref, slots, heads)
    expected = torch.empty_like(q)
    kernels.paged_decode_attention(expected, q, k_ref, v_ref, tables, seq_lens, dim ** -0.5)
    out = kernels.qkv_decode_attention(qkv, positions, cos_sin, k_cache, v_cache, slots, tables,
                                       seq_lens, heads, dim ** -0.5)
    assert out.shape == (3, heads * dim)
    assert torch.equal(out, expected.view(3, -1))
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


@pytest.mark.parametrize("rows", [6, 71])
def test_silu_and_mul_matches_torch_ops(gen, kernels, rows):
    x = randn(gen, rows, 2 * 1536, dtype=torch.float32, device="cpu") * 8  # exp's tails too
    assert_close(CpuOps(kernels).silu_and_mul(x), TorchOps.silu_and_mul(x))


def test_other_dtypes_fall_back_to_torch(gen, kernels):
    x = randn(gen, 4, 64, dtype=torch.bfloat16, device="cpu")
    weight = randn(gen, 64, dtype=torch.bfloat16, device="cpu")
    assert torch.equal(CpuOps(kernels).rms_norm(x, weight, 1e-5), TorchOps.rms_norm(x, weight, 1e-5))


def test_kernels_release_the_gil(gen, kernels):
    """A Python thread (the server's event loop) keeps running inside a kernel call."""
    import threading
    import time

    k_cache, v_cache, tables, lens = paged_kv(gen, [12000] * 8, 16, 4, 128, torch.float32, "cpu")
    q = randn(gen, 8, 16, 128, dtype=torch.float32, device="cpu")
    out = torch.empty_like(q)
    ticks, stop = [], threading.Event()

    def count():
        while not stop.is_set():
            ticks.append(time.perf_counter())
            time.sleep(0.001)

    counter = threading.Thread(target=count)
    counter.start()
    calls = []
    try:
        for _ in range(5):
            start = time.perf_counter()
            kernels.paged_decode_attention(out, q, k_cache, v_cache, tables, lens, 0.1)
            calls.append((start, time.perf_counter()))
    finally:
        stop.set()
        counter.join()
    # Ticks strictly inside a call (5 ms margins): none if the call held the GIL.
    inside = sum(start + 0.005 < t < end - 0.005 for t in ticks for start, end in calls)
    longest = max(end - start for start, end in calls)
    assert longest > 0.02, f"calls too short to tell ({longest:.3f} s)"
    assert inside >= 5, f"{inside} ticks of the other thread inside the kernel calls"


def test_build_is_cached_per_kind_of_cpu(kernels):
    """The cache key includes this CPU's instruction-set flags (-march=native builds)."""
    cpu_id = cpu_kernels._cpu_id()
    assert cpu_id == cpu_kernels._cpu_id() and len(cpu_id) == 10
    assert kernels.__name__ == f"tokenwire_cpu_ops_{cpu_id}"
