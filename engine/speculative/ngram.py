"""N-gram proposer: the request's own prompt and output as the draft model.

The last n tokens (n from max_n down to min_n) are looked up in the request's earlier
tokens; the tokens that followed their most recent earlier occurrence are the proposal:

    tokens: [ ... a b c X Y Z ... | ... a b c ]      (n = 3, k = 3)
                      ^ match         ^ suffix  -> propose X Y Z

k adapts per request: it grows by one after a step that accepted every proposed token
and shrinks to what the last step accepted otherwise. A verification costs more than a
plain decode step (on CPU its rows skip the fused decode stack), so a request whose recent
steps accepted less than `min_accepted` tokens on average (a moving average) stops
proposing for a rest of steps that doubles each time it comes back (up to `max_rest`), and
a stream that does not repeat itself soon pays next to nothing. The scan reads only the last
`max_lookback` tokens, so its cost per step is bounded whatever the context's length.
Pure Python: the step scheduler calls it and never loads torch.
"""
from __future__ import annotations

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
                 max_rest: int = 128, decay: float = 0.7):
        self.max_k = num_speculative_tokens
        self.min_n, self.max_n = min_n, max_n
        self.max_lookback = max_lookback
        self.min_accepted = min_accepted
        self.first_rest, self.max_rest = first_rest, max_rest
        self.decay = decay
        self._state: dict[str, _Acceptance] = {}  # running requests only (see forget)

    def propose(self, request: Request, limit: int) -> list[int]:
        """Up to min(k, limit) tokens likely to follow the request's tokens; [] for none."""
        state = self._state.get(request.request_id)
        if state is None:
            state = self._state[request.request_id] = self._fresh(self.first_rest)
        if state.resting:
            state.resting -= 1
            return []
        k = min(state.k, limit)
        if k <= 0:
            return []
        return find_continuation(request.all_token_ids[-self.max_lookback:], k,
                                 self.min_n, self.max_n)

    def record(self, request: Request, num_proposed: int, num_accepted: int) -> None:
        """Adapt the request's k to how many of its proposed tokens the model accepted."""
        state = self._state.get(request.request_id)
        if state is None or num_proposed == 0:
            return
        state.k = min(self.max_k, state.k + 1) if num_accepted == num_proposed \
            else max(1, num_accepted)
        state.average = self.decay * state.average + (1 - self.decay) * num_accepted
        if state.average < self.min_accepted:  # rest, then start afresh with a longer rest
            rest = state.rest
            self._state[request.request_id] = self._fresh(min(self.max_rest, 2 * rest))
            self._state[request.request_id].resting = rest
        elif num_accepted >= self.min_accepted:
            state.rest = self.first_rest

    def forget(self, request: Request) -> None:
        self._state.pop(request.request_id, None)

    def _fresh(self, rest: int) -> _Acceptance:
        """A fresh start: two verifications in a row that accept nothing end it."""
        return _Acceptance(self.max_k, self.min_accepted / self.decay, rest)


def find_continuation(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The up to k tokens after the most recent earlier occurrence of tokens' last n
    (the longest n in [min_n, max_n] that occurs), else []. The search runs in C
    (bytes.rfind over the ids as 4-byte words; a hit off a word boundary is skipped)."""
    data = array("i", tokens).tobytes()
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        suffix = data[-4 * n:]
        end = len(data) - 4  # a match must end before the last token
        pos = data.rfind(suffix, 0, end)
        while pos > 0 and pos % 4:
            end = pos + len(suffix) - 1
            pos = data.rfind(suffix, 0, end)
        if pos >= 0 and pos % 4 == 0:
            start = pos // 4 + n
            return tokens[start:start + k]
    return []
