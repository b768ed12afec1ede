"""Pointwise model ops in plain torch, written to match Hugging Face's Llama numerics.

The GPU path swaps in fused Triton kernels with the same signatures (engine.triton_ops).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.models.rope import rope_frequencies


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
    """[max_pos, head_dim]: cos of each position's angles, then sin, both times the rope
    type's attention factor (transformers' rotary embedding, engine.models.rope)."""
    inv_freq, attention_factor = rope_frequencies(head_dim, theta, scaling)
    angles = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)
    table = torch.cat((angles.cos(), angles.sin()), dim=-1) * attention_factor
    return table.to(dtype=dtype, device=device)
