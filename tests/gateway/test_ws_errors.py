"""Every protocol error code, auth and origin checks, size limits and the graceful drain."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest

from gateway.app import drain
from scheduler.config import SchedulerConfig
from ws_helpers import open_ws, recv_type, recv_until

LONG = {"max_tokens": 400, "ignore_eos": True}
# Still running after the round trips a test makes before cancelling it
LONGER = {"max_tokens": 4000, "ignore_eos": True}


async def error_for(ws, frame) -> dict:
    await (ws.send_str(frame) if isinstance(frame, str) else ws.send_json(frame))
    return await recv_type(ws, "error")


async def test_request_errors_name_the_problem_and_keep_the_socket(base_url):
    async with aiohttp.ClientSession() as s:
        ws, _ = await open_ws(s, base_url)
        cases = [
            ("{not json", "invalid_json", None),
            ("[1, 2]", "invalid_json", None),
            ({"type": "teleport"}, "unknown_type", "type"),
            ({"id": "x"}, "invalid_request", "type"),
            ({"type": "chat", "id": "c1"}, "invalid_request", "content"),
            ({"type": "chat", "id": "c2", "content": 5}, "invalid_request", "content"),
            ({"type": "chat", "id": "c3", "content": "hi", "params": {"top_p": 3}},
             "invalid_request", "params.top_p"),
            ({"type": "chat", "id": "c4", "content": "hi", "params": {"warp": 9}},
             "invalid_request", "params.warp"),
            ({"type": "chat", "id": "c5", "content": "hi", "params": {"max_tokens": 10**5}},
             "invalid_request", "params.max_tokens"),
            ({"type": "generate", "id": "g1"}, "invalid_request", "prompt"),
            ({"type": "generate", "id": "g2", "messages": [{"role": "wizard", "content": "x"}]},
             "invalid_request", "messages[0].role"),
            ({"type": "generate", "id": "g3", "prompt": [10**7]}, "invalid_request", "prompt"),
            ({"type": "ping", "extra": 1}, "invalid_request", "extra"),
            ({"type": "cancel", "id": "nobody"}, "not_found", "id"),
            ({"type": "session.update", "params": {"temperature": -1}}, "invalid_request",
             "params.temperature"),
        ]
        for frame, code, field in cases:
            error = await error_for(ws, frame)
            assert error["code"] == code, (frame, error)
            if field is not None:
                assert error["message"].startswith(field), (frame, error)
        # A prompt beyond the 2048-token context, as generate and as a chat turn; the
        # refused turn does not join the history.
        error = await error_for(ws, {"type": "generate", "id": "big", "prompt": "hello " * 3000})
        assert error["code"] == "too_large" and error["id"] == "big"
        error = await error_for(ws, {"type": "chat", "id": "bigchat", "content": "hi " * 3000})
        assert error["code"] == "too_large" and error["id"] == "bigchat"
        # Past the context's tokens by its characters alone: refused before encoding
        # (engine.prompt_length), as generate and as a chat turn fitted to the context.
        for frame in ({"type": "generate", "id": "huge", "prompt": "hello " * 40000},
                      {"type": "chat", "id": "hugechat", "content": "hi " * 80000}):
            error = await error_for(ws, frame)
            assert error["code"] == "too_large" and error["id"] == frame["id"], error
            assert "characters" in error["message"], error
        await ws.send_json({"type": "session.history"})
        assert (await recv_type(ws, "session.history"))["messages"] == []
        # The socket still serves.
        await ws.send_json({"type": "ping", "t": 1})
        assert (await recv_type(ws, "pong"))["t"] == 1
        await ws.close()


async def test_duplicate_id_and_busy(server):
    # In full runs the cancel used to land as the turn's render finished, where Python
    # 3.11's asyncio.wait_for dropped it and the turn ran to its end (`length`):
    # tests/scheduler/test_off_loop.py holds that race.
    url = server.start_app()
    try:
        async with aiohttp.ClientSession() as s:
            ws, _ = await open_ws(s, url)
            await ws.send_json({"type": "chat", "id": "t", "content": "Hello",
                                "params": LONGER})
            dup = await error_for(ws, {"type": "generate", "id": "t", "prompt": "x"})
            assert dup["code"] == "duplicate_id" and dup["id"] == "t"
            busy = await error_for(ws, {"type": "chat", "id": "t2", "content": "Again?"})
            assert busy["code"] == "busy" and busy["id"] == "t2"
            reset = await error_for(ws, {"type": "session.reset"})
            assert reset["code"] == "busy"
            await ws.send_json({"type": "cancel", "id": "t"})
            _, done = await recv_until(ws, "t")
            assert done["finish_reason"] == "cancelled"
            await ws.close()
    finally:
        server.stop_app(url)


async def test_rate_limited_per_socket_and_per_key(server):
    url = server.start_app(api_keys=("key-one", "key-two"), scheduler=SchedulerConfig(
        max_inflight_per_key=2, max_inflight_per_socket=1))
    one, two = ({"Authorization": f"Bearer key-{k}"} for k in ("one", "two"))
    try:
        async with aiohttp.ClientSession() as s:
            ws, hello = await open_ws(s, url, headers=one)
            assert hello["limits"]["max_inflight"] == 1
            await ws.send_json({"type": "generate", "id": "a", "prompt": "x", "params": LONG})
            await recv_type(ws, "delta")
            error = await error_for(ws, {"type": "generate", "id": "b", "prompt": "y"})
            assert error["code"] == "rate_limited" and error["id"] == "b"
            assert error["retry_after_ms"] > 0
            # The key's second request, on another socket, is its last.
            ws2, _ = await open_ws(s, url, headers=one)
            await ws2.send_json({"type": "generate", "id": "c", "prompt": "x", "params": LONG})
            await recv_type(ws2, "delta")
            async with s.post(url + "/v1/completions", headers=one,
                              json={"prompt": "x", "max_tokens": 2}) as r:
                assert r.status == 429 and int(r.headers["Retry-After"]) >= 1
                assert (await r.json())["error"]["code"] == "rate_limited"
            async with s.post(url + "/v1/completions", headers=two,
                              json={"prompt": "x", "max_tokens": 2}) as r:
                assert r.status == 200  # another key has its own allowance
            async with s.post(url + "/v1/completions", headers=two,
                              json={"prompt": "x", "priority": 10**6}) as r:
                assert r.status == 400 and (await r.json())["error"]["param"] == "priority"
            await ws.close()
            await ws2.close()
    finally:
        server.stop_app(url)
    assert server.all_blocks_free()


async def test_overloaded_ws_and_http_then_recovers(server, base_url):
    # An app whose KV-usage overload signal trips at 2% of the shared engine's 512 blocks:
    # one running request with a ~25-block prompt holds it there.
    url = server.start_app(scheduler=SchedulerConfig(kv_usage_enter=0.02, kv_usage_leave=0.01))
    try:
        async with aiohttp.ClientSession() as s:
            ws, _ = await open_ws(s, base_url)
            await ws.send_json({"type": "generate", "id": "hog", "prompt": "word " * 400,
                                "params": LONG})
            await recv_type(ws, "delta")
            probe, _ = await open_ws(s, url)
            error = await error_for(probe, {"type": "generate", "id": "p", "prompt": "y"})
            assert error["code"] == "overloaded" and error["id"] == "p"
            assert isinstance(error["retry_after_ms"], int) and error["retry_after_ms"] > 0
            async with s.get(url + "/ready") as r:
                assert r.status == 503 and (await r.json())["reason"] == "overloaded"
            async with s.post(url + "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": "hi"}]}) as r:
                assert r.status == 503 and int(r.headers["Retry-After"]) >= 1
                assert (await r.json())["error"]["code"] == "overloaded"
            async with s.get(url + "/metrics") as r:
                assert 'admission_rejections_total{reason="overloaded"} 2.0' in await r.text()
            await ws.send_json({"type": "cancel", "id": "hog"})
            await recv_until(ws, "hog")
            assert server.all_blocks_free()
            async with s.get(url + "/ready") as r:
                assert r.status == 200  # below the leave threshold: admitting again
            await probe.send_json({"type": "generate", "id": "q", "prompt": "y",
                                   "params": {"max_tokens": 2}})
            assert (await recv_until(probe, "q"))[1]["type"] == "done"
            await ws.close()
            await probe.close()
    finally:
        server.stop_app(url)
    assert server.all_blocks_free()


async def test_message_over_limit_closes_1009(server):
    url = server.start_app(max_message_bytes=1024)
    try:
        async with aiohttp.ClientSession() as s:
            ws, hello = await open_ws(s, url)
            assert hello["limits"]["max_message_bytes"] == 1024
            await ws.send_json({"type": "chat", "id": "big", "content": "x" * 2000})
            msg = await ws.receive(timeout=10)
            assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            assert ws.close_code == 1009
    finally:
        server.stop_app(url)


async def test_auth_401_before_upgrade_and_session_owner(server):
    url = server.start_app(api_keys=("key-one", "key-two"))
    try:
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await s.ws_connect(url + "/v1/ws")
            assert info.value.status == 401
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await s.ws_connect(url + "/v1/ws", headers={"Authorization": "Bearer nope"})
            assert info.value.status == 401
            one = {"Authorization": "Bearer key-one"}
            ws, hello = await open_ws(s, url, headers=one)
            await ws.send_json({"type": "session.update", "system": "Be brief."})
            await recv_type(ws, "session.updated")  # saved: the session now exists
            await ws.close()
            # Browsers: the key rides in a subprotocol; the server echoes tokenwire.v1.
            ws, again = await open_ws(s, url, protocols=("tokenwire.v1", "bearer.key-one"),
                                      params={"session_id": hello["session_id"]})
            assert ws.protocol == "tokenwire.v1" and again["resumed"] is True
            await ws.close()
            # Another key cannot take the session over: it gets a fresh one.
            ws, other = await open_ws(s, url, headers={"Authorization": "Bearer key-two"},
                                      params={"session_id": hello["session_id"]})
            assert other["resumed"] is False and other["session_id"] != hello["session_id"]
            await ws.close()
            async with s.post(url + "/v1/completions", json={"prompt": "x"}) as r:
                assert r.status == 401
                assert (await r.json())["error"]["code"] == "unauthorized"
    finally:
        server.stop_app(url)


async def test_origin_403(server):
    url = server.start_app(allowed_origins=("http://good.example",))
    try:
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.WSServerHandshakeError) as info:
                await s.ws_connect(url + "/v1/ws", origin="http://evil.example")
            assert info.value.status == 403
            ws, _ = await open_ws(s, url, origin="http://good.example")
            await ws.close()
            async with s.post(url + "/v1/completions", json={"prompt": "x"},
                              headers={"Origin": "http://evil.example"}) as r:
                assert r.status == 403 and (await r.json())["error"]["code"] == "forbidden"
    finally:
        server.stop_app(url)


async def test_drain_finishes_short_turns_cancels_long_ones_closes_1012(server):
    url = server.start_app(drain_timeout_s=1.5, reconnect_after_ms=1234)
    app = server.apps[url]
    async with aiohttp.ClientSession() as s:
        ws, _ = await open_ws(s, url)
        await ws.send_json({"type": "generate", "id": "short", "prompt": "Hi",
                            "params": {"max_tokens": 3, "ignore_eos": True}})
        await ws.send_json({"type": "generate", "id": "long", "prompt": "Hi", "params": LONG})
        await recv_type(ws, "delta")
        draining = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(drain(app), server.loop))
        notice = await recv_type(ws, "draining")
        assert notice["reconnect_after_ms"] == 1234
        async with s.get(url + "/ready") as r:
            assert r.status == 503 and (await r.json())["reason"] == "draining"
        await ws.send_json({"type": "generate", "id": "late", "prompt": "x"})
        done = {}
        while not {"short", "long", "late"} <= done.keys():
            frame = await ws.receive_json(timeout=30)
            if frame["type"] in ("done", "error") and "id" in frame:
                done[frame["id"]] = frame
        assert done["late"]["code"] == "draining"
        assert done["short"]["finish_reason"] == "length"
        assert done["long"]["finish_reason"] == "cancelled"
        msg = await ws.receive(timeout=10)
        assert msg.type == aiohttp.WSMsgType.CLOSE and ws.close_code == 1012
        await draining
    server.stop_app(url)
    assert server.all_blocks_free()
    assert done["long"]["error"] == "server draining"
