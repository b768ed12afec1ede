"""Greedy output must be token-identical to Hugging Face generate (fp32, one prompt at a time)."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import SamplingParams
from engine.loader import default_model_dir

PROMPTS = [
    "Hi",
    "The capital of France is",
    "Write a haiku about autumn leaves falling on a quiet pond.",
    "List three prime numbers:",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Translate to French: The weather is lovely today and I would like to go for a walk "
    "in the park with my friends before dinner.",
    "Once upon a time, in a kingdom far away, there lived a curious young inventor who "
    "spent every night in her workshop building machines out of scrap metal. One evening,",
    "Q: What is 12 times 12?\nA:",
    "Explain, step by step and in plain words, how a bicycle stays upright when it moves "
    "forward, and why it falls over when it stops. Mention gyroscopic effects, steering "
    "geometry, and the role of the rider in keeping balance during slow turns.",
]
MAX_NEW = 24


@pytest.fixture(scope="module")
def hf_outputs(llm):
    model = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32)
    model.eval()
    outs = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = torch.tensor([llm.tokenizer.encode(prompt)])
            gen = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)
            outs.append(gen[0, ids.shape[1]:].tolist())
    return outs


def test_greedy_matches_hf_generate_batched(llm, hf_outputs):
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_NEW, temperature=0.0))
    assert len({len(llm.tokenizer.encode(p)) for p in PROMPTS}) >= 8  # different lengths
    for prompt, ours, theirs in zip(PROMPTS, outs, hf_outputs):
        assert ours.token_ids == theirs, prompt
        expected_reason = "length" if len(theirs) == MAX_NEW and theirs[-1] != 2 else "stop"
        assert ours.finish_reason == expected_reason
