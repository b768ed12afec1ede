"""Redis stopped mid-load under a real `tokenwire serve` with `--session-store redis://`.

While Redis is down, stateless `generate` keeps streaming; chat turns and session changes
answer `store_unavailable` with retry_after_ms (never a hang, never a crash); resuming a
session this replica does not hold answers 503 before the upgrade. Redis comes back on
the same port with its data, and the clients' retries go through with no restart of the
server: every turn that got `done` is in the stored history, in order, exactly once.
"""
from __future__ import annotations

import asyncio

import aiohttp
from services import RedisServer

from gateway.sessions.redis import RedisSessionStore
from gateway.sessions.store import SessionStoreConfig

from .harness import connect, history, recv, settle

CHATS = 3
TURNS = 4  # completed turns per session by the end
RETRY_AFTER_MS = 300
STORE_TIMEOUT_S = 0.5


class ChatClient:
    """A session that runs TURNS turns, retrying a turn refused with store_unavailable."""

    def __init__(self, ws, session_id: str, index: int):
        self.ws, self.session_id, self.index = ws, session_id, index
        self.sent: list[str] = []  # the user turns that got `done`, in order
        self.refusals: list[dict] = []
        self.first_done = asyncio.Event()

    async def run(self, outage: asyncio.Event) -> None:
        """Turn 0, then (once Redis has been stopped) the rest."""
        attempt = 0
        while len(self.sent) < TURNS:
            if self.sent:
                await outage.wait()
            content = f"Session {self.index}, turn {len(self.sent)}: name a fruit."
            attempt += 1
            if await self._turn(f"t{attempt}", content):
                self.sent.append(content)
                self.first_done.set()
            else:
                await asyncio.sleep(RETRY_AFTER_MS / 1000)

    async def _turn(self, request_id: str, content: str) -> bool:
        """True once the turn's `done` came. An error before any delta refused the turn; an
        error after its deltas says its reply was not saved yet, and `done` follows."""
        await self.ws.send_json({"type": "chat", "id": request_id, "content": content,
                                 "params": {"max_tokens": 6, "temperature": 0,
                                            "ignore_eos": True}})
        streamed = False
        while True:
            frame = await recv(self.ws)
            if frame.get("id") != request_id:
                continue
            if frame["type"] == "delta":
                streamed = True
            elif frame["type"] == "error":
                self.refusals.append(frame)
                if not streamed:
                    return False
            elif frame["type"] == "done":
                return frame["finish_reason"] == "length"


async def _generate_loop(ws, stop: asyncio.Event, ends: list[tuple[bool, dict]],
                         redis_down: asyncio.Event) -> None:
    i = 0
    while not stop.is_set():
        i += 1
        down = redis_down.is_set()
        await ws.send_json({"type": "generate", "id": f"g{i}", "prompt": "Hello",
                            "params": {"max_tokens": 4, "ignore_eos": True}})
        while (frame := await recv(ws)).get("id") != f"g{i}" or frame["type"] == "delta":
            pass
        ends.append((down and redis_down.is_set(), frame))


async def _resume_status(http, server, session_id: str) -> tuple[int, dict]:
    async with http.get(server.http_url + "/v1/ws", params={"session_id": session_id},
                        headers={"Connection": "Upgrade", "Upgrade": "websocket",
                                 "Sec-WebSocket-Version": "13",
                                 "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="}) as resp:
        return resp.status, await resp.json(content_type=None)


async def _idle_session(http, server) -> str:
    """A stored session that no socket holds: resuming it needs the store."""
    ws, hello = await connect(http, server)
    await ws.send_json({"type": "session.update", "system": "Be brief."})
    assert (await recv(ws))["type"] == "session.updated"
    await ws.close()
    # Released once its socket's handler ends: the chat sessions and the generate one stay.
    values = await settle(http, server, {"tokenwire_sessions_active": CHATS + 1})
    assert values["tokenwire_sessions_active"] == CHATS + 1, values
    return hello["session_id"]


