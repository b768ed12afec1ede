"""The drain at its deadline: WebSocket and SSE streams alike end with a terminal event,
a socket that does not read is closed instead of failing the drain, and the drain ends
within drain_timeout_s + drain_grace_s whatever the clients do."""
from __future__ import annotations

import asyncio
import json

import aiohttp

from gateway.app import drain
from sched_clients import RawWsClient, WsClient
from scheduler.config import SchedulerConfig
from test_slow_consumer import _constrain

DRAIN_TIMEOUT_S, DRAIN_GRACE_S = 1.0, 1.0
MAX_TOKENS = 900


def _start_drain(server, app) -> asyncio.Future:
    """Run the drain on the server's loop; its result is the seconds it took there."""
    async def timed() -> float:
        loop = asyncio.get_running_loop()
        start = loop.time()
        await drain(app)
        return loop.time() - start

    return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(timed(), server.loop))


async def _first_token(result) -> None:
    """Wait until the stream has produced a token: a drain that starts before the server has
    read the generate frame refuses it (`draining`) instead of cancelling it."""
    while not result.tokens:
        assert not result.done.is_set(), (result.error, result.message)
        await asyncio.sleep(0.01)


async def _sse_events(resp: aiohttp.ClientResponse) -> list[bytes]:
    return [line.strip() async for line in resp.content if line.strip()]


async def test_drain_ends_sse_and_ws_streams_at_the_deadline(server):
    url, app = server.start_app(SchedulerConfig(), drain_timeout_s=DRAIN_TIMEOUT_S,
                                drain_grace_s=DRAIN_GRACE_S)
    rt = server.runtime(app)
    body = {"prompt": "Once upon a time", "stream": True, "max_tokens": MAX_TOKENS,
            "ignore_eos": True}
    async with aiohttp.ClientSession() as http, WsClient(http, url) as ws:
        await asyncio.wait_for(_first_token(await ws.generate("w", "Once upon a time",
                                                              MAX_TOKENS)), 30)
        async with http.post(url + "/v1/completions", json=body) as resp:
            assert resp.status == 200
            await resp.content.readline()  # the first chunk: the stream is running
            drained = _start_drain(server, app)
            events = await asyncio.wait_for(_sse_events(resp), 30)
        took = await asyncio.wait_for(drained, 30)
        await asyncio.wait_for(ws.results["w"].done.wait(), 10)
    assert events[-1] == b"data: [DONE]"
    last = json.loads(events[-2].removeprefix(b"data: "))
    assert last.get("error", {}).get("code") == "draining", last
    assert ws.results["w"].finish_reason == "cancelled"
    assert not rt.http_streams and not rt.connections
    assert took < DRAIN_TIMEOUT_S + DRAIN_GRACE_S


async def test_full_outbox_closes_that_socket_and_the_drain_goes_on(server):
    """One socket stopped reading with its outbox full, one never answers the close
    handshake: the drain closes the first, drops the second at the bound, and still ends
    the healthy socket's stream with `done`."""
    url, app = server.start_app(SchedulerConfig(), drain_timeout_s=DRAIN_TIMEOUT_S,
                                drain_grace_s=DRAIN_GRACE_S, max_pending_frames=2,
                                send_timeout_s=60.0, heartbeat_s=60.0)
    rt = server.runtime(app)
    stalled, silent = RawWsClient(), RawWsClient()
    await stalled.connect(url)
    await silent.connect(url)
    conn = next(c for c in list(rt.connections) if c.session.id == stalled.session_id)
    server.call(_constrain(conn))
    # Pongs the client never reads fill its socket buffers, then block the writer, then
    # fill the outbox: how many that takes depends on the kernel's buffer sizes. A ping is
    # sent only once the last one has been answered into the outbox, so none overflows it.
    for _ in range(300):
        if len(conn.outbox._entries) >= 2:  # noqa: SLF001 - full
            break
        await stalled.send({"type": "ping", "t": "x" * 60_000})
        await asyncio.sleep(0.1)
    assert len(conn.outbox._entries) == 2  # noqa: SLF001
    async with aiohttp.ClientSession() as http, WsClient(http, url) as healthy:
        await asyncio.wait_for(_first_token(await healthy.generate("h", "Once upon a time",
                                                                   MAX_TOKENS)), 30)
        took = await asyncio.wait_for(_start_drain(server, app), 30)
        await asyncio.wait_for(healthy.results["h"].done.wait(), 10)
    assert healthy.results["h"].finish_reason == "cancelled"
    assert not rt.connections
    assert took < DRAIN_TIMEOUT_S + DRAIN_GRACE_S
