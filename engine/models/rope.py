"""Rotary embedding frequencies for each rope_type we run, computed the way transformers'
modeling_rope_utils does (same fp32 operations in the same order), so tables match.

A rope type also carries an attention factor that scales cos and sin (transformers'
`attention_scaling`): 1 for all but yarn. It lives in the [cos | sin] table, so every
backend that reads the table (torch, Triton, C++) applies it.
"""
from __future__ import annotations

import math

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


def rope_frequencies(head_dim: int, theta: float,
                     scaling: dict | None) -> tuple[torch.Tensor, float]:
    """(inv_freq [head_dim / 2] fp32, attention factor) for `scaling` (None: default)."""
    rope_type = "default" if scaling is None else scaling["rope_type"]
    if rope_type == "yarn":
        return _yarn(head_dim, theta, scaling)
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float()
                                / head_dim))
    if rope_type == "linear":
        return inv_freq / scaling["factor"], 1.0
    if rope_type == "llama3":
        return _llama3(inv_freq, scaling), 1.0
    if rope_type == "default":
        return inv_freq, 1.0
    raise ValueError(f"unsupported rope_type {rope_type!r}; "
                     f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")


def _llama3(inv_freq: torch.Tensor, s: dict) -> torch.Tensor:
    """Llama 3.1+ frequency scaling: long wavelengths slowed by `factor`, short kept."""
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    out = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    medium = (wavelen <= old_len / low) & (wavelen >= old_len / high)
    return torch.where(medium, blended, out)


def _yarn(dim: int, base: float, s: dict) -> tuple[torch.Tensor, float]:
    """YaRN: dimensions that turn more than beta_fast times over the original context keep
    their frequency, those under beta_slow are interpolated by `factor`, a linear ramp
    between; cos and sin grow by the attention factor (0.1 ln(factor) + 1 unless given).

        dim index:   0 ........ low ======== high ........ dim/2
        frequency:   original    ramp         original / factor
    """
    factor = s["factor"]
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolation, interpolation = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    low, high = _correction_range(s.get("beta_fast") or 32, s.get("beta_slow") or 1, dim, base,
                                  s["original_max_position_embeddings"],
                                  s.get("truncate", True))
    if low == high:
        high += 0.001  # keeps the ramp finite
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    keep = 1 - ramp
    inv_freq = interpolation * (1 - keep) + extrapolation * keep
    return inv_freq, _yarn_attention_factor(s, factor)


def _correction_range(fast, slow, dim, base, original_len, truncate) -> tuple[float, float]:
    """The dimension indices that turn `fast` and `slow` times over the original context."""
    def turns_to_dim(turns):
        return dim * math.log(original_len / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = turns_to_dim(fast), turns_to_dim(slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _yarn_attention_factor(s: dict, factor: float) -> float:
    if s.get("attention_factor") is not None:
        return s["attention_factor"]
    mscale, mscale_all_dim = s.get("mscale"), s.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return float(_mscale(factor, mscale) / _mscale(factor, mscale_all_dim))
    return _mscale(factor)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0
