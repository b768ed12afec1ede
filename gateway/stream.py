"""Stream: one request's life on a socket, from the frame that asked for it to `done`.

Times are time.perf_counter() seconds (uvloop's loop clock only has millisecond steps):

    received ---admit---> admitted ---engine---> first delta written ... done written
    |<--- queue_ms --->|
    |<----------------- ttft_ms ------------------>|
    |<------------------------------- e2e_ms -------------------------------------->|
    tpot_ms = (e2e - ttft) / (completion_tokens - 1)
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from engine.outputs import RequestOutput
from scheduler.mailbox import Mailbox


class Stream:
    """A live chat or generate request: its pending delta slot, usage and timing.

    `mailbox` is the one-slot scheduler Mailbox the writer drains: deltas that arrive
    while a frame is still queued merge into it, so a slow reader costs constant
    memory and tokens go out as produced when the reader keeps up.
    """

    __slots__ = ("id", "engine_id", "kind", "received", "admitted", "first_written",
                 "last_written", "mailbox", "queued", "last_delta_tokens", "text_parts",
                 "prompt_tokens", "cached_tokens", "completion_tokens", "finish_reason",
                 "error", "cancel_requested", "task", "logprob_entries")

    def __init__(self, request_id: str, engine_id: str, kind: str):
        self.id = request_id
        self.engine_id = engine_id
        self.kind = kind  # "chat" | "generate"
        self.received = time.perf_counter()
        self.admitted: float | None = None
        self.first_written: float | None = None
        self.last_written: float | None = None
        self.mailbox = Mailbox()
        self.queued = False  # a delta entry of this stream waits in the outbox
        self.last_delta_tokens = 0  # tokens in the delta frame taken last (for metrics)
        self.text_parts: list[str] = []
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.completion_tokens = 0
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.cancel_requested = False  # the client (or a drain) asked to end it
        self.task: asyncio.Task | None = None
        # shapes the engine's logprobs for a delta frame; None: the request did not ask
        self.logprob_entries: Callable[[list], list[dict]] | None = None

    @property
    def text(self) -> str:
        return "".join(self.text_parts)

    def absorb(self, out: RequestOutput) -> int:
        """Fold an engine output in; returns how many new tokens it carried."""
        n = len(out.new_token_ids)
        self.mailbox.put_delta(out.delta_text, n, out.logprobs)
        if out.delta_text:
            self.text_parts.append(out.delta_text)
        self.prompt_tokens = out.num_prompt_tokens or self.prompt_tokens
        self.cached_tokens = out.num_cached_tokens
        self.completion_tokens = out.num_output_tokens
        if out.finished:
            self.finish_reason = out.finish_reason or "stop"
            # The engine logged its exception; clients learn only that it was internal.
            self.error = "internal error" if out.error else None
        return n

    def take_delta(self) -> dict | None:
        """The merged delta frame to write now, or None when nothing is pending."""
        self.queued = False
        delta = self.mailbox.take_delta()
        if delta is None:
            return None
        self.last_delta_tokens = delta[1]
        return self.delta_frame(*delta)

    def delta_frame(self, text: str, n: int, logprobs: list | None) -> dict:
        frame = {"type": "delta", "id": self.id, "text": text, "n": n}
        if self.logprob_entries is not None:
            frame["logprobs"] = self.logprob_entries(logprobs or [])
        return frame

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

    def done_frame(self, now: float) -> dict:
        frame = {"type": "done", "id": self.id, "finish_reason": self.finish_reason or "stop",
                 "usage": {"prompt_tokens": self.prompt_tokens,
                           "completion_tokens": self.completion_tokens,
                           "cached_tokens": self.cached_tokens},
                 "timing": self.timing(now)}
        if self.error:
            frame["error"] = self.error
        return frame
