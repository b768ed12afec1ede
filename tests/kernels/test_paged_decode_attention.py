import pytest
import torch

from kernel_cases import assert_close, gpu, nan_like, paged_kv, randn
from kernels.paged_decode_attention import (paged_decode_attention, paged_decode_attention_ref,
                                           split_num_partitions)


def run_case(gen, device, seq_lens, num_heads, num_kv_heads, head_dim, dtype, block_size,
             **partitioning):
    k_cache, v_cache, tables, lens = paged_kv(gen, seq_lens, block_size, num_kv_heads,
                                              head_dim, dtype, device)
    q = randn(gen, len(seq_lens), num_heads, head_dim, dtype=dtype, device=device)
    scale = head_dim ** -0.5
    out = paged_decode_attention(q, k_cache, v_cache, tables, lens, scale, out=nan_like(q),
                                 **partitioning)
    expected = paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, scale)
    assert_close(out, expected)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(6, 2), (8, 2), (4, 4)])
def test_matches_reference_ragged_single_partition(gen, device, dtype, num_heads, num_kv_heads):
    # seq_len 1, partial last blocks (13, 30 with block 8) and a full block (16).
    run_case(gen, device, [13, 1, 30, 16], num_heads, num_kv_heads, 32, dtype, block_size=8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(6, 2), (8, 2)])
def test_matches_reference_multiple_partitions(gen, device, dtype, num_heads, num_kv_heads):
    # partitions of >= 16 tokens, 7 launched (a 108-token table): 100 splits into 7 of 16,
    # 17 into 2 of 16 (one token in the second), 64 into 4; 1 and 33 use fewer.
    run_case(gen, device, [100, 17, 1, 64, 33], num_heads, num_kv_heads, 32, dtype,
             block_size=4, min_partition=16)


@pytest.mark.parametrize("num_partitions", [2, 3, 20])
def test_partition_length_follows_each_context(gen, device, num_partitions):
    # Fewer partitions than the minimum length allows: each context is cut into
    # num_partitions equal runs of whole 16-token tiles (100 -> 48+48+4 with 3);
    # more than the table can use (20 > 260 / 16): the extra programs exit.
    run_case(gen, device, [100, 35, 16, 0, 250], 8, 2, 32, torch.float32, block_size=4,
             min_partition=16, num_partitions=num_partitions)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_head_dims(gen, device, head_dim):
    run_case(gen, device, [40, 9], 8, 2, head_dim, torch.bfloat16, block_size=16,
             min_partition=32)


@pytest.mark.parametrize("min_partition", [16, 256])
def test_zero_length_rows_give_zeros(gen, device, min_partition):
    # seq_len 0 rows are CUDA-graph padding: finite zeros, no reads of their table row.
    out = run_case(gen, device, [0, 21, 0], 6, 2, 32, torch.float32, block_size=4,
                   min_partition=min_partition)
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert torch.equal(out[2], torch.zeros_like(out[2]))


def test_strided_q_and_out(gen, device):
    # q as a view into a fused qkv projection; out as a view into a larger buffer.
    k_cache, v_cache, tables, lens = paged_kv(gen, [11, 5], 4, 2, 32, torch.float32, device)
    qkv = randn(gen, 2, 10 * 32, dtype=torch.float32, device=device)
    q = qkv[:, :6 * 32].view(2, 6, 32)
    buf = torch.full((2, 7, 32), float("nan"), device=device)
    out = buf[:, 1:]
    paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.2, out=out, min_partition=16)
    assert_close(out, paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.2))
    assert buf[:, 0].isnan().all()


def test_split_num_partitions_fills_target_programs_only_when_needed():
    # A big batch already gives >= 528 programs (4 per SM on a 132-SM H100): no split.
    assert split_num_partitions(256, 8, 768, 528) == 1
    assert split_num_partitions(256, 8, 32768, 528) == 1
    # Mid batch: enough partitions for the target, whatever the table width.
    assert split_num_partitions(32, 8, 32768, 528) == 3
    # One sequence: 66 wanted, but a 768-token table holds only 3 of 256.
    assert split_num_partitions(1, 8, 32768, 528) == 66
    assert split_num_partitions(1, 8, 768, 528) == 3
    assert split_num_partitions(3, 2, 5000, 1) == 1
    assert split_num_partitions(4, 2, 0, 528) == 1


