"""Mailbox: a stream's one-slot store of unsent output, merged while the socket is busy.

    engine outputs --put_delta--> Mailbox(text, n, logprobs) --take_delta--> writer --> socket
                                  ^ later deltas merge here while a frame is in flight

A request task never waits on its socket: deltas that arrive while the writer is busy
(or the client is slow) merge into the one pending delta (text concatenated, token
counts summed, per-token log-probabilities appended), so a slow reader costs one pending
frame per stream however far behind it is, and the engine never stalls on it. The
gateway's writer sends with a timeout and closes a socket that does not drain within it
(gateway/outbox.py), aborting its requests.
"""
from __future__ import annotations


class Mailbox:
    """One stream's unsent delta: at most one frame's worth, merged in place. It holds
    text, a token count and (when the request asked) one log-probability entry per token;
    the gateway shapes them into its wire frame."""

    __slots__ = ("text", "n", "logprobs")

    def __init__(self):
        self.text = ""
        self.n = 0
        self.logprobs: list | None = None

    def put_delta(self, text: str, n: int, logprobs: list | None = None) -> None:
        self.text += text
        self.n += n
        if logprobs:
            self.logprobs = (self.logprobs or []) + logprobs

    @property
    def empty(self) -> bool:
        return not self.text and not self.n

    @property
    def pending_bytes(self) -> int:
        return len(self.text)

    def take_delta(self) -> tuple[str, int, list | None] | None:
        """The merged (text, token count, logprobs or None) to send now (None when
        nothing is pending); empties the slot."""
        if self.empty:
            return None
        delta = self.text, self.n, self.logprobs
        self.text, self.n, self.logprobs = "", 0, None
        return delta