async def _outage(http, server, redis, clients, gen_ends, redis_down, outage) -> dict:
    """Stop Redis once every session has a stored turn; wait for the refusals and for
    generates served meanwhile; check the socket-level answers; start Redis again."""
    await asyncio.gather(*(c.first_done.wait() for c in clients))
    idle = await _idle_session(http, server)
    redis.stop()
    redis_down.set()
    outage.set()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 120
    while not (all(c.refusals for c in clients)
               and sum(during for during, _ in gen_ends) >= 3):
        assert loop.time() < deadline, "no refusal or no generate during the outage"
        await asyncio.sleep(0.05)
    ws, _ = await connect(http, server)  # a new socket, no session to load: works
    await ws.send_json({"type": "session.update", "system": "Be brief."})
    update = await recv(ws)
    await ws.close()
    seen = {"update": update, "resume": await _resume_status(http, server, idle)}
    async with http.get(server.http_url + "/health") as resp:
        seen["health"] = resp.status
    async with http.get(server.http_url + "/ready") as resp:  # Redis is every replica's:
        seen["ready"] = resp.status  # its outage takes none out of rotation
    redis_down.clear()
    redis.start()
    return seen


async def test_redis_outage_mid_load(spawn, tmp_path, figures):
    redis = RedisServer(tmp_path / "redis", persist=True).start()
    server = spawn("--session-store", redis.url, "--session-store-timeout",
                   str(STORE_TIMEOUT_S), "--session-store-retry-after", str(RETRY_AFTER_MS),
                   name="redis-outage").start()
    stop, redis_down, outage, gen_ends = asyncio.Event(), asyncio.Event(), asyncio.Event(), []
    try:
        async with aiohttp.ClientSession() as http:
            clients = []
            for i in range(CHATS):
                ws, hello = await connect(http, server)
                clients.append(ChatClient(ws, hello["session_id"], i))
            gen_ws, _ = await connect(http, server)
            generator = asyncio.create_task(_generate_loop(gen_ws, stop, gen_ends, redis_down))
            checks = asyncio.create_task(_outage(http, server, redis, clients, gen_ends,
                                                 redis_down, outage))
            # Bounded: a session stuck after the outage fails the test instead of hanging it.
            await asyncio.wait_for(asyncio.gather(*(c.run(outage) for c in clients)), 300)
            seen = await checks
            stop.set()
            await generator
            histories = [await history(c.ws) for c in clients]
            for c in clients:
                await c.ws.close()
            await gen_ws.close()
        assert server.proc.poll() is None, server.log()  # no crash
        stored = await _stored(redis.url, clients)
    finally:
        redis.stop()
    refusals = [f for c in clients for f in c.refusals]
    during = sum(down for down, _ in gen_ends)
    kept = sum(len(r.messages) // 2 for r in stored if r is not None)
    figures(f"Redis stopped mid-load ({CHATS} sessions x {TURNS} turns, generates)",
            tried=CHATS * TURNS, survived=kept, lost=CHATS * TURNS - kept,
            notes=f"{len(refusals)} store_unavailable answers while down; {during} of "
                  f"{len(gen_ends)} generates served during the outage; no restart")
    assert {f["code"] for f in refusals} == {"store_unavailable"}, refusals
    assert all(f["retry_after_ms"] == RETRY_AFTER_MS for f in refusals)
    assert all(frame["type"] == "done" for _, frame in gen_ends), gen_ends
    assert seen["update"]["code"] == "store_unavailable", seen
    assert seen["resume"][0] == 503 and seen["resume"][1]["error"]["code"] == (
        "store_unavailable"), seen
    assert seen["health"] == 200 and seen["ready"] == 200
    for c, live, record in zip(clients, histories, stored):
        assert [m["content"] for m in live if m["role"] == "user"] == c.sent
        assert [m["role"] for m in live] == ["user", "assistant"] * TURNS
        assert record.messages == live  # the store holds every completed turn, once


async def _stored(url: str, clients: list[ChatClient]) -> list:
    store = RedisSessionStore(SessionStoreConfig(url))
    try:
        return [await store.load(c.session_id) for c in clients]
    finally:
        await store.close()
