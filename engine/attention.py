"""Paged attention behind one interface: a plain-torch backend (CPU, reference) and a
Triton backend (GPU). Metadata is built once per step and passed as an argument.

Token order in a step: decode rows first (one query each: a decoding request, or one of
a verifying request's 1 + k rows, each with its own context length), then prefill/extend
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
    num_decodes: int  # the first num_decodes rows of the tables have one query token each
    max_seq_len: int
    # host copies for the torch backend's per-request prefill loop
    query_lens_host: list[int]
    seq_lens_host: list[int]


class TorchAttention:
    """Reference paged attention in plain torch; runs anywhere.

    window: each query sees only the last `window` positions up to its own (transformers'
    sliding window: key position > query position - window); None: the whole context.
    scale: the scores' factor (head_dim ** -0.5 unless given).
    """

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, *,
                 window: int | None = None, scale: float | None = None):
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.scale = head_dim ** -0.5 if scale is None else scale
        self.window = window
        self._rows_for: AttentionMetadata | None = None  # the step _rows was built for
        self._rows: tuple[torch.Tensor, torch.Tensor] | None = None

    def __call__(self, q, k, v, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        """q [T, H, D], k/v [T, Hkv, D] -> [T, H, D]; stores k/v into the cache first."""
        k_cache, v_cache = kv_cache
        self._store(k, v, k_cache, v_cache, meta.slot_mapping)
        return self.attend_stored(q, k, v, kv_cache, meta)

    def attend_qkv(self, qkv, positions, cos_sin_cache, kv_cache, meta):
        """A backend that can take the fused qkv projection whole (rope, store and
        attention in one go) returns [T, H * D]; this one cannot: None, and the model
        splits qkv itself."""
        return None

    def attend_stored(self, q, k, v, kv_cache, meta: AttentionMetadata) -> torch.Tensor:
        """Attention once this step's K/V are in the cache (k, v: the same new rows, which
        the torch prefill of a fresh prompt reads directly)."""
        k_cache, v_cache = kv_cache
        nd = meta.num_decodes
        if nd == q.shape[0]:  # a decode-only step: no prefill rows to place beside them
            return self._decode(q, k_cache, v_cache, meta)
        out = torch.empty_like(q)
        if nd:
            out[:nd] = self._decode(q[:nd], k_cache, v_cache, meta)
        self._prefill(q, k, v, k_cache, v_cache, meta, out)
        return out

    def _prefill(self, q, k, v, k_cache, v_cache, meta: AttentionMetadata, out) -> None:
        """Rows of the prefill/extend requests (after the decodes) into out, one request at
        a time: a whole prompt from its own new K/V, an extend from the cache."""
        start = meta.num_decodes
        for b in range(meta.num_decodes, len(meta.seq_lens_host)):
            q_len, seq_len = meta.query_lens_host[b], meta.seq_lens_host[b]
            span = slice(start, start + q_len)
            if q_len == seq_len:  # no cached prefix: the new tokens are the whole context
                out[span] = self._causal(q[span], k[span], v[span])
            else:
                out[span] = self._extend(q[span], k_cache, v_cache, meta.block_tables[b], seq_len)
            start += q_len

    def _store(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        store_kv(k, v, k_cache, v_cache, slot_mapping)

    def _decode(self, q, k_cache, v_cache, meta):
        """One query per request against its paged context, as two batched matmuls with
        the query heads of each KV head grouped, so K/V are never repeated for GQA."""
        nd, head_dim = q.shape[0], self.head_dim
        rows, bias = self._decode_rows(meta, nd, k_cache.shape[1], q.dtype)
        k = k_cache.view(-1, head_dim).index_select(0, rows).view(nd, self.num_kv_heads, -1, head_dim)
        v = v_cache.view(-1, head_dim).index_select(0, rows).view(nd, self.num_kv_heads, -1, head_dim)
        q = (q * self.scale).view(nd, self.num_kv_heads, -1, head_dim)  # [B, Hkv, G, D]
        scores = torch.matmul(q, k.transpose(-1, -2)) + bias  # [B, Hkv, G, L]
        return torch.matmul(torch.softmax(scores, dim=-1), v).view(nd, self.num_heads, head_dim)

    def _decode_rows(self, meta, nd: int, block_size: int, dtype: torch.dtype):
        """Cache rows to gather ([B, Hkv, L] flattened, one row per token and KV head) and
        the length mask as an additive bias in the scores' dtype (matmul takes no mixed
        dtypes); built once per step and reused by every layer."""
        if self._rows_for is not meta:
            device, hkv = meta.block_tables.device, self.num_kv_heads
            num_blocks = -(-meta.max_seq_len // block_size)
            tables = meta.block_tables[:nd, :num_blocks].long()
            slots = (tables[:, :, None] * block_size
                     + torch.arange(block_size, device=device)).view(nd, 1, -1)  # [B, 1, L]
            rows = (slots * hkv + torch.arange(hkv, device=device)[None, :, None]).view(-1)
            positions = torch.arange(slots.shape[-1], device=device)
            bias = torch.zeros(nd, 1, 1, slots.shape[-1], dtype=dtype, device=device)
            seq_lens = meta.seq_lens[:nd, None]
            hidden = positions[None, :] >= seq_lens
            if self.window is not None:
                hidden |= positions[None, :] < seq_lens - self.window
            bias.masked_fill_(hidden[:, None, None, :], float("-inf"))
            self._rows_for, self._rows = meta, (rows, bias)
        return self._rows

    def _causal(self, q, k, v):
        if self.window is None:
            return self._sdpa(q, k, v, is_causal=True)
        return self._sdpa(q, k, v, attn_mask=self._mask(0, q.shape[0], q.device))

    def _mask(self, first_query: int, seq_len: int, device) -> torch.Tensor:
        """[queries, seq_len] True where query position first_query + i sees key j."""
        q_pos = torch.arange(first_query, seq_len, device=device)[:, None]
        k_pos = torch.arange(seq_len, device=device)[None, :]
        mask = q_pos >= k_pos
        if self.window is not None:
            mask &= k_pos > q_pos - self.window
        return mask

    def _sdpa(self, q, k, v, **mask):
        """q [Tq, H, D], k/v [Tk, Hkv, D] -> [Tq, H, D]. Batched 4-D inputs with K/V
        repeated to every query head: torch's fused CPU kernel takes those (2x faster
        here), where 3-D or enable_gqa inputs fall back to its unfused math path."""
        group = self.num_heads // self.num_kv_heads
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, scale=self.scale, **mask)
        return out.squeeze(0).transpose(0, 1)

    def _gather(self, cache, block_table, num_blocks):
        # cache [N, bs, Hkv, D] -> [num_blocks*bs, Hkv, D]
        return cache[block_table[:num_blocks].long()].flatten(0, 1)

    def _extend(self, q, k_cache, v_cache, block_table, seq_len):
        """Queries are the last q_len positions of a context partly in the cache: causal
        with an offset."""
        q_len, block_size = q.shape[0], k_cache.shape[1]
        num_blocks = -(-seq_len // block_size)
        k = self._gather(k_cache, block_table, num_blocks)[:seq_len]
        v = self._gather(v_cache, block_table, num_blocks)[:seq_len]
        return self._sdpa(q, k, v, attn_mask=self._mask(seq_len - q_len, seq_len, q.device))


def store_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    """Write new tokens' K/V into their cache slots (plain torch)."""
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v)
