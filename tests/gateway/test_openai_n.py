"""n > 1 through the official openai SDK: one prefill for all samples (the engine's
counters), distinct samples from seed + i, reproducible, usage counting the prompt once,
streamed choices told apart by `index`."""
from __future__ import annotations

import random
import re

import aiohttp
import openai
import pytest

CHAT = [{"role": "user", "content": "Tell me a short story."}]


def _fresh_prompt(seed: int) -> list[int]:
    rng = random.Random(seed)  # a prompt no earlier request left in the prefix cache
    return [rng.randrange(100, 40000) for _ in range(1000)]


async def test_n4_shares_one_prefill_and_reproduces(server, client):
    prompt = _fresh_prompt(41)
    body = {"model": "m", "prompt": prompt, "n": 4, "max_tokens": 10, "seed": 5,
            "temperature": 1.0, "extra_body": {"ignore_eos": True}}
    before = server.engine.stats()
    first = await client.completions.create(**body)
    after = server.engine.stats()
    block = server.engine.core.config.block_size
    shared = (1000 - 1) // block * block
    assert after.fork_shared_tokens - before.fork_shared_tokens == 3 * shared
    assert after.prefill_tokens - before.prefill_tokens == 1000 + 3 * (1000 - shared)
    assert [c.index for c in first.choices] == [0, 1, 2, 3]
    assert len({c.text for c in first.choices}) == 4
    assert first.usage.prompt_tokens == 1000  # the prompt once
    assert first.usage.completion_tokens == 40
    again = await client.completions.create(**body)
    assert [c.text for c in again.choices] == [c.text for c in first.choices]
    assert server.all_blocks_free()
    async with aiohttp.ClientSession() as s:
        async with s.get(str(client.base_url).removesuffix("v1/") + "metrics") as r:
            scraped = await r.text()
    shown = re.search(r"^tokenwire_fork_shared_tokens_total (\S+)$", scraped, re.M)
    assert float(shown.group(1)) >= 6 * shared  # both runs forked, as /metrics shows


async def test_streamed_choices_carry_their_index(client):
    body = {"model": "m", "messages": CHAT, "n": 3, "max_tokens": 8, "seed": 9}
    # Both requests below meet the prompt's prefix already cached. A cold prefill (the int8
    # panels over all its rows) and an extend over a cached prefix (the row dots) put the
    # default model's logprobs up to ~2e-3 apart, enough to move a seeded sample that
    # lands near a boundary: whole and streamed are compared in the same cache state.
    await client.chat.completions.create(**{**body, "max_tokens": 1})
    whole = await client.chat.completions.create(**body)
    texts, finishes, usage = {}, {}, None
    async for chunk in await client.chat.completions.create(
            **body, stream=True, stream_options={"include_usage": True}):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + (c.delta.content or "")
            finishes[c.index] = c.finish_reason or finishes.get(c.index)
        usage = chunk.usage or usage
    assert texts == {c.index: c.message.content for c in whole.choices}
    assert finishes == {c.index: c.finish_reason for c in whole.choices}
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.completion_tokens == whole.usage.completion_tokens


async def test_n_beyond_the_limit_names_n(client):
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="m", messages=CHAT, n=17)
    assert info.value.body["param"] == "n"
