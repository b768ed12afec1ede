"""Pointwise model ops in plain torch, written to match Hugging Face's Llama numerics.

The GPU path swaps in fused Triton kernels with the same signatures (engine.triton_ops).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


class TorchOps:
    """RMSNorm (+ residual add), rotary embedding and SiLU-and-mul in plain torch."""

    @staticmethod
    def rms_norm(x, weight, eps, residual=None):
        """rmsnorm(x) if residual is None, else (rmsnorm(x + residual), x + residual)."""
        if residual is not None:
            x = x + residual
            residual = x
        xf = x.float()
        variance = xf.pow(2).mean(-1, keepdim=True)
        out = weight * (xf * torch.rsqrt(variance + eps)).to(x.dtype)
        return out if residual is None else (out, residual)

    @staticmethod
    def rotary(q, k, positions, cos_sin_cache):
        """Rotate q [T, H, D] and k [T, Hkv, D] in place (rotate_half / neox layout)."""
        cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)  # [T, D/2] each
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        for x in (q, k):
            x1, x2 = x.chunk(2, dim=-1)
            rotated = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
            x.copy_(rotated)

    @staticmethod
    def silu_and_mul(x):
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


def build_cos_sin_cache(max_pos: int, head_dim: int, theta: float, scaling: dict | None,
                        dtype: torch.dtype, device) -> torch.Tensor:
    """[max_pos, head_dim]: cos of each position's angles, then sin (HF default rope)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
    inv_freq = 1.0 / (theta ** exponents)
    if scaling is not None:
        inv_freq = _llama3_scaled(inv_freq, scaling)
    angles = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(dtype=dtype, device=device)


def _llama3_scaled(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1+ frequency scaling: long wavelengths slowed by `factor`, short kept."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    medium = (wavelen <= old_len / low) & (wavelen >= old_len / high)
    return torch.where(medium, blended, out)
