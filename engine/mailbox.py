"""Mailbox: one request's unsent output, merged in a single slot until its reader takes it.

    producer --put(out)--> [ one pending RequestOutput ] --take() / await get()--> reader
                             ^ later outputs merge in: text appended, token ids and
                               logprobs extended, totals and finish state replaced

A reader that falls behind costs one pending output however far behind it is (the text
itself, kept as parts and joined once on take), and the producer never waits for it. The
engine hands each request's outputs over in one (AsyncEngine); a socket's writer drains
another (the gateway's per-stream pending delta).
"""
from __future__ import annotations

import asyncio

from engine.outputs import RequestOutput


class Mailbox:
    """One-slot store of RequestOutputs; `put` takes ownership of the output it is given."""

    __slots__ = ("_pending", "_parts", "_pending_chars", "_ready")

    def __init__(self):
        self._pending: RequestOutput | None = None
        self._parts: list[str] = []
        self._pending_chars = 0
        self._ready = asyncio.Event()

    def put(self, out: RequestOutput) -> None:
        """Merge a later output into the pending one (or make it the pending one)."""
        self._parts.append(out.delta_text)
        self._pending_chars += len(out.delta_text)
        if self._pending is None:
            self._pending = out
            if out.logprobs is not None:
                out.logprobs = list(out.logprobs)  # extended below: never the caller's list
        else:
            _merge(self._pending, out)
        self._ready.set()

    def take(self) -> RequestOutput | None:
        """The merged output to hand on now (its text joined), or None; empties the slot."""
        out = self._pending
        if out is None:
            return None
        out.delta_text = "".join(self._parts)
        self._pending, self._parts, self._pending_chars = None, [], 0
        self._ready.clear()
        return out

    async def get(self) -> RequestOutput:
        """Wait until an output is pending, then take it."""
        while self._pending is None:
            await self._ready.wait()
        return self.take()

    @property
    def empty(self) -> bool:
        return self._pending is None

    @property
    def pending_chars(self) -> int:
        """Characters of text waiting (what a slow reader costs)."""
        return self._pending_chars


def _merge(pending: RequestOutput, later: RequestOutput) -> None:
    """Fold a later diff into the pending one; its text is kept in the mailbox's parts."""
    pending.new_token_ids.extend(later.new_token_ids)
    if later.logprobs:
        if pending.logprobs is None:
            pending.logprobs = []
        pending.logprobs.extend(later.logprobs)
    pending.finished = later.finished
    pending.finish_reason = later.finish_reason
    pending.num_cached_tokens = later.num_cached_tokens
    pending.num_output_tokens = later.num_output_tokens
    pending.error = later.error
