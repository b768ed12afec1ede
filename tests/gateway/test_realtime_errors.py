"""/v1/realtime errors and limits: every client-caused error is an `error` event with the
client's event_id; overload, rate limits, too_large and draining are `error` events with
their codes (and a failed response.done, so nothing waits for ever); auth as OpenAI's."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest
import websockets
from realtime_helpers import connect, parse, recv, say
from ws_helpers import open_ws, recv_type, recv_until as ws_recv_until

from gateway.app import drain
from gateway.sessions.store import MemorySessionStore
from scheduler.config import SchedulerConfig

LONG_WS = {"max_tokens": 2000, "ignore_eos": True}
COUNT = "Count from 1 to 300, comma separated."


async def open_rt(http: aiohttp.ClientSession, url: str, **kwargs):
    ws = await http.ws_connect(url.replace("http", "ws") + "/v1/realtime?model=default",
                               **kwargs)
    created = await next_event(ws)
    assert created.type == "session.created"
    return ws, created


async def next_event(ws, timeout: float = 120.0):
    msg = await ws.receive(timeout=timeout)
    assert msg.type == aiohttp.WSMsgType.TEXT, msg
    return parse(msg.data)


async def until(ws, kind: str, timeout: float = 120.0) -> tuple[list, object]:
    seen = []
    async with asyncio.timeout(timeout):
        while True:
            seen.append(await next_event(ws))
            if seen[-1].type == kind:
                return seen, seen[-1]


async def user(ws, text: str) -> None:
    await ws.send_json({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    await until(ws, "conversation.item.done")


@pytest.mark.parametrize("frame, code, param", [
    ("not json", "invalid_json", None),
    ({"type": "bogus.event", "event_id": "e1"}, "unknown_event", "type"),
    ({"type": "response.create", "event_id": "e1", "response": {"max_output_tokens": "x"}},
     "invalid_request", "response.max_output_tokens"),
    ({"type": "response.create", "event_id": "e1", "response": {"max_output_tokens": 10**6}},
     "invalid_request", "max_output_tokens"),
    ({"type": "session.update", "event_id": "e1", "session": {"type": "realtime",
                                                             "audio": {}}},
     "unsupported", "session.audio"),
    ({"type": "session.update", "event_id": "e1", "session": {
        "type": "realtime", "output_modalities": ["audio"]}},
     "unsupported", "session.output_modalities"),
    ({"type": "conversation.item.create", "event_id": "e1", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_audio"}]}},
     "unsupported", "item.content[0].type"),
    ({"type": "conversation.item.delete", "event_id": "e1", "item_id": "nope"},
     "item_not_found", "item_id"),
    ({"type": "response.cancel", "event_id": "e1"}, "response_cancel_not_active", None),
    ({"type": "input_audio_buffer.commit", "event_id": "e1"}, "unsupported", "type"),
])
async def test_client_errors_carry_the_event_id(base_url, frame, code, param):
    async with aiohttp.ClientSession() as http:
        ws, _ = await open_rt(http, base_url)
        await ws.send_str(frame if isinstance(frame, str) else json.dumps(frame))
        error = await next_event(ws)
        assert error.type == "error" and error.error.code == code
        assert error.error.event_id == (None if isinstance(frame, str) else "e1")
        if param is not None:
            assert error.error.param == param
        await ws.send_json({"type": "conversation.item.retrieve", "item_id": "x",
                            "event_id": "e2"})
        assert (await next_event(ws)).error.event_id == "e2"  # the socket goes on
        await ws.close()


async def test_second_in_band_response_is_refused_while_one_runs(base_url):
    async with aiohttp.ClientSession() as http:
        ws, _ = await open_rt(http, base_url)
        await user(ws, COUNT)
        await ws.send_json({"type": "response.create", "response": {
            "max_output_tokens": 1000, "temperature": 0}})
        await until(ws, "response.output_text.delta")
        await ws.send_json({"type": "response.create", "event_id": "e_busy"})
        _, error = await until(ws, "error")
        assert error.error.code == "conversation_already_has_active_response"
        assert error.error.event_id == "e_busy"
        await ws.send_json({"type": "response.cancel"})
        _, done = await until(ws, "response.done")
        assert done.response.status == "cancelled"
        await ws.close()


async def test_prompt_beyond_the_context_is_too_large_then_a_failed_response(server, base_url):
    async with aiohttp.ClientSession() as http:
        ws, _ = await open_rt(http, base_url)
        await user(ws, "word " * 3000)
        await ws.send_json({"type": "response.create", "event_id": "e_big"})
        events, done = await until(ws, "response.done")
        errors = [e for e in events if e.type == "error"]
        assert [e.error.code for e in errors] == ["too_large"]
        assert errors[0].error.event_id == "e_big"
        assert done.response.status == "failed"
        assert done.response.status_details.error.code == "too_large"
        await ws.close()
    assert server.all_blocks_free()


async def test_item_and_session_byte_limits(server):
    url = server.start_app(max_conversation_items=2,
                           store=MemorySessionStore(max_bytes_per_session=2000))
    try:
        async with aiohttp.ClientSession() as http:
            ws, _ = await open_rt(http, url)
            await user(ws, "one")
            await user(ws, "two")
            await ws.send_json({"type": "conversation.item.create", "event_id": "e_3", "item": {
                "type": "message", "role": "user", "content": [{"type": "input_text",
                                                                "text": "three"}]}})
            error = await next_event(ws)
            assert (error.error.code, error.error.event_id) == ("too_large", "e_3")
            await ws.send_json({"type": "session.update", "event_id": "e_big", "session": {
                "type": "realtime", "instructions": "x" * 3000}})
            events, error = await until(ws, "error")
            assert (error.error.code, error.error.event_id) == ("too_large", "e_big")
            await ws.close()
    finally:
        server.stop_app(url)


async def test_overloaded_and_rate_limited_are_errors_and_failed_responses(server, base_url):
    # KV-usage overload trips at 2% of the shared engine's blocks: one long prompt holds it.
    url = server.start_app(scheduler=SchedulerConfig(kv_usage_enter=0.02, kv_usage_leave=0.01,
                                                     max_inflight_per_socket=1))
    try:
        async with aiohttp.ClientSession() as http:
            hog, _ = await open_ws(http, base_url)
            await hog.send_json({"type": "generate", "id": "hog", "prompt": "word " * 400,
                                 "params": LONG_WS})
            await recv_type(hog, "delta")
            ws, _ = await open_rt(http, url)
            await user(ws, "Hi")
            await ws.send_json({"type": "response.create", "event_id": "e_over"})
            events, done = await until(ws, "response.done")
            error = next(e for e in events if e.type == "error").error
            assert (error.code, error.event_id) == ("overloaded", "e_over")
            assert error.model_extra["retry_after_ms"] > 0
            assert done.response.status == "failed"
            assert done.response.status_details.error.code == "overloaded"
            await hog.send_json({"type": "cancel", "id": "hog"})
            await ws_recv_until(hog, "hog")
            assert server.all_blocks_free()
            # One response at a time on this socket: an out-of-band one beside it is refused.
            await user(ws, COUNT)
            await ws.send_json({"type": "response.create", "response": {
                "max_output_tokens": 1000, "temperature": 0}})
            await until(ws, "response.output_text.delta")
            await ws.send_json({"type": "response.create", "event_id": "e_rate",
                                "response": {"conversation": "none"}})
            _, error = await until(ws, "error")
            assert (error.error.code, error.error.event_id) == ("rate_limited", "e_rate")
            await ws.send_json({"type": "response.cancel"})
            await hog.close()
            await ws.close()
    finally:
        server.stop_app(url)
    assert server.all_blocks_free()


async def test_drain_is_an_error_event_then_close_1012(server):
    url = server.start_app(drain_timeout_s=1.0, reconnect_after_ms=1234)
    async with aiohttp.ClientSession() as http:
        ws, _ = await open_rt(http, url)
        await user(ws, COUNT)
        await ws.send_json({"type": "response.create", "response": {
            "max_output_tokens": 1000, "temperature": 0}})
        await until(ws, "response.output_text.delta")
        draining = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(
            drain(server.apps[url]), server.loop))
        _, notice = await until(ws, "error")
        assert notice.error.code == "draining" and "1234 ms" in notice.error.message
        await ws.send_json({"type": "response.create", "event_id": "e_late",
                            "response": {"conversation": "none"}})
        events, done = await until(ws, "response.done")
        late = [e.error for e in events if e.type == "error"]
        assert [(e.code, e.event_id) for e in late] == [("draining", "e_late")]
        assert done.response.status == "cancelled"
        msg = await ws.receive(timeout=10)
        assert msg.type == aiohttp.WSMsgType.CLOSE and ws.close_code == 1012
        await draining
    server.stop_app(url)
    assert server.all_blocks_free()


async def test_auth_bearer_and_browser_subprotocols(server):
    url = server.start_app(api_keys=("key-one",))
    try:
        async with connect(url, api_key="key-one") as conn:
            assert (await recv(conn)).type == "session.created"
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with connect(url, api_key="wrong"):
                pass
        assert refused.value.response.status_code == 401
        async with aiohttp.ClientSession() as http:
            ws, _ = await open_rt(http, url, protocols=("realtime",
                                                        "openai-insecure-api-key.key-one"))
            assert ws.protocol == "realtime"  # echoed; the key never is
            await ws.close()
            with pytest.raises(aiohttp.WSServerHandshakeError) as bad:
                await open_rt(http, url, protocols=("realtime", "openai-insecure-api-key.x"))
            assert bad.value.status == 401
    finally:
        server.stop_app(url)


async def test_session_id_resumes_the_conversation_shared_with_v1_ws(base_url):
    async with connect(base_url) as conn:
        session_id = (await recv(conn)).session.id
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 4})
        await recv(conn)
        _, first = await say(conn, "My name is Ada.")
    async with connect(base_url, extra_query={"session_id": session_id}) as conn:
        assert (await recv(conn)).session.id == session_id
        _, second = await say(conn, "What is my name?")
        assert second.response.usage.input_tokens > first.response.usage.input_tokens + 4
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(f"{base_url}/v1/ws?session_id={session_id}")
        hello = await ws.receive_json()
        assert hello["resumed"] is True
        await ws.send_json({"type": "session.history"})
        history = await recv_type(ws, "session.history")
        assert [m["role"] for m in history["messages"]] == ["user", "assistant"] * 2
        assert history["messages"][0]["content"] == "My name is Ada."
        await ws.close()
