"""HTTP side: the official openai client (stream and not), raw SSE, health, ready, metrics."""
from __future__ import annotations

import asyncio
import gc
import json

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ws_helpers import open_ws, recv_type, recv_until

METRICS = {  # docs/http-api.md's list: name (without prefix) -> Prometheus type
    "time_to_first_token_seconds": "histogram", "inter_token_latency_seconds": "histogram",
    "e2e_request_latency_seconds": "histogram", "request_queue_time_seconds": "histogram",
    "requests_running": "gauge", "requests_waiting": "gauge", "kv_cache_usage_ratio": "gauge",
    "gpu_utilization_ratio": "gauge", "gpu_memory_used_bytes": "gauge",
    "websocket_connections_active": "gauge", "sessions_active": "gauge",
    "prompt_tokens": "counter", "generation_tokens": "counter",
    "prefix_cache_queries": "counter", "prefix_cache_hits": "counter", "preemptions": "counter",
    "admission_rejections": "counter", "requests": "counter", "responses_previous": "counter",
}


async def test_openai_chat_non_streaming(client):
    models = await client.models.list()
    model = models.data[0].id
    assert model == "SmolLM2-135M-Instruct"
    resp = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=8,
        temperature=0)
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert resp.usage.completion_tokens <= 8
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


async def test_openai_chat_streaming_matches_non_streaming(client):
    messages = [{"role": "user", "content": "Count to five."}]
    whole = await client.chat.completions.create(model="m", messages=messages, max_tokens=10,
                                                 temperature=0)
    stream = await client.chat.completions.create(
        model="m", messages=messages, max_tokens=10, temperature=0, stream=True,
        stream_options={"include_usage": True})
    parts, finish, usage = [], None, None
    async for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            parts.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(parts) == whole.choices[0].message.content  # greedy: same text
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens


async def test_openai_completions_and_errors(client):
    resp = await client.completions.create(model="m", prompt="The capital of France is",
                                           max_tokens=4, temperature=0)
    assert resp.choices[0].text and resp.usage.prompt_tokens > 0
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model="m", messages=[{"role": "user",
                                             "content": "x"}], temperature=500)
    assert info.value.body["code"] == "invalid_request"
    assert info.value.body["param"] == "temperature"


async def test_sse_wire_format(base_url):
    body = {"prompt": "Hello", "max_tokens": 5, "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True}}
    async with aiohttp.ClientSession() as s:
        async with s.post(base_url + "/v1/completions", json=body) as r:
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("text/event-stream")
            raw = (await r.read()).decode()
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 5
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert all(c["object"] == "text_completion" for c in chunks)


async def test_health_ready_models(base_url):
    async with aiohttp.ClientSession() as s:
        async with s.get(base_url + "/health") as r:
            assert r.status == 200 and (await r.json())["engine_alive"] is True
        async with s.get(base_url + "/ready") as r:
            assert r.status == 200 and (await r.json())["ready"] is True
        async with s.get(base_url + "/") as r:
            assert r.status == 200 and "/v1/ws" in await r.text()
        async with s.post(base_url + "/v1/chat/completions", data=b"{oops") as r:
            assert r.status == 400 and (await r.json())["error"]["code"] == "invalid_json"


def test_ready_server_keeps_its_startup_heap_out_of_collections(server, base_url):
    # A full collection would walk the model's objects with the GIL held, stalling every
    # socket; once ready they sit in the collector's permanent generation instead.
    model = server.engine.core.runner.model
    assert gc.get_freeze_count() > 100_000
    assert not any(obj is model for obj in gc.get_objects())


def scrape_text(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def sample(families: dict, name: str, suffix: str = "", **labels) -> float:
    family = families["tokenwire_" + name]
    return sum(s.value for s in family.samples if s.name == family.name + suffix
               and all(s.labels.get(k) == v for k, v in labels.items()))


async def test_metrics_parse_and_move(base_url):
    async with aiohttp.ClientSession() as s:
        async def scrape() -> dict:
            async with s.get(base_url + "/metrics") as r:
                assert r.status == 200
                return scrape_text(await r.text())

        before = await scrape()
        for name, kind in METRICS.items():
            assert before["tokenwire_" + name].type == kind, name
        ws, _ = await open_ws(s, base_url)
        await ws.send_json({"type": "generate", "id": "m", "prompt": "Hello there",
                            "params": {"max_tokens": 24, "ignore_eos": True}})
        await recv_type(ws, "delta")
        during = await scrape()  # the request holds an engine slot and KV blocks
        assert sample(during, "requests_running") >= 1
        assert sample(during, "kv_cache_usage_ratio") > 0
        assert sample(during, "websocket_connections_active") >= 1
        assert sample(during, "sessions_active") >= 1
        await recv_until(ws, "m")
        await ws.close()
        after = await scrape()
    assert sample(after, "time_to_first_token_seconds", "_count") == \
        sample(before, "time_to_first_token_seconds", "_count") + 1
    assert sample(after, "inter_token_latency_seconds", "_count") >= \
        sample(before, "inter_token_latency_seconds", "_count") + 20  # coalescing margin
    assert sample(after, "request_queue_time_seconds", "_count") == \
        sample(before, "request_queue_time_seconds", "_count") + 1
    assert sample(after, "e2e_request_latency_seconds", "_count") > \
        sample(before, "e2e_request_latency_seconds", "_count")
    assert sample(after, "requests", "_total", finish_reason="length") == \
        sample(before, "requests", "_total", finish_reason="length") + 1
    assert sample(after, "generation_tokens", "_total") >= \
        sample(before, "generation_tokens", "_total") + 24
    assert sample(after, "prompt_tokens", "_total") > sample(before, "prompt_tokens", "_total")
    assert sample(after, "prefix_cache_queries", "_total") > \
        sample(before, "prefix_cache_queries", "_total")


@pytest.mark.parametrize("stream", [False, True])
async def test_client_gone_mid_completion_aborts_it(server, base_url, stream):
    body = {"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": True,
            "stream": stream}
    async with aiohttp.ClientSession() as s:
        request = asyncio.ensure_future(s.post(base_url + "/v1/completions", json=body))
        deadline = asyncio.get_running_loop().time() + 30
        while not server.engine.stats().num_running:
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.05)
        request.cancel()  # drops the connection
    # 1000 tokens take minutes on CPU: free within seconds means aborted.
    assert server.all_blocks_free(timeout=10)
