"""Hugging Face transformers as the benchmark's peer: the same weights (or, for `dummy:`,
a random model of the same shape) run through `generate` as one static batch, and through
`generate_batch` (transformers' own continuous batching, CUDA graphs on)."""
from __future__ import annotations

import time

import torch

from engine.loader import default_model_dir
from engine.models.config import DUMMY_SHAPES

PEERS = ("static", "cb")


def load_hf_model(spec: str, device: torch.device, dtype: torch.dtype):
    from transformers import AutoModelForCausalLM

    if spec.startswith("dummy:"):
        hf_config = _hf_config(DUMMY_SHAPES[spec.removeprefix("dummy:")])
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(hf_config, dtype=dtype)
    else:
        path = default_model_dir() if spec == "default" else spec
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    return model.eval()


def _hf_config(c):
    """A transformers config of the same shape as one of our dummy models."""
    from transformers import LlamaConfig, Qwen2Config

    cls = Qwen2Config if c.attention_bias else LlamaConfig
    return cls(vocab_size=c.vocab_size, hidden_size=c.hidden_size,
               intermediate_size=c.intermediate_size, num_hidden_layers=c.num_layers,
               num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
               head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
               rope_scaling=c.rope_scaling, max_position_embeddings=c.max_position_embeddings,
               tie_word_embeddings=c.tie_word_embeddings)


@torch.inference_mode()
def run_static(model, prompts: list[list[int]], output_len: int, batch_size: int) -> tuple[int, float]:
    """All prompts have the same length, so a static batch needs no padding.
    Returns (output tokens, seconds)."""
    device = model.device
    tokens, start = 0, time.perf_counter()
    for i in range(0, len(prompts), batch_size):
        ids = torch.tensor(prompts[i:i + batch_size], device=device)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             max_new_tokens=output_len, min_new_tokens=output_len,
                             pad_token_id=0)
        tokens += (out.shape[1] - ids.shape[1]) * ids.shape[0]
    _sync(device)
    return tokens, time.perf_counter() - start


# No inference_mode here: generate_batch builds its tensors in this thread and updates
# them in place from its own generation thread, which inference tensors forbid; it turns
# off autograd itself. None sizes the KV pool and batch from free GPU memory (on CPU, from
# host memory: gigabytes and slow steps, so tests pass small ones).
def run_continuous_batching(model, prompts: list[list[int]], output_len: int,
                            num_blocks: int | None = None,
                            max_batch_tokens: int | None = None) -> tuple[int, float]:
    """transformers' continuous batching over all prompts at once. Returns (output tokens,
    seconds); raises if any request came back short (it logs failures, never raises)."""
    from transformers import ContinuousBatchingConfig, GenerationConfig

    config = GenerationConfig(max_new_tokens=output_len, do_sample=False, eos_token_id=None,
                              pad_token_id=0)
    cb_config = ContinuousBatchingConfig(use_cuda_graph=True, num_blocks=num_blocks,
                                         max_batch_tokens=max_batch_tokens)
    start = time.perf_counter()
    results = model.generate_batch(inputs=prompts, generation_config=config,
                                   continuous_batching_config=cb_config)
    _sync(model.device)
    seconds = time.perf_counter() - start
    tokens = sum(len(r.generated_tokens) for r in results.values())
    if tokens != len(prompts) * output_len:
        raise RuntimeError(f"HF generate_batch produced {tokens} of "
                           f"{len(prompts) * output_len} tokens (its log says why)")
    return tokens, seconds


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
