"""The engine on the C++ CPU kernels (attention_backend auto/cpu on CPU): chosen by
default, projections included, and the same greedy tokens as the plain-torch backend on
the default model."""

import pytest

from engine import LLM, SamplingParams
from engine.cpu_backend import CpuAttention, CpuLinear, CpuOps
from engine.errors import ConfigError
from engine.linear import Linear
from engine.quant.linear import QuantLinear

needs_kernels = pytest.mark.usefixtures("cpu_kernels")

PREFIX = [(17 * i + 5) % 3000 + 100 for i in range(40)]
PROMPTS = [PREFIX + [7, 8, 9], [11, 12, 13, 14, 15], PREFIX + list(range(500, 523)),
           list(range(900, 958)), PREFIX[:21]]


@needs_kernels
def test_auto_uses_cpu_kernels_on_cpu(llm):
    assert isinstance(llm.core.runner.model.attention, CpuAttention)
    assert isinstance(llm.core.runner.model.ops, CpuOps)
    model = llm.core.runner.model  # the default model's GGUF blocks: the quantized matmul
    assert isinstance(model.lm_head, QuantLinear) and isinstance(model.layers[0].gate_up,
                                                                 QuantLinear)
    fp32 = LLM(model="dummy:tiny", device="cpu", num_kv_blocks=8).core.runner.model
    assert isinstance(fp32.lm_head, CpuLinear) and isinstance(fp32.layers[0].gate_up, CpuLinear)


@needs_kernels
@pytest.mark.parametrize("backend,prepack,kind", [("torch", True, "onednn"),
                                                  ("cpu", False, "plain"),
                                                  ("torch", False, "plain")])
def test_projections_follow_backend_and_prepack(backend, prepack, kind):
    engine = LLM(model="dummy:tiny", device="cpu", attention_backend=backend,
                 cpu_weight_prepack=prepack, num_kv_blocks=8)
    qkv = engine.core.runner.model.layers[0].qkv
    assert isinstance(qkv, Linear) and qkv.prepacked == (kind == "onednn")


@needs_kernels
def test_greedy_tokens_match_torch_backend(llm):
    # A 24-token budget chunks the long prompts and mixes decodes with prefill chunks;
    # the warm call leaves PREFIX's blocks in the prefix cache (extend path).
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    outputs = {}
    for backend in ("cpu", "torch"):
        engine = LLM(model="default", device="cpu", attention_backend=backend,
                     max_num_batched_tokens=24, max_num_seqs=8, num_kv_blocks=64)
        outputs[backend] = engine.generate([PREFIX + [1, 2]], params) + engine.generate(PROMPTS, params)
    for i, (got, want) in enumerate(zip(outputs["cpu"], outputs["torch"])):
        assert len(got.token_ids) == 16
        assert got.token_ids == want.token_ids, f"request {i} diverged"
        assert got.num_cached_tokens == want.num_cached_tokens
    assert outputs["cpu"][1].num_cached_tokens >= 32


def test_cpu_backend_needs_the_cpu():
    with pytest.raises(ConfigError, match="cpu needs device cpu"):
        LLM(model="dummy:tiny", device="cuda", attention_backend="cpu")
