"""Outbox and writer: the one coroutine per socket that writes frames.

    request tasks ──put_delta(stream)──┐
    reader (handler) ──put(frame)──────┼──> Outbox (FIFO of entries) ──> writer ──> socket
    request tasks ──put_done(stream)───┘

A delta entry is the stream itself: while it waits in the FIFO, newer tokens merge into
the stream's pending slot, so deltas coalesce only when the socket drains slower than the
engine generates; otherwise each step's tokens go out in their own frame. A stream's
`done` is queued after its delta entry, so it is always written last.
"""
from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable

from aiohttp import web

from gateway.metrics import Metrics
from gateway.stream import Stream

log = logging.getLogger(__name__)

CLOSE_SLOW_CONSUMER = 1008  # policy violation: the client does not read its frames


class OutboxFull(Exception):
    """More control frames are queued than the socket's limit: the client is not reading."""


class Outbox:
    """FIFO of frames to write; delta entries are streams whose pending slot merges."""

    def __init__(self, max_pending: int):
        self._entries: collections.deque = collections.deque()
        self._ready = asyncio.Event()
        self._max_pending = max_pending
        self._in_hand = False  # the writer holds an entry it has not finished writing
        self.closed = False

    def put(self, frame: dict) -> None:
        if self.closed:
            return
        if len(self._entries) >= self._max_pending:
            raise OutboxFull(f"{len(self._entries)} frames waiting")
        self._push(("frame", frame))

    def put_delta(self, stream: Stream) -> None:
        # One entry per stream at a time: later tokens merge into its pending slot.
        if not self.closed and not stream.queued:
            stream.queued = True
            self._push(("delta", stream))

    def put_done(self, stream: Stream) -> None:
        if not self.closed:
            self._push(("done", stream))

    def _push(self, entry: tuple) -> None:
        self._entries.append(entry)
        self._ready.set()

    async def get(self) -> tuple | None:
        """The next entry, or None once the outbox is closed; the writer calls
        `written()` once it is on the socket."""
        while not self._entries:
            if self.closed:
                return None
            self._ready.clear()
            await self._ready.wait()
        self._in_hand = True
        return self._entries.popleft()

    def written(self) -> None:
        self._in_hand = False

    @property
    def empty(self) -> bool:
        """Nothing left to write: no entry queued, none being written (a close that
        waits for this must not cut off the `done` frame the writer is sending)."""
        return not self._entries and not self._in_hand

    def close(self) -> None:
        self.closed = True
        self._entries.clear()
        self._ready.set()  # the writer ends even if its cancellation was lost


async def run_writer(ws: web.WebSocketResponse, encode: Callable[[dict], bytes | str],
                     outbox: Outbox, metrics: Metrics, send_timeout: float,
                     on_stuck: Callable[[], None]) -> None:
    """Write frames until cancelled; a frame not written within send_timeout closes the
    socket. `encode` turns a frame into a text (str) or binary (bytes) message."""
    while True:
        # The writer ends when the outbox closes, not only when cancelled, so the socket's
        # handler, awaiting the writer, never depends on a cancellation arriving (on Python
        # 3.11 asyncio.wait_for swallowed one that landed as a send completed; the sends
        # now run under asyncio.timeout, which does not).
        entry = await outbox.get()
        if entry is None:
            return
        try:
            if not await _write(ws, encode, entry, metrics, send_timeout, on_stuck):
                return
        finally:
            outbox.written()


async def _write(ws: web.WebSocketResponse, encode: Callable[[dict], bytes | str],
                 entry: tuple, metrics: Metrics, send_timeout: float,
                 on_stuck: Callable[[], None]) -> bool:
    """Write one outbox entry; False once the socket is stuck or gone."""
    kind, item = entry
    frame = item if kind == "frame" else (
        item.take_delta() if kind == "delta" else item.done_frame(time.perf_counter()))
    if not frame:
        if kind == "done":  # the protocol had nothing left to say: the request ended
            metrics.observe_done(item, time.perf_counter())
        return True
    try:
        # A protocol may answer one entry with several messages (a list of frames).
        for one in frame if isinstance(frame, list) else [frame]:
            data = encode(one)
            send = ws.send_bytes if isinstance(data, bytes) else ws.send_str
            async with asyncio.timeout(send_timeout):
                await send(data)
    except asyncio.TimeoutError:
        log.warning("socket did not drain within %.1fs; closing it", send_timeout)
        on_stuck()
        return False
    except ConnectionError:
        return False  # the reader sees the close and cleans up
    now = time.perf_counter()
    if kind == "delta":
        metrics.observe_delta(item, item.last_delta_tokens, now)
    elif kind == "done":
        metrics.observe_done(item, now)
    return True
