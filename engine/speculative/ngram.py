"""N-gram proposer: the request's own prompt and output as the draft model.

The last n tokens (n from max_n down to min_n) are looked up in the request's earlier
tokens; the tokens that followed their most recent earlier occurrence are the proposal:

    tokens: [ ... a b c X Y Z ... | ... a b c ]      (n = 3, k = 3)
                      ^ match         ^ suffix  -> propose X Y Z

k adapts per request: it grows by one after a step that accepted every proposed token,
shrinks to what the last step accepted otherwise, and a request whose proposals keep
failing stops proposing (k = 0) for a cool-down of steps before it tries again, so a
stream that does not repeat itself pays nothing. The scan reads only the last
`max_lookback` tokens, so its cost per step is bounded whatever the context's length.
Pure Python: the step scheduler calls it and never loads torch.
"""
from __future__ import annotations

from array import array
from dataclasses import dataclass

from engine.request import Request


@dataclass(slots=True)
class _Acceptance:
    """One request's adaptive k."""

    k: int
    failures: int = 0  # steps in a row that accepted nothing
    cooldown: int = 0  # steps left without proposals


class NgramProposer:
    """Proposes up to `num_speculative_tokens` tokens per request and step."""

    def __init__(self, num_speculative_tokens: int, min_n: int = 1, max_n: int = 3,
                 max_lookback: int = 4096, max_failures: int = 3, cooldown_steps: int = 16):
        self.max_k = num_speculative_tokens
        self.min_n, self.max_n = min_n, max_n
        self.max_lookback = max_lookback
        self.max_failures = max_failures
        self.cooldown_steps = cooldown_steps
        self._state: dict[str, _Acceptance] = {}  # running requests only (see forget)

    def propose(self, request: Request, limit: int) -> list[int]:
        """Up to min(k, limit) tokens likely to follow the request's tokens; [] for none."""
        state = self._state.get(request.request_id)
        if state is None:
            state = self._state[request.request_id] = _Acceptance(self.max_k)
        if state.cooldown:
            state.cooldown -= 1
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
        if num_accepted == num_proposed:
            state.k, state.failures = min(self.max_k, state.k + 1), 0
            return
        state.k = max(1, num_accepted)
        state.failures = 0 if num_accepted else state.failures + 1
        if state.failures >= self.max_failures:
            state.failures, state.cooldown = 0, self.cooldown_steps

    def forget(self, request: Request) -> None:
        self._state.pop(request.request_id, None)


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
