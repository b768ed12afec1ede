"""Blocks of every GGUF format the CPU kernels run, for the kernel and loader tests."""
import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from engine.quant.layout import FORMATS

LEGACY = ["Q4_0", "Q4_1", "Q5_0", "Q8_0"]  # gguf can quantize these; K blocks are made byte by byte


def gguf_blocks(rng, fmt: str, out_features: int, in_features: int) -> np.ndarray:
    """Blocks of `fmt`: gguf's quantizer for the legacy formats; for Q4_K/Q6_K random
    bytes (every code, sub-scale and min pattern) with sane fp16 super-block scales."""
    kind = GGMLQuantizationType[fmt]
    if fmt in LEGACY:
        values = rng.standard_normal((out_features, in_features)).astype(np.float32)
        return quantize(values, kind)
    size, nbytes = FORMATS[fmt]
    blocks = rng.integers(0, 256, (out_features, in_features // size, nbytes), dtype=np.uint8)
    scale = (rng.random(blocks.shape[:2]) * 0.01 + 0.001).astype(np.float16)
    halves = scale.view(np.uint8).reshape(*blocks.shape[:2], 2)
    if fmt == "Q4_K":  # d, dmin lead the block
        blocks[..., 0:2], blocks[..., 2:4] = halves, halves
    else:  # Q6_K: d ends it
        blocks[..., 208:210] = halves
    return blocks.reshape(out_features, -1)
