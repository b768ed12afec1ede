"""OpenAI's prompt_cache_key and prompt_cache_retention on the KV tiers (docs/sessions.md):
through the openai SDK against a real `tokenwire serve` on loopback (the default model on
CPU, a 16-block pool, no host tier, a disk tier of 26 blocks), a chat completion with
`prompt_cache_retention: "24h"` and a response with a `prompt_cache_key` come back from
disk after other requests crowded them out of the pool and out of the disk tier's byte
bound, while the same requests without either (side by side, same run) prefill again.
A deleted stored response forgets its own turn's blocks; bad values answer 400 by name.
"""
from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import openai
import pytest

BLOCK = 16
POOL_BLOCKS = 16
FILE_BYTES = 737_280 + 112 + 4 * BLOCK  # one block file of the default model: KV + header
DISK_BLOCKS = 26
SENTENCE = "Record {} of {}: the tide came in at the harbour wall and the boats rose."
FLAGS = ("--session-store", "memory:", "--block-size", str(BLOCK), "--num-kv-blocks",
         str(POOL_BLOCKS), "--kv-host-bytes", "0", "--kv-disk-bytes",
         str(DISK_BLOCKS * FILE_BYTES))


def text(place: str, sentences: int) -> str:
    return " ".join(SENTENCE.format(i, place) for i in range(sentences))


@pytest.fixture(scope="module")
def server(spawn, tmp_path_factory):
    kv_dir = tmp_path_factory.mktemp("kv")
    yield spawn(*FLAGS, "--kv-disk-dir", str(kv_dir), name="prompt-cache").start(), kv_dir


def client(server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.http_url + "/v1", api_key="none",
                              max_retries=0, timeout=300)


async def chat(api, content: str, **cache) -> dict:
    resp = await api.chat.completions.create(
        model="default", messages=[{"role": "user", "content": content}], max_tokens=4,
        temperature=0, **cache)
    return {"prompt": resp.usage.prompt_tokens,
            "cached": resp.usage.prompt_tokens_details.cached_tokens}


async def respond(api, content: str, **cache) -> dict:
    resp = await api.responses.create(model="default", input=content, max_output_tokens=4,
                                      temperature=0, store=False, **cache)
    return {"prompt": resp.usage.input_tokens,
            "cached": resp.usage.input_tokens_details.cached_tokens}


async def disk_stores(server) -> float:
    async with aiohttp.ClientSession() as http:
        async with http.get(server.http_url + "/metrics") as resp:
            body = await resp.text()
    found = re.search(r'^tokenwire_kv_tier_stores_total\{tier="disk"\} (\S+)$', body,
                      re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def settled(server) -> float:
    """The disk stores once the writer has been quiet for a moment (parks land async)."""
    last = -1.0
    while (now := await disk_stores(server)) != last:
        last = now
        await asyncio.sleep(0.5)
    return now


def block_files(kv_dir) -> set[str]:
    return {p.name for p in kv_dir.glob("*/*") if not p.name.startswith(".")}


async def test_a_deleted_response_forgets_its_own_turn_and_keeps_the_chain_before(server):
    server, kv_dir = server
    api = client(server)
    first = await api.responses.create(model="default", input=text("Skerry", 3),
                                       max_output_tokens=4, temperature=0)
    second = await api.responses.create(model="default", input=text("Stack", 3),
                                        previous_response_id=first.id, max_output_tokens=4,
                                        temperature=0)
    await settled(server)
    before = block_files(kv_dir)
    own_blocks = (second.usage.input_tokens + 4 - first.usage.input_tokens - 4) // BLOCK
    await api.responses.delete(second.id)
    for _ in range(50):
        forgotten = before - block_files(kv_dir)
        if forgotten:
            break
        await asyncio.sleep(0.1)
    assert 1 <= len(forgotten) <= own_blocks + 1, (len(forgotten), own_blocks)
    assert len(before) - len(forgotten) >= first.usage.input_tokens // BLOCK - 1  # first's


async def test_key_and_24h_blocks_outlast_the_pool_and_the_disk_bound(server):
    server, _ = server
    api = client(server)

    async def ask_all() -> dict:
        """The four requests, each with a retention or key or with neither."""
        return {"chat 24h": await chat(api, text("Ardnamurchan", 5),
                                       prompt_cache_retention="24h"),
                "chat plain": await chat(api, text("Balnakeil", 5)),
                "responses key": await respond(api, text("Cape Wrath", 5),
                                               prompt_cache_key="lighthouses"),
                "responses plain": await respond(api, text("Dunnet Head", 5))}

    asked = await ask_all()
    await settled(server)
    for i in range(3):  # each fills most of the pool; their evicted blocks fill the disk
        await chat(api, text(f"Filler Point {i}", 9))
    again = await ask_all()
    print()
    for name, fig in again.items():
        print(f"{name:16} cached {fig['cached']:4}/{fig['prompt']} (first run "
              f"{asked[name]['cached']})")
    for name in ("chat 24h", "responses key"):
        assert again[name]["cached"] >= again[name]["prompt"] - 2 * BLOCK, name
    for name in ("chat plain", "responses plain"):
        assert again[name]["cached"] <= 2 * BLOCK, name  # the system prompt's block at most


@pytest.mark.parametrize("field, value", [("prompt_cache_retention", "1h"),
                                          ("prompt_cache_retention", 24),
                                          ("prompt_cache_key", "k" * 1025),
                                          ("prompt_cache_key", ["k"])])
async def test_a_bad_value_answers_400_naming_the_field(server, field, value):
    server, _ = server
    api = client(server)
    for create in (lambda: chat(api, "Hi", extra_body={field: value}),
                   lambda: respond(api, "Hi", extra_body={field: value})):
        with pytest.raises(openai.BadRequestError) as info:
            await create()
        assert info.value.status_code == 400
        assert info.value.body["param"] == field, info.value.body
        assert info.value.body["type"] == "invalid_request_error"


async def test_websocket_mode_takes_the_fields_and_refuses_a_bad_one_by_name(server):
    server, _ = server
    async with client(server).responses.connect() as conn:
        await conn.response.create(input="Hi", max_output_tokens=2,
                                   prompt_cache_retention="1h")
        error = json.loads(await asyncio.wait_for(conn.recv_bytes(), 30))
        assert error["type"] == "error", error
        assert error["error"]["param"] == "prompt_cache_retention", error
        await conn.response.create(input="Hi", max_output_tokens=2,
                                   prompt_cache_retention="24h", prompt_cache_key="k")
        ends = ("response.completed", "response.incomplete", "error")  # 2 tokens: incomplete
        while (event := json.loads(await asyncio.wait_for(conn.recv_bytes(), 120))
               )["type"] not in ends:
            pass
        assert event["type"] == "response.incomplete", event
