"""The default model's GGUF loaded as stored: every projection stays in its quantized
blocks (no fp32 copy), under the right names and in Hugging Face's row order."""

import pytest
import torch
from safetensors import safe_open

import kernels.cpu as cpu_kernels
from engine.config import cpu_kv_cache_bytes
from engine.loader import default_model_dir, load_model
from engine.quant.linear import QuantLinear
from engine.quant.weights import QuantWeight

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def loaded():
    return load_model("default", CPU, torch.float32)


def test_matrices_stay_packed(loaded):
    matrices = {k: w for k, w in loaded.weights.items() if k.endswith("proj.weight")}
    assert len(matrices) == 7 * loaded.config.num_layers
    assert all(isinstance(w, QuantWeight) and w.fmt == "Q4_1" for w in matrices.values())
    embed = loaded.weights["model.embed_tokens.weight"]
    assert isinstance(embed, QuantWeight) and embed.fmt == "Q8_0"
    dense = [k for k, w in loaded.weights.items() if isinstance(w, torch.Tensor) and w.dim() > 1]
    assert dense == []


@pytest.mark.parametrize("layer", [0, 29])
@pytest.mark.parametrize("name", ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                  "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj"])
def test_dequantized_values_match_transformers(loaded, layer, name):
    """transformers' GGUF conversion (the safetensors copy) un-permutes q/k rows the same."""
    key = f"model.layers.{layer}.{name}.weight"
    with safe_open(default_model_dir() / "model.safetensors", "pt") as f:
        expected = f.get_tensor(key)
    assert torch.equal(loaded.weights[key].dequantize(), expected)


def test_engine_runs_the_packed_blocks(llm):
    if cpu_kernels.load_quant() is None:
        pytest.skip("the quantized C++ kernels did not build here")
    model = llm.core.runner.model
    embed = model.embed
    assert isinstance(model.lm_head, QuantLinear)
    assert model.lm_head.weight.codes.data_ptr() == embed.codes.data_ptr()  # tied: one table
    for layer in model.layers:
        for proj in (layer.qkv, layer.o_proj, layer.gate_up, layer.down):
            assert isinstance(proj, QuantLinear) and proj.weight.fmt == "Q4_1"


def test_cpu_kv_pool_holds_one_full_context(llm):
    """The default CPU pool: one max_model_len sequence (SmolLM2: 8192 tokens, 360 MiB),
    not the flat 1 GiB that took most of the server's memory."""
    core = llm.core
    per_token = core.runner.kv_bytes_per_block(core.model_config) // core.config.block_size
    pool = core.runner.num_blocks * core.config.block_size
    assert core.max_model_len == 8192 and pool * per_token <= cpu_kv_cache_bytes(per_token, 8192)
    assert 8192 <= pool < 8192 + core.config.block_size
