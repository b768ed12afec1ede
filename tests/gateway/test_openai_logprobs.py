"""Log-probabilities over HTTP (the official openai SDK, stream and not) and /v1/ws: the
model's own numbers (checked against Hugging Face's forward pass), sorted alternatives that
hold the chosen token when it is among them, the same numbers on every surface."""
from __future__ import annotations

import aiohttp
import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from engine.loader import default_model_dir
from loadtest.logprob_error import fp32_logprobs
from logprob_tolerance import assert_near_fp32, assert_same_top, logprob_tolerance
from ws_helpers import open_ws, recv_until

CHAT = [{"role": "user", "content": "Name a fruit."}]
PROMPT_IDS = [504, 3575, 282, 4649, 314]  # "The capital of France is"
GREEDY = {"temperature": 0, "max_tokens": 8, "model": "m"}
# The second of two identical requests hits the prefix cache, so its prefill multiplies fewer
# rows, and a quantized matmul's path depends on the row count (on AVX2, from 12 rows the
# activations are taken exact, below that at two int8 levels: docs/quantization.md). Each is
# within logprob_tolerance().each of fp32's logprobs, so the two may differ by twice that,
# never by a token's.


def repeat_tolerance() -> float:
    return 2 * logprob_tolerance().each


def _assert_sorted_with_chosen(token: str, logprob: float, top: list[tuple[str, float]],
                               k: int) -> None:
    values = [lp for _, lp in top]
    assert len(top) == k and values == sorted(values, reverse=True)
    if logprob >= values[-1]:  # among the top ones: listed with its own value
        assert (token, pytest.approx(logprob)) in [(t, pytest.approx(v)) for t, v in top]


async def test_chat_logprobs_whole_and_streamed(client):
    whole = await client.chat.completions.create(messages=CHAT, logprobs=True,
                                                 top_logprobs=3, **GREEDY)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    for entry in content:
        assert entry.bytes == list(entry.token.encode())
        _assert_sorted_with_chosen(entry.token, entry.logprob,
                                   [(t.token, t.logprob) for t in entry.top_logprobs], 3)
        assert entry.top_logprobs[0].token == entry.token  # greedy: the most likely
    streamed = []
    async for chunk in await client.chat.completions.create(
            messages=CHAT, logprobs=True, top_logprobs=3, stream=True, **GREEDY):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.content
    assert [e.token for e in streamed] == [e.token for e in content]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in content],
                                                          abs=repeat_tolerance())


async def test_completion_logprobs_legacy_shape(client):
    whole = await client.completions.create(prompt=PROMPT_IDS, logprobs=2, **GREEDY)
    lp = whole.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 8
    assert lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0
    for token, logprob, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        _assert_sorted_with_chosen(token, logprob, list(top.items()), 2)
    streamed = []
    async for chunk in await client.completions.create(prompt=PROMPT_IDS, logprobs=2,
                                                       stream=True, **GREEDY):
        if chunk.choices[0].logprobs:
            streamed += chunk.choices[0].logprobs.token_logprobs
    assert streamed == pytest.approx(lp.token_logprobs, abs=repeat_tolerance())


async def test_ws_logprobs_are_the_models_own(base_url, client):
    async with aiohttp.ClientSession() as s:
        ws, _ = await open_ws(s, base_url)
        await ws.send_json({"type": "generate", "id": "g", "prompt": PROMPT_IDS,
                            "params": {"temperature": 0, "max_tokens": 8, "logprobs": 4}})
        frames, done = await recv_until(ws, "g")
        await ws.close()
    deltas = [f for f in frames if f["type"] == "delta"]
    entries = [e for f in deltas for e in f["logprobs"]]
    assert all(len(f["logprobs"]) == f["n"] for f in deltas)  # one entry per token
    assert len(entries) == done["usage"]["completion_tokens"] == 8
    model = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32)
    ref = fp32_logprobs(model, PROMPT_IDS, [e["token_id"] for e in entries])
    for row, entry in zip(ref, entries):
        assert len(entry["top"]) == 4
        assert_same_top([t["token_id"] for t in entry["top"]], row)
    assert_near_fp32([e["logprob"] for e in entries],
                     [row[e["token_id"]].item() for row, e in zip(ref, entries)])
    http = await client.completions.create(prompt=PROMPT_IDS, logprobs=0, **GREEDY)
    assert http.choices[0].logprobs.token_logprobs == pytest.approx(
        [e["logprob"] for e in entries], abs=1e-5)  # the same numbers on both surfaces


async def test_logprobs_limits_name_the_field(client):
    for kwargs, param in [({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
                          ({"top_logprobs": 2}, "top_logprobs")]:
        with pytest.raises(openai.BadRequestError) as info:
            await client.chat.completions.create(messages=CHAT, **kwargs, **GREEDY)
        assert info.value.body["param"] == param
    plain = await client.chat.completions.create(messages=CHAT, **GREEDY)
    assert plain.choices[0].logprobs is None
