import pytest
import torch

from kernel_cases import gpu, randn
from kernels.store_kv_cache import store_kv_cache, store_kv_cache_ref


def run_case(gen, device, num_tokens, num_kv_heads, head_dim, dtype, num_blocks, block_size,
             skip_rows=()):
    key = randn(gen, num_tokens, num_kv_heads, head_dim, dtype=dtype, device=device)
    value = randn(gen, num_tokens, num_kv_heads, head_dim, dtype=dtype, device=device)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    slots[list(skip_rows)] = -1
    slots = slots.to(device)
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = randn(gen, *shape, dtype=dtype, device=device)
    v_cache = randn(gen, *shape, dtype=dtype, device=device)
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    store_kv_cache(key, value, k_cache, v_cache, slots)
    store_kv_cache_ref(key, value, k_expected, v_expected, slots)
    # Bit-exact: written slots hold the new rows, every other slot is untouched.
    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)
    return key, k_cache, slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_matches_reference(gen, device, dtype):
    run_case(gen, device, 9, 3, 32, dtype, num_blocks=6, block_size=4)


def test_negative_slots_are_skipped(gen, device):
    key, k_cache, slots = run_case(gen, device, 8, 2, 16, torch.float32, num_blocks=5,
                                   block_size=4, skip_rows=(0, 5, 7))
    # The skipped rows' values appear nowhere in the cache.
    flat = k_cache.view(-1, *k_cache.shape[2:])
    for row in (0, 5, 7):
        assert not (flat == key[row]).all(-1).all(-1).any()


def test_strided_key_value(gen, device):
    # key/value as views into a fused qkv projection [T, (H + 2 * Hkv) * D].
    qkv = randn(gen, 5, (4 + 2 + 2) * 32, dtype=torch.bfloat16, device=device)
    key = qkv[:, 4 * 32:6 * 32].view(5, 2, 32)
    value = qkv[:, 6 * 32:].view(5, 2, 32)
    slots = torch.tensor([3, -1, 0, 9, 4], device=device)
    k_cache = torch.zeros(3, 4, 2, 32, dtype=torch.bfloat16, device=device)
    v_cache = torch.zeros_like(k_cache)
    k_expected, v_expected = k_cache.clone(), v_cache.clone()
    store_kv_cache(key, value, k_cache, v_cache, slots)
    store_kv_cache_ref(key, value, k_expected, v_expected, slots)
    assert torch.equal(k_cache, k_expected) and torch.equal(v_cache, v_expected)


def test_rejects_bad_arguments(gen, device):
    key = randn(gen, 4, 2, 16, dtype=torch.float32, device=device)
    k_cache = torch.zeros(2, 4, 2, 16, device=device)
    slots = torch.arange(4, device=device)
    bad = {
        "slot_mapping int32": dict(slot_mapping=slots.int()),
        "slot_mapping wrong length": dict(slot_mapping=slots[:3]),
        "cache dtype differs": dict(k_cache=k_cache.half(), v_cache=k_cache.half()),
        "kv heads differ": dict(key=key[:, :1], value=key[:, :1]),
        "value shape differs": dict(value=key[:3]),
        "non-contiguous cache": dict(k_cache=k_cache.transpose(0, 1), v_cache=k_cache.transpose(0, 1)),
        "integer key": dict(key=key.int(), value=key.int()),
    }
    for what, override in bad.items():
        args = dict(key=key, value=key, k_cache=k_cache, v_cache=k_cache.clone(),
                    slot_mapping=slots) | override
        with pytest.raises(ValueError):
            store_kv_cache(**args)
            pytest.fail(f"accepted {what}")


@gpu
@pytest.mark.parametrize("head_dim", [64, 128])
def test_gpu_real_shapes(gen, head_dim):
    run_case(gen, "cuda", 4096, 8, head_dim, torch.bfloat16, num_blocks=1024, block_size=16,
             skip_rows=range(0, 4096, 97))
