"""Decode-only steps in one C++ call (engine.cpu_decode, kernels/cpu/decode_stack.cpp): the
same tokens and the same logprobs, bit for bit, as LlamaModel.forward chaining the same
kernels from Python; models it does not cover keep that forward."""
import contextlib
import itertools

import pytest
import torch

import kernels.cpu as cpu_kernels
from engine import LLM
from engine.sampling_params import SamplingParams

PARAMS = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, logprobs=3)


@pytest.fixture(autouse=True)
def quant_kernels():
    """Built at the first test, never while collecting: the GPU run collects this module
    and must not spend its minutes building C++ (tests/gpu_kit)."""
    if cpu_kernels.load_quant() is None:
        pytest.skip("the quantized C++ kernels did not build here")


@contextlib.contextmanager
def python_forward(llm):
    """Decode steps through LlamaModel.forward instead of the stack, for the comparison."""
    runner = llm.core.runner
    stack, runner.decode_stack = runner.decode_stack, None
    try:
        yield
    finally:
        runner.decode_stack = stack


def assert_same_generations(llm, prompts, params=PARAMS):
    # Both runs must find the prompts in the prefix cache alike: a prefill of the whole
    # prompt rounds differently from one of its uncached tail, which is not what is compared.
    llm.generate(prompts, SamplingParams(max_tokens=1, temperature=0))
    fused = llm.generate(prompts, params)
    with python_forward(llm):
        reference = llm.generate(prompts, params)
    for a, b in zip(fused, reference):
        assert a.token_ids == b.token_ids
        assert a.logprobs == b.logprobs  # every float equal: the same kernels, the same order


def test_default_model_decodes_through_the_stack(llm):
    stack = llm.core.runner.decode_stack
    assert stack is not None and stack.stack.num_layers == llm.core.model_config.num_layers


def test_stack_gives_the_python_forwards_tokens_and_logprobs(llm):
    """Ragged prompts submitted together: one mixed prefill step (Python), then decode-only
    steps of 3 sequences at different lengths (the stack)."""
    assert_same_generations(llm, ["The capital of France is", "Write a haiku about the sea.",
                                  list(range(1000, 1070))])


def test_verification_steps_go_through_the_stack_bit_for_bit():
    """Speculation on: a step verifying proposed tokens runs each sequence's 1 + k rows
    through the stack, each row attending to its sequence's context up to itself."""
    # No history of finished outputs: the two runs compared must propose alike, and the
    # second would otherwise find the first's outputs (other rows, other roundings).
    # No row limit: every sequence verifies proposals (the stack's rows, not the back-off).
    llm = LLM(model="default", device="cpu", max_num_batched_tokens=512, speculative="ngram",
              speculative_history_tokens=0, speculative_max_rows=None)
    text = "one two three four five six seven eight nine ten"
    prompts = [llm.core.encode_chat([{"role": "user", "content": p}]) for p in (
        f"Repeat exactly: {text}", f"Repeat twice: {text}", "Count from 1 to 30 in digits.")]
    assert_same_verifications(llm, prompts)


def assert_same_verifications(llm, prompts):
    """The stack gives the Python forward's tokens and logprobs on verification steps
    (greedy, speculation on), some with one sequence's rows across a block boundary, and
    every block is free at the end (rejected tokens' slots rolled back)."""
    rows = record_stack_rows(llm)
    assert_same_generations(llm, prompts, SamplingParams(max_tokens=40, temperature=0,
                                                         ignore_eos=True, logprobs=3))
    verifying = [r for r in rows if len(r) > len({table for _, table in r})]
    assert verifying, "no step verified proposed tokens through the stack"
    block_size = llm.core.config.block_size
    assert any(a[1] == b[1] and b[0] % block_size == 0  # one sequence's rows p - 1, p
               for r in verifying for a, b in itertools.pairwise(r)), "no block boundary"
    stats = llm.core.stats()
    assert stats.spec_accepted_tokens > 0 and stats.num_free_blocks == stats.num_total_blocks


def record_stack_rows(llm) -> list[list[tuple[int, tuple]]]:
    """Each stack call's rows as (position, block table), appended as the engine runs."""
    stack, calls = llm.core.runner.decode_stack, []
    forward = stack.forward

    def recording(input_ids, positions, meta, kv_caches):
        calls.append(list(zip(positions.tolist(), map(tuple, meta.block_tables.tolist()))))
        return forward(input_ids, positions, meta, kv_caches)

    stack.forward = recording
    return calls


def test_stack_covers_int4_weights_and_qkv_bias():
    """Another packing (int4 groups of 32 quantized at load) and Qwen2's q/k/v bias."""
    llm = LLM(model="dummy:qwen2.5-0.5b", device="cpu", quantization="int4", max_model_len=256,
              max_num_batched_tokens=256)
    assert llm.core.runner.decode_stack is not None
    assert_same_generations(llm, [[1, 2, 3, 4, 5], [7] * 40])


def test_models_it_does_not_cover_keep_the_python_forward():
    tiny = LLM(model="dummy:tiny", device="cpu", quantization="int8")  # head_dim 16: no C++
    assert tiny.core.runner.decode_stack is None
    off = LLM(model="dummy:tiny", device="cpu", cpu_fused_decode=False)
    assert off.core.runner.decode_stack is None


def test_stack_refuses_caches_that_do_not_match_its_layers(llm):
    stack = llm.core.runner.decode_stack
    hidden = torch.zeros(1, llm.core.model_config.hidden_size)
    one = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="KV caches for 30 layers"):
        stack.stack.forward(hidden, one.long(), stack.model.cos_sin_cache, one.long(),
                            one.view(1, 1), one, [])


def test_the_bench_replays_one_captured_decode_step_through_both_paths(llm):
    """`python -m loadtest.decode_stack_bench`: one real decode step captured, then
    replayed through the stack and the Python forward, which agree bit for bit."""
    from loadtest.decode_stack_bench import captured_step, replay

    runner = llm.core.runner
    args = captured_step(llm, batch=2, context=8)
    input_ids, positions, meta, _ = args
    assert input_ids.shape == (2,) and meta.num_decodes == 2
    assert positions.tolist() == [9, 9]  # the third new token of each 8-token prompt
    paths = {"fused": runner.decode_stack.forward, "python": runner.model.forward}
    with torch.inference_mode():
        assert torch.equal(paths["fused"](*args), paths["python"](*args))
    times = replay(paths, args, 2)
    assert all(len(ms) == 2 and min(ms) > 0 for ms in times.values())


def test_the_bench_makes_a_verification_step_of_the_captured_one(llm):
    """`decode_stack_bench --verify K`: the captured step's row and K more as decode rows
    give the Python forward's bits, and the prefill attention's result over one extend
    request up to float noise (a different kernel: 7e-3 here; rows that saw the tokens
    after them: 1.7)."""
    from loadtest.decode_stack_bench import captured_step, verification_step

    runner = llm.core.runner
    rows, extend = verification_step(captured_step(llm, batch=1, context=8), 3)
    assert rows[2].seq_lens.tolist() == [10, 11, 12, 13] and extend[2].num_decodes == 0
    with torch.inference_mode():
        fused = runner.decode_stack.forward(*rows)
        assert torch.equal(fused, runner.model.forward(*rows))
        torch.testing.assert_close(fused, runner.model.forward(*extend), atol=2e-2, rtol=0)
