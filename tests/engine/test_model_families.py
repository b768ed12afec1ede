"""Every supported model family, tiny and randomly initialised from a transformers config:
our engine's greedy tokens equal transformers' for 32 steps and the logits behind them agree
within 1e-4 in fp32, on both CPU attention backends (and the Triton kernels, interpreted).
Mistral's and Gemma 3's sliding windows (16 tokens) are shorter than the longest prompt and
the steps, so attention beyond the window is checked too."""
import os

import pytest

from loadtest import tiny_models


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_models.default_tokenizer()


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return [tokenizer.encode(p) for p in tiny_models.PROMPTS]


@pytest.fixture(scope="module")
def family(tmp_path_factory, tokenizer, prompts):
    """family name -> (model directory, transformers' runs on the prompts), built once."""
    root, built = tmp_path_factory.mktemp("families"), {}

    def get(name):
        if name not in built:
            path = tiny_models.build_family(name, root, tokenizer)
            built[name] = path, tiny_models.hf_runs(path, prompts)
        return built[name]
    return get


def _assert_same(ours, theirs, steps):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert len(b.tokens) >= steps
        assert a.tokens == b.tokens[:steps]
        assert a.logits.shape[0] == steps
        error = (a.logits - b.logits[:steps, :a.logits.shape[1]]).abs().max().item()
        assert error < 1e-4


@pytest.mark.parametrize("backend", ["cpu", "torch"])
@pytest.mark.parametrize("name", list(tiny_models.FAMILIES))
def test_greedy_tokens_and_logits_match_transformers(name, backend, family, prompts, request):
    if backend == "cpu":
        # built on first use, never while collecting (the GPU run collects this module too)
        request.getfixturevalue("cpu_kernels")
    path, theirs = family(name)
    ours = tiny_models.engine_runs(path, prompts, attention_backend=backend)
    assert len(ours) == len(prompts)
    _assert_same(ours, theirs, tiny_models.STEPS)


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the Triton kernels run on CPU under TRITON_INTERPRET=1")
@pytest.mark.parametrize("name", ["llama3", "qwen2-yarn", "mistral", "gemma3"])
def test_triton_kernels_apply_the_scaled_rope_and_windows(name, family, prompts):
    """The Triton rotary kernel reads the same table, yarn's attention factor included, and
    the Triton attention honours Mistral's and Gemma 3's sliding windows (interpreted, so
    fewer steps)."""
    path, theirs = family(name)
    ours = tiny_models.engine_runs(path, prompts, steps=8, attention_backend="triton")
    _assert_same(ours, theirs, 8)


def test_families_cover_the_features(family):
    """The parity above is only as good as the shapes it runs: each feature is present."""
    from transformers import AutoConfig

    configs = {name: AutoConfig.from_pretrained(family(name)[0])
               for name in tiny_models.FAMILIES}
    types = {c.model_type for c in configs.values()}
    assert types == {"llama", "mistral", "qwen2", "qwen3", "gemma3_text"}
    ropes = {c.rope_parameters["rope_type"] for c in configs.values()
             if "rope_type" in c.rope_parameters}  # Gemma 3's: one per layer type
    assert ropes == {"default", "llama3", "linear", "yarn"}
    assert {c.tie_word_embeddings for c in configs.values()} == {True, False}
    assert all(c.head_dim == 64 for c in configs.values())
    # sliding windows the prompts and steps outgrow, on every layer and on some
    windowed = {n: c.layer_types if getattr(c, "layer_types", None) else c.sliding_window
                for n, c in configs.items() if getattr(c, "sliding_window", None)}
    assert windowed == {"mistral": 16, "gemma3": ["sliding_attention", "full_attention"]}
    assert configs["gemma3"].sliding_window == 16
