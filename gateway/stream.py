"""Stream: one request's life, from the frame or body that asked for it to its end.

Times are time.perf_counter() seconds (uvloop's loop clock only has millisecond steps):

    received ---admit---> admitted ---engine---> first delta written ... done written
    |<--- queue_ms --->|
    |<----------------- ttft_ms ------------------>|
    |<------------------------------- e2e_ms -------------------------------------->|
    tpot_ms = (e2e - ttft) / (completion_tokens - 1)

A socket's stream also holds its unsent output (`pending`, a Mailbox) and a `shaper`,
the protocol object that turns that output into the protocol's frames.
"""
from __future__ import annotations

import asyncio
import time
from typing import Protocol

from engine.mailbox import Mailbox
from engine.outputs import RequestOutput


class Shaper(Protocol):
    """A protocol's frames for one stream: what the socket's writer sends (a list: one
    message each; empty or None: nothing to send)."""

    def delta_frame(self, stream: "Stream", out: RequestOutput) -> dict | list[dict] | None: ...

    def done_frame(self, stream: "Stream", now: float) -> dict | list[dict] | None: ...


class Stream:
    """A live request: usage, timing, how it ended, and (on a socket) its pending output.

    `pending` merges outputs that arrive while the writer is busy or the client slow, so a
    slow reader costs one pending output per stream and tokens go out as produced when
    the reader keeps up.
    """

    __slots__ = ("id", "engine_id", "kind", "received", "admitted", "first_written",
                 "last_written", "pending", "shaper", "queued", "last_delta_tokens",
                 "text_parts", "prompt_tokens", "cached_tokens", "completion_tokens",
                 "finish_reason", "error", "cancel_requested", "task", "logprobs", "model")

    def __init__(self, request_id: str, engine_id: str, kind: str,
                 shaper: Shaper | None = None):
        self.id = request_id
        self.engine_id = engine_id
        self.kind = kind  # "chat" | "generate"
        self.received = time.perf_counter()
        self.admitted: float | None = None
        self.first_written: float | None = None
        self.last_written: float | None = None
        self.shaper = shaper
        self.pending = Mailbox() if shaper is not None else None
        self.queued = False  # a delta entry of this stream waits in the socket's outbox
        self.last_delta_tokens = 0  # tokens in the delta frame taken last (for metrics)
        self.text_parts: list[str] = []
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.cancel_requested = False  # the client (or a drain) asked to end it
        self.task: asyncio.Task | None = None
        self.logprobs = False  # the request asked for log-probabilities
        self.model = None  # the ModelSlot it runs on, once held (its tokens' texts)

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def absorb(self, out: RequestOutput) -> int:
        """Fold an engine output in (a socket's stream keeps it to send); returns how many
        new tokens it carried."""
        n = len(out.new_token_ids)
        if out.delta_text:
            self.text_parts.append(out.delta_text)
        self.prompt_tokens = out.num_prompt_tokens or self.prompt_tokens
        self.cached_tokens = out.num_cached_tokens
        self.completion_tokens = out.num_output_tokens
        if out.finished:
            self.finish_reason = out.finish_reason or "stop"
            # The engine logged its exception; clients learn only that it was internal.
            self.error = "internal error" if out.error else None
        if self.pending is not None:
            self.pending.put(out)
        return n

    def take_delta(self) -> dict | None:
        """The merged delta frame to write now, or None when nothing is pending."""
        self.queued = False
        out = self.pending.take()
        if out is None or not (out.delta_text or out.new_token_ids):
            return None  # an end with nothing new: only `done` follows
        self.last_delta_tokens = len(out.new_token_ids)
        return self.shaper.delta_frame(self, out)

    def done_frame(self, now: float) -> dict:
        return self.shaper.done_frame(self, now)

    def written(self, now: float) -> float | None:
        """Record a delta frame written; returns the gap since the previous one."""
        gap = None if self.last_written is None else now - self.last_written
        if self.first_written is None:
            self.first_written = now
        self.last_written = now
        return gap

    def timing(self, now: float) -> dict:
        def ms(seconds: float) -> float:
            return round(seconds * 1000.0, 3)

        admitted = self.admitted if self.admitted is not None else now
        first = self.first_written if self.first_written is not None else now
        decode_tokens = self.completion_tokens - 1
        tpot = (now - first) / decode_tokens if decode_tokens > 0 else 0.0
        return {"queue_ms": ms(admitted - self.received), "ttft_ms": ms(first - self.received),
                "e2e_ms": ms(now - self.received), "tpot_ms": ms(tpot)}
