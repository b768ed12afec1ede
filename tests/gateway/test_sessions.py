"""One live session per id: sockets resuming one session at once share its history and
its one active chat turn, and no completed turn is ever lost to a stale save."""
from __future__ import annotations

import asyncio

import aiohttp
from ws_helpers import open_ws, recv_type, recv_until

from gateway.sessions.sqlite import SqliteSessionStore

ROUNDS = 20
CLIENTS = 4
# Every turn's defaults: short greedy replies that are never empty.
PARAMS = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}


async def _create_session(http: aiohttp.ClientSession, url: str) -> str:
    """A stored session (its defaults saved) that no socket holds any more."""
    ws, hello = await open_ws(http, url)
    await ws.send_json({"type": "session.update", "params": PARAMS})
    await recv_type(ws, "session.updated")
    await ws.close()
    return hello["session_id"]


async def _round(http: aiohttp.ClientSession, url: str, session_id: str,
                 round_no: int) -> list[tuple[str, str, dict]]:
    """CLIENTS sockets resume the session at once, then each sends one chat turn at once;
    returns (question, reply text, last frame) per client."""
    opened = await asyncio.gather(*(open_ws(http, url, params={"session_id": session_id})
                                    for _ in range(CLIENTS)))
    assert all(h["resumed"] and h["session_id"] == session_id for _, h in opened), opened
    sockets = [ws for ws, _ in opened]
    questions = [f"Round {round_no}, client {c}: name a fruit." for c in range(CLIENTS)]
    await asyncio.gather(*(ws.send_json({"type": "chat", "id": "turn", "content": q})
                           for ws, q in zip(sockets, questions)))
    ends = await asyncio.gather(*(recv_until(ws, "turn") for ws in sockets))
    await asyncio.gather(*(ws.close() for ws in sockets))
    results = []
    for question, (frames, last) in zip(questions, ends):
        text = "".join(f["text"] for f in frames if f["type"] == "delta" and f["id"] == "turn")
        results.append((question, text, last))
    return results


async def _history(http: aiohttp.ClientSession, url: str, session_id: str) -> list[dict]:
    ws, hello = await open_ws(http, url, params={"session_id": session_id})
    assert hello["resumed"]
    await ws.send_json({"type": "session.history"})
    messages = (await recv_type(ws, "session.history"))["messages"]
    await ws.close()
    return messages


async def _sessions_active(http: aiohttp.ClientSession, url: str) -> float:
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    return next(float(line.split()[-1]) for line in text.splitlines()
                if line.startswith("tokenwire_sessions_active "))


async def test_session_leaves_memory_once_its_last_save_lands(server, tmp_path):
    """Sockets close while their sessions' saves are under way (a mid-turn chat, a
    session.update not waited for): each session stays live until its save lands, then
    the gauge (read at scrape time) is back to 0."""
    url = server.start_app(store=SqliteSessionStore(tmp_path / "sessions.db"))
    try:
        async with aiohttp.ClientSession() as http:
            chat, _ = await open_ws(http, url)
            await chat.send_json({"type": "chat", "id": "cut", "content": "Tell me a story.",
                                  "params": {"max_tokens": 64, "ignore_eos": True}})
            await recv_type(chat, "delta")
            updates = [(await open_ws(http, url))[0] for _ in range(8)]
            for ws in updates:
                await ws.send_json({"type": "session.update", "system": "x" * 200_000})
            await asyncio.gather(chat.close(), *(ws.close() for ws in updates))
            async with asyncio.timeout(10):
                while await _sessions_active(http, url) != 0:
                    await asyncio.sleep(0.05)
    finally:
        server.stop_app(url)


async def test_sockets_resuming_one_session_at_once_lose_no_turn(server, tmp_path):
    db = tmp_path / "sessions.db"
    url = server.start_app(store=SqliteSessionStore(db))
    done_turns, busy = [], 0
    try:
        async with aiohttp.ClientSession() as http:
            session_id = await _create_session(http, url)
            for round_no in range(ROUNDS):
                results = await _round(http, url, session_id, round_no)
                dones = [(q, t) for q, t, last in results if last["type"] == "done"]
                refused = [last for _, _, last in results if last["type"] == "error"]
                # One turn runs; the ones sent while it ran are refused, never run beside it.
                assert dones and all(t for _, t in dones), results
                assert refused and all(e["code"] == "busy" for e in refused), results
                assert len(dones) + len(refused) == CLIENTS
                done_turns += dones
                busy += len(refused)
            seen = await _history(http, url, session_id)
    finally:
        server.stop_app(url)
    # Every completed turn is in the history, once, with its reply; nothing else is.
    assert [m["role"] for m in seen] == ["user", "assistant"] * len(done_turns), seen
    pairs = [(u["content"], a["content"]) for u, a in zip(seen[0::2], seen[1::2])]
    assert sorted(pairs) == sorted(done_turns)
    fresh = SqliteSessionStore(db)  # what a restarted server would resume
    stored = await fresh.load(session_id)
    await fresh.close()
    assert stored is not None and stored.messages == seen
    assert stored.params == PARAMS
    assert busy == ROUNDS * CLIENTS - len(done_turns)
