"""WebSocket mode of /v1/responses with the official openai SDK's
`client.responses.connect()`, against the shared real server. Every server event is read
raw and validated strictly as the SDK's own server-event union."""
from __future__ import annotations

import asyncio
import itertools
import re

import aiohttp
from openai import AsyncOpenAI
from openai.types.responses.responses_server_event import ResponsesServerEvent
from pydantic import TypeAdapter

SERVER_EVENT = TypeAdapter(ResponsesServerEvent)
FAST = {"model": "default", "max_output_tokens": 10, "temperature": 0}


def connect(base_url: str):
    return AsyncOpenAI(base_url=base_url + "/v1", api_key="unused").responses.connect()


async def recv(conn, timeout: float = 120.0):
    return SERVER_EVENT.validate_json(await asyncio.wait_for(conn.recv_bytes(), timeout),
                                      strict=True)


async def until_end(conn) -> list:
    """Events up to the response's last (completed, incomplete, failed) or an error."""
    events = []
    while True:
        event = await recv(conn)
        events.append(event)
        if event.type in ("response.completed", "response.incomplete", "response.failed",
                          "error"):
            return events


async def test_five_turn_chain_on_one_socket(base_url):
    previous, inputs = None, []
    async with connect(base_url) as conn:
        for turn in range(5):
            await conn.response.create(input=f"Remember the number {turn}.",
                                       previous_response_id=previous, **FAST)
            events = await until_end(conn)
            kinds = [e.type for e in events]
            assert kinds[:4] == ["response.created", "response.in_progress",
                                 "response.output_item.added", "response.content_part.added"]
            assert kinds[-1] in ("response.completed", "response.incomplete"), events[-1]
            assert [e.sequence_number for e in events] == list(range(len(events)))
            done = events[-1].response
            assert done.previous_response_id == previous
            text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            assert done.output[0].content[0].text == text
            inputs.append(done.usage.input_tokens)
            previous = done.id
    assert all(b > a for a, b in itertools.pairwise(inputs))
    # The chain goes on over HTTP (and any new socket) from the store.
    client = AsyncOpenAI(base_url=base_url + "/v1", api_key="unused")
    resp = await client.responses.create(input="And now?", previous_response_id=previous,
                                         **FAST)
    assert resp.usage.input_tokens > inputs[-1]


async def test_second_create_while_running_is_refused_unless_another_lane(base_url):
    async with connect(base_url) as conn:
        await conn.response.create(input="Count from 1 to 50.", **FAST)
        await conn.response.create(input="Say hi.", **FAST)
        events = await until_end(conn)
        while events[-1].type != "error":  # the refusal comes before the first ends
            events += await until_end(conn)
        assert events[-1].error.code == "response_in_progress"
        await until_end(conn)
        # Refused, not queued: a queued one would run now, and its events (no stream_id)
        # would fail the lanes' check below.
        # Two lanes run side by side, each event echoing its lane.
        await conn.response.create(input="Say hi.", stream_id="a", **FAST)
        await conn.response.create(input="Say bye.", stream_id="b", **FAST)
        ends = {}
        while len(ends) < 2:
            event = await recv(conn)
            assert event.type != "error", event
            assert event.stream_id in ("a", "b")
            if event.type in ("response.completed", "response.incomplete"):
                ends[event.stream_id] = event.response.id
        assert ends["a"] != ends["b"]


async def test_generate_false_warms_a_chain(base_url):
    async with connect(base_url) as conn:
        await conn.response.create(input="A long system context to warm up.",
                                   generate=False, **FAST)
        events = await until_end(conn)
        assert [e.type for e in events] == ["response.created", "response.in_progress",
                                            "response.completed"]
        warmed = events[-1].response
        assert warmed.output == []
        await conn.response.create(input="Now answer: hello?",
                                   previous_response_id=warmed.id, **FAST)
        events = await until_end(conn)
        usage = events[-1].response.usage
        assert usage.input_tokens_details.cached_tokens > 0


async def test_errors_are_events_and_the_socket_stays_open(base_url):
    async with connect(base_url) as conn:
        await conn.response.create(input="Hi.", previous_response_id="resp_missing", **FAST)
        error = await recv(conn)
        assert error.type == "error" and error.error.code == "previous_response_not_found"
        assert error.error.param == "previous_response_id"
        await conn.send({"type": "response.create", "input": "Hi.", "tools": [
            {"type": "function", "name": "f f", "parameters": {}, "strict": True}]})
        error = await recv(conn)
        assert error.error.param == "tools[0].name"
        await conn.response.create(input="Say hi.", **FAST)
        assert (await until_end(conn))[-1].type in ("response.completed",
                                                     "response.incomplete")


