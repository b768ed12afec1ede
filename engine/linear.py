"""Linear layers: plain F.linear, or oneDNN's matmul over weights reordered once at load.

On CPU in fp32, oneDNN (`torch.ops.mkldnn._linear_pointwise`, the op torch.compile's
CPU weight prepacking emits) ran this model family's projections 1.1-2.6x faster than
F.linear's MKL call on the 2-core CI box, the most at decode's few rows and at the wide
lm_head (docs/benchmarks.md). The weight is reordered into oneDNN's blocked layout once, so a
step pays only the matmul. Where the C++ CPU kernels are built, the engine uses their
packed-weight matmul instead (engine.cpu_backend.CpuLinear), faster again on this box.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def can_prepack(weight: torch.Tensor) -> bool:
    """oneDNN's fp32 matmul exists in this torch build and suits this weight."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


class Linear:
    """y = x @ weight.T + bias for x [T, in]; the weight prepacked for oneDNN if asked."""

    __slots__ = ("weight", "bias", "prepacked")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 prepack: bool = False):
        self.prepacked = prepack and can_prepack(weight)
        self.weight = (torch.ops.mkldnn._reorder_linear_weight(weight) if self.prepacked
                       else weight)
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.prepacked:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)
