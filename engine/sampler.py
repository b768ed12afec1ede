"""Sampling: penalties, temperature, top-k, top-p, min-p and per-request seeded draws.

Rows are independent: one argmax over the batch serves the greedy rows; the others are
processed one by one, each with its own generator, so a request's draws depend only on its
own seed and history. Results stay on the device until one host copy per step.
"""
from __future__ import annotations

import torch

from engine.request import Request


class Sampler:
    """Turns a step's logits [N, V] into one token id per request."""

    def __init__(self, base_seed: int = 0):
        self.base_seed = base_seed
        self._generators: dict[str, torch.Generator] = {}
        self._unseeded = 0

    def sample(self, logits: torch.Tensor, requests: list[Request]) -> list[int]:
        tokens = logits.argmax(dim=-1)
        for row, request in enumerate(requests):
            params = request.params
            if params.greedy and not params.has_penalties:
                continue
            row_logits = logits[row].clone()
            if params.has_penalties:
                apply_penalties(row_logits, request)
            # device-side writes only: the step's single host sync is the tolist() below
            tokens[row] = row_logits.argmax() if params.greedy else self._draw(row_logits, request)
        return tokens.tolist()

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _draw(self, logits: torch.Tensor, request: Request) -> torch.Tensor:
        probs = filtered_probs(logits, request.params)
        gen = self._generator(request, logits.device)
        return torch.multinomial(probs, 1, generator=gen)[0]

    def _generator(self, request: Request, device: torch.device) -> torch.Generator:
        gen = self._generators.get(request.request_id)
        if gen is None:
            seed = request.params.seed
            if seed is None:  # distinct per request, reproducible per engine run
                self._unseeded += 1
                seed = hash((self.base_seed, self._unseeded)) & (2**63 - 1)
            gen = torch.Generator(device=device).manual_seed(seed)
            self._generators[request.request_id] = gen
        return gen


def apply_penalties(logits: torch.Tensor, request: Request) -> None:
    """Repetition (HF-style, over prompt and output), presence and frequency (OpenAI-style,
    over the output) penalties, in place on one row."""
    p = request.params
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(request.all_token_ids)), device=logits.device)
        scores = logits[seen]
        logits[seen] = torch.where(scores < 0, scores * p.repetition_penalty,
                                   scores / p.repetition_penalty)
    if (p.presence_penalty or p.frequency_penalty) and request.num_output_tokens:
        out = torch.tensor(request.output_token_ids, device=logits.device)
        counts = torch.bincount(out, minlength=logits.shape[0]).to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)


def filtered_probs(logits: torch.Tensor, params) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p filters; returns probabilities over [V]."""
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[0]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        before = sorted_probs.cumsum(0) - sorted_probs  # mass strictly above each token
        sorted_probs = sorted_probs.masked_fill(before >= params.top_p, 0.0)
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    if params.min_p > 0.0:
        probs = probs.masked_fill(probs < params.min_p * probs.max(), 0.0)
    return probs / probs.sum()
