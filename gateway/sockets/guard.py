"""ConnectionGuard: every TCP connection passes here before aiohttp parses a byte of it.

    connection_made: over max_connections_total (or max_connections_per_ip for a non-loopback
                     peer)? -> a 503 with its code, closed; else counted
    head:   the request line and headers must arrive within header_timeout_s of their
            first byte (the first request's: of the connection), else closed (slowloris)
    body:   Content-Length bytes pass through; the handler bounds their time
    upgrade to WebSocket, or a chunked body: the rest passes through (the WebSocket has
            its heartbeat and receive timeout; a chunked body its handler's timeout)

Loopback peers are not counted per IP: a proxy on this host carries every client. The
wrapper hands every callback on to aiohttp's own protocol unchanged.
"""
from __future__ import annotations

import asyncio
import collections
import ipaddress
import json
import re
from collections.abc import Callable

from aiohttp import web

from gateway.config import GatewayConfig
from gateway.metrics import Metrics

_HEAD_END = b"\r\n\r\n"
_MAX_HEAD = 1 << 16  # aiohttp refuses heads past its line and field limits well before
_LENGTH = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)", re.IGNORECASE)
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[^\r]*chunked", re.IGNORECASE)
_UPGRADE = re.compile(rb"\r\nupgrade:", re.IGNORECASE)


class ConnectionGuard:
    """Caps on open connections and a deadline for each request's head."""

    def __init__(self, config: GatewayConfig, metrics: Metrics):
        self.config = config
        self.metrics = metrics
        self.open = 0
        self.per_ip: collections.Counter[str] = collections.Counter()

    def factory(self, inner: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """A protocol factory that wraps each protocol `inner` makes (aiohttp's Server)."""
        return lambda: _Guarded(self, inner())

    def admit(self, ip: str | None) -> str | None:
        """Count a new connection, or say why it is refused."""
        if self.open >= self.config.max_connections_total:
            return "too many connections to this server"
        counted = ip is not None and not _loopback(ip)
        if counted and self.per_ip[ip] >= self.config.max_connections_per_ip:
            return "too many connections from this address"
        self.open += 1
        if counted:
            self.per_ip[ip] += 1
        return None

    def release(self, ip: str | None) -> None:
        self.open -= 1
        if ip is not None and ip in self.per_ip:
            self.per_ip[ip] -= 1
            if self.per_ip[ip] <= 0:
                del self.per_ip[ip]


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind the guard's checks."""

    def __init__(self, guard: ConnectionGuard, inner: asyncio.Protocol):
        self.guard, self.inner = guard, inner
        self.transport: asyncio.Transport | None = None
        self.ip: str | None = None
        self.counted = False
        self.head = bytearray()  # the request head read so far
        self.body_left = 0  # bytes of the current body still to pass
        self.through = False  # a WebSocket or a chunked body: no more heads to watch
        self.timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        self.ip = peer[0] if isinstance(peer, tuple) else None
        refusal = self.guard.admit(self.ip)
        if refusal is not None:
            self.guard.metrics.connection_refusals.labels("too_many_connections").inc()
            _refuse(transport, refusal)
            return
        self.counted = True
        self.inner.connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        if not self.counted:
            return
        if not self.through:
            self._watch(data)
        self.inner.data_received(data)

    def _watch(self, data: bytes) -> None:
        """Follow request boundaries: heads (timed) and Content-Length bodies (passed)."""
        view = memoryview(data)
        while view and not self.through:
            if self.body_left:
                step = min(self.body_left, len(view))
                self.body_left -= step
                view = view[step:]
                continue
            if not self.head and self.timer is None:
                self._arm()  # the first byte of the next request's head
            view = view[self._read_head(view):]

    def _read_head(self, view: memoryview) -> int:
        """Add `view` to the head; returns how many of its bytes belong to it."""
        start = max(0, len(self.head) - 3)
        self.head += view
        end = self.head.find(_HEAD_END, start)
        if end < 0:
            if len(self.head) > _MAX_HEAD:
                self.through = True  # aiohttp answers 400 to this head itself
            return len(view)
        head, rest = bytes(self.head[:end]), len(self.head) - end - 4
        self.head = bytearray()
        self._disarm()
        if _UPGRADE.search(head) or _CHUNKED.search(head):
            self.through = True
        elif length := _LENGTH.search(head):
            self.body_left = int(length.group(1))
        return len(view) - rest

    def _arm(self) -> None:
        self._disarm()
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.guard.config.header_timeout_s, self._too_slow)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _too_slow(self) -> None:
        self.timer = None
        self.guard.metrics.connection_refusals.labels("header_timeout").inc()
        if self.transport is not None:
            self.transport.abort()

    def eof_received(self) -> bool | None:
        return self.inner.eof_received() if self.counted else None

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.counted:
            self.counted = False
            self.guard.release(self.ip)
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.counted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.counted:
            self.inner.resume_writing()


def _refuse(transport: asyncio.BaseTransport, message: str) -> None:
    """A 503 in OpenAI's error shape, then the connection closes."""
    body = json.dumps({"error": {"message": message, "type": "server_error", "param": None,
                                 "code": "too_many_connections"}}).encode()
    transport.write(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: "
                    + str(len(body)).encode() + b"\r\n\r\n" + body)
    transport.close()


def _loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return False


class GuardedRunner(web.AppRunner):
    """An AppRunner whose sites hand each connection to the guard first."""

    def __init__(self, app: web.Application, guard: ConnectionGuard, **kwargs):
        super().__init__(app, **kwargs)
        self._guard = guard

    @property
    def server(self):
        inner = super().server
        return None if inner is None else self._guard.factory(inner)