def test_rejects_bad_arguments(gen, device):
    k_cache, v_cache, tables, lens = paged_kv(gen, [5, 3], 4, 2, 32, torch.float32, device)
    q = randn(gen, 2, 6, 32, dtype=torch.float32, device=device)
    bad = {
        "block_tables int64": dict(block_tables=tables.long()),
        "seq_lens wrong length": dict(seq_lens=lens[:1]),
        "q dtype differs from cache": dict(q=q.half()),
        "heads not a multiple of kv heads": dict(q=q[:, :5]),
        "head_dim mismatch": dict(q=q[..., :16]),
        "q not 3-D": dict(q=q[0]),
        "out wrong shape": dict(out=q[:1]),
    }
    for what, override in bad.items():
        args = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=tables, seq_lens=lens,
                    scale=0.1) | override
        with pytest.raises(ValueError):
            paged_decode_attention(**args)
            pytest.fail(f"accepted {what}")
    with pytest.raises(ValueError, match="min_partition"):
        paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.1, min_partition=24)
    with pytest.raises(ValueError, match="num_partitions"):
        paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.1, num_partitions=0)
    with pytest.raises(ValueError, match="head_dim"):
        paged_decode_attention(q[..., :24], k_cache[..., :24].contiguous(),
                               v_cache[..., :24].contiguous(), tables, lens, 0.1)


@gpu
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(32, 8, 64), (9, 3, 64), (32, 8, 128)])
def test_gpu_real_shapes(gen, num_heads, num_kv_heads, head_dim):
    lens = torch.randint(1, 2048, (64,), generator=gen).tolist()
    lens[:3] = [0, 1, 2048]
    run_case(gen, "cuda", lens, num_heads, num_kv_heads, head_dim, torch.bfloat16,
             block_size=16)


@gpu
def test_gpu_cuda_graph_replay_follows_new_seq_lens(gen):
    """The launch grid depends on shapes only: a graph captured once stays correct when
    seq_lens and block tables change between replays."""
    k_cache, v_cache, tables, lens = paged_kv(gen, [700, 300, 5, 0], 16, 8, 64,
                                              torch.bfloat16, "cuda", extra_cols=4)
    q = randn(gen, 4, 32, 64, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q)
    paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125, out=out)  # compile
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.125, out=out)
    lens.copy_(torch.tensor([3, 290, 0, 0], dtype=torch.int32))
    q.copy_(randn(gen, 4, 32, 64, dtype=torch.bfloat16, device="cuda"))
    out.fill_(float("nan"))
    graph.replay()
    assert_close(out, paged_decode_attention_ref(q, k_cache, v_cache, tables, lens, 0.125))


@pytest.mark.parametrize("num_partitions", [1, 3, None])
@pytest.mark.parametrize("window", [1, 20, 64, 500])
def test_sliding_window_sees_and_reads_only_the_last_tokens(gen, device, window,
                                                            num_partitions):
    """A window shorter than some contexts, longer than others (500: all), over one or
    several partitions; tokens before it are NaN-poisoned, so reading one fails."""
    seq_lens = [100, 17, 1, 64, 33, 0]
    k_cache, v_cache, tables, lens = paged_kv(gen, seq_lens, 4, 2, 32, torch.float32, device)
    for b, n in enumerate(seq_lens):
        pos = torch.arange(max(0, n - window))
        slots = tables[b, pos // 4].long().cpu(), pos % 4
        k_cache[slots], v_cache[slots] = float("nan"), float("nan")
    q = randn(gen, len(seq_lens), 8, 32, dtype=torch.float32, device=device)
    out = paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.2, out=nan_like(q),
                                 min_partition=16, num_partitions=num_partitions,
                                 window=window)
    clean = [t.nan_to_num(0.0) for t in (k_cache, v_cache)]
    expected = paged_decode_attention_ref(q, *clean, tables, lens, 0.2, window=window)
    assert_close(out, expected)
    if window < 100:  # the window changed the answer where it cut a context
        whole = paged_decode_attention_ref(q, *clean, tables, lens, 0.2)
        assert not torch.allclose(whole[0], expected[0])
