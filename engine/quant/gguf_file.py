"""Weights of a llama- or gemma3-architecture GGUF file under Hugging Face names and
conventions, quantized tensors left packed (QuantWeight) where the C++ kernels run their
format, others as fp32."""
from __future__ import annotations

import re

import numpy as np
import torch

from engine.quant.gguf_index import build_index, map_tensors
from engine.quant.layout import FORMATS
from engine.quant.weights import QuantWeight

_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma 3 normalizes around both blocks; its ffn_norm is the one before the MLP
_GEMMA3_LAYER_NAMES = {**_LAYER_NAMES, "ffn_norm": "pre_feedforward_layernorm",
                       "post_attention_norm": "post_attention_layernorm",
                       "post_ffw_norm": "post_feedforward_layernorm"}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
              "output": "lm_head"}


def read_gguf_weights(path, num_heads: int, num_kv_heads: int, index: dict | None = None
                      ) -> dict:
    """{HF name: tensor or QuantWeight}. Packed bytes are copied out of the file's map.
    `index`: the file's tensor directory (engine.quant.gguf_index), else read from it."""
    from gguf.quants import dequantize

    architecture, tensors = map_tensors(path, index or build_index(path))
    permute = architecture == "llama"
    weights = {}
    for gguf_name, qtype, dims, data in tensors:
        name = hf_name(gguf_name, _GEMMA3_LAYER_NAMES if architecture == "gemma3"
                       else _LAYER_NAMES)
        kind = qtype.name
        if kind in FORMATS:
            value = QuantWeight.from_blocks(np.asarray(data), kind, dims[0])
        else:
            value = torch.from_numpy(np.array(dequantize(data, qtype), np.float32))
        if permute and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = num_heads if ".q_proj" in name else num_kv_heads
            value = _take_rows(value, _unpermute_index(_rows(value), heads))
        if architecture == "gemma3" and name.endswith("norm.weight"):
            value = value - 1  # llama.cpp's converter stores Gemma's (1 + w); HF keeps w
        weights[name] = value
    return weights


def hf_name(gguf_name: str, layer_names: dict = _LAYER_NAMES) -> str:
    match = re.fullmatch(r"blk\.(\d+)\.(\w+)\.(weight|bias)", gguf_name)
    if match:
        layer, part, kind = match.groups()
        return f"model.layers.{layer}.{layer_names[part]}.{kind}"
    part, kind = gguf_name.rsplit(".", 1)
    return f"{_TOP_NAMES[part]}.{kind}"


def _unpermute_index(rows: int, heads: int) -> torch.Tensor:
    """llama.cpp's converter interleaves each head's two rotary halves (for its rope
    layout); this row order restores Hugging Face's (transformers' reverse_permute)."""
    return torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)


def _rows(value) -> int:
    return value.out_features if isinstance(value, QuantWeight) else value.shape[0]


def _take_rows(value, index: torch.Tensor):
    return value.rows(index) if isinstance(value, QuantWeight) else value[index].contiguous()
