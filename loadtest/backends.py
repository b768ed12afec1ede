"""Transports behind one interface: `complete(prompt, record)` and `open_session()`.

WsBackend keeps a pool of idle sockets (one request per socket at a time, like an HTTP
keep-alive pool); a session holds its own socket and sends `chat` turns, so its history
and prefix cache live on the server. HttpBackend speaks OpenAI SSE; its sessions keep the
history on the client and resend it each turn, as a chat app over HTTP does.
"""
from __future__ import annotations

import aiohttp

from loadtest.datasets import Prompt, request_params
from loadtest.http_client import build_body, fetch_model, stream
from loadtest.records import RequestRecord
from loadtest.ws_client import ConnectFailed
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
        self.http: aiohttp.ClientSession | None = None
        self.model: str | None = None
        self._idle: list[WsConnection] = []
        self._all: set[WsConnection] = set()

    async def start(self) -> None:
        self.http = aiohttp.ClientSession()
        first = await self.connect()
        self.model = first.hello.get("model")
        self._idle.append(first)

    async def complete(self, prompt: Prompt, record: RequestRecord) -> None:
        try:
            conn = self._idle.pop() if self._idle else await self.connect()
        except ConnectFailed as exc:
            record.fail(exc.code, str(exc))
            return
        if self.endpoint == "chat":
            body = {"messages": [{"role": "user", "content": prompt.text}]}
        else:
            body = {"prompt": completion_prompt(prompt)}
        params = request_params(prompt, self.temperature, self.ignore_eos)
        await conn.request({"type": "generate", **body, "params": params}, record)
        if record.error_code != "disconnected":
            self._idle.append(conn)

    async def open_session(self) -> WsSession:
        return WsSession(self, await self.connect())

    async def close(self) -> None:
        for conn in list(self._all):
            await conn.close()
        if self.http is not None:
            await self.http.close()

    async def connect(self, session_id: str | None = None) -> WsConnection:
        """A new socket (resuming `session_id` when given), or ConnectFailed."""
        try:
            conn = await WsConnection.open(self.http, self.url, self.use_msgpack,
                                           self.connect_timeout_s, session_id)
        except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
            raise ConnectFailed(connect_code(exc), repr(exc)) from exc
        self._all.add(conn)
        return conn

    async def forget(self, conn: WsConnection) -> None:
        """Close a socket the caller is done with."""
        self._all.discard(conn)
        await conn.close()


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

    async def close(self) -> None:
        pass


def connect_code(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.WSServerHandshakeError):
        return {401: "unauthorized", 403: "unauthorized", 429: "rate_limited",
                503: "overloaded"}.get(exc.status, f"http_{exc.status}")
    return "connect_failed"
