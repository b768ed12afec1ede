"""Client side of WebSocket protocol v1 (docs/protocol.md): `generate` and session `chat` turns.

One reader task per socket stamps every frame on arrival and routes it by `id` to the
waiting request, so a request's timings never wait on another request's handling.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import time

import aiohttp
import msgpack

from loadtest.records import RequestRecord

MSGPACK_PROTOCOL = "tokenwire.msgpack"


class ConnectFailed(Exception):
    """A socket could not be opened; `code` is a protocol error code (overloaded, ...)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code


class WsConnection:
    """One protocol v1 socket; `request()` sends a message and streams its reply into a record."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, hello: dict, use_msgpack: bool):
        self.ws = ws
        self.hello = hello
        self.use_msgpack = use_msgpack
        self.draining: dict | None = None  # the server's `draining` frame, once sent
        self.closed = False  # the socket is gone: nothing more will arrive
        self._waiting: dict[str, asyncio.Queue] = {}
        self._ids = itertools.count()
        self._reader = asyncio.create_task(self._read_loop())

    @classmethod
    async def open(cls, http: aiohttp.ClientSession, url: str, use_msgpack: bool,
                   timeout_s: float, session_id: str | None = None) -> "WsConnection":
        protocols = (MSGPACK_PROTOCOL,) if use_msgpack else ()
        params = {"session_id": session_id} if session_id else None
        timeout = aiohttp.ClientWSTimeout(ws_receive=None, ws_close=5.0)
        ws = await http.ws_connect(url, protocols=protocols, params=params, timeout=timeout,
                                   max_msg_size=0, autoping=True)
        if use_msgpack and ws.protocol != MSGPACK_PROTOCOL:
            await ws.close()
            raise ConnectionError("server did not accept the tokenwire.msgpack subprotocol")
        hello = _decode(await asyncio.wait_for(ws.receive(), timeout_s))
        if hello is None or hello.get("type") != "hello":
            await ws.close()
            raise ConnectionError(f"expected a hello frame, got {hello!r}")
        return cls(ws, hello, use_msgpack)

    async def request(self, message: dict, record: RequestRecord) -> None:
        """Send `message` (its `id` is set here) and fill `record` until done or error."""
        request_id = f"r{next(self._ids)}"
        queue: asyncio.Queue = asyncio.Queue()
        self._waiting[request_id] = queue
        try:
            record.start = time.perf_counter()
            await self._send({**message, "id": request_id})
            while True:
                now, frame = await queue.get()
                if _apply(frame, now, record):
                    return
        finally:
            self._waiting.pop(request_id, None)

    async def cancel_all(self) -> None:
        for request_id in list(self._waiting):
            await self._send({"type": "cancel", "id": request_id})

    async def close(self) -> None:
        self.closed = True
        await self.ws.close()
        self._reader.cancel()

    async def _send(self, message: dict) -> None:
        if self.use_msgpack:
            await self.ws.send_bytes(msgpack.packb(message))
        else:
            await self.ws.send_str(json.dumps(message))

    async def _read_loop(self) -> None:
        try:
            async for raw in self.ws:
                now = time.perf_counter()
                frame = _decode(raw)
                if frame is None:
                    continue
                queue = self._waiting.get(frame.get("id"))
                if queue is not None:
                    queue.put_nowait((now, frame))
                elif frame.get("type") == "draining":
                    self.draining = frame
                elif frame.get("type") == "error":
                    self._broadcast(now, frame)  # an error without id: every request failed
        finally:
            self.closed = True
            self._broadcast(time.perf_counter(), {"type": "error", "code": "disconnected",
                                                  "message": "socket closed"})

    def _broadcast(self, now: float, frame: dict) -> None:
        for queue in self._waiting.values():
            queue.put_nowait((now, frame))


def _decode(raw: aiohttp.WSMessage) -> dict | None:
    if raw.type == aiohttp.WSMsgType.TEXT:
        return json.loads(raw.data)
    if raw.type == aiohttp.WSMsgType.BINARY:
        return msgpack.unpackb(raw.data)
    return None


def _apply(frame: dict, now: float, record: RequestRecord) -> bool:
    """Fold one server frame into the record; True when the request is over."""
    kind = frame.get("type")
    if kind == "delta":
        text = frame.get("text", "")
        record.add_chunk(now, text, int(frame.get("n", 1 if text else 0)))
        return False
    if kind == "done":
        usage = frame.get("usage") or {}
        record.usage_prompt_tokens = usage.get("prompt_tokens")
        record.usage_completion_tokens = usage.get("completion_tokens")
        record.usage_cached_tokens = usage.get("cached_tokens")
        timing = frame.get("timing") or {}
        record.server_ttft_ms = timing.get("ttft_ms")
        record.server_queue_ms = timing.get("queue_ms")
        record.finish(now, frame.get("finish_reason"))
        if not record.success:
            record.fail(frame.get("finish_reason") or "error", frame.get("message", ""))
        return True
    if kind == "error":
        record.fail(frame.get("code", "unknown"), frame.get("message", ""))
        return True
    return False
