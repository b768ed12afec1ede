"""Log-probabilities: the model's own distribution for the tokens it chose, checked against
Hugging Face's forward pass of the same model over the same tokens (fp32)."""
import pytest
import torch
from transformers import AutoModelForCausalLM

from engine import SamplingParams
from engine.loader import default_model_dir
from engine.logprobs import LogprobRows
from engine.request import Request
from loadtest.logprob_error import fp32_logprobs
from logprob_tolerance import assert_near_fp32, assert_same_top

PROMPTS = ["The capital of France is", "def fibonacci(n):", "List three prime numbers:"]
TOP = 5


@pytest.fixture(scope="module")
def hf_model():
    return AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32).eval()


def test_greedy_logprobs_match_the_models_logits(llm, hf_model):
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=10, temperature=0.0, logprobs=TOP))
    ours, fp32 = [], []
    for prompt, out in zip(PROMPTS, outs):
        ref = fp32_logprobs(hf_model, llm.tokenizer.encode(prompt), out.token_ids)
        assert len(out.logprobs) == len(out.token_ids)
        for row, token, entry in zip(ref, out.token_ids, out.logprobs):
            assert entry.token_id == token
            values = [lp for _, lp in entry.top]
            assert len(entry.top) == TOP and values == sorted(values, reverse=True)
            assert entry.top[0] == (token, entry.logprob)  # greedy: the chosen one is first
            assert_same_top([t for t, _ in entry.top], row)
            ours += [entry.logprob, *values]
            fp32 += [row[token].item(), *(row[t].item() for t, _ in entry.top)]
    assert_near_fp32(ours, fp32)


def test_logprobs_are_raw_before_penalties_and_temperature(llm, hf_model):
    """A sampled, penalised request's logprobs are still the model's own distribution."""
    params = SamplingParams(max_tokens=8, temperature=1.7, top_k=20, seed=3,
                            repetition_penalty=1.5, presence_penalty=1.0, logprobs=2)
    out = llm.generate([PROMPTS[0]], params)[0]
    ref = fp32_logprobs(hf_model, llm.tokenizer.encode(PROMPTS[0]), out.token_ids)
    for entry in out.logprobs:
        in_top = entry.token_id in [t for t, _ in entry.top]
        assert in_top == (entry.logprob >= entry.top[-1][1])
    assert_near_fp32([e.logprob for e in out.logprobs],
                     [row[e.token_id].item() for row, e in zip(ref, out.logprobs)])


def test_only_rows_that_ask_pay():
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    asks = [None, 3, None, 0]
    reqs = [Request(f"r{i}", [1], SamplingParams(temperature=0.0, logprobs=k))
            for i, k in enumerate(asks)]
    rows = LogprobRows(logits, reqs)
    assert rows.rows == [1, 3] and rows.logprobs.shape == (2, 50)
    out = rows.gather(logits.argmax(-1), 4)
    assert out[0] is None and out[2] is None
    assert len(out[1].top) == 3 and out[3].top == []
    assert LogprobRows(logits, [reqs[0], reqs[2]]).logprobs is None


def test_logprobs_above_the_engine_limit_are_refused(llm):
    from engine.errors import InvalidRequestError
    with pytest.raises(InvalidRequestError, match="logprobs"):
        llm.core.validate([1, 2], SamplingParams(logprobs=21))
    with pytest.raises(InvalidRequestError, match="logprobs"):
        SamplingParams(logprobs=-1)
