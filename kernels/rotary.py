"""Rotary position embedding, HF Llama "rotate_half" (neox) style, in place on q and k.

    x = [x1 | x2] (halves of head_dim D);  cos, sin = cos_sin_cache[pos, :D/2], [pos, D/2:]
    out = [x1 * cos - x2 * sin | x2 * cos + x1 * sin]     (fp32 math, one rounding)
One program per token rotates all its q heads and k heads.
"""

import torch
import triton
import triton.language as tl

from kernels._checks import check_dim, check_same, check_tensor


@triton.jit
def _rotate(x_ptr, stride_h, cos, sin, NUM_HEADS: tl.constexpr, HEADS_PAD: tl.constexpr,
            HALF: tl.constexpr):
    offs_h = tl.arange(0, HEADS_PAD)[:, None]
    offs_d = tl.arange(0, HALF)[None, :]
    mask = offs_h < NUM_HEADS
    ptr1 = x_ptr + offs_h * stride_h + offs_d
    x1 = tl.load(ptr1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr1 + HALF, mask=mask, other=0.0).to(tl.float32)
    dtype = x_ptr.dtype.element_ty
    tl.store(ptr1, (x1 * cos - x2 * sin).to(dtype), mask=mask)
    tl.store(ptr1 + HALF, (x2 * cos + x1 * sin).to(dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, positions_ptr, cos_sin_ptr, stride_qt, stride_qh, stride_kt, stride_kh,
    stride_cache, NUM_HEADS: tl.constexpr, NUM_KV_HEADS: tl.constexpr,
    HEADS_PAD: tl.constexpr, KV_HEADS_PAD: tl.constexpr, HALF: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(positions_ptr + t)
    offs_d = tl.arange(0, HALF)[None, :]
    cos = tl.load(cos_sin_ptr + pos * stride_cache + offs_d).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cache + HALF + offs_d).to(tl.float32)
    _rotate(q_ptr + t * stride_qt, stride_qh, cos, sin, NUM_HEADS, HEADS_PAD, HALF)
    _rotate(k_ptr + t * stride_kt, stride_kh, cos, sin, NUM_KV_HEADS, KV_HEADS_PAD, HALF)


def _check_args(q, k, positions, cos_sin_cache) -> None:
    check_tensor("q", q, 3)
    check_tensor("k", k, 3)
    check_same("k", k, "q", q)
    check_tensor("positions", positions, 1, (torch.int64,))
    check_tensor("cos_sin_cache", cos_sin_cache, 2)
    if positions.device != q.device or cos_sin_cache.device != q.device:
        raise ValueError(f"positions and cos_sin_cache must be on q's device {q.device}")
    check_dim("k", k, 0, q.shape[0])
    check_dim("k", k, 2, q.shape[2])
    check_dim("positions", positions, 0, q.shape[0])
    check_dim("cos_sin_cache", cos_sin_cache, 1, q.shape[2])
    head_dim = q.shape[2]
    if head_dim < 2 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two >= 2, got {head_dim}")


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                 cos_sin_cache: torch.Tensor) -> None:
    """Rotate q [T, H, D] and k [T, Hkv, D] in place by positions [T] (int64).

    cos_sin_cache [max_pos, D]: cos in the first D/2 columns, sin in the last D/2;
    every position must be < max_pos.
    """
    _check_args(q, k, positions, cos_sin_cache)
    num_tokens, num_heads, head_dim = q.shape
    if num_tokens == 0:
        return
    _rotary_kernel[(num_tokens,)](
        q, k, positions, cos_sin_cache, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        cos_sin_cache.stride(0), NUM_HEADS=num_heads, NUM_KV_HEADS=k.shape[1],
        HEADS_PAD=triton.next_power_of_2(num_heads),
        KV_HEADS_PAD=triton.next_power_of_2(k.shape[1]), HALF=head_dim // 2,
    )


def apply_rotary_ref(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                     cos_sin_cache: torch.Tensor) -> None:
    """Plain-torch apply_rotary (fp32 math): same arguments and in-place effect."""
    cos, sin = cos_sin_cache[positions].float().chunk(2, dim=-1)  # [T, D/2] each
    for x in (q, k):
        x1, x2 = x.float().chunk(2, dim=-1)
        c, s = cos[:, None, :], sin[:, None, :]
        x.copy_(torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1))


def build_cos_sin_cache(max_pos: int, head_dim: int, theta: float, dtype: torch.dtype,
                        device, inv_freq: torch.Tensor | None = None) -> torch.Tensor:
    """[max_pos, head_dim] table of [cos | sin] for HF's default rope, computed in fp32.

    inv_freq [head_dim / 2] overrides 1 / theta ** (arange(0, D, 2) / D), for scaled
    ropes (e.g. HF's "llama3" rope_type computes its own inv_freq).
    """
    if inv_freq is None:
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float()
        inv_freq = 1.0 / (theta ** (exponents / head_dim))
    t = torch.arange(max_pos, dtype=torch.int64, device=device).float()
    freqs = torch.outer(t, inv_freq.to(device=device, dtype=torch.float32))  # [max_pos, D/2]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).to(dtype)
