"""C++ drop-ins for engine.attention.TorchAttention's decode path, engine.ops.TorchOps and
engine.linear.Linear (CPU, fp32): the kernels in kernels/cpu. Same signatures and results
as the torch versions; anything they do not cover (other dtypes, prefill attention) stays
on torch.
"""
from __future__ import annotations

import torch

from engine.attention import AttentionMetadata, TorchAttention
from engine.ops import TorchOps
from kernels.cpu import ATTENTION_HEAD_DIMS


class CpuAttention(TorchAttention):
    """TorchAttention with decode and prefill/extend rows read straight from the paged
    cache in C++ (no gathered or per-head repeated copy of the context; each K/V row read
    once for all query heads of its group; all prefill requests in one call) and new K/V
    rows stored in one C++ call; with a sliding window, tokens before it are never read.
    Other dtypes and head sizes keep the torch path. prefill_bf16: prefill/extend rows
    multiply the key tiles far behind them in bf16 (kernels.cpu.prefill_attention_bf16
    chooses); decode rows, a speculative verification's included, stay fp32."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, kernels, *,
                 window: int | None = None, scale: float | None = None,
                 prefill_bf16: bool = False):
        super().__init__(num_heads, num_kv_heads, head_dim, window=window, scale=scale)
        self.kernels = kernels
        self.prefill_bf16 = prefill_bf16

    def _prefill_in_cpp(self, dtype: torch.dtype) -> bool:
        return dtype == torch.float32 and self.head_dim in ATTENTION_HEAD_DIMS

    def _store(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        if k_cache.dtype != torch.float32:
            return super()._store(k, v, k_cache, v_cache, slot_mapping)
        self.kernels.store_kv(k, v, k_cache, v_cache, slot_mapping)

    def _prefill(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, out) -> None:
        if not self._prefill_in_cpp(q.dtype):
            return super()._prefill(q, k, v, k_cache, v_cache, meta, out)
        nd = meta.num_decodes
        self.kernels.paged_prefill_attention(out, q, k_cache, v_cache, meta.block_tables[nd:],
                                             meta.query_start_loc[nd:], meta.seq_lens[nd:],
                                             self.scale, self.window or 0,
                                             self.prefill_bf16)

    def attend_qkv(self, qkv, positions, cos_sin_cache, kv_cache, meta: AttentionMetadata):
        """qkv [T, (H + 2 Hkv) * D] -> [T, H * D]: rope and the K/V store in one C++ pass
        straight from the fused projection, then attention from the paged cache (no split,
        reshape, copy or rotary call per layer from Python). None for what the C++ paths
        do not cover: the model then splits qkv itself."""
        if not self._prefill_in_cpp(qkv.dtype):
            return None
        k_cache, v_cache = kv_cache
        if meta.num_decodes == qkv.shape[0] and self.window is None:  # decode-only: all of
            # it in one C++ call (which takes no window)
            return self.kernels.qkv_decode_attention(
                qkv, positions, cos_sin_cache, k_cache, v_cache, meta.slot_mapping,
                meta.block_tables, meta.seq_lens, self.num_heads, self.scale)
        q = self.kernels.qkv_rope_store(qkv, positions, cos_sin_cache, k_cache, v_cache,
                                        meta.slot_mapping, self.num_heads)
        return self.attend_stored(q, None, None, kv_cache, meta).view(q.shape[0], -1)

    def _decode(self, q, k_cache, v_cache, meta: AttentionMetadata):
        if q.dtype != torch.float32 or self.head_dim not in ATTENTION_HEAD_DIMS:
            return super()._decode(q, k_cache, v_cache, meta)
        out = torch.empty_like(q)
        self.kernels.paged_decode_attention(out, q, k_cache, v_cache, meta.block_tables,
                                            meta.seq_lens, self.scale, self.window or 0)
        return out


class CpuLinear:
    """y = x @ weight.T + bias (fp32) on the weight packed once into 16-column panels for
    the C++ matmul, which beat oneDNN's at every row count of this model family's steps
    on the CI box (docs/benchmarks.md)."""

    __slots__ = ("packed", "bias", "out_features", "kernels")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernels):
        self.packed = kernels.pack_linear_weight(weight.contiguous())
        self.bias = None if bias is None else bias.contiguous()
        self.out_features = weight.shape[0]
        self.kernels = kernels

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.packed_linear(x.contiguous(), self.packed, self.bias,
                                          self.out_features)


class CpuOps:
    """TorchOps with fp32 rows done in one C++ pass each; other dtypes go to TorchOps."""

    def __init__(self, kernels):
        self.kernels = kernels

    def linear(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> CpuLinear:
        """A projection on the C++ matmul (the caller checks the dtype is fp32)."""
        return CpuLinear(weight, bias, self.kernels)

    def rms_norm(self, x, weight, eps, residual=None):
        if x.dtype != torch.float32:
            return TorchOps.rms_norm(x, weight, eps, residual)
        outs = self.kernels.rms_norm(x, weight, eps, residual)
        return outs[0] if residual is None else tuple(outs)

    def rotary(self, q, k, positions, cos_sin_cache):
        if q.dtype != torch.float32:
            return TorchOps.rotary(q, k, positions, cos_sin_cache)
        for x in (q, k):
            self.kernels.rotary(x, positions, cos_sin_cache)

    def silu_and_mul(self, x):
        if x.dtype != torch.float32:
            return TorchOps.silu_and_mul(x)
        return self.kernels.silu_and_mul(x)
