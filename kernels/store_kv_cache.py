"""Write new tokens' K/V into the paged cache.

    key[t] ──slot_mapping[t]──> k_cache.view(num_blocks * block_size, Hkv, D)[slot]
    slot = block_id * block_size + offset; slot < 0 marks a padding row (skipped).
"""

import torch
import triton
import triton.language as tl

from kernels._checks import check_dim, check_kv_cache, check_same, check_tensor


@triton.jit
def _store_kv_cache_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_H: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_mapping_ptr + t).to(tl.int64)
    if slot < 0:
        return
    offs_h = tl.arange(0, BLOCK_H)[:, None]
    offs_d = tl.arange(0, HEAD_DIM)[None, :]
    mask = offs_h < NUM_KV_HEADS
    k = tl.load(key_ptr + t * stride_kt + offs_h * stride_kh + offs_d, mask=mask)
    v = tl.load(value_ptr + t * stride_vt + offs_h * stride_vh + offs_d, mask=mask)
    # The cache is contiguous: one slot holds NUM_KV_HEADS * HEAD_DIM elements.
    dst = slot * (NUM_KV_HEADS * HEAD_DIM) + offs_h * HEAD_DIM + offs_d
    tl.store(k_cache_ptr + dst, k, mask=mask)
    tl.store(v_cache_ptr + dst, v, mask=mask)


def _check_args(key, value, k_cache, v_cache, slot_mapping) -> None:
    check_tensor("key", key, 3)
    check_tensor("value", value, 3)
    check_kv_cache(k_cache, v_cache)
    check_tensor("slot_mapping", slot_mapping, 1, (torch.int64,))
    check_same("value", value, "key", key)
    check_same("k_cache", k_cache, "key", key)
    if slot_mapping.device != key.device:
        raise ValueError(f"slot_mapping is on {slot_mapping.device} but key is on {key.device}")
    if value.shape != key.shape:
        raise ValueError(f"value shape {tuple(value.shape)} != key shape {tuple(key.shape)}")
    check_dim("slot_mapping", slot_mapping, 0, key.shape[0])
    check_dim("k_cache", k_cache, 2, key.shape[1])
    check_dim("k_cache", k_cache, 3, key.shape[2])
    head_dim = key.shape[2]
    if head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two, got {head_dim}")


def store_kv_cache(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                   v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Copy key/value [T, Hkv, D] into the caches at slot_mapping [T] (int64; < 0 skips)."""
    _check_args(key, value, k_cache, v_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    _store_kv_cache_kernel[(num_tokens,)](
        key, value, k_cache, v_cache, slot_mapping,
        key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads),
    )


def store_kv_cache_ref(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor,
                       v_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Plain-torch store_kv_cache: same arguments, same in-place effect."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    k_cache.view(-1, *k_cache.shape[2:])[slots] = key[keep]
    v_cache.view(-1, *v_cache.shape[2:])[slots] = value[keep]
