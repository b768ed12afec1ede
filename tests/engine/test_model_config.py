"""Reading a model's config: rope types (run exactly as transformers does, or refused at
load naming the type) and sliding windows (applied wherever transformers applies them, by
every attention backend, so the context is never capped to the window)."""
import json
import logging

import pytest
import torch
from transformers import AutoConfig, LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from engine import LLM
from engine.errors import ModelLoadError
from engine.models.config import context_len, from_hf_config
from engine.ops import build_cos_sin_cache
from loadtest import tiny_models

MAX_POS = 2048
ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 256},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
    "yarn-attention-factor": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.3,
                              "original_max_position_embeddings": 512},
    "yarn-mscale": {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
                    "mscale_all_dim": 0.707, "original_max_position_embeddings": 4096},
    "yarn-untruncated": {"rope_type": "yarn", "factor": 2.0, "beta_fast": 16.0,
                         "beta_slow": 2.0, "truncate": False,
                         "original_max_position_embeddings": 1024},
    "yarn-implicit-factor": {"rope_type": "yarn", "factor": None,
                             "original_max_position_embeddings": 512},
}
POOL_TOKENS = 64 * 16  # num_kv_blocks * block_size


def _llama(rope: dict | None, theta: float = 100000.0) -> LlamaConfig:
    params = {**(rope or {"rope_type": "default"}), "rope_theta": theta}
    return LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=64,
                       max_position_embeddings=MAX_POS, rope_parameters=params)


@pytest.mark.parametrize("name", list(ROPES))
def test_cos_sin_table_matches_transformers_rotary_embedding(name):
    hf = _llama(ROPES[name])
    ours = from_hf_config(hf, ())
    table = build_cos_sin_cache(MAX_POS, 64, ours.rope_theta, ours.rope_scaling,
                                torch.float32, "cpu")
    positions = torch.arange(MAX_POS)[None]
    cos, sin = LlamaRotaryEmbedding(hf)(torch.zeros(1, dtype=torch.float32), positions)
    torch.testing.assert_close(table, torch.cat([cos[0, :, :32], sin[0, :, :32]], dim=-1),
                               rtol=0, atol=1e-6)
    if name.startswith("yarn"):  # the attention factor is in the table
        assert table[0, 0].item() == pytest.approx(LlamaRotaryEmbedding(hf).attention_scaling)
        assert table[0, 0].item() > 1.0


def test_old_rope_scaling_spelling_is_read(tmp_path):
    """config.json files written before transformers 5 say rope_scaling / type."""
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4,
              "rope_theta": 500000.0, "rope_scaling": {"type": "linear", "factor": 4.0}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    ours = from_hf_config(AutoConfig.from_pretrained(tmp_path), ())
    assert ours.rope_theta == 500000.0
    assert ours.rope_scaling["rope_type"] == "linear" and ours.rope_scaling["factor"] == 4.0


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_models.default_tokenizer()


@pytest.mark.parametrize("rope", [
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "longrope", "short_factor": [1.0] * 32, "long_factor": [2.0] * 32,
     "original_max_position_embeddings": 512},
    {"rope_type": "proportional", "factor": 2.0}])
def test_unsupported_rope_type_fails_at_load_naming_it(rope, tmp_path, tokenizer):
    _llama(rope).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match=f"rope_type '{rope['rope_type']}'"):
        LLM(model=str(tmp_path), device="cpu", dtype="float32", num_kv_blocks=64)


def _engine(tmp_path, tokenizer, family: str, **config) -> LLM:
    hf = tiny_models.hf_config(family, len(tokenizer), **config)
    path = tiny_models.build(hf, tmp_path / family, tokenizer)
    return LLM(model=str(path), device="cpu", dtype="float32", attention_backend="torch",
               num_kv_blocks=64)


@pytest.mark.parametrize("family, config, window", [
    ("mistral", dict(sliding_window=256), 256),
    ("mistral", dict(sliding_window=None), None),
    ("qwen2", dict(use_sliding_window=False, sliding_window=256), None),
    ("qwen2", dict(use_sliding_window=True, sliding_window=256, max_window_layers=1), 256),
    ("qwen2", dict(use_sliding_window=True, sliding_window=256, max_window_layers=2), None),
    ("qwen3", dict(use_sliding_window=True, sliding_window=256, max_window_layers=0), 256),
    ("llama-tied", {}, None)])
def test_a_sliding_window_is_applied_where_transformers_applies_it_and_not_capped(
        family, config, window, tmp_path, tokenizer, caplog):
    """The CPU attention backends honour the window, so the context is the whole pool and
    a prompt longer than the window is served."""
    with caplog.at_level(logging.INFO, logger="engine"):
        llm = _engine(tmp_path, tokenizer, family, **config)
    c = llm.core.model_config
    assert {c.layer_window(i) for i in range(c.num_layers)} >= {window}
    assert llm.core.max_model_len == POOL_TOKENS
    assert "capped" not in caplog.text
    if window:
        assert len(llm.generate([[42] * (window + 8)])[0].token_ids) > 0


def test_the_context_is_not_capped_to_a_sliding_window(tokenizer):
    """Every backend (torch, C++, Triton) honours a window: the context goes past it."""
    hf = tiny_models.hf_config("mistral", len(tokenizer), sliding_window=128)
    config = from_hf_config(hf, (2,))
    assert context_len(config, 512, MAX_POS) == 512
