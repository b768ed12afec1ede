"""QuantWeight: an [out_features, in_features] matrix kept quantized, in the layout the C++
kernels read (engine.quant.layout): codes plus a scale and an offset per sub-block of a row.

Rows are independent, so the model's fused projections (q/k/v, gate/up) and the row
permutation GGUF applies to q/k are done on the packed rows, never on floats.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch

from engine.quant import layout


@dataclass(frozen=True)
class QuantWeight:
    codes: torch.Tensor  # uint8 [out_features, kp * bits / 8]
    scales: torch.Tensor  # float16 or float32 [out_features, kp / sub]
    offsets: torch.Tensor  # as scales
    bits: int  # 4 or 8
    sub: int  # weights per scale: 32 or 16
    in_features: int
    fmt: str  # the GGUF format(s) it came from, "Q4_K+Q6_K" for rows of two
    fused: bool  # dequantized as round(scale * code + offset), else round(round(s * c) + o)

    @classmethod
    def from_blocks(cls, blocks: np.ndarray, fmt: str, in_features: int) -> QuantWeight:
        """From GGUF blocks uint8 [out_features, row bytes] of format `fmt`."""
        codes, scales, offsets, bits, sub, fused = layout.unpack(blocks, fmt)
        if codes.shape[1] != in_features:
            raise ValueError(f"{fmt} rows hold {codes.shape[1]} weights, not {in_features}")
        packed = layout.pack(codes, scales, offsets, bits, sub)
        return cls(*(torch.from_numpy(a) for a in packed), bits, sub, in_features, fmt, fused)

    @property
    def out_features(self) -> int:
        return self.codes.shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.offsets))

    def rows(self, index: torch.Tensor) -> QuantWeight:
        return replace(self, codes=self.codes[index].contiguous(),
                       scales=self.scales[index].contiguous(),
                       offsets=self.offsets[index].contiguous())

    def dequantize(self) -> torch.Tensor:
        """fp32 [out, in], equal to ggml's dequantization of the source blocks."""
        codes = layout.unpack_codes(self.codes.numpy(), self.bits)[:, :self.in_features]
        scales, offsets = (np.repeat(t.numpy().astype(np.float32), self.sub, axis=1)
                           [:, :self.in_features] for t in (self.scales, self.offsets))
        if self.fused:  # exact in fp64 (a 24-bit scale times an 8-bit code, plus a multiple
            # of the scale), so one rounding to fp32
            values = (scales.astype(np.float64) * codes + offsets).astype(np.float32)
        else:
            values = scales * codes.astype(np.float32) + offsets
        return torch.from_numpy(np.ascontiguousarray(values))

    def widened(self, bits: int, sub: int, dtype: torch.dtype) -> QuantWeight:
        """The same weights in a wider layout (8-bit codes, 16-weight sub-blocks, fp32
        parameters), so rows of two formats can share one matrix."""
        codes = self.codes
        if bits != self.bits:
            codes = torch.from_numpy(layout.pack_codes(
                layout.unpack_codes(codes.numpy(), self.bits), bits))
        scales, offsets = (t.repeat_interleave(self.sub // sub, dim=1).to(dtype)
                           for t in (self.scales, self.offsets))
        return replace(self, codes=codes, scales=scales, offsets=offsets, bits=bits, sub=sub)


def cat_rows(weights: list) -> torch.Tensor | QuantWeight:
    """Rows of several projections stacked into one (q/k/v, gate/up): torch.cat for
    tensors; for QuantWeights the packed rows, in the widest layout among them (a Q4_K q
    beside a Q6_K v takes 8-bit codes and 16-weight sub-blocks: still no float copy)."""
    if not any(isinstance(w, QuantWeight) for w in weights):
        return torch.cat(weights)
    if not all(isinstance(w, QuantWeight) for w in weights):
        return torch.cat([w.dequantize() if isinstance(w, QuantWeight) else w for w in weights])
    bits, sub = max(w.bits for w in weights), min(w.sub for w in weights)
    dtype = torch.float16 if all(w.scales.dtype == torch.float16 for w in weights) \
        else torch.float32
    parts = [w.widened(bits, sub, dtype) for w in weights]
    fmt = "+".join(dict.fromkeys(w.fmt for w in weights))
    return QuantWeight(torch.cat([p.codes for p in parts]), torch.cat([p.scales for p in parts]),
                       torch.cat([p.offsets for p in parts]), bits, sub,
                       weights[0].in_features, fmt, all(w.fused for w in weights))
