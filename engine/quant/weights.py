"""QuantWeight: a [out_features, in_features] matrix kept in ggml's 32-weight blocks.

Rows are independent byte ranges, so the model's fused projections (q/k/v, gate/up) and
the row permutation GGUF applies to q/k are done on the packed bytes, never on floats.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

# ggml block formats the C++ kernels run (kernels/cpu/quant_kernels.h's Format), with
# their bytes per block of 32 weights.
FORMATS = {"Q4_0": (0, 18), "Q4_1": (1, 20), "Q8_0": (2, 34)}


@dataclass(frozen=True)
class QuantWeight:
    data: torch.Tensor  # uint8 [out_features, in_features / 32 * block bytes]
    fmt: str  # a key of FORMATS
    in_features: int

    @property
    def out_features(self) -> int:
        return self.data.shape[0]

    @property
    def fmt_id(self) -> int:
        return FORMATS[self.fmt][0]

    def rows(self, index: torch.Tensor) -> QuantWeight:
        return QuantWeight(self.data[index].contiguous(), self.fmt, self.in_features)

    def dequantize(self) -> torch.Tensor:
        """fp32 [out, in] (where the C++ kernels are not built): gguf's numpy reference."""
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        kind = GGMLQuantizationType[self.fmt]
        return torch.from_numpy(np.ascontiguousarray(dequantize(self.data.numpy(), kind)))


def cat_rows(weights: list) -> torch.Tensor | QuantWeight:
    """Rows of several projections stacked into one (q/k/v, gate/up): torch.cat for
    tensors, the packed bytes for QuantWeights of one format (else dequantized)."""
    if not any(isinstance(w, QuantWeight) for w in weights):
        return torch.cat(weights)
    formats = {(w.fmt, w.in_features) for w in weights if isinstance(w, QuantWeight)}
    if len(formats) == 1 and all(isinstance(w, QuantWeight) for w in weights):
        fmt, in_features = formats.pop()
        return QuantWeight(torch.cat([w.data for w in weights]), fmt, in_features)
    return torch.cat([w.dequantize() if isinstance(w, QuantWeight) else w for w in weights])
