"""SocketPool: the idle WebSocket pool behind WsBackend (/v1/ws) and RealtimeBackend
(/v1/realtime). One request at a time per socket, as an HTTP keep-alive pool holds its
connections; a socket that lost its request is not reused."""
from __future__ import annotations

from collections.abc import Awaitable, Callable

import aiohttp

from loadtest.records import RequestRecord
from loadtest.ws_client import ConnectFailed


class SocketPool:
    """Sockets over one aiohttp session; `open_socket(http, *args)` opens one (a
    WsConnection or an RtConnection: anything with an async `close()`)."""

    def __init__(self, open_socket: Callable[..., Awaitable]):
        self.open_socket = open_socket
        self.http: aiohttp.ClientSession | None = None
        self._idle: list = []
        self._all: set = set()

    async def start(self):
        """Open the session and a first socket, kept idle; return that socket."""
        self.http = aiohttp.ClientSession()
        first = await self.connect()
        self._idle.append(first)
        return first

    async def take(self, record: RequestRecord):
        """An idle socket, else a new one; None, with the failure on `record`, when none
        opens."""
        try:
            return self._idle.pop() if self._idle else await self.connect()
        except ConnectFailed as exc:
            record.fail(exc.code, str(exc))
            return None

    def put_back(self, conn, record: RequestRecord) -> None:
        """Keep `conn` for the next request, unless its request lost the socket."""
        if record.error_code != "disconnected":
            self._idle.append(conn)

    async def connect(self, *args):
        """A new socket that the caller holds (`args` go to open_socket), or ConnectFailed."""
        try:
            conn = await self.open_socket(self.http, *args)
        except (aiohttp.ClientError, ConnectionError, TimeoutError) as exc:
            raise ConnectFailed(connect_code(exc), repr(exc)) from exc
        self._all.add(conn)
        return conn

    async def forget(self, conn) -> None:
        """Close a socket the caller is done with."""
        self._all.discard(conn)
        await conn.close()

    async def close(self) -> None:
        for conn in list(self._all):
            await conn.close()
        if self.http is not None:
            await self.http.close()


def connect_code(exc: BaseException) -> str:
    if isinstance(exc, aiohttp.WSServerHandshakeError):
        return {401: "unauthorized", 403: "unauthorized", 429: "rate_limited",
                503: "overloaded"}.get(exc.status, f"http_{exc.status}")
    return "connect_failed"
