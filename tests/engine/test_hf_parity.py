"""Greedy output against Hugging Face generate (fp32, one prompt at a time). The engine's
quantized matmuls round a decode step's activations (docs/quantization.md), so where HF's
two likeliest tokens lie within that rounding's logprob error of each other the engine may
take the other one: at most one prompt of the nine may part from HF, and only at such a
tie (at least 8 of 9 whole: docs/quantization.md)."""
import pytest
import torch
from logprob_tolerance import logprob_tolerance
from transformers import AutoModelForCausalLM

from engine import SamplingParams
from engine.loader import default_model_dir
from loadtest.logprob_error import first_difference

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
    """Per prompt: HF's greedy tokens, and at each the gap between its two likeliest
    tokens' logprobs."""
    model = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32)
    model.eval()
    outs = []
    with torch.inference_mode():
        for prompt in PROMPTS:
            ids = torch.tensor([llm.tokenizer.encode(prompt)])
            gen = model.generate(ids, max_new_tokens=MAX_NEW, do_sample=False)
            n = ids.shape[1]
            logprobs = torch.log_softmax(model(gen).logits[0, n - 1:-1], -1)
            top2 = logprobs.topk(2).values
            outs.append((gen[0, n:].tolist(), (top2[:, 0] - top2[:, 1]).tolist()))
    return outs


def test_greedy_matches_hf_generate_batched(llm, hf_outputs):
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=MAX_NEW, temperature=0.0))
    assert len({len(llm.tokenizer.encode(p)) for p in PROMPTS}) >= 8  # different lengths
    # a flip needs the two tokens' logprobs each off by up to the tolerance
    tie = 2 * logprob_tolerance().each
    parted = []
    for prompt, ours, (theirs, gaps) in zip(PROMPTS, outs, hf_outputs):
        at = first_difference(ours.token_ids, theirs)
        if at is not None:
            parted.append(prompt)
            assert at < len(theirs) and gaps[at] <= tie, (
                f"{prompt!r} parts from HF at token {at}, not at a tie: {ours.token_ids} "
                f"vs {theirs}")
            continue
        expected_reason = "length" if len(theirs) == MAX_NEW and theirs[-1] != 2 else "stop"
        assert ours.finish_reason == expected_reason
    assert len(parted) <= 1, parted
