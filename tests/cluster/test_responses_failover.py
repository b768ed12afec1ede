"""kill -9 of the replica that holds a Responses chain, behind HAProxy: the next
`responses.create` with previous_response_id, through HAProxy, continues the chain on
another replica with its full history (0 lost turns), over HTTP and over WebSocket mode
(the openai SDK's socket sees the replica die and reconnects through HAProxy)."""
from __future__ import annotations

import asyncio
import contextlib
import itertools

import aiohttp
import pytest
from openai import AsyncOpenAI

from tests.reliability.harness import scrape

from .test_failover import _pin_new_sockets

pytestmark = pytest.mark.slow  # three replicas load the model: minutes on a 2-core box

FAST = {"model": "default", "max_output_tokens": 8, "temperature": 0}
TURNS = 3
ENDS = ("response.completed", "response.incomplete")


def _full_history(chain: list) -> bool:
    """Each turn's prompt holds the previous turn's whole prompt and its reply: a turn
    lost anywhere in the chain would make a later prompt shorter than that."""
    return all(b.usage.input_tokens > a.usage.input_tokens + a.usage.output_tokens
               for a, b in itertools.pairwise(chain))


async def _ws_turn(conn, text: str, previous: str | None):
    await conn.response.create(input=text, previous_response_id=previous, **FAST)
    async for event in conn:
        assert event.type != "error", event
        if event.type in ENDS:
            return event.response
    raise AssertionError("the socket ended without the response's end")


async def _finished(http, replica) -> float:
    return (await scrape(http, replica))["tokenwire_e2e_request_latency_seconds_count"]


async def _chains_on(cluster, victim, client, stack, reconnects: list) -> tuple:
    """TURNS turns of an HTTP chain and of a socket's chain, all run by `victim` (every
    other replica drained meanwhile); returns the chains and the open socket."""
    http_chain, ws_chain = [], []
    async with aiohttp.ClientSession() as http:
        ran_before = await _finished(http, victim)
        _pin_new_sockets(cluster.lb, cluster.name(victim), True)
        try:
            for turn in range(TURNS):
                http_chain.append(await client.responses.create(
                    input=f"HTTP fact {turn}: my number is {turn}.",
                    previous_response_id=http_chain[-1].id if http_chain else None, **FAST))
            conn = await stack.enter_async_context(client.responses.connect(
                on_reconnecting=reconnects.append, initial_delay=0.2))
            for turn in range(TURNS):
                ws_chain.append(await _ws_turn(conn, f"Socket fact {turn}: I like {turn}.",
                                               ws_chain[-1].id if ws_chain else None))
        finally:
            _pin_new_sockets(cluster.lb, cluster.name(victim), False)
        assert await _finished(http, victim) - ran_before == 2 * TURNS
    return http_chain, ws_chain, conn


async def test_kill9_chains_continue_through_haproxy(cluster):
    victim = cluster.replicas[0]
    client = AsyncOpenAI(base_url=cluster.lb.http_url + "/v1", api_key="unused",
                         max_retries=0)  # HAProxy's own retry finds a live replica
    reconnects = []
    try:
        async with contextlib.AsyncExitStack() as stack:
            http_chain, ws_chain, conn = await _chains_on(cluster, victim, client, stack,
                                                          reconnects)
            events = aiter(conn)
            pending = asyncio.ensure_future(anext(events))  # sees the socket die, reconnects
            victim.kill9()
            http_chain.append(await client.responses.create(
                input="What is my number?", previous_response_id=http_chain[-1].id, **FAST))
            async with asyncio.timeout(60):
                while not reconnects:
                    await asyncio.sleep(0.05)
            await conn.response.create(input="What do I like?",
                                       previous_response_id=ws_chain[-1].id, **FAST)
            seen = [await pending]
            while seen[-1].type not in (*ENDS, "error"):
                seen.append(await anext(events))
            assert seen[-1].type != "error", seen[-1]
            ws_chain.append(seen[-1].response)
    finally:
        if victim.proc.poll() is not None:  # leave the three replicas up
            cluster.restart(victim)
    assert reconnects[0].close_code == 1006  # the replica vanished: no close frame
    for chain in (http_chain, ws_chain):
        assert len(chain) == TURNS + 1 and chain[-1].status in ("completed", "incomplete")
        assert chain[-1].previous_response_id == chain[-2].id
        assert _full_history(chain), [c.usage for c in chain]
