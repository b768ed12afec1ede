"""Per-stream one-slot mailboxes and the per-socket outbox the socket writer drains.

    request task --put_delta--> Mailbox(id=a) --+
    request task --put_delta--> Mailbox(id=b) --+--> Outbox.get() --> writer --send--> socket
    handler -----put_control--> control FIFO ---+

A request task never waits on its socket: while the writer is busy, later deltas of a
stream merge into the one pending delta (text concatenated, token counts summed), so a
slow reader costs one pending frame per stream, however far behind it is. The writer
sends with a timeout; a socket that does not drain within it is closed by the gateway,
which aborts its requests.
"""
from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable


class OutboxOverflow(Exception):
    """The socket's control frames piled up past their bound: the reader is not reading."""


class SendTimeout(Exception):
    """A frame was not taken by the socket within the send timeout."""


class Mailbox:
    """One stream's unsent output: at most one merged delta and one final frame."""

    __slots__ = ("stream_id", "text", "n", "final")

    def __init__(self, stream_id):
        self.stream_id = stream_id
        self.text = ""
        self.n = 0
        self.final: dict | None = None  # the stream's `done` (or `error`) frame

    def put_delta(self, text: str, n: int) -> None:
        if self.final is None:
            self.text += text
            self.n += n

    def put_final(self, frame: dict) -> None:
        if self.final is None:
            self.final = frame

    @property
    def empty(self) -> bool:
        return not self.text and not self.n and self.final is None

    @property
    def pending_bytes(self) -> int:
        return len(self.text)

    def take(self) -> list[dict]:
        """The frames to send now, in order (delta before final); empties the slot."""
        frames = []
        if self.text or self.n:
            frames.append({"type": "delta", "id": self.stream_id, "text": self.text,
                           "n": self.n})
            self.text, self.n = "", 0
        if self.final is not None:
            frames.append(self.final)
        return frames


class Outbox:
    """All unsent frames of one socket: a bounded FIFO of control frames and one Mailbox
    per live stream; `get()` hands the writer what is ready, streams in turn."""

    def __init__(self, max_control_frames: int = 256):
        self.max_control_frames = max_control_frames
        self._control: deque[dict] = deque()
        self._mailboxes: dict[object, Mailbox] = {}
        self._ready: OrderedDict[object, None] = OrderedDict()  # stream ids with output
        self._wake = asyncio.Event()
        self._closed = False

    def put_delta(self, stream_id, text: str, n: int) -> None:
        if self._closed:
            return  # nobody will send it: drop rather than hold it
        self._mailbox(stream_id).put_delta(text, n)
        self._mark_ready(stream_id)

    def put_final(self, stream_id, frame: dict) -> None:
        if self._closed:
            return
        self._mailbox(stream_id).put_final(frame)
        self._mark_ready(stream_id)

    def put_control(self, frame: dict) -> None:
        """Queue a frame that belongs to no stream (pong, session.*, a refusal)."""
        if self._closed:
            return
        if len(self._control) >= self.max_control_frames:
            raise OutboxOverflow(f"{len(self._control)} unsent control frames")
        self._control.append(frame)
        self._wake.set()

    def close(self) -> None:
        """No more frames will be taken; a waiting `get()` returns None once empty."""
        self._closed = True
        self._wake.set()

    async def get(self) -> list[dict] | None:
        """Wait for frames: control frames first, then one stream's merged output."""
        while not self._control and not self._ready:
            if self._closed:
                return None
            self._wake.clear()
            await self._wake.wait()
        if self._control:
            return [self._control.popleft()]
        stream_id, _ = self._ready.popitem(last=False)
        box = self._mailboxes[stream_id]
        frames = box.take()
        if box.final is not None:
            del self._mailboxes[stream_id]  # the stream is over: its slot goes
        return frames

    # -- introspection for metrics and tests -------------------------------------------
    @property
    def num_streams(self) -> int:
        return len(self._mailboxes)

    @property
    def pending_frames(self) -> int:
        """Unsent frames: control frames plus at most two per stream (delta, final)."""
        streams = sum((bool(b.text or b.n)) + (b.final is not None)
                      for b in self._mailboxes.values())
        return len(self._control) + streams

    @property
    def pending_bytes(self) -> int:
        return sum(b.pending_bytes for b in self._mailboxes.values())

    def _mailbox(self, stream_id) -> Mailbox:
        box = self._mailboxes.get(stream_id)
        if box is None:
            box = self._mailboxes[stream_id] = Mailbox(stream_id)
        return box

    def _mark_ready(self, stream_id) -> None:
        self._ready[stream_id] = None  # keeps its place in line if already there
        self._wake.set()


async def write_outbox(outbox: Outbox, send: Callable[[dict], Awaitable[None]],
                       send_timeout_s: float) -> None:
    """The socket writer: send what the outbox hands out until it is closed.

    Raises SendTimeout when the socket does not take a frame within send_timeout_s; the
    caller closes the socket and aborts its requests.
    """
    while (frames := await outbox.get()) is not None:
        for frame in frames:
            try:
                await asyncio.wait_for(send(frame), send_timeout_s)
            except asyncio.TimeoutError:
                raise SendTimeout(f"socket took no frame in {send_timeout_s:g} s") from None
