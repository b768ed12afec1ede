"""Gemma 3 (text): LlamaModel's paged attention and fused projections with Gemma's
differences (transformers' modeling_gemma3):

- embeddings scaled by sqrt(hidden); the lm_head is the (unscaled) embedding, tied;
- RMSNorm weights are stored as w and applied as (1 + w): added once here, at build;
- each layer normalizes before and after both attention and the MLP
  (hidden += post_norm(block(pre_norm(hidden))));
- q and k are RMS-normed per head; scores scaled by query_pre_attn_scalar ** -0.5;
- layers alternate a sliding window (local rope base) and full attention (global base);
- the MLP is GeGLU: gelu_tanh(gate) * up.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention import AttentionMetadata
from engine.linear import Linear
from engine.models.config import ModelConfig
from engine.models.llama import (
    LayerWeights,
    LlamaModel,
    _layer_weights,
    layer_attention,
)
from engine.ops import TorchOps, build_cos_sin_cache
from engine.quant.linear import embedding


@dataclass
class Gemma3Norms:
    """The two norms LlamaModel's layer does not have, as (1 + w)."""

    pre_feedforward: torch.Tensor
    post_feedforward: torch.Tensor


class Gemma3Model(LlamaModel):
    """Forward pass over flattened tokens; returns final hidden states [T, hidden]."""

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], make_attention,
                 ops=TorchOps, max_positions: int | None = None, make_linear=Linear):
        self.config = config
        self.ops = ops
        self.layer_attention = layer_attention(config, make_attention)
        self.attention = self.layer_attention[0]
        self.embed = weights["model.embed_tokens.weight"]
        self.lm_head = make_linear(self.embed)
        self.norm = _plus_one(weights["model.norm.weight"])
        self.layers = [_gemma_layer(weights, i, config, make_linear)
                       for i in range(config.num_layers)]
        self.extra_norms = [Gemma3Norms(
            _plus_one(weights[f"model.layers.{i}.pre_feedforward_layernorm.weight"]),
            _plus_one(weights[f"model.layers.{i}.post_feedforward_layernorm.weight"]))
            for i in range(config.num_layers)]
        positions = max_positions or config.max_position_embeddings
        self.cos_sin_cache = build_cos_sin_cache(
            positions, config.head_dim, config.rope_theta, config.rope_scaling,
            self.norm.dtype, self.norm.device)
        self.local_cos_sin_cache = build_cos_sin_cache(
            positions, config.head_dim, config.local_rope_theta, None, self.norm.dtype,
            self.norm.device)
        # transformers keeps sqrt(hidden) as a tensor in the embedding's dtype
        self.embed_scale = torch.tensor(config.hidden_size ** 0.5, dtype=self.norm.dtype)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids [T] -> the scaled embeddings [T, hidden]."""
        return embedding(input_ids, self.embed) * self.embed_scale.to(self.norm.device)

    def layer_cos_sin_cache(self, i: int) -> torch.Tensor:
        """Layer i's rope table: the local base on sliding-window layers."""
        return self.cos_sin_cache if self.config.layer_window(i) is None \
            else self.local_cos_sin_cache

    def forward(self, input_ids, positions, meta: AttentionMetadata, kv_caches):
        """input_ids, positions [T] -> hidden [T, hidden]."""
        rms, eps = self.ops.rms_norm, self.config.rms_norm_eps
        hidden = self.embed_tokens(input_ids)
        for i, (layer, norms, attention, kv_cache) in enumerate(
                zip(self.layers, self.extra_norms, self.layer_attention, kv_caches)):
            x = self._attention(layer, attention, self.layer_cos_sin_cache(i),
                                rms(hidden, layer.input_norm, eps), positions, meta, kv_cache)
            hidden = hidden + rms(x, layer.post_norm, eps)
            gate, up = layer.gate_up(rms(hidden, norms.pre_feedforward, eps)).chunk(2, dim=-1)
            x = layer.down(F.gelu(gate, approximate="tanh") * up)
            hidden = hidden + rms(x, norms.post_feedforward, eps)
        return rms(hidden, self.norm, eps)


def _gemma_layer(w: dict, i: int, c: ModelConfig, make_linear) -> LayerWeights:
    """LlamaModel's layer with every norm as (1 + w); post_norm is the one after attention."""
    layer = _layer_weights(w, i, c, make_linear)
    layer.input_norm = _plus_one(layer.input_norm)
    layer.post_norm = _plus_one(layer.post_norm)
    layer.q_norm = _plus_one(layer.q_norm)
    layer.k_norm = _plus_one(layer.k_norm)
    return layer


def _plus_one(weight: torch.Tensor) -> torch.Tensor:
    """Gemma's RMSNorm scale, computed in fp32 as transformers does."""
    return (1.0 + weight.float()).to(weight.dtype)
