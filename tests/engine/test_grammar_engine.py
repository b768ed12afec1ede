"""Structured outputs in the engine: only constrained rows are masked, a terminated grammar
ends with `stop` (even with ignore_eos), preemption by recompute never re-feeds the matcher,
and the compile pool refuses, caches, times out and withdraws work as it should."""
from __future__ import annotations

import asyncio
import json
import os
import threading

import jsonschema
import pytest
import torch

from engine import LLM, SamplingParams
from engine.errors import InvalidRequestError
from engine.grammar import COMPILE_NICENESS, GrammarCompiler, new_matcher
from engine.request import Request
from engine.response_format import grammar_key
from loadtest.json_schemas import SCHEMAS, max_tokens_for

from tests.engine.conftest import assert_all_blocks_free

ITEMS = dict(SCHEMAS)["items"]


def _format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}


def _replays(schema: dict, token_ids: list[int], compiler: GrammarCompiler) -> bool:
    """Whether a fresh matcher accepts the whole output and ends with it."""
    matcher = new_matcher(compiler.compile({"type": "json_schema", "schema": schema}))
    return all(matcher.accept_token(t) for t in token_ids) and matcher.is_terminated()


def test_only_constrained_rows_are_masked(llm):
    compiled = llm.core.grammars.compile({"type": "json_schema", "schema": ITEMS})
    requests = [Request(f"r{i}", [1, 2], SamplingParams(temperature=0)) for i in range(3)]
    requests[1].grammar = new_matcher(compiled)
    logits = torch.randn(3, llm.core.runner.sample_vocab)
    before = logits.clone()
    tokens, _ = llm.core.runner.sampler.sample(logits, requests)
    token = tokens[1]
    assert torch.equal(logits[0], before[0]) and torch.equal(logits[2], before[2])
    allowed = logits[1] > float("-inf")
    assert 0 < allowed.sum() < 100 and allowed[token]  # `{` and little else may open it
    assert torch.equal(logits[1][allowed], before[1][allowed])


def test_a_terminated_grammar_stops_even_with_ignore_eos(llm):
    name, schema = SCHEMAS[0]
    params = SamplingParams(max_tokens=max_tokens_for(schema), temperature=0, ignore_eos=True,
                            response_format=_format(schema))
    out, plain = llm.generate([f"A {name} as JSON:", "Hello"],
                              [params, SamplingParams(max_tokens=5, temperature=0)])
    assert out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.text), schema)
    assert plain.finish_reason == "length"
    assert _replays(schema, out.token_ids, llm.core.grammars)


def test_preemption_by_recompute_keeps_each_matcher_in_step():
    """A pool too small for the batch forces preemptions mid-answer; the recompute must
    resume the matcher where it was (tokens already accepted are not fed again)."""
    small = LLM(model="default", device="cpu", num_kv_blocks=10, block_size=16,
                max_num_batched_tokens=256, max_num_seqs=6)
    chosen = SCHEMAS[:6]
    prompts = [f"Give one {name} as JSON for {json.dumps(schema)}" for name, schema in chosen]
    params = [SamplingParams(max_tokens=max_tokens_for(schema), temperature=0.8, seed=i,
                             response_format=_format(schema))
              for i, (_, schema) in enumerate(chosen)]
    outs = small.generate(prompts, params)
    assert small.core.step_scheduler.num_preemptions > 0
    for (_, schema), out in zip(chosen, outs):
        assert out.finish_reason == "stop", out.text
        jsonschema.validate(json.loads(out.text), schema)
        assert _replays(schema, out.token_ids, small.core.grammars)
    assert_all_blocks_free(small.core)


def test_bad_schemas_are_refused_naming_response_format_and_compiled_once(llm):
    bad = _format({"type": "string", "pattern": "(unclosed"})
    compiles = llm.core.grammars.num_compiles
    for _ in range(2):
        with pytest.raises(InvalidRequestError) as err:
            llm.generate(["hi"], SamplingParams(max_tokens=4, response_format=bad))
        assert err.value.field == "response_format" and "cannot be compiled" in str(err.value)
    assert llm.core.grammars.num_compiles == compiles + 1  # the refusal is cached too
    assert_all_blocks_free(llm.core)


@pytest.mark.parametrize("value", [{"type": "xml"}, "json", {"type": "json_schema"},
                                   {"type": "json_schema", "json_schema": {"schema": 3}}])
def test_response_format_shapes_are_checked(value):
    with pytest.raises(InvalidRequestError) as err:
        SamplingParams(response_format=value)
    assert err.value.field == "response_format"


def test_text_is_unconstrained_and_names_do_not_split_the_cache():
    assert SamplingParams(response_format={"type": "text"}).response_format is None
    a = SamplingParams(response_format={"type": "json_schema", "json_schema": {
        "name": "a", "schema": {"type": "object", "properties": {"x": {"type": "integer"}}}}})
    b = SamplingParams(response_format={"type": "json_schema", "json_schema": {
        "name": "b", "strict": True,
        "schema": {"properties": {"x": {"type": "integer"}}, "type": "object"}}})
    assert grammar_key(a.response_format) == grammar_key(b.response_format)


@pytest.fixture
def blocked_compiler(llm):
    """A compiler whose one pool thread is busy until the test lets it go."""
    compiler = GrammarCompiler(llm.tokenizer, llm.core.runner.sample_vocab, {2}, threads=1,
                               cache_size=8, timeout_s=0.3)
    gate = threading.Event()
    compiler._pool.submit(gate.wait)  # noqa: SLF001 - occupy the only worker
    yield compiler
    gate.set()
    compiler.shutdown()


def test_compiles_run_below_the_engine_s_priority(llm):
    """A long compile takes the CPU the decode steps leave (Linux: per-thread nice)."""
    compiler = GrammarCompiler(llm.tokenizer, llm.core.runner.sample_vocab, {2}, threads=1,
                               cache_size=8, timeout_s=5.0)
    def niceness() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    try:
        on_pool = compiler._pool.submit(niceness).result()  # noqa: SLF001 - the compile thread
    finally:
        compiler.shutdown()
    assert on_pool == niceness() + COMPILE_NICENESS


async def test_a_compile_past_its_time_is_refused_and_withdrawn(blocked_compiler):
    spec = {"type": "json_object"}
    with pytest.raises(InvalidRequestError, match="longer than 0.3 s") as err:
        await blocked_compiler.compile_async(spec)
    assert err.value.field == "response_format"
    assert not blocked_compiler._cache  # noqa: SLF001 - the queued compile was withdrawn


async def test_a_cancelled_request_withdraws_its_queued_compile(blocked_compiler):
    blocked_compiler.timeout_s = 60.0
    spec = {"type": "json_schema", "schema": ITEMS}
    first = asyncio.create_task(blocked_compiler.compile_async(spec))
    second = asyncio.create_task(blocked_compiler.compile_async(spec))
    cache = blocked_compiler._cache  # noqa: SLF001
    while not cache or next(iter(cache.values())).waiters < 2:
        await asyncio.sleep(0.01)
    entry = next(iter(cache.values()))
    first.cancel()
    await asyncio.sleep(0.05)
    assert not entry.future.cancelled()  # the other request still waits for it
    second.cancel()
    await asyncio.gather(first, second, return_exceptions=True)
    assert entry.future.cancelled() and not cache
    assert blocked_compiler.num_compiles == 1
