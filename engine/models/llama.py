"""A compact Llama-family decoder (Llama 2/3, Mistral, Qwen2, Qwen3, SmolLM2).

Projections are callables made by `make_linear(weight, bias)` (engine.linear.Linear, or
the C++ packed-weight matmul on CPU), with q/k/v and gate/up fused for fewer, larger
matmuls.
All tokens of a step are flattened into one [T, hidden] batch; attention is paged.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.attention import AttentionMetadata
from engine.linear import Linear
from engine.models.config import ModelConfig
from engine.ops import TorchOps, build_cos_sin_cache
from engine.quant.linear import embedding
from engine.quant.weights import cat_rows


@dataclass
class LayerWeights:
    input_norm: torch.Tensor  # [hidden]
    qkv: Callable  # hidden -> (H + 2*Hkv) * D, with bias (Qwen2)
    q_norm: torch.Tensor | None  # [D] (Qwen3)
    k_norm: torch.Tensor | None
    o_proj: Callable  # H*D -> hidden
    post_norm: torch.Tensor
    gate_up: Callable  # hidden -> 2*inter
    down: Callable  # inter -> hidden


class LlamaModel:
    """Forward pass over flattened tokens; returns final hidden states [T, hidden].

    make_attention(window): the attention backend for layers with that sliding window
    (None: full attention); layers with the same window share one.
    make_linear(weight, bias=None): builds each projection (engine.linear.Linear by
    default). One that repacks the weight gives a tied lm_head its own packed copy of the
    embedding. Weights may be QuantWeights (engine.quant), kept packed: then the tied
    lm_head and the embedding lookup share the one packed table.
    """

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], make_attention,
                 ops=TorchOps, max_positions: int | None = None, make_linear=Linear):
        self.config = config
        self.layer_attention = layer_attention(config, make_attention)
        self.attention = self.layer_attention[0]
        self.ops = ops
        self.embed = weights["model.embed_tokens.weight"]
        self.norm = weights["model.norm.weight"]
        head = self.embed if config.tie_word_embeddings else weights["lm_head.weight"]
        self.lm_head = make_linear(head)
        self.layers = [_layer_weights(weights, i, config, make_linear)
                       for i in range(config.num_layers)]
        self.cos_sin_cache = build_cos_sin_cache(
            max_positions or config.max_position_embeddings, config.head_dim,
            config.rope_theta, config.rope_scaling, self.norm.dtype, self.norm.device)

    def forward(self, input_ids, positions, meta: AttentionMetadata, kv_caches):
        """input_ids, positions [T] -> hidden [T, hidden]."""
        eps = self.config.rms_norm_eps
        hidden = embedding(input_ids, self.embed)
        residual = None
        for layer, attention, kv_cache in zip(self.layers, self.layer_attention, kv_caches):
            if residual is None:
                residual, x = hidden, self.ops.rms_norm(hidden, layer.input_norm, eps)
            else:
                x, residual = self.ops.rms_norm(hidden, layer.input_norm, eps, residual)
            hidden = self._attention(layer, attention, self.cos_sin_cache, x, positions, meta,
                                     kv_cache)
            x, residual = self.ops.rms_norm(hidden, layer.post_norm, eps, residual)
            hidden = layer.down(self.ops.silu_and_mul(layer.gate_up(x)))
        out, _ = self.ops.rms_norm(hidden, self.norm, eps, residual)
        return out

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, hidden] -> float32 logits [N, vocab]."""
        return self.lm_head(hidden).float()

    def _attention(self, layer: LayerWeights, attention, cos_sin_cache, x, positions, meta,
                   kv_cache):
        c = self.config
        qkv = layer.qkv(x)
        if layer.q_norm is None:
            out = attention.attend_qkv(qkv, positions, cos_sin_cache, kv_cache, meta)
            if out is not None:
                return layer.o_proj(out)
        q, k, v = qkv.split([c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim,
                             c.num_kv_heads * c.head_dim], dim=-1)
        q = q.reshape(-1, c.num_heads, c.head_dim)
        k = k.reshape(-1, c.num_kv_heads, c.head_dim)
        v = v.reshape(-1, c.num_kv_heads, c.head_dim)
        if layer.q_norm is not None:
            q = self.ops.rms_norm(q, layer.q_norm, c.rms_norm_eps)
            k = self.ops.rms_norm(k, layer.k_norm, c.rms_norm_eps)
        else:
            q, k = q.contiguous(), k.contiguous()
        self.ops.rotary(q, k, positions, cos_sin_cache)
        out = attention(q, k, v.contiguous(), kv_cache, meta)
        return layer.o_proj(out.reshape(-1, c.num_heads * c.head_dim))


def layer_attention(config: ModelConfig, make_attention) -> list:
    """One attention backend per layer, from make_attention(window); one per window."""
    by_window = {}
    for i in range(config.num_layers):
        window = config.layer_window(i)
        if window not in by_window:
            by_window[window] = make_attention(window)
    return [by_window[config.layer_window(i)] for i in range(config.num_layers)]


def _layer_weights(w: dict[str, torch.Tensor], i: int, c: ModelConfig,
                   make_linear) -> LayerWeights:
    p = f"model.layers.{i}."
    attn = p + "self_attn."
    qkv = cat_rows([w[attn + n + "_proj.weight"] for n in "qkv"])
    bias = None
    if c.attention_bias:
        bias = torch.cat([w[attn + n + "_proj.bias"] for n in "qkv"])
    gate_up = cat_rows([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])
    return LayerWeights(
        input_norm=w[p + "input_layernorm.weight"], qkv=make_linear(qkv, bias),
        q_norm=w.get(attn + "q_norm.weight"), k_norm=w.get(attn + "k_norm.weight"),
        o_proj=make_linear(w[attn + "o_proj.weight"]),
        post_norm=w[p + "post_attention_layernorm.weight"],
        gate_up=make_linear(gate_up),
        down=make_linear(w[p + "mlp.down_proj.weight"]))
