"""`--quantization int8|int4`: fp32 weights of a safetensors or dummy model quantized at
load, one tensor at a time as it is read, into the blocks the C++ kernels run (int8:
Q8_0, a scale per 32 weights of a row; int4: Q4_0, group-32 symmetric 4-bit)."""
from __future__ import annotations

import torch

from engine.quant.weights import QuantWeight

SCHEMES = {"int8": "Q8_0", "int4": "Q4_0"}
# The matrices quantized: every projection, the embedding table and an untied lm_head.
_TOP_LEVEL = ("model.embed_tokens.weight", "lm_head.weight")


def quantizer(scheme: str | None):
    """prepare(name, tensor) -> the tensor, or its QuantWeight for a quantized matrix."""
    if scheme is None:
        return lambda name, tensor: tensor
    fmt = SCHEMES[scheme]

    def prepare(name: str, tensor: torch.Tensor):
        if tensor.dim() != 2 or tensor.shape[1] % 32 or not (
                name.endswith("proj.weight") or name in _TOP_LEVEL):
            return tensor
        return quantize(tensor, fmt)
    return prepare


def quantize(tensor: torch.Tensor, fmt: str) -> QuantWeight:
    """gguf's reference quantizer (round to nearest, as llama.cpp's quantize tool)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize as gguf_quantize

    values = tensor.detach().float().cpu().numpy()
    blocks = gguf_quantize(values, GGMLQuantizationType[fmt])
    return QuantWeight.from_blocks(blocks, fmt, tensor.shape[1])
