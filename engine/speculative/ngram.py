"""N-gram proposer: the request's own prompt and output as the draft model.

The last n tokens (n from max_n down to min_n) are looked up in the request's earlier
tokens; the tokens that followed their most recent earlier occurrence are the proposal:

    tokens: [ ... a b c X Y Z ... | ... a b c ]      (n = 3, k = 3)
                      ^ match         ^ suffix  -> propose X Y Z

k adapts per request to the proposed tokens its verifications accepted, as a moving
average: one more than that average (rounded up), so a stream that keeps quoting proposes
the full k and one that diverges after a token or two proposes two or three. The last
step alone is a poor guide: a proposal ends where the text being copied and the output
part, and the next step's is a fresh lookup, often of a long quote resumed (k shrunk to
the last step's accepted tokens gave ~6% less on the copy-heavy dataset's replay). A
verification costs more than a plain decode step (each row pays the int8 dots' work), so a
request whose recent steps accepted less than `min_accepted` tokens on average stops
proposing for a rest of steps that doubles each time it comes back (up to `max_rest`), and
a stream that does not repeat itself soon pays next to nothing. A rest ends early on a match
of more than min_n tokens, stronger evidence than the shortest match: a quote resumed (the
copy-heavy dataset's greedy outputs replayed at measured step costs: 3-5% more decode speed
on three held-out seeds; chat unchanged, its rests rarely meet such a match). The scan
reads only the last `max_lookback` tokens, so its cost per step is bounded whatever the
context's length.

Where a request's own tokens hold no earlier occurrence of its suffix, the proposer looks in
the outputs of the model's recently finished requests (RecentTokens, the last
`history_tokens` of them): an agent quoting what another session's tool call returned, a
chat repeating an answer given elsewhere. Pure Python: the step scheduler calls it and never
loads torch.
"""
from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

from engine.request import Request


@dataclass(slots=True)
class _Acceptance:
    """One request's adaptive k and its rest after poor acceptance."""

    k: int
    average: float  # moving average of tokens accepted per verification
    rest: int  # the next rest's length, in steps
    resting: int = 0  # steps left without proposals


class NgramProposer:
    """Proposes up to `num_speculative_tokens` tokens per request and step."""

    def __init__(self, num_speculative_tokens: int, min_n: int = 1, max_n: int = 3,
                 max_lookback: int = 4096, min_accepted: float = 1.0, first_rest: int = 8,
                 max_rest: int = 128, decay: float = 0.7, history_tokens: int = 0):
        self.max_k = num_speculative_tokens
        self.min_n, self.max_n = min_n, max_n
        self.max_lookback = max_lookback
        self.min_accepted = min_accepted
        self.first_rest, self.max_rest = first_rest, max_rest
        self.decay = decay
        self._state: dict[str, _Acceptance] = {}  # running requests only (see forget)
        self.history = RecentTokens(history_tokens) if history_tokens > 0 else None

    def propose(self, request: Request, limit: int) -> list[int]:
        """Up to min(k, limit) tokens likely to follow the request's tokens; [] for none."""
        state = self._state.get(request.request_id)
        if state is None:
            state = self._state[request.request_id] = self._fresh(self.first_rest)
        k = min(state.k, limit)
        if state.resting:
            state.resting -= 1
            drafts = self._lookup(request, k, self.min_n + 1)
            if drafts:  # a longer match: a quote resumed, the rest is over
                state.resting = 0
            return drafts
        return self._lookup(request, k, self.min_n)

    def _lookup(self, request: Request, k: int, min_n: int) -> list[int]:
        """Up to k tokens after the longest match of min_n to max_n tokens: in the request's
        own tokens, else in the history."""
        if k <= 0:
            return []
        context = request.all_token_ids[-self.max_lookback:]
        drafts = find_continuation(context, k, min_n, self.max_n)
        if not drafts and self.history is not None:
            drafts = self.history.continuation(context[-self.max_n:], k, min_n, self.max_n)
        return drafts

    def record(self, request: Request, num_proposed: int, num_accepted: int) -> None:
        """Adapt the request's k to how many of its proposed tokens the model accepted."""
        state = self._state.get(request.request_id)
        if state is None or num_proposed == 0:
            return
        state.average = self.decay * state.average + (1 - self.decay) * num_accepted
        state.k = min(self.max_k, math.ceil(state.average) + 1)
        if state.average < self.min_accepted:  # rest, then start afresh with a longer rest
            rest = state.rest
            self._state[request.request_id] = self._fresh(min(self.max_rest, 2 * rest))
            self._state[request.request_id].resting = rest
        elif num_accepted >= self.min_accepted:
            state.rest = self.first_rest

    def forget(self, request: Request) -> None:
        """A request has finished: its state goes, its output joins the history."""
        self._state.pop(request.request_id, None)
        if self.history is not None:
            self.history.add(request.output_token_ids)

    def _fresh(self, rest: int) -> _Acceptance:
        """A fresh start: two verifications in a row that accept nothing end it."""
        return _Acceptance(self.max_k, self.min_accepted / self.decay, rest)


