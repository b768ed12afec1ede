"""Exact verification of proposed tokens: the target model's own sampling, one position at
a time, over logits computed for all positions in one forward pass.

A request's proposal d0 d1 .. d(k-1) gets k + 1 rows of logits: row j is the target's
distribution after the real tokens and d0 .. d(j-1). Row 0 is sampled as any step samples;
while the token drawn at row j equals d(j), row j + 1 is sampled too; the first token that
differs (or the one at row k) ends the request's tokens for the step.

That is standard speculative sampling for a deterministic (one-hot) draft: d(j) is kept
with probability p_j(d(j)), and otherwise the token comes from p_j with d(j) removed and
renormalized, which is exactly the distribution of a draw from p_j given that it is not
d(j). Greedy rows take the argmax chain. Each emitted token consumes one draw of the
request's generator, as without speculation, so a seeded request draws the same noise
for the same position either way.
"""
from __future__ import annotations

import torch

from engine.outputs import SampledToken
from engine.request import Request
from engine.sampler import Sampler


def sample_verified(sampler: Sampler, logits: torch.Tensor, requests: list[Request]
                    ) -> list[list[SampledToken]]:
    """logits [sum(1 + proposed), V], each request's rows in order -> per request, the
    accepted proposed tokens and the token sampled after them."""
    first_row, row = [], 0
    for request in requests:
        first_row.append(row)
        row += 1 + len(request.spec_token_ids)
    out: list[list[SampledToken]] = [[] for _ in requests]
    live = list(range(len(requests)))  # requests whose every token so far was accepted
    depth = 0
    while live:
        rows = [first_row[i] + depth for i in live]
        tokens, logprobs = sampler.sample(take_rows(logits, rows), [requests[i] for i in live])
        still = []
        for i, token, logprob in zip(live, tokens, logprobs):
            out[i].append(SampledToken(token, logprob))
            drafts = requests[i].spec_token_ids
            if depth < len(drafts) and token == drafts[depth]:
                still.append(i)
        live, depth = still, depth + 1
    return out


def take_rows(x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """x[rows], on CPU through numpy: torch copies them on OpenMP's threads, and waking
    those took tens of milliseconds per step on a loaded 2-core box (numpy: one thread)."""
    if x.device.type == "cpu":
        return torch.from_numpy(x.numpy()[rows])
    return x[rows]
