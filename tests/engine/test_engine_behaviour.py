"""Prefix cache, preemption, block accounting and bad input on the real default model."""
import random

import pytest

from engine import LLM, InvalidRequestError, PromptTooLongError, SamplingParams
from engine.errors import ModelLoadError
from tests.engine.conftest import assert_all_blocks_free, forge_keys

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)
LONG_PREFIX = ("You are a meticulous assistant. Answer briefly and cite the rule you used. "
               "Rules: be kind, be exact, say when you do not know, never invent facts. ") * 3


def test_prefix_cache_hit_reports_cached_tokens_and_same_output(llm):
    block = llm.core.config.block_size
    llm.generate([LONG_PREFIX + "Q: What is 2+2?"], GREEDY)
    second = llm.generate([LONG_PREFIX + "Q: Name a color."], GREEDY)[0]
    shared = len(llm.tokenizer.encode(LONG_PREFIX)) - 1
    assert second.num_cached_tokens >= (shared // block) * block > 0
    uncached = LLM(model="default", device="cpu", enable_prefix_caching=False)
    again = uncached.generate([LONG_PREFIX + "Q: Name a color."], GREEDY)[0]
    assert again.num_cached_tokens == 0
    assert again.token_ids == second.token_ids
    assert_all_blocks_free(llm.core)


@pytest.mark.parametrize("forgery", ["chunk", "prefix"])
def test_a_forged_key_collision_serves_the_prompts_own_kv(llm, monkeypatch, forgery):
    block = llm.core.config.block_size
    rng = random.Random(forgery)  # chunks unseen by the prefix cache of earlier tests
    w, x, y, z = ([rng.randrange(100, 40000) for _ in range(block)] for _ in range(4))
    probe = x + y + [7, 8, 9]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    want = llm.generate([probe], params)[0].token_ids
    if forgery == "chunk":  # every chunk at one depth gets one key: w's is x's
        forge_keys(monkeypatch, lambda real, parent, token_ids: real(parent, ()))
        earlier, cached = [w + z + [7, 8, 9]], 0
    else:  # a chunk gets one key whatever precedes it: y's after w is y's after x
        forge_keys(monkeypatch, lambda real, parent, token_ids: real(None, token_ids))
        earlier, cached = [w + y + [7, 8, 9], x + z + [7, 8, 9]], block
    llm.generate(earlier, params)
    got = llm.generate([probe], params)[0]
    assert (got.token_ids, got.num_cached_tokens) == (want, cached)
    assert_all_blocks_free(llm.core)


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_preemption_with_small_pool_gives_same_outputs(llm, prefix_caching):
    # a shared first block: later requests hit it, and preempted ones find their own blocks
    prompts = [f"Once upon a time, in a kingdom by the sea, lived a dragon. Story {i}: the "
               f"dragon and the {w} went to" for i, w in
               enumerate(["knight", "baker", "robot", "cat", "poet", "sailor"])]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    big = llm.generate(prompts, params)
    # 10 blocks of 16 tokens cannot hold 4 requests of ~54 tokens (4 blocks each) at once;
    # the last two requests start once the first block is cached
    small = LLM(model="default", device="cpu", num_kv_blocks=10, max_num_seqs=4,
                enable_prefix_caching=prefix_caching)
    outs = small.generate(prompts, params)
    stats = small.core.stats()
    assert stats.num_preemptions > 0
    assert [o.token_ids for o in outs] == [o.token_ids for o in big]
    assert all(o.finish_reason == "length" and len(o.token_ids) == 24 for o in outs)
    assert_all_blocks_free(small.core)
    # each request's lookup counts once, however often it was rescheduled
    lookups = sum(o.num_prompt_tokens for o in outs) if prefix_caching else 0
    assert stats.prefix_cache_queries == lookups
    assert stats.prefix_cache_hits == sum(o.num_cached_tokens for o in outs)
    assert (stats.prefix_cache_hits > 0) == prefix_caching


def test_abort_frees_blocks(llm):
    core = llm.core
    for i in range(3):
        core.add_request(f"a{i}", llm.tokenizer.encode(f"Count to ten, {i}:"),
                         SamplingParams(max_tokens=50, temperature=0.0))
    core.step()
    core.step()
    for i in range(3):
        core.abort_request(f"a{i}")
    outs = core.step()
    assert sorted(o.request_id for o in outs if o.finished) == ["a0", "a1", "a2"]
    assert all(o.finish_reason == "cancelled" for o in outs)
    assert_all_blocks_free(core)


def test_bad_input_is_rejected_and_engine_keeps_serving(llm):
    core = llm.core
    with pytest.raises(PromptTooLongError):
        core.validate([1] * core.max_model_len, GREEDY)
    with pytest.raises(InvalidRequestError, match="prompt"):
        core.validate([], GREEDY)
    with pytest.raises(InvalidRequestError, match="prompt"):
        core.validate([core.vocab_size + 5], GREEDY)
    with pytest.raises(InvalidRequestError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(InvalidRequestError, match="params.bogus"):
        SamplingParams.from_dict({"bogus": 1})
    with pytest.raises(InvalidRequestError, match="max_tokens"):
        SamplingParams.from_dict({"max_tokens": "5"})
    with pytest.raises(ModelLoadError):
        LLM(model="/nonexistent/model", device="cpu")
    out = llm.generate(["Hello"], GREEDY)[0]
    assert out.token_ids and out.finish_reason in ("stop", "length")
    assert_all_blocks_free(core)


def test_generation_stops_at_context_limit():
    small = LLM(model="default", device="cpu", max_model_len=40)
    prompt = small.tokenizer.encode("Tell me a very long story about a lighthouse keeper.")
    out = small.generate([prompt], SamplingParams(max_tokens=500, ignore_eos=True,
                                                  temperature=0.0))[0]
    assert out.finish_reason == "length"
    assert len(prompt) + len(out.token_ids) == 40
