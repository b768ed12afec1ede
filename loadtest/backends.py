"""Transports behind one interface: `complete(prompt, record)` and `open_session()`.

WsBackend keeps a SocketPool of idle sockets (loadtest/socket_pool.py); a session holds
its own socket and sends `chat` turns, so its history and prefix cache live on the
server. HttpBackend speaks OpenAI SSE; its sessions keep the history on the client and
resend it each turn, as a chat app over HTTP does.
"""
from __future__ import annotations

import asyncio

import aiohttp

from loadtest.datasets import Prompt, request_params
from loadtest.http_client import build_body, fetch_model, stream
from loadtest.records import RequestRecord
from loadtest.socket_pool import SocketPool
from loadtest.ws_client import WsConnection
from loadtest.ws_session import WsSession


def completion_prompt(prompt: Prompt) -> str | list[int]:
    return list(prompt.token_ids) if prompt.token_ids else prompt.text


class WsBackend:
    """Protocol v1 over a pool of WebSockets (JSON or msgpack frames)."""

    def __init__(self, url: str, endpoint: str, use_msgpack: bool, temperature: float,
                 ignore_eos: bool, connect_timeout_s: float = 30.0):
        self.url, self.endpoint, self.use_msgpack = url, endpoint, use_msgpack
        self.temperature, self.ignore_eos = temperature, ignore_eos
        self.connect_timeout_s = connect_timeout_s
        self.pool = SocketPool(self._open)  # WsSession opens and forgets its own through it
        self.model: str | None = None

    async def _open(self, http: aiohttp.ClientSession,
                    session_id: str | None = None) -> WsConnection:
        """A new socket, resuming `session_id` when given."""
        return await WsConnection.open(http, self.url, self.use_msgpack,
                                       self.connect_timeout_s, session_id)

    async def start(self) -> None:
        self.model = (await self.pool.start()).hello.get("model")

    async def complete(self, prompt: Prompt, record: RequestRecord) -> None:
        conn = await self.pool.take(record)
        if conn is None:
            return
        if self.endpoint == "chat":
            body = {"messages": [{"role": "user", "content": prompt.text}]}
        else:
            body = {"prompt": completion_prompt(prompt)}
        params = request_params(prompt, self.temperature, self.ignore_eos)
        await conn.request({"type": "generate", **body, "params": params}, record)
        self.pool.put_back(conn, record)

    async def open_session(self) -> WsSession:
        return WsSession(self, await self.pool.connect())

    async def close(self) -> None:
        await self.pool.close()


class HttpBackend:
    """OpenAI-compatible HTTP with SSE streaming: `completions` or `chat` endpoint."""

    def __init__(self, base_url: str, endpoint: str, model: str | None, temperature: float,
                 ignore_eos: bool, max_connections: int = 0):
        self.base_url, self.endpoint, self.model = base_url.rstrip("/"), endpoint, model
        self.temperature, self.ignore_eos = temperature, ignore_eos
        self.max_connections = max_connections
        self.http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # A connection per request, as vLLM's benchmark client does: a pooled keep-alive
        # connection that the server closed as idle (llama-server does, after a few
        # seconds) failed 2-5 of 16 of its c=8 requests when reused.
        connector = aiohttp.TCPConnector(limit=self.max_connections, force_close=True)
        timeout = aiohttp.ClientTimeout(total=None)
        self.http = aiohttp.ClientSession(connector=connector, timeout=timeout)
        if self.model is None:
            self.model = await fetch_model(self.http, self.base_url)

    async def complete(self, prompt: Prompt, record: RequestRecord) -> None:
        text = [{"role": "user", "content": prompt.text}] if self.endpoint == "chat" \
            else completion_prompt(prompt)
        await self.post(self.endpoint, text, prompt, record)

    async def post(self, endpoint: str, text: str | list, prompt: Prompt,
                   record: RequestRecord) -> None:
        path = "chat/completions" if endpoint == "chat" else "completions"
        params = request_params(prompt, self.temperature, self.ignore_eos)
        body = build_body(endpoint, self.model, text, params)
        await stream(self.http, f"{self.base_url}/{path}", body, record)

    async def open_session(self) -> "HttpSession":
        return HttpSession(self)

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()


class HttpSession:
    """A chat over HTTP (always the chat endpoint): the client resends the growing history."""

    def __init__(self, backend: HttpBackend):
        self.backend = backend
        self.history: list[dict] = []

    async def turn(self, prompt: Prompt, record: RequestRecord) -> None:
        messages = self.history + [{"role": "user", "content": prompt.text}]
        await self.backend.post("chat", messages, prompt, record)
        if record.success:
            self.history = messages + [{"role": "assistant", "content": record.text}]

    async def idle(self, seconds: float) -> None:
        await asyncio.sleep(seconds)  # no socket to close: the client holds the history

    async def close(self) -> None:
        pass

