"""`quantization` int8/int4: a dummy or safetensors model's matrices quantized at load into
the packed CPU kernels' blocks; refused where they cannot run."""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from engine.errors import ConfigError
from engine.loader import load_model
from engine.quant.linear import QuantLinear
from engine.quant.weights import QuantWeight

CPU = torch.device("cpu")


@pytest.mark.parametrize("scheme,fmt", [("int8", "Q8_0"), ("int4", "Q4_0")])
def test_matrices_are_quantized_as_read(scheme, fmt):
    loaded = load_model("dummy:tiny", CPU, torch.float32, quantization=scheme)
    for name, w in loaded.weights.items():
        matrix = name.endswith("proj.weight") or name == "model.embed_tokens.weight"
        assert isinstance(w, QuantWeight) == matrix, name
        if matrix:
            assert w.fmt == fmt


def test_quantized_values_are_near_the_fp32_ones():
    dense = load_model("dummy:tiny", CPU, torch.float32).weights
    packed = load_model("dummy:tiny", CPU, torch.float32, quantization="int8").weights
    key = "model.layers.0.mlp.down_proj.weight"
    err = (packed[key].dequantize() - dense[key]).abs().max()
    assert 0 < err <= dense[key].abs().max() / 127  # a half step of the block's scale at most


def test_engine_generates_on_int4_blocks():
    llm = LLM(model="dummy:tiny", device="cpu", quantization="int4", num_kv_blocks=16)
    model = llm.core.runner.model
    assert all(isinstance(layer.gate_up, QuantLinear) for layer in model.layers)
    out = llm.generate(["hello there"], SamplingParams(max_tokens=8, temperature=0.0,
                                                       ignore_eos=True))
    assert len(out[0].token_ids) == 8


@pytest.mark.parametrize("kwargs,match", [
    ({"quantization": "int3"}, "int8 or int4"),
    ({"quantization": "int4", "dtype": "bfloat16"}, "CPU in float32"),
    ({"quantization": "int8", "device": "cuda"}, "CPU in float32"),
])
def test_refused_where_the_kernels_cannot_run(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        EngineConfig(model="dummy:tiny", **kwargs)
