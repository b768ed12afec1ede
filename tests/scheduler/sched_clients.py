"""Test clients: a WebSocket client that runs many requests on one socket and times them."""
from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import struct
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass
class Result:
    """What the client saw of one request (times from time.perf_counter)."""

    id: str
    sent: float
    deltas: list[float] = field(default_factory=list)  # arrival time of each delta frame
    tokens: int = 0
    end: float | None = None
    finish_reason: str | None = None
    error: str | None = None  # the error code, if refused
    message: str | None = None
    retry_after_ms: int | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def ttft(self) -> float:
        return self.deltas[0] - self.sent

    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.deltas, self.deltas[1:])]


class WsClient:
    """One socket; `generate` sends a request, a reader task sorts frames by id."""

    def __init__(self, session: aiohttp.ClientSession, url: str, api_key: str | None = None):
        self._session, self._url = session, url
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self.results: dict[str, Result] = {}
        self.ws = None
        self._reader = None

    async def __aenter__(self):
        self.ws = await self._session.ws_connect(self._url + "/v1/ws", compress=0,
                                                 headers=self._headers)
        hello = json.loads((await self.ws.receive()).data)
        assert hello["type"] == "hello"
        self.session_id = hello["session_id"]
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc):
        await self.ws.close()
        self._reader.cancel()

    async def generate(self, request_id: str, prompt: str, max_tokens: int,
                       **params) -> Result:
        """Send one generate; the Result fills in as frames arrive (`done` is set at the end)."""
        return await self._send({"type": "generate", "id": request_id, "prompt": prompt},
                                max_tokens, params)

    async def chat(self, request_id: str, content: str, max_tokens: int, **params) -> Result:
        """Send one chat turn (in this socket's session)."""
        return await self._send({"type": "chat", "id": request_id, "content": content},
                                max_tokens, params)

    async def cancel(self, request_id: str) -> None:
        await self.ws.send_str(json.dumps({"type": "cancel", "id": request_id}))

    async def _send(self, frame: dict, max_tokens: int, params: dict) -> Result:
        frame["params"] = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
                           **params}
        result = self.results[frame["id"]] = Result(frame["id"], time.perf_counter())
        await self.ws.send_str(json.dumps(frame))
        return result

    async def _read(self):
        async for msg in self.ws:
            frame = json.loads(msg.data)
            result = self.results.get(frame.get("id"))
            if result is None:
                continue
            now = time.perf_counter()
            if frame["type"] == "delta":
                result.deltas.append(now)
                result.tokens += frame["n"]
            elif frame["type"] in ("done", "error"):
                result.end = now
                result.finish_reason = frame.get("finish_reason")
                result.error = frame.get("code")
                result.message = frame.get("message")
                result.retry_after_ms = frame.get("retry_after_ms")
                result.done.set()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class RawWsClient:
    """A bare WebSocket client on a socket with tiny buffers, so that when it stops
    reading, the server's sends back up within a few kilobytes (a slow phone, say)."""

    def __init__(self):
        self.frames: list[dict] = []
        self.session_id = None

    async def connect(self, url: str, rcvbuf: int = 2048) -> None:
        host, port = url.removeprefix("http://").split(":")
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        self.reader, self.writer = await asyncio.open_connection(sock=sock, limit=1024)
        key = base64.b64encode(os.urandom(16)).decode()
        self.writer.write((f"GET /v1/ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket"
                           f"\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                           "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        assert b" 101 " in head.split(b"\r\n")[0], head
        hello = await self.recv()
        self.session_id = hello["session_id"]

    async def send(self, obj: dict, opcode: int = 0x1) -> None:
        payload = json.dumps(obj).encode() if opcode == 0x1 else obj
        mask = os.urandom(4)
        n = len(payload)
        header = bytes([0x80 | opcode]) + (bytes([0x80 | n]) if n < 126 else
                                           bytes([0x80 | 126]) + struct.pack(">H", n))
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.writer.write(header + mask + masked)
        await self.writer.drain()

    async def recv(self) -> dict | None:
        """The next text frame (answering pings on the way); None once closed."""
        while True:
            b1, b2 = await self.reader.readexactly(2)
            n = b2 & 0x7F
            if n == 126:
                n = struct.unpack(">H", await self.reader.readexactly(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", await self.reader.readexactly(8))[0]
            payload = await self.reader.readexactly(n)
            opcode = b1 & 0x0F
            if opcode == 0x1:
                frame = json.loads(payload)
                self.frames.append(frame)
                return frame
            if opcode == 0x9:
                await self.send(payload, opcode=0xA)
            elif opcode == 0x8:
                return None

    async def read_until_done(self, ids: set[str]) -> None:
        ids = set(ids)
        while ids:
            frame = await self.recv()
            assert frame is not None, "server closed the socket"
            assert frame["type"] != "error" or "id" in frame, frame
            if frame["type"] in ("done", "error"):
                ids.discard(frame.get("id"))

    def close(self) -> None:
        self.writer.close()
