"""Honest finish reasons: a request the server cancelled or that failed is never reported
as `stop`. SSE ends with an OpenAI error event and `[DONE]`; a whole response is a 503
(cancelled) or 500 (failed) in OpenAI's error shape; a WebSocket `done` says `cancelled`
or `error`."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from gateway.runtime import RUNTIME
from ws_helpers import open_ws, recv_type, recv_until, tiny_engine

LONG = {"max_tokens": 400, "ignore_eos": True, "temperature": 0}
CHAT = {"messages": [{"role": "user", "content": "Hi"}]}


async def _sse_events(resp) -> list:
    raw = (await resp.read()).decode()
    events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e]
    return [e if e == "[DONE]" else json.loads(e) for e in events]


def _assert_ends_with_error(events: list, code: str) -> None:
    assert events[-1] == "[DONE]", events[-3:]
    assert events[-2]["error"]["code"] == code, events[-3:]
    assert events[-2]["error"]["type"] == "server_error", events[-3:]
    finishes = [c["finish_reason"] for e in events[:-2] for c in e["choices"]]
    assert not any(finishes), events[-4:]  # no `stop` (nor any finish) before the error


async def _abort_when_running(server, url: str) -> None:
    """Abort the app's running HTTP completion from the server side, as a drain would."""
    rt = server.apps[url][RUNTIME]
    while not rt.http_streams or not any(s.completion_tokens for s in rt.http_streams):
        await asyncio.sleep(0.01)
    for stream in list(rt.http_streams):
        server.loop.call_soon_threadsafe(server.engine.abort, stream.engine_id)


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_cancelled_sse_stream_ends_with_an_error_event(server, base_url, path):
    body = {**(CHAT if "chat" in path else {"prompt": "Hi"}), **LONG, "stream": True,
            "stream_options": {"include_usage": True}}
    async with aiohttp.ClientSession() as s:
        async with s.post(base_url + path, json=body) as r:
            await _abort_when_running(server, base_url)
            events = await _sse_events(r)
    _assert_ends_with_error(events, "cancelled")


async def test_cancelled_whole_response_is_503(server, base_url):
    async with aiohttp.ClientSession() as s:
        post = asyncio.ensure_future(s.post(base_url + "/v1/completions",
                                            json={"prompt": "Hi", **LONG}))
        await _abort_when_running(server, base_url)
        async with await post as r:
            assert r.status == 503, await r.text()
            assert (await r.json())["error"]["code"] == "cancelled"


async def test_ws_done_says_cancelled_when_the_server_aborts(server, base_url):
    async with aiohttp.ClientSession() as s:
        ws, _ = await open_ws(s, base_url)
        await ws.send_json({"type": "generate", "id": "g", "prompt": "Hi", "params": LONG})
        await recv_type(ws, "delta")
        conn = next(iter(server.apps[base_url][RUNTIME].connections))
        server.loop.call_soon_threadsafe(server.engine.abort, conn.streams["g"].engine_id)
        _, done = await recv_until(ws, "g")
        assert done["type"] == "done" and done["finish_reason"] == "cancelled", done
        await ws.close()


async def test_failed_streams_end_with_error_on_every_surface(server):
    """The engine stops under a running SSE stream and a running WS request."""
    engine = server.call(tiny_engine(max_model_len=512))
    url = server.start_app(engine=engine)
    try:
        async with aiohttp.ClientSession() as s:
            ws, _ = await open_ws(s, url)
            await ws.send_json({"type": "generate", "id": "g", "prompt": "Hi", "params": LONG})
            await recv_type(ws, "delta")
            async with s.post(url + "/v1/completions",
                              json={"prompt": "Hi", **LONG, "stream": True}) as r:
                await r.content.readuntil(b"\n\n")  # the first chunk is out
                server.call(engine.stop())
                events = await _sse_events(r)
            _assert_ends_with_error(events, "internal")
            _, done = await recv_until(ws, "g")
            assert done["finish_reason"] == "error" and done["error"] == "internal error", done
            await ws.close()
    finally:
        server.stop_app(url)