def find_continuation(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The up to k tokens after the most recent earlier occurrence of tokens' last n
    (the longest n in [min_n, max_n] that occurs), else [].

    The lengths that occur are all those up to the longest: an earlier occurrence of the
    last n tokens holds one of the last n - 1 (its own tail). So one scan of the context
    (min_n's) settles a miss, the common case of a stream that does not repeat itself, and
    a binary search finds the longest n of a hit, where trying each n from max_n down took
    up to 14 scans (a miss over 4,096 tokens took 0.14 ms a step, now 0.07: most of it
    is making the byte string)."""
    if min_n > max_n:  # no length to match (a rest's longer match when min_n is max_n)
        return []
    data = array("i", tokens).tobytes()

    def last_match(n: int) -> int:  # ending before the last token
        return _last_word_match(data, data[-4 * n:], len(data) - 4)

    if len(tokens) <= min_n or (pos := last_match(min_n)) < 0:
        return []
    n, low, high = min_n, min_n + 1, min(max_n, len(tokens) - 1)
    while low <= high:
        mid = (low + high) // 2
        if (at := last_match(mid)) >= 0:
            n, pos, low = mid, at, mid + 1
        else:
            high = mid - 1
    start = pos // 4 + n
    return tokens[start:start + k]


def _last_word_match(data: bytes | bytearray, needle: bytes, end: int) -> int:
    """Where the last occurrence of `needle` within data[:end] that starts on a 4-byte word
    starts, or -1. The search runs in C (rfind over the ids as 4-byte words; a hit off a word
    boundary is skipped)."""
    pos = data.rfind(needle, 0, end)
    while pos > 0 and pos % 4:
        pos = data.rfind(needle, 0, pos + len(needle) - 1)
    return pos if pos >= 0 and pos % 4 == 0 else -1


class RecentTokens:
    """The last `capacity` output tokens of a model's finished requests, as one buffer of
    4-byte ids, each request's output after a separator (-1) so that a continuation never
    runs from one request's output into the next; the oldest are dropped first. Memory is
    4 bytes a token and a lookup reads the buffer once per n: both bounded by `capacity`."""

    _SEPARATOR = array("i", [-1]).tobytes()

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._data = bytearray()

    def __len__(self) -> int:
        """Words held, separators included."""
        return len(self._data) // 4

    def add(self, tokens: list[int]) -> None:
        if not tokens:
            return
        self._data += self._SEPARATOR + array("i", tokens[-self.capacity:]).tobytes()
        excess = len(self._data) - 4 * self.capacity
        if excess > 0:
            del self._data[:excess]

    def continuation(self, suffix: list[int], k: int, min_n: int, max_n: int) -> list[int]:
        """The up to k tokens that followed the most recent occurrence of suffix's last n
        tokens (the longest n in [min_n, max_n] that occurs and was followed by any), up to
        the end of the output they were in; else []. A suffix whose last min_n tokens
        never occur has no longer match either: one scan of the buffer settles that miss
        (0.3 ms a step for a full 32,768-token history when every n was tried)."""
        if len(suffix) < min_n or _last_word_match(
                self._data, array("i", suffix[-min_n:]).tobytes(), len(self._data)) < 0:
            return []
        for n in range(min(max_n, len(suffix)), min_n - 1, -1):
            pos = _last_word_match(self._data, array("i", suffix[-n:]).tobytes(),
                                   len(self._data))
            if pos < 0:
                continue
            start = pos + 4 * n
            follow = array("i", bytes(self._data[start:start + 4 * k]))
            drafts = []
            for token in follow:
                if token < 0:
                    break
                drafts.append(token)
            if drafts:
                return drafts
        return []
