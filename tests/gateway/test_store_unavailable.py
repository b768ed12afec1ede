"""A chat turn whose reply streamed while Redis went down: `store_unavailable`, then `done`;
the reply stays in the live session and the next save that reaches Redis stores it."""
from __future__ import annotations

import aiohttp
from services import RedisServer
from ws_helpers import open_ws, recv_type, recv_until

from gateway.sessions.redis import RedisSessionStore
from gateway.sessions.store import SessionStoreConfig


async def test_reply_saved_by_the_next_save_after_an_outage(server, tmp_path):
    redis = RedisServer(tmp_path / "redis", persist=True).start()
    config = SessionStoreConfig(redis.url, timeout_s=0.5, retry_after_ms=200)
    url = server.start_app(store=RedisSessionStore(config))
    try:
        async with aiohttp.ClientSession() as s:
            ws, hello = await open_ws(s, url)
            await ws.send_json({"type": "chat", "id": "long", "content": "Tell me a story.",
                                "params": {"max_tokens": 96, "ignore_eos": True}})
            await recv_type(ws, "delta")  # its user turn is stored; the reply streams
            redis.stop()
            frames, end = await recv_until(ws, "long")
            error = [f for f in frames if f["type"] == "error"]
            if end["type"] == "error":  # the error came first: `done` follows it
                _, end = await recv_until(ws, "long")
            redis.start()
            await ws.send_json({"type": "chat", "id": "next", "content": "And then?",
                                "params": {"max_tokens": 4}})
            _, after = await recv_until(ws, "next")
            await ws.send_json({"type": "session.history"})
            live = (await recv_type(ws, "session.history"))["messages"]
            await ws.close()
        store = RedisSessionStore(SessionStoreConfig(redis.url))
        stored = await store.load(hello["session_id"])
        await store.close()
    finally:
        server.stop_app(url)
        redis.stop()
    assert [(f["code"], f["retry_after_ms"]) for f in error] == [("store_unavailable", 200)]
    assert end["type"] == "done" and end["finish_reason"] == "length", end
    assert after["type"] == "done", after
    assert [m["content"] for m in live if m["role"] == "user"] == ["Tell me a story.",
                                                                   "And then?"]
    assert stored.messages == live and len(live) == 4