async def test_store_false_chains_on_its_own_socket_only(base_url):
    async with connect(base_url) as conn:
        await conn.response.create(input="My name is Ada.", store=False, **FAST)
        first = (await until_end(conn))[-1].response
        await conn.response.create(input="What is my name?", store=False,
                                   previous_response_id=first.id, **FAST)
        second = (await until_end(conn))[-1]
        assert second.type != "error", second
        assert second.response.usage.input_tokens > first.usage.input_tokens
    async with connect(base_url) as conn:  # another socket: it was never stored
        await conn.response.create(input="Hi.", previous_response_id=second.response.id,
                                   **FAST)
        assert (await recv(conn)).error.code == "previous_response_not_found"


async def previous_sources(base_url: str) -> dict[str, float]:
    """tokenwire_responses_previous_total by source, from /metrics."""
    async with aiohttp.ClientSession() as http, http.get(base_url + "/metrics") as r:
        text = await r.text()
    found = re.findall(r'^tokenwire_responses_previous_total\{source="(\w+)"\} (\S+)$', text,
                       re.M)
    return {"socket": 0.0, "store": 0.0, **{k: float(v) for k, v in found}}


async def test_a_socket_continues_from_its_last_response_without_reading_the_store(
        base_url):
    before = await previous_sources(base_url)
    async with connect(base_url) as conn:
        await conn.response.create(input="My name is Ada.", **FAST)
        first = (await until_end(conn))[-1].response
        await conn.response.create(input="What is my name?", previous_response_id=first.id,
                                   **FAST)
        second = (await until_end(conn))[-1]
        assert second.type != "error", second
        assert second.response.usage.input_tokens > first.usage.input_tokens
        kept = await previous_sources(base_url)
        assert (kept["socket"] - before["socket"], kept["store"] - before["store"]) == (1, 0)
        # An older response of the chain is not the socket's last: the store has it.
        await conn.response.create(input="Again?", previous_response_id=first.id, **FAST)
        assert (await until_end(conn))[-1].type != "error"
        read = await previous_sources(base_url)
        assert (read["socket"] - kept["socket"], read["store"] - kept["store"]) == (0, 1)


async def test_a_deleted_response_is_gone_from_its_socket_too(base_url):
    """The socket's copy of its last response never outlives the stored one: deleted
    (over HTTP, or on another replica), a chain cannot continue from it."""
    client = AsyncOpenAI(base_url=base_url + "/v1", api_key="unused")
    async with connect(base_url) as conn:
        await conn.response.create(input="My name is Ada.", **FAST)
        first = (await until_end(conn))[-1].response
        await client.responses.delete(first.id)
        await conn.response.create(input="What is my name?", previous_response_id=first.id,
                                   **FAST)
        error = (await until_end(conn))[-1]
        assert error.type == "error" and error.error.code == "previous_response_not_found"


async def test_plain_get_is_told_to_upgrade_or_post(base_url):
    async with aiohttp.ClientSession() as http, http.get(base_url + "/v1/responses") as r:
        assert r.status == 400 and "POST /v1/responses" in (await r.json())["error"]["message"]


async def test_lanes_are_bounded_per_socket(server):
    from scheduler.config import SchedulerConfig
    url = server.start_app(scheduler=SchedulerConfig(max_inflight_per_socket=2))
    async with connect(url) as conn:
        for lane in "abc":
            await conn.response.create(input="Count to 30.", stream_id=lane, **FAST)
        errors = []
        ends = 0
        while ends < 2:
            event = await recv(conn)
            if event.type == "error":
                errors.append(event)
            ends += event.type in ("response.completed", "response.incomplete")
        assert [(e.error.code, e.stream_id) for e in errors] == [("rate_limited", "c")]


async def test_sdk_reconnects_and_the_chain_goes_on(server):
    from gateway.app import close_sockets
    url = server.start_app()
    codes = []
    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused")
    manager = client.responses.connect(on_reconnecting=lambda e: codes.append(e.close_code),
                                       initial_delay=0.05)
    async with manager as conn:
        await conn.response.create(input="My name is Ada.", **FAST)
        first = (await until_end(conn))[-1].response
        events = aiter(conn)
        pending = asyncio.ensure_future(anext(events))  # sees the close, reconnects
        server.call(close_sockets(server.apps[url], 2.0))  # 1001: going away
        async with asyncio.timeout(30):
            while not codes:
                await asyncio.sleep(0.01)
        await conn.response.create(input="What is my name?", previous_response_id=first.id,
                                   **FAST)
        seen = [await pending]
        while seen[-1].type not in ("response.completed", "response.incomplete", "error"):
            seen.append(await anext(events))
    assert codes == [1001]
    assert seen[-1].type != "error", seen[-1]
    assert seen[-1].response.previous_response_id == first.id
    assert seen[-1].response.usage.input_tokens > first.usage.input_tokens
