"""Tiny randomly initialised models of each supported family, built from `transformers`
configs and saved as local HF directories (no download), and the parity of our engine with
`transformers` on them: greedy tokens and the logits behind each of them.

Shared by tests/engine/test_model_families.py and `python -m loadtest.model_parity`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

# head_dim 64: one of the two head sizes the C++ attention kernels take (kernels/cpu).
_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=64, rms_norm_eps=1e-6,
             max_position_embeddings=2048)

# family -> (transformers config class name, its arguments beyond _TINY)
FAMILIES: dict[str, tuple[str, dict]] = {
    "llama3": ("LlamaConfig", dict(
        rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 256})),
    "llama-tied": ("LlamaConfig", dict(rope_theta=100000.0, tie_word_embeddings=True)),
    # windows short enough that the prompts and 32 steps outgrow them
    "mistral": ("MistralConfig", dict(rope_theta=1000000.0, sliding_window=16,
                                      tie_word_embeddings=False)),
    "gemma3": ("Gemma3TextConfig", dict(
        sliding_window=16, layer_types=["sliding_attention", "full_attention"],
        query_pre_attn_scalar=48, rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})),
    "qwen2": ("Qwen2Config", dict(rope_theta=1000000.0, tie_word_embeddings=True)),
    "qwen3": ("Qwen3Config", dict(rope_theta=1000000.0, tie_word_embeddings=True)),
    "llama-linear": ("LlamaConfig", dict(
        rope_theta=10000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "linear", "factor": 4.0})),
    "qwen2-yarn": ("Qwen2Config", dict(
        rope_theta=1000000.0, tie_word_embeddings=False,
        rope_scaling={"rope_type": "yarn", "factor": 4.0,
                      "original_max_position_embeddings": 512})),
}

PROMPTS = [
    "Hi",
    "The capital of France is",
    "Once upon a time, in a kingdom far away, there lived a curious young inventor who "
    "spent every night in her workshop building machines out of scrap metal.",
]
STEPS = 32


def default_tokenizer():
    """The default model's tokenizer, which the tiny models share."""
    from transformers import AutoTokenizer

    from engine.loader import default_model_dir

    return AutoTokenizer.from_pretrained(default_model_dir())


def hf_config(family: str, vocab_size: int, **overrides):
    """The transformers config of a tiny `family` model (see FAMILIES)."""
    import transformers

    cls_name, extra = FAMILIES[family]
    return getattr(transformers, cls_name)(vocab_size=vocab_size, **{**_TINY, **extra,
                                                                     **overrides})


def build(config, path: Path, tokenizer, seed: int = 0) -> Path:
    """Save a model of `config` with seeded random weights and `tokenizer` under `path`.

    Norm weights and biases are random too (transformers initialises them to one and
    zero), and weights are large enough that attention is far from uniform, so positions,
    and with them the rotary embedding, shape the logits."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.normal_(0.0, 0.1)
            else:
                param.normal_(0.0, 0.15)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_family(family: str, root: Path, tokenizer) -> Path:
    """`family`'s tiny model under root/family, seeded by its place in FAMILIES."""
    seed = list(FAMILIES).index(family)
    return build(hf_config(family, len(tokenizer)), root / family, tokenizer, seed)


@dataclass
class Run:
    """One prompt's greedy continuation and the logits [steps, vocab] that chose it."""

    tokens: list[int]
    logits: torch.Tensor


@torch.inference_mode()
def hf_runs(path: Path, prompts: list[list[int]], steps: int = STEPS) -> list[Run]:
    """transformers `generate`, greedy, one prompt at a time, never stopping early."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    config = GenerationConfig(max_new_tokens=steps, do_sample=False, eos_token_id=None,
                              pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    runs = []
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
        runs.append(Run(out.sequences[0, len(prompt):].tolist(),
                        torch.cat([step_logits.float() for step_logits in out.logits])))
    return runs


def engine_runs(path: Path, prompts: list[list[int]], steps: int = STEPS,
                attention_backend: str = "cpu") -> list[Run]:
    """Our engine on CPU in fp32, all prompts in one batch; the logits are read where the
    runner hands them to the sampler."""
    from engine import LLM, SamplingParams

    llm = LLM(model=str(path), device="cpu", dtype="float32",
              attention_backend=attention_backend, num_kv_blocks=64)
    seen: dict[str, list[torch.Tensor]] = {}
    sample = llm.core.runner.sampler.sample

    def recording_sample(logits, requests):
        for row, request in zip(logits, requests):
            seen.setdefault(request.request_id, []).append(row.float().clone())
        return sample(logits, requests)

    llm.core.runner.sampler.sample = recording_sample
    params = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True)
    outs = llm.generate(prompts, params)
    ids = sorted(seen, key=lambda rid: int(rid.rsplit("-", 1)[1]))
    return [Run(out.token_ids, torch.stack(seen[rid])) for out, rid in zip(outs, ids)]


@dataclass
class Parity:
    """How far our engine's greedy runs are from transformers' on the same prompts."""

    tokens_matched: int  # greedy steps equal before the first difference, over all prompts
    tokens_total: int
    max_logit_error: float  # over the steps both runs took from the same prefix


def compare(ours: list[Run], theirs: list[Run]) -> Parity:
    matched, total, error = 0, 0, 0.0
    for a, b in zip(ours, theirs):
        same = next((i for i, (x, y) in enumerate(zip(a.tokens, b.tokens)) if x != y),
                    min(len(a.tokens), len(b.tokens)))
        # the step that first differs was still computed from the same prefix
        shared = min(same + 1, len(a.logits), len(b.logits))
        vocab = min(a.logits.shape[1], b.logits.shape[1])
        diff = (a.logits[:shared, :vocab] - b.logits[:shared, :vocab]).abs().max().item()
        matched, total, error = matched + same, total + len(b.tokens), max(error, diff)
    return Parity(matched, total, error)
