"""A corrupt SQLite session file under a real server, over real sockets: resuming a
session answers HTTP 503 `store_unavailable`, a chat turn and a session.update answer
`store_unavailable` frames, /ready is 503 meanwhile; once a good file is put back the
server recovers by itself (/ready first, with no client call), turns work again and
nothing stored before is lost."""
from __future__ import annotations

import asyncio
import os
import sqlite3

import aiohttp
from ws_helpers import open_ws, recv_type, recv_until

from gateway.sessions.sqlite import SqliteSessionStore

RETRY_AFTER_MS = 300
UPGRADE = {"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
           "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}
PARAMS = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}


async def _turn(ws, request_id: str, content: str) -> dict:
    await ws.send_json({"type": "chat", "id": request_id, "content": content,
                        "params": PARAMS})
    return (await recv_until(ws, request_id))[1]


async def _idle_session(http, url: str) -> tuple[str, list[dict]]:
    """A stored session with one turn that no socket holds: resuming it needs the store."""
    ws, hello = await open_ws(http, url)
    assert (await _turn(ws, "t", "Name a fruit."))["type"] == "done"
    await ws.send_json({"type": "session.history"})
    messages = (await recv_type(ws, "session.history"))["messages"]
    await ws.close()
    return hello["session_id"], messages


async def _resume(http, url: str, session_id: str) -> tuple[int, dict, dict]:
    async with http.get(url + "/v1/ws", params={"session_id": session_id},
                        headers=UPGRADE) as resp:
        return resp.status, dict(resp.headers), await resp.json(content_type=None)


async def _ready(http, url: str) -> tuple[int, dict]:
    async with http.get(url + "/ready") as resp:
        return resp.status, await resp.json()


def _backup_then_corrupt(db, good) -> None:
    """Keep a good copy, checkpoint the WAL into the file (so no WAL frame can mend it),
    then write garbage over the whole file."""
    with sqlite3.connect(db) as src, sqlite3.connect(good) as dst:
        src.backup(dst)
        src.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    src.close()
    dst.close()
    db.write_bytes(os.urandom(db.stat().st_size))


async def test_corrupt_sqlite_file_answers_store_unavailable_then_recovers(server, tmp_path):
    db, good = tmp_path / "sessions.db", tmp_path / "good.db"
    url = server.start_app(store=SqliteSessionStore(db, retry_after_ms=RETRY_AFTER_MS))
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as http:
            idle_id, idle_history = await _idle_session(http, url)
            ws, hello = await open_ws(http, url)
            assert (await _turn(ws, "before", "Name a colour."))["type"] == "done"
            assert (await _ready(http, url))[0] == 200
            _backup_then_corrupt(db, good)

            status, headers, body = await _resume(http, url, idle_id)
            assert status == 503 and body["error"]["code"] == "store_unavailable", body
            assert headers["Retry-After"] == "1"
            refused = await _turn(ws, "during", "Name a tree.")
            assert refused["type"] == "error", refused
            assert (refused["code"], refused["retry_after_ms"]) == ("store_unavailable",
                                                                    RETRY_AFTER_MS)
            await ws.send_json({"type": "session.update", "system": "Be brief."})
            update = await recv_type(ws, "error")
            assert update["code"] == "store_unavailable", update
            assert await _ready(http, url) == (503, {"ready": False,
                                                     "reason": "session store unavailable"})

            os.replace(good, db)  # a good file is back: nothing calls the store but /ready
            async with asyncio.timeout(10):
                while (await _ready(http, url))[0] != 200:
                    await asyncio.sleep(0.1)
            assert (await _turn(ws, "after", "Name a bird."))["type"] == "done"
            await ws.send_json({"type": "session.history"})
            live = (await recv_type(ws, "session.history"))["messages"]
            await ws.close()
            resumed, again = await open_ws(http, url, params={"session_id": idle_id})
            assert again["resumed"]
            await resumed.send_json({"type": "session.history"})
            assert (await recv_type(resumed, "session.history"))["messages"] == idle_history
            await resumed.close()
    finally:
        server.stop_app(url)
    # The refused turn is not in the history; the turns before and after are, and stored.
    assert [m["content"] for m in live if m["role"] == "user"] == ["Name a colour.",
                                                                   "Name a bird."]
    fresh = SqliteSessionStore(db)  # what a restarted server would resume
    stored = await fresh.load(hello["session_id"])
    await fresh.close()
    assert stored.messages == live
