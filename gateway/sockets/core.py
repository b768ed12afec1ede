"""SocketCore: one WebSocket's mechanics, the same for every wire format.

    reader (the handler task) ──each frame──> protocol.handle(data) ──> request tasks
    reader, request tasks ──put / put_delta / put_done──> Outbox ──> writer ──> socket
    socket closes ──> request tasks cancelled (their engine requests aborted), writer ends

A protocol object (gateway/ws/ for protocol v1, gateway/realtime/) decides what frames
mean and which frames go out; it holds a SocketCore and never subclasses another
protocol. Only the handler task calls `receive()`; only the writer writes.
"""
from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
from typing import TYPE_CHECKING, Protocol

from aiohttp import WSMsgType, web

from gateway.sockets.outbox import CLOSE_SLOW_CONSUMER, Outbox, OutboxFull, run_writer
from gateway.stream import Stream

if TYPE_CHECKING:
    from gateway.errors import RequestError
    from gateway.runtime import Runtime
    from gateway.sessions.live import LiveSession

log = logging.getLogger(__name__)
_socket_ids = itertools.count()


class WireProtocol(Protocol):
    """What a wire format provides to the core that serves its sockets."""

    def encode(self, frame: dict) -> bytes | str:
        """A frame as a text (str) or binary (bytes) message."""

    def hello(self) -> dict:
        """The first frame the server sends."""

    def handle(self, data: bytes | str) -> None:
        """One client frame. Answers its own errors; only OutboxFull escapes."""

    def draining_frame(self, reconnect_after_ms: int) -> dict:
        """The frame that tells the client the server is shutting down."""

    def error_frame(self, exc: RequestError) -> dict:
        """A request-level error as this protocol's frame."""

    def loading_frame(self, stream: Stream, model: str) -> dict | None:
        """The frame that tells the client `stream` waits for `model` to load (None: the
        protocol has none)."""


class SocketCore:
    """A socket attached to a session; `serve()` runs until the socket closes."""

    def __init__(self, rt: Runtime, ws: web.WebSocketResponse, session: LiveSession,
                 tag_prefix: str = "ws"):
        self.rt = rt
        self.ws = ws
        self.session = session
        self.tag = f"{tag_prefix}{next(_socket_ids)}"
        self.protocol: WireProtocol | None = None
        self.streams: dict[str, Stream] = {}
        self.outbox = Outbox(rt.config.max_pending_frames)
        self._engine_ids = itertools.count()
        self._background: set[asyncio.Task] = set()

    # -- the socket's lifetime -----------------------------------------------------------
    async def serve(self, protocol: WireProtocol) -> None:
        self.protocol = protocol
        writer = asyncio.create_task(run_writer(
            self.ws, protocol.encode, self.outbox, self.rt.metrics,
            self.rt.config.send_timeout_s, self.on_stuck))
        self.outbox.put(protocol.hello())
        try:
            await self._read_loop()
        finally:
            # The handler may be cancelled (again) while it waits for the aborts when the
            # peer vanishes (handler_cancellation): the writer must be cancelled anyway.
            try:
                await self._abort_all()
            finally:
                self.outbox.close()
                writer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await writer

    async def _read_loop(self) -> None:
        try:
            async for msg in self.ws:
                if msg.type in (WSMsgType.TEXT, WSMsgType.BINARY):
                    self.protocol.handle(msg.data)
                elif msg.type == WSMsgType.ERROR:
                    break
        except asyncio.TimeoutError:  # receive_timeout: the client went quiet
            await self.ws.close(code=1000, message=b"receive timeout")
        except OutboxFull:
            await self.ws.close(code=CLOSE_SLOW_CONSUMER, message=b"client is not reading")

    async def _abort_all(self) -> None:
        tasks = [s.task for s in self.streams.values() if s.task is not None]
        for task in tasks:
            task.cancel()  # cancel_requested stays False: the cancellation re-raises
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- requests and background work ------------------------------------------------------
    def start(self, stream: Stream, coro, context: contextvars.Context | None = None) -> None:
        """Run a request's coroutine as its own task, registered under its client id, in
        `context` (Runtime.request_context: the request's model) or a copy of this one."""
        self.streams[stream.id] = stream
        stream.task = asyncio.create_task(coro, context=context)
        stream.task.add_done_callback(self._task_ended)

    def new_engine_id(self) -> str:
        """An engine request id unique in this process."""
        return f"{self.tag}-{next(self._engine_ids)}"

    def cancel(self, stream: Stream) -> None:
        """The client asked to end this request: it ends with its `cancelled` frames."""
        stream.cancel_requested = True
        stream.task.cancel()

    def spawn(self, coro) -> None:
        """Run coro beside the socket's tasks, holding a reference until it ends: the event
        loop keeps only weak ones, so an unreferenced task can be collected mid-run."""
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _task_ended(self, task: asyncio.Task) -> None:
        """The last boundary of a request task: the request runner answers the request's
        own faults, so what escapes came after its reply (a full outbox, a failed cleanup)."""
        if task.cancelled() or task.exception() is None:
            return
        if isinstance(task.exception(), OutboxFull):
            self.on_stuck()  # the client is not reading: close it as the reader would
            return
        log.error("request task on %s failed after its reply", self.tag,
                  exc_info=task.exception())

    # -- closing -----------------------------------------------------------------------------
    def on_stuck(self) -> None:
        self.spawn(self._close_stuck())

    async def _close_stuck(self) -> None:
        """Offer a close frame for a second, then drop the connection whatever happened:
        a graceful close waits forever for a peer that does not read, and ws.close() can
        also end cancelled (when the reader sees the close first), not only time out."""
        try:
            async with asyncio.timeout(1.0):
                await self.ws.close(code=CLOSE_SLOW_CONSUMER, message=b"send timeout")
        except (asyncio.TimeoutError, ConnectionError):
            pass
        finally:
            self._drop()

    def _drop(self) -> None:
        transport = self.ws._req.transport if self.ws._req else None  # noqa: SLF001
        if transport is not None:
            transport.abort()

    def notify_draining(self, reconnect_after_ms: int) -> None:
        """Tell the client the server is shutting down. A socket whose outbox is full is
        not reading: it is closed, as one that does not drain, and the caller goes on."""
        try:
            self.outbox.put(self.protocol.draining_frame(reconnect_after_ms))
        except OutboxFull:
            log.warning("socket %s is not reading its frames; closing it", self.tag)
            self.on_stuck()

    async def close(self, code: int, message: bytes, timeout: float) -> None:
        """Close after the frames already queued are written (drain, shutdown); a peer
        that has not read them and answered the close within `timeout` is dropped."""
        try:
            async with asyncio.timeout(timeout):
                await self._flush_then_close(code, message)
        except (asyncio.TimeoutError, ConnectionError):
            self._drop()

    async def _flush_then_close(self, code: int, message: bytes) -> None:
        while not self.outbox.empty:
            await asyncio.sleep(0.02)
        await self.ws.close(code=code, message=message)
