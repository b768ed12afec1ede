"""A GGUF file holding every packed format (a Q4_K_M-style mix: Q4_K q, Q6_K v, Q4_0/Q4_1/Q5_0
projections, a Q8_0 embedding) read as stored: each matrix stays a QuantWeight with the
file's values bit for bit (q/k rows back in Hugging Face's order), nothing dequantized."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import dequantize

from engine.quant.gguf_file import _unpermute_index, read_gguf_weights
from engine.quant.gguf_index import build_index, load_index, save_index
from engine.quant.weights import QuantWeight, cat_rows
from tests.kernels.quant_blocks import gguf_blocks

HIDDEN, HEADS = 256, 2
TENSORS = {  # GGUF name -> (format, rows)
    "token_embd.weight": ("Q8_0", 40),
    "blk.0.attn_q.weight": ("Q4_K", HIDDEN),
    "blk.0.attn_k.weight": ("Q4_K", HIDDEN),
    "blk.0.attn_v.weight": ("Q6_K", HIDDEN),
    "blk.0.attn_output.weight": ("Q4_0", HIDDEN),
    "blk.0.ffn_down.weight": ("Q4_1", HIDDEN),
    "blk.0.ffn_up.weight": ("Q5_0", HIDDEN),
}


@pytest.fixture(scope="module")
def gguf_file(tmp_path_factory):
    rng = np.random.default_rng(11)
    path = tmp_path_factory.mktemp("gguf") / "mix.gguf"
    writer = GGUFWriter(path, "llama")
    blocks = {}
    for name, (fmt, rows) in TENSORS.items():
        blocks[name] = gguf_blocks(rng, fmt, rows, HIDDEN)
        writer.add_tensor(name, blocks[name], raw_dtype=GGMLQuantizationType[fmt])
    writer.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, blocks


def test_every_format_stays_packed_with_the_files_values(gguf_file):
    path, blocks = gguf_file
    weights = read_gguf_weights(path, HEADS, HEADS)
    hf = {"token_embd.weight": "model.embed_tokens.weight",
          "blk.0.attn_q.weight": "model.layers.0.self_attn.q_proj.weight",
          "blk.0.attn_k.weight": "model.layers.0.self_attn.k_proj.weight",
          "blk.0.attn_v.weight": "model.layers.0.self_attn.v_proj.weight",
          "blk.0.attn_output.weight": "model.layers.0.self_attn.o_proj.weight",
          "blk.0.ffn_down.weight": "model.layers.0.mlp.down_proj.weight",
          "blk.0.ffn_up.weight": "model.layers.0.mlp.up_proj.weight"}
    for name, (fmt, rows) in TENSORS.items():
        w = weights[hf[name]]
        assert isinstance(w, QuantWeight) and w.fmt == fmt, name
        dense = torch.from_numpy(dequantize(blocks[name], GGMLQuantizationType[fmt]))
        if "attn_q" in name or "attn_k" in name:  # llama.cpp's rope row order undone
            dense = dense[_unpermute_index(rows, HEADS)]
        assert torch.equal(w.dequantize(), dense), name
    assert weights["model.norm.weight"].dtype == torch.float32


def test_a_mixed_qkv_stays_packed(gguf_file):
    weights = read_gguf_weights(gguf_file[0], HEADS, HEADS)
    attn = "model.layers.0.self_attn."
    parts = [weights[attn + n + "_proj.weight"] for n in "qkv"]
    qkv = cat_rows(parts)
    assert isinstance(qkv, QuantWeight) and qkv.fmt == "Q4_K+Q6_K"
    assert torch.equal(qkv.dequantize(), torch.cat([p.dequantize() for p in parts]))


def test_a_saved_tensor_index_maps_the_same_weights(gguf_file, tmp_path):
    """Read through the saved directory (no metadata parse), every tensor is the one the
    file's own reader gives; a directory that points past the file's end is refused."""
    path = gguf_file[0]
    save_index(build_index(path), tmp_path)
    index = load_index(tmp_path)
    direct, mapped = read_gguf_weights(path, HEADS, HEADS), \
        read_gguf_weights(path, HEADS, HEADS, index)
    assert direct.keys() == mapped.keys()
    for name, w in direct.items():
        dense = w.dequantize() if isinstance(w, QuantWeight) else w
        other = mapped[name].dequantize() if isinstance(w, QuantWeight) else mapped[name]
        assert torch.equal(dense, other), name
    index["tensors"][0][3] = path.stat().st_size - 8
    with pytest.raises(ValueError, match="ends before its data"):
        read_gguf_weights(path, HEADS, HEADS, index)
