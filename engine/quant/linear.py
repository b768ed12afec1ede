"""Projections and embedding lookups on QuantWeights: the C++ kernels (kernels/cpu/quant_*)
read the packed codes (activations rounded to int8 levels per 32-block, three or AVX2's
two, integer dots, fp32 scales and sums); without those kernels the weight is dequantized
once and the model runs in fp32."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import kernels.cpu as cpu_kernels
from engine.quant.weights import QuantWeight


class QuantLinear:
    """y = x @ W.T + bias for x [T, in] fp32, W packed."""

    __slots__ = ("weight", "bias", "kernels", "isa")

    def __init__(self, weight: QuantWeight, bias: torch.Tensor | None, kernels):
        self.weight = weight
        self.bias = None if bias is None else bias.float().contiguous()
        self.kernels = kernels
        self.isa = cpu_kernels.quant_isa()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        return self.kernels.quant_linear(x.contiguous(), w.codes, w.scales, w.offsets, w.bits,
                                         w.sub, self.bias, self.isa)


def quant_aware(make_linear):
    """make_linear that also takes QuantWeights (QuantLinear; dequantized into
    make_linear where the quantized kernels cannot be built)."""
    def build(weight, bias=None):
        if not isinstance(weight, QuantWeight):
            return make_linear(weight, bias)
        kernels = cpu_kernels.load_quant()
        if kernels is None:
            return make_linear(weight.dequantize(), bias)
        return QuantLinear(weight, bias, kernels)
    return build


def embedding(ids: torch.Tensor, table) -> torch.Tensor:
    """Rows of the embedding table for token ids: only those rows are unpacked."""
    if not isinstance(table, QuantWeight):
        return F.embedding(ids, table)
    kernels = cpu_kernels.load_quant()
    if kernels is None:
        return F.embedding(ids, table.rows(ids).dequantize())
    return kernels.quant_embedding(ids, table.codes, table.scales, table.offsets, table.bits,
                                   table.sub, table.in_features, table.fused)
