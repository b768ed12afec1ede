"""Log-probabilities of sampled tokens, from the model's own distribution.

They are taken from the raw logits, before penalties, temperature, top-k/top-p/min-p and
any constraint (vLLM's default, "raw_logprobs"): what the model itself gives each token.
Only the rows that ask pay for them, and all of those together:

    logits [N, V] --rows that ask--> [R, V] --log_softmax (fp32)--> [R, V]
        --gather(chosen)--> [R]      --topk(max k)--> values/ids [R, K]
    then one host copy of the three.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.request import Request


@dataclass(slots=True)
class TokenLogprob:
    """One sampled token's log-probability and its row's `top` most likely alternatives
    (token id, log-probability), most likely first."""

    token_id: int
    logprob: float
    top: list[tuple[int, float]]


class LogprobRows:
    """The log-softmax of the rows that asked, taken before sampling touches the logits."""

    __slots__ = ("rows", "ks", "logprobs")

    def __init__(self, logits: torch.Tensor, requests: list[Request]):
        self.rows = [i for i, r in enumerate(requests) if r.params.logprobs is not None]
        self.ks = [requests[i].params.logprobs for i in self.rows]
        self.logprobs = (torch.log_softmax(logits[self.rows].float(), dim=-1)
                         if self.rows else None)  # [R, V]

    def gather(self, tokens: torch.Tensor, num_rows: int) -> list[TokenLogprob | None]:
        """tokens [N] (the step's choices) -> one entry per row, None where not asked."""
        out: list[TokenLogprob | None] = [None] * num_rows
        if not self.rows:
            return out
        chosen_ids = tokens[self.rows]  # [R]
        chosen = self.logprobs.gather(1, chosen_ids[:, None])[:, 0]  # [R]
        top_values, top_ids = self.logprobs.topk(max(self.ks), dim=-1)  # [R, K]
        host = [t.tolist() for t in (chosen_ids, chosen, top_values, top_ids)]
        for j, (row, k) in enumerate(zip(self.rows, self.ks)):
            top = list(zip(host[3][j][:k], host[2][j][:k]))
            out[row] = TokenLogprob(host[0][j], host[1][j], top)
        return out
