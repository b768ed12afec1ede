"""Decode-only steps on CPU in one C++ call: kernels/cpu/decode_stack.cpp runs every
decoder layer of a Llama-style model whose projections are all quantized (QuantLinear),
gemma_decode_stack.cpp those of Gemma 3, each with the same kernels in the same order as the
model's forward, so the same bits come out. What it saves is the Python between the
kernels: ~1 ms of an ~11 ms SmolLM2-135M step at batch 1, where a lone chat's every token
waits on it. Speculative verification steps come here too: each proposed token is a decode
row with its own context length. Steps with prefill rows, and models it does not cover,
keep the model's forward."""
from __future__ import annotations

import torch

from engine.attention import AttentionMetadata
from engine.cpu_backend import CpuAttention
from engine.models.gemma3 import Gemma3Model
from engine.models.llama import LlamaModel
from engine.quant.linear import QuantLinear, embedding
from kernels.cpu import ATTENTION_HEAD_DIMS


class CpuDecodeStack:
    """LlamaModel.forward (or Gemma3Model.forward) for decode-only steps, in C++."""

    def __init__(self, model: LlamaModel, stack):
        self.model = model
        self.stack = stack

    @classmethod
    def build(cls, model: LlamaModel) -> CpuDecodeStack | None:
        """The stack for `model`, or None where it does not cover it: not the C++ attention
        (or its head size), fp32 norms and quantized projections; for Llama-style models
        also no sliding window and no q/k norms (Qwen3's)."""
        attention, c = model.attention, model.config
        if not isinstance(attention, CpuAttention) or c.head_dim not in ATTENTION_HEAD_DIMS \
                or model.norm.dtype != torch.float32 or not all(
                    isinstance(p, QuantLinear) for layer in model.layers
                    for p in _projections(layer)):
            return None
        if isinstance(model, Gemma3Model):
            return cls(model, _gemma_stack(model))
        if c.sliding_window is not None or c.architecture != "llama" or any(
                layer.q_norm is not None for layer in model.layers):
            return None
        return cls(model, _llama_stack(model))

    def forward(self, input_ids, positions, meta: AttentionMetadata, kv_caches):
        """input_ids, positions [T], decode rows only (a sequence's proposed tokens are
        rows of their own, engine.model_runner._host_inputs) -> hidden [T, hidden]."""
        assert meta.num_decodes == input_ids.shape[0], "decode-only steps"
        if isinstance(self.model, Gemma3Model):
            return self.stack.forward(self.model.embed_tokens(input_ids), positions,
                                      meta.slot_mapping, meta.block_tables, meta.seq_lens,
                                      kv_caches)
        return self.stack.forward(embedding(input_ids, self.model.embed), positions,
                                  self.model.cos_sin_cache, meta.slot_mapping,
                                  meta.block_tables, meta.seq_lens, kv_caches)


def _llama_stack(model: LlamaModel):
    c, attention = model.config, model.attention
    stack = attention.kernels.DecodeStack(model.norm, c.num_heads, attention.scale,
                                          c.rms_norm_eps)
    for layer in model.layers:
        stack.add_layer(layer.input_norm, layer.post_norm,
                        *(_arguments(p) for p in _projections(layer)))
    return stack


def _gemma_stack(model: Gemma3Model):
    c, attention = model.config, model.attention
    stack = attention.kernels.GemmaDecodeStack(model.norm, c.num_heads, c.num_kv_heads,
                                               attention.scale, c.rms_norm_eps)
    for i, (layer, extra) in enumerate(zip(model.layers, model.extra_norms)):
        norms = [layer.input_norm, layer.post_norm, extra.pre_feedforward,
                 extra.post_feedforward, layer.q_norm, layer.k_norm]
        stack.add_layer(norms, model.layer_cos_sin_cache(i), c.layer_window(i) or 0,
                        *(_arguments(p) for p in _projections(layer)))
    return stack


def _projections(layer) -> tuple:
    return layer.qkv, layer.o_proj, layer.gate_up, layer.down


def _arguments(p: QuantLinear) -> tuple:
    w = p.weight
    return w.codes, w.scales, w.offsets, w.bits, w.sub, p.bias, p.isa
