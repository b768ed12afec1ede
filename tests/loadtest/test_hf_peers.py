"""The Hugging Face peers of `tokenwire bench` on dummy:tiny, on CPU: static `generate` and
`generate_batch` (continuous batching) both produce every requested token, and a model
built for a llama3-roped shape (dummy:llama-3.2-1b) uses the same rotary angles as ours."""
from dataclasses import replace

import pytest
import torch

from engine.models.config import DUMMY_SHAPES, from_hf_config
from engine.ops import build_cos_sin_cache
from loadtest import hf_peers

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny():
    return hf_peers.load_hf_model("dummy:tiny", CPU, torch.float32)


def test_static_peer_generates_every_token(tiny):
    prompts = [[5 + i, 6, 7, 8, 9, 10] for i in range(5)]
    tokens, seconds = hf_peers.run_static(tiny, prompts, output_len=4, batch_size=2)
    assert tokens == 5 * 4 and seconds > 0


def test_continuous_batching_peer_generates_every_token(tiny):
    """Ragged prompts through transformers' own scheduler (CUDA graphs turn themselves
    off on CPU); a small KV pool and batch, since on CPU it sizes them from host memory."""
    prompts = [list(range(100, 100 + n)) for n in (3, 17, 9, 30)]
    tokens, seconds = hf_peers.run_continuous_batching(tiny, prompts, output_len=6,
                                                       num_blocks=8, max_batch_tokens=256)
    assert tokens == 4 * 6 and seconds > 0


def test_llama3_shape_keeps_its_rope_in_the_hf_config():
    shape = DUMMY_SHAPES["llama-3.2-1b"]
    back = from_hf_config(hf_peers._hf_config(shape), shape.eos_token_ids)
    assert back.rope_scaling is not None
    assert {k: back.rope_scaling[k] for k in shape.rope_scaling} == shape.rope_scaling
    assert back.rope_theta == shape.rope_theta
    assert back.max_position_embeddings == shape.max_position_embeddings


def test_llama3_rope_angles_match_the_engine():
    """A tiny model with the 1B model's llama3 rope: HF's cos/sin equal our cache's."""
    big = DUMMY_SHAPES["llama-3.2-1b"]
    shape = replace(DUMMY_SHAPES["tiny"], rope_theta=big.rope_theta,
                    rope_scaling=big.rope_scaling, max_position_embeddings=4096)
    with torch.device(CPU):
        from transformers import AutoModelForCausalLM
        model = AutoModelForCausalLM.from_config(hf_peers._hf_config(shape), dtype=torch.float32)
    positions = torch.tensor([[0, 1, 7, 100, 2047, 4095]])
    x = torch.zeros(1, positions.shape[1], shape.head_dim)
    cos, sin = model.model.rotary_emb(x, positions)
    ours = build_cos_sin_cache(4096, shape.head_dim, shape.rope_theta, shape.rope_scaling,
                               torch.float32, CPU)[positions[0]]
    half = shape.head_dim // 2
    torch.testing.assert_close(cos[0, :, :half], ours[:, :half], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(sin[0, :, :half], ours[:, half:], atol=1e-5, rtol=1e-5)
