"""Decode-only steps on CPU in one C++ call: kernels/cpu/decode_stack.cpp runs every
decoder layer of a model whose projections are all quantized (QuantLinear), with the same
kernels in the same order as LlamaModel.forward, so the same bits come out. What it saves
is the Python between the kernels: ~1 ms of an ~11 ms SmolLM2-135M step at batch 1, where a
lone chat's every token waits on it. Steps with prefill rows, and models it does not cover,
keep LlamaModel.forward."""
from __future__ import annotations

import torch

from engine.attention import AttentionMetadata
from engine.cpu_backend import CpuAttention
from engine.models.llama import LlamaModel
from engine.quant.linear import QuantLinear, embedding
from kernels.cpu import ATTENTION_HEAD_DIMS


class CpuDecodeStack:
    """LlamaModel.forward for decode-only steps, in C++."""

    def __init__(self, model: LlamaModel, stack):
        self.model = model
        self.stack = stack

    @classmethod
    def build(cls, model: LlamaModel) -> CpuDecodeStack | None:
        """The stack for `model`, or None where it does not cover it: not the C++ attention
        (or its head size), a sliding window, Qwen3's q/k norms, or a projection that is not
        quantized."""
        attention, c = model.attention, model.config
        if not isinstance(attention, CpuAttention) or c.head_dim not in ATTENTION_HEAD_DIMS \
                or c.sliding_window is not None or c.architecture != "llama":
            return None
        if model.norm.dtype != torch.float32 or any(
                layer.q_norm is not None or not all(
                    isinstance(p, QuantLinear) for p in _projections(layer))
                for layer in model.layers):
            return None
        stack = attention.kernels.DecodeStack(model.norm, c.num_heads, attention.scale,
                                              c.rms_norm_eps)
        for layer in model.layers:
            stack.add_layer(layer.input_norm, layer.post_norm,
                            *(_arguments(p) for p in _projections(layer)))
        return cls(model, stack)

    def forward(self, input_ids, positions, meta: AttentionMetadata, kv_caches):
        """input_ids, positions [T], one token per sequence -> hidden [T, hidden]."""
        assert meta.num_decodes == input_ids.shape[0], "decode-only steps"
        return self.stack.forward(embedding(input_ids, self.model.embed), positions,
                                  self.model.cos_sin_cache, meta.slot_mapping,
                                  meta.block_tables, meta.seq_lens, kv_caches)


def _projections(layer) -> tuple:
    return layer.qkv, layer.o_proj, layer.gate_up, layer.down


def _arguments(p: QuantLinear) -> tuple:
    w = p.weight
    return w.codes, w.scales, w.offsets, w.bits, w.sub, p.bias, p.isa
