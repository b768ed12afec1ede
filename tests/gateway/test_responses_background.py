"""`background: true` with the official openai SDK against the shared real server: a
response runs detached, survives its client leaving, is polled to completion, its event
stream resumes from an offset, and a cancel stops it and frees its KV blocks."""
from __future__ import annotations

import asyncio

import aiohttp

LONG = {"model": "default", "input": "Count from 1 to 500, comma separated.",
        "temperature": 0, "background": True}


async def poll(client, response_id: str, timeout: float = 120.0):
    async with asyncio.timeout(timeout):
        while True:
            resp = await client.responses.retrieve(response_id)
            if resp.status not in ("queued", "in_progress"):
                return resp
            await asyncio.sleep(0.1)


async def test_polled_to_completion_and_stream_resumed_from_an_offset(client):
    resp = await client.responses.create(**{**LONG, "max_output_tokens": 24})
    assert resp.status == "in_progress" and resp.background
    done = await poll(client, resp.id)
    assert done.status == "incomplete" and done.usage.output_tokens == 24
    events = [e async for e in await client.responses.retrieve(
        resp.id, stream=True, starting_after=3)]
    assert [e.sequence_number for e in events] == list(range(4, 4 + len(events)))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.output_text == done.output_text


async def test_survives_its_client_leaving(client, base_url):
    async with aiohttp.ClientSession() as http:
        async with http.post(base_url + "/v1/responses",
                             json={**LONG, "max_output_tokens": 16, "stream": True}) as r:
            first = await r.content.readuntil(b"\n\n")
    response_id = first.split(b'"id": "')[1].split(b'"')[0].decode()
    done = await poll(client, response_id)  # the socket closed: the run went on
    assert done.status == "incomplete" and done.usage.output_tokens == 16


async def test_cancel_stops_it_and_frees_its_blocks(server, client):
    resp = await client.responses.create(**{**LONG, "max_output_tokens": 1000})
    stream = await client.responses.retrieve(resp.id, stream=True)
    async for event in stream:
        if event.type == "response.output_text.delta":
            break  # it is generating
    cancelled = await client.responses.cancel(resp.id)
    assert cancelled.status == "cancelled"
    assert (await client.responses.retrieve(resp.id)).status == "cancelled"
    assert cancelled.usage.output_tokens < 1000
    assert server.all_blocks_free()
