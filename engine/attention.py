"""Paged attention behind one interface: a plain-torch backend (CPU, reference) and a
Triton backend (GPU). Metadata is built once per step and passed as an argument.

Token order in a step: decode requests first (one query each), then prefill/extend
requests (several queries each, the last ones of their context):

    tokens: [d0 d1 d2 | p0 p0 p0 p0 | p1 p1]     num_decodes = 3
    seq_lens:  ctx lengths after this step, one per request
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class AttentionMetadata:
    """Per-step attention inputs (tensors on the model's device)."""

    slot_mapping: torch.Tensor  # [T] int64: cache slot of each new token (-1: padding)
    block_tables: torch.Tensor  # [B, max_blocks] int32, decodes first
    seq_lens: torch.Tensor  # [B] int32: context length after this step
    query_start_loc: torch.Tensor  # [B+1] int32 over all tokens
    num_decodes: int  # the first num_decodes requests have exactly one query token
    max_seq_len: int
    # host copies for the torch backend's per-request prefill loop
    query_lens_host: list[int]
    seq_lens_host: list[int]


class TorchAttention:
    """Reference paged attention in plain torch; runs anywhere."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5

    def __call__(self, q, k, v, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] -> [T, H, D]; stores k/v into the cache first."""
        k_cache, v_cache = kv_cache
        store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        out = torch.empty_like(q)
        nd = meta.num_decodes
        if nd:
            out[:nd] = self._decode(q[:nd], k_cache, v_cache, meta)
        start = nd
        for b in range(nd, len(meta.seq_lens_host)):
            q_len, seq_len = meta.query_lens_host[b], meta.seq_lens_host[b]
            qs = q[start:start + q_len]
            out[start:start + q_len] = self._extend(qs, k_cache, v_cache,
                                                    meta.block_tables[b], seq_len)
            start += q_len
        return out

    def _gather(self, cache, block_table, num_blocks):
        # cache [N, bs, Hkv, D] -> [.., num_blocks*bs, Hkv, D]
        blocks = cache[block_table[..., :num_blocks].long()]
        return blocks.flatten(-4, -3)

    def _decode(self, q, k_cache, v_cache, meta):
        nd, block_size = q.shape[0], k_cache.shape[1]
        num_blocks = -(-meta.max_seq_len // block_size)
        tables = meta.block_tables[:nd]
        k = self._gather(k_cache, tables, num_blocks).transpose(1, 2)  # [B, Hkv, L, D]
        v = self._gather(v_cache, tables, num_blocks).transpose(1, 2)
        positions = torch.arange(k.shape[2], device=q.device)
        mask = positions[None, :] < meta.seq_lens[:nd, None]  # [B, L]
        out = F.scaled_dot_product_attention(
            q.unsqueeze(2), k, v, attn_mask=mask[:, None, None, :], scale=self.scale,
            enable_gqa=self.num_heads != self.num_kv_heads)
        return out.squeeze(2)

    def _extend(self, q, k_cache, v_cache, block_table, seq_len):
        q_len, block_size = q.shape[0], k_cache.shape[1]
        num_blocks = -(-seq_len // block_size)
        k = self._gather(k_cache, block_table, num_blocks)[:seq_len].transpose(0, 1)
        v = self._gather(v_cache, block_table, num_blocks)[:seq_len].transpose(0, 1)
        gqa = self.num_heads != self.num_kv_heads
        if q_len == seq_len:  # no cached prefix: plain causal
            out = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, is_causal=True,
                                                 scale=self.scale, enable_gqa=gqa)
        else:  # queries are the last q_len positions: causal with an offset
            q_pos = torch.arange(seq_len - q_len, seq_len, device=q.device)
            mask = q_pos[:, None] >= torch.arange(seq_len, device=q.device)[None, :]
            out = F.scaled_dot_product_attention(q.transpose(0, 1), k, v, attn_mask=mask,
                                                 scale=self.scale, enable_gqa=gqa)
        return out.transpose(0, 1)


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Write new tokens' K/V into their cache slots (plain torch)."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v)
