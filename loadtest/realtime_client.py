"""Client side of `/v1/realtime` (OpenAI Realtime API, text) for `tokenwire loadtest`.

A stateless prompt is an out-of-band response (`conversation: "none"`, the prompt as its
`input`), so it reaches the model as /v1/ws `generate` with `messages` does; a session
turn is a user item plus an in-band response. One response at a time per socket (a
SocketPool of idle sockets, as WsBackend keeps). Deltas carry no token count: each counts
one, and the total comes from response.done's usage.
"""
from __future__ import annotations

import itertools
import json
import time

import aiohttp

from loadtest.datasets import Prompt
from loadtest.records import RequestRecord
from loadtest.socket_pool import SocketPool

# response.done status -> the finish_reason the metrics use
_FINISH = {"completed": "stop", "incomplete": "length", "cancelled": "cancelled",
           "failed": "error"}


class RtConnection:
    """One /v1/realtime socket; `respond()` sends events and folds one response into a record."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, session: dict):
        self.ws, self.session = ws, session
        self._ids = itertools.count()

    @classmethod
    async def open(cls, http: aiohttp.ClientSession, url: str,
                   timeout_s: float) -> "RtConnection":
        ws = await http.ws_connect(url, timeout=aiohttp.ClientWSTimeout(
            ws_receive=None, ws_close=5.0), max_msg_size=0, autoping=True)
        created = json.loads((await ws.receive(timeout=timeout_s)).data or "{}")
        if created.get("type") != "session.created":
            await ws.close()
            raise ConnectionError(f"expected session.created, got {created!r}")
        return cls(ws, created["session"])

    async def respond(self, events: list[dict], record: RequestRecord) -> None:
        """Send `events` (the last a response.create) and read up to its response.done, or
        the error that refused the response.create before any response began."""
        ids = [f"c{next(self._ids)}" for _ in events]
        record.start = time.perf_counter()
        for event, event_id in zip(events, ids):
            await self.ws.send_str(json.dumps({**event, "event_id": event_id}))
        started = False
        async for raw in self.ws:
            now = time.perf_counter()
            if raw.type != aiohttp.WSMsgType.TEXT:
                continue
            event = json.loads(raw.data)
            started = started or event["type"] == "response.created"
            if _apply(event, now, record) or (event["type"] == "error" and not started
                                               and event["error"].get("event_id") == ids[-1]):
                return
        record.fail("disconnected", "socket closed")

    async def close(self) -> None:
        await self.ws.close()


def _apply(event: dict, now: float, record: RequestRecord) -> bool:
    """Fold one server event into the record; True at response.done."""
    kind = event["type"]
    if kind == "response.output_text.delta":
        record.add_chunk(now, event["delta"], 1)
    elif kind == "error" and event["error"].get("event_id") is not None:
        error = event["error"]  # one of ours (a notice like `draining` has no event_id)
        record.fail(error.get("code") or "error", error.get("message", ""))
    elif kind == "response.done":
        response = event["response"]
        usage = response.get("usage") or {}
        record.usage_prompt_tokens = usage.get("input_tokens")
        record.usage_completion_tokens = usage.get("output_tokens")
        record.usage_cached_tokens = (usage.get("input_token_details") or {}).get(
            "cached_tokens")
        refused = record.error_code is not None
        record.finish(now, _FINISH.get(response.get("status"), "error"))
        if refused or not record.success:
            record.success = False
            record.error_code = record.error_code or record.finish_reason
        return True
    return False


class RealtimeBackend:
    """The Realtime API over a pool of sockets (the chat template always applies)."""

    def __init__(self, url: str, temperature: float, connect_timeout_s: float = 30.0):
        self.url, self.temperature, self.connect_timeout_s = url, temperature, connect_timeout_s
        self.pool = SocketPool(self._open)
        self.model: str | None = None

    async def _open(self, http: aiohttp.ClientSession) -> RtConnection:
        return await RtConnection.open(http, self.url, self.connect_timeout_s)

    async def start(self) -> None:
        self.model = (await self.pool.start()).session.get("model")

    async def complete(self, prompt: Prompt, record: RequestRecord) -> None:
        conn = await self.pool.take(record)
        if conn is None:
            return
        response = {**response_config(prompt, self.temperature), "conversation": "none",
                    "input": [user_message(prompt.text)]}
        await conn.respond([{"type": "response.create", "response": response}], record)
        self.pool.put_back(conn, record)

    async def open_session(self) -> "RealtimeSession":
        return RealtimeSession(self, await self.pool.connect())

    async def close(self) -> None:
        await self.pool.close()


class RealtimeSession:
    """A multi-turn conversation on its own socket: a user item, then an in-band response."""

    def __init__(self, backend: RealtimeBackend, conn: RtConnection):
        self.backend, self.conn = backend, conn

    async def turn(self, prompt: Prompt, record: RequestRecord) -> None:
        await self.conn.respond([
            {"type": "conversation.item.create", "item": user_message(prompt.text)},
            {"type": "response.create",
             "response": response_config(prompt, self.backend.temperature)}], record)

    async def close(self) -> None:
        await self.backend.pool.forget(self.conn)


def user_message(text: str) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text",
                                                            "text": text}]}


def response_config(prompt: Prompt, temperature: float) -> dict:
    return {"max_output_tokens": prompt.output_len, "temperature": temperature}
