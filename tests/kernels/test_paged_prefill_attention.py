import pytest
import torch

from kernel_cases import assert_close, gpu, nan_like, ragged, verification_step
from kernels.paged_decode_attention import paged_decode_attention
from kernels.paged_prefill_attention import paged_prefill_attention, paged_prefill_attention_ref


def run_case(gen, device, seq_lens, q_lens, num_heads, num_kv_heads, head_dim, dtype,
             block_size=4):
    args = ragged(gen, seq_lens, q_lens, num_heads, num_kv_heads, head_dim, dtype, device,
                  block_size)
    scale = head_dim ** -0.5
    out = paged_prefill_attention(*args, scale, out=nan_like(args[0]))
    assert_close(out, paged_prefill_attention_ref(*args, scale))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("num_heads,num_kv_heads", [(6, 2), (8, 2), (4, 4)])
def test_matches_reference_ragged(gen, device, dtype, num_heads, num_kv_heads):
    # cached prefix (q_len < seq_len), a whole prompt (q_len == seq_len), a one-token
    # extend, a prompt of one token; partial last blocks with block_size 4.
    run_case(gen, device, [70, 37, 9, 1], [30, 37, 1, 1], num_heads, num_kv_heads, 32, dtype)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(6, 2), (4, 4)])
def test_many_query_and_kv_tiles(gen, device, num_heads, num_kv_heads):
    # 90 new tokens span several query tiles (16 per tile at group 3-4, 64 at group 1)
    # and contexts of 150 span several 64-token K/V tiles.
    run_case(gen, device, [150, 90], [90, 90], num_heads, num_kv_heads, 32, torch.float32)


@pytest.mark.parametrize("head_dim", [64, 128])
def test_head_dims(gen, device, head_dim):
    run_case(gen, device, [40, 21], [17, 21], 8, 2, head_dim, torch.bfloat16, block_size=16)


def test_rows_before_first_sequence_untouched(gen, device):
    """query_start_loc may start past row 0 (decode rows first in the step's q):
    those rows are neither read nor written."""
    args = ragged(gen, [30, 12], [10, 12], 6, 2, 32, torch.float32, device, 4, lead_rows=5)
    out = paged_prefill_attention(*args, 0.2, out=nan_like(args[0]))
    assert out[:5].isnan().all()
    assert_close(out[5:], paged_prefill_attention_ref(*args, 0.2)[5:])


def test_one_query_per_sequence_equals_decode(gen, device):
    q, k_cache, v_cache, tables, starts, lens = ragged(
        gen, [19, 1, 40], [1, 1, 1], 8, 2, 32, torch.float32, device, 4)
    prefill = paged_prefill_attention(q, k_cache, v_cache, tables, starts, lens, 0.3)
    decode = paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.3, min_partition=16)
    assert_close(prefill, decode)


def test_rejects_bad_arguments(gen, device):
    q, k_cache, v_cache, tables, starts, lens = ragged(gen, [9, 4], [3, 4], 6, 2, 32,
                                                       torch.float32, device, 4)
    bad = {
        "query_start_loc int64": dict(query_start_loc=starts.long()),
        "query_start_loc wrong length": dict(query_start_loc=starts[:2]),
        "block_tables rows != batch": dict(block_tables=tables[:1]),
        "cache dtype differs": dict(k_cache=k_cache.half(), v_cache=v_cache.half()),
        "k/v cache shapes differ": dict(v_cache=v_cache[:-1]),
        "non-contiguous cache": dict(k_cache=k_cache.transpose(0, 1), v_cache=v_cache.transpose(0, 1)),
        "heads not a multiple of kv heads": dict(q=q[:, :5]),
        "out dtype differs": dict(out=q.half()),
        "q is not a tensor": dict(q=q.tolist()),
    }
    for what, override in bad.items():
        args = dict(q=q, k_cache=k_cache, v_cache=v_cache, block_tables=tables,
                    query_start_loc=starts, seq_lens=lens, scale=0.1) | override
        with pytest.raises(ValueError):
            paged_prefill_attention(**args)
            pytest.fail(f"accepted {what}")


@gpu
@pytest.mark.parametrize("num_heads,num_kv_heads,head_dim", [(32, 8, 64), (9, 3, 64), (32, 8, 128)])
def test_gpu_real_shapes(gen, num_heads, num_kv_heads, head_dim):
    seq_lens = [2048, 1500, 700, 513, 64, 1]
    q_lens = [2048, 300, 700, 1, 64, 1]
    run_case(gen, "cuda", seq_lens, q_lens, num_heads, num_kv_heads, head_dim,
             torch.bfloat16, block_size=16)


@pytest.mark.parametrize("window", [1, 5, 40, 300])
def test_sliding_window(gen, device, window):
    """Each query sees the last `window` positions up to its own: a cached prefix longer
    than the window, a prompt spanning several query and K/V tiles, one-token rows (rows
    that see nothing in a tile's first K/V tiles must not turn NaN)."""
    args = ragged(gen, [150, 90, 9, 1], [90, 90, 1, 1], 6, 2, 32, torch.float32, device, 4)
    out = paged_prefill_attention(*args, 0.2, out=nan_like(args[0]), window=window)
    expected = paged_prefill_attention_ref(*args, 0.2, window=window)
    assert_close(out, expected)
    if window < 90:
        assert not torch.allclose(expected, paged_prefill_attention_ref(*args, 0.2))


def test_sliding_window_equals_decode(gen, device):
    """One query per sequence with a window: the decode kernel's answer."""
    q, k_cache, v_cache, tables, starts, lens = ragged(gen, [70, 33, 5], [1, 1, 1], 8, 2, 32,
                                                       torch.float32, device, 4)
    prefill = paged_prefill_attention(q, k_cache, v_cache, tables, starts, lens, 0.2, window=12)
    decode = paged_decode_attention(q, k_cache, v_cache, tables, lens, 0.2, window=12)
    assert_close(prefill, decode)


@pytest.mark.parametrize("num_heads,num_kv_heads", [(9, 3), (4, 4)])
def test_multi_query_decode_of_speculative_verification(gen, device, num_heads, num_kv_heads):
    """Verification steps (1-5 queries per sequence over a long cached context) run on
    this kernel, with the rejected slots of an earlier verification still holding K/V."""
    args, expected = verification_step(gen, num_heads, num_kv_heads, 32, 0.25)
    moved = [t.to(device) for t in args]
    out = paged_prefill_attention(*moved, 0.25, out=nan_like(moved[0]))
    assert_close(out.cpu(), expected)
