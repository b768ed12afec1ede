"""A drain (SIGTERM) cuts long responses on every Responses transport with a proper end:
an SSE stream ends with response.failed (status cancelled) and is stored so; a socket
gets `draining` and its response ends the same way; a background run is stored
cancelled. Every KV block is free afterwards."""
from __future__ import annotations

import asyncio

from openai import AsyncOpenAI
from test_responses_ws import recv

from gateway.app import drain
from gateway.runtime import RUNTIME

LONG = {"model": "default", "input": "Count from 1 to 500, comma separated.",
        "temperature": 0, "max_output_tokens": 1500}


async def test_drain_ends_sse_socket_and_background_responses(server):
    url = server.start_app(drain_timeout_s=0.5)
    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    background = await client.responses.create(**LONG, background=True)
    sse = await client.responses.create(**LONG, stream=True)
    async for event in sse:
        if event.type == "response.output_text.delta":
            break
    async with client.responses.connect() as conn:
        await conn.response.create(**{k: v for k, v in LONG.items() if k != "model"})
        while (await recv(conn)).type != "response.output_text.delta":
            pass
        draining = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
            drain(server.apps[url]), server.loop))
        socket_events = []
        while not socket_events or socket_events[-1].type not in ("response.failed",
                                                                   "response.completed"):
            socket_events.append(await recv(conn))
        sse_events = [event async for event in sse]
        await draining
    notice = [e for e in socket_events if e.type == "error"]
    assert notice and notice[0].error.code == "draining"
    assert socket_events[-1].response.status == "cancelled"
    assert sse_events[-1].type == "response.failed"
    assert sse_events[-1].response.status == "cancelled"
    for response_id in (sse_events[-1].response.id, socket_events[-1].response.id,
                        background.id):
        stored = server.call(server.apps[url][RUNTIME].sessions.store.load(response_id))
        assert stored.response["object"]["status"] == "cancelled", response_id
    assert server.all_blocks_free()
