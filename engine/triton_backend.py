"""Triton drop-ins for engine.attention.TorchAttention and engine.ops.TorchOps (GPU path).

Same call signatures, return conventions and in-place effects as the torch versions; the
kernels live in kernels/. Under TRITON_INTERPRET=1 they also run on CPU tensors (tests).

CUDA-graph capture of a decode-only step: every launch here takes its grid, partition
count and workspace from tensor shapes and meta.num_decodes only, never from tensor values,
and nothing synchronises with the host. Captured, a step is fixed by (batch, H, D,
block_tables.shape[1], num_decodes == batch); slot_mapping, block_tables, seq_lens and
q/k/v may change between replays in place (query_start_loc, max_seq_len and the host
lists are not read on that path). Padding rows: slot_mapping -1 (not stored), seq_lens 0
(zero output; their block-table row is not read). Each sequence splits its own context
over the launched partitions at run time, so a table as wide as max_model_len costs
nothing at short contexts.
"""
from __future__ import annotations

import functools

import torch
import triton

from engine.attention import AttentionMetadata
from kernels.paged_decode_attention import (PROGRAMS_PER_SM, paged_decode_attention,
                                           split_num_partitions)
from kernels.paged_prefill_attention import paged_prefill_attention
from kernels.rms_norm import rms_norm
from kernels.rotary import apply_rotary
from kernels.silu_and_mul import silu_and_mul
from kernels.store_kv_cache import store_kv_cache


class TritonAttention:
    """Paged attention with Triton kernels; a drop-in for TorchAttention."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, *,
                 target_programs: int | None = None, scale: float | None = None,
                 window: int | None = None):
        """target_programs: decode programs to aim for when splitting contexts
        (None: PROGRAMS_PER_SM per SM of q's GPU; 1, i.e. never split, elsewhere).
        window: each query sees only the last `window` positions up to its own (a
        sliding-window layer); tokens before it are never read. None: the whole context."""
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5 if scale is None else scale
        self.target_programs = target_programs
        self.window = window

    def attend_qkv(self, qkv, positions, cos_sin_cache, kv_cache, meta):
        """No fused qkv path here (engine.attention.TorchAttention.attend_qkv): None."""
        return None

    def __call__(self, q, k, v, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] -> [T, H, D]; stores k/v into the cache first."""
        _require_runnable(q)
        k_cache, v_cache = kv_cache
        store_kv_cache(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            self._decode(q[:nd], k_cache, v_cache, meta.block_tables[:nd], meta.seq_lens[:nd],
                         out[:nd])
        if meta.seq_lens.shape[0] > nd:
            # Prefill/extend rows follow the decode rows: query_start_loc[nd] == nd, and the
            # kernel leaves rows before it alone.
            paged_prefill_attention(q, k_cache, v_cache, meta.block_tables[nd:],
                                    meta.query_start_loc[nd:], meta.seq_lens[nd:],
                                    self.scale, out=out, window=self.window)
        return out

    def _decode(self, q, k_cache, v_cache, block_tables, seq_lens, out) -> None:
        target = self.target_programs or _default_target_programs(q.device)
        max_context = block_tables.shape[1] * k_cache.shape[1]
        num_partitions = split_num_partitions(q.shape[0], self.num_kv_heads, max_context, target)
        paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, self.scale,
                               out=out, num_partitions=num_partitions, window=self.window)


class TritonOps:
    """Fused RMSNorm (+ residual add), rotary embedding and SiLU-and-mul; a drop-in for
    TorchOps (same arguments, results and in-place effects)."""

    @staticmethod
    def rms_norm(x, weight, eps, residual=None):
        """rmsnorm(x) if residual is None, else (rmsnorm(x + residual), x + residual).
        x may have any leading dims (Qwen3 normalises q [T, H, D] per head)."""
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        if residual is None:
            return rms_norm(rows, weight, eps).view(shape)
        out, new_residual = rms_norm(rows, weight, eps, residual.reshape(-1, shape[-1]))
        return out.view(shape), new_residual.view(shape)

    @staticmethod
    def rotary(q, k, positions, cos_sin_cache):
        """Rotate q [T, H, D] and k [T, Hkv, D] in place (rotate_half / neox layout)."""
        apply_rotary(q, k, positions, cos_sin_cache)

    @staticmethod
    def silu_and_mul(x):
        shape = x.shape
        out = silu_and_mul(x.reshape(-1, shape[-1]))
        return out.view(*shape[:-1], shape[-1] // 2)


def _require_runnable(q: torch.Tensor) -> None:
    if not q.is_cuda and not triton.knobs.runtime.interpret:
        raise RuntimeError(f"attention_backend='triton' needs a CUDA device (q is on {q.device}); "
                           "on CPU set TRITON_INTERPRET=1 (slow, for tests) or use 'torch'")


@functools.cache
def _default_target_programs(device: torch.device) -> int:
    if device.type != "cuda":
        return 1  # the interpreter runs programs one after another: splitting only costs
    return PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
