"""Sampling: penalties, temperature, top-k, top-p, min-p and per-request seeded draws.

One argmax over the batch serves the greedy rows. The other rows are filtered together and
drawn with the exponential race (argmax of p / E with E ~ Exp(1) picks token i with
probability p_i), each row's noise from its own generator, so a request's draws depend only
on its own seed and history, never on its batch. The race, not one uniform against the
running sum of p (inverse transform, far less noise to draw), because a winner moves only
where two of its ratios are close: the running sum moves with every earlier token's
probability, and the prefix cache or a batch's size (which picks the CPU matmul's path)
changes logits by ~1e-3, enough to change a seeded request's samples.
Results stay on the device until one host copy per step.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from engine.grammar import TokenMasks
from engine.logprobs import LogprobRows, TokenLogprob
from engine.request import Request
from engine.sampling_params import SamplingParams

# On CPU top-p looks at a row's 256 most likely tokens first, then at its 1024 where those
# do not hold the nucleus, and sorts the whole vocabulary only where 1024 do not either:
# a topk of 256 costs about half one of 1024 and a sixth of a sort, and many nuclei fit in
# 256 (where many pass 1024 they are sorted either way). Timings and the speed-up on the
# default model's own logits: docs/benchmarks.md, "Sampling on CPU" (`python -m
# loadtest.sampler_bench --model-logits`).
TOP_P_CANDIDATES = (256, 1024)


class Sampler:
    """Turns a step's logits [N, V] into one token id per request."""

    def __init__(self, base_seed: int = 0):
        self.base_seed = base_seed
        self._generators: dict[str, torch.Generator | np.random.Generator] = {}
        self._unseeded = 0
        self._masks = TokenMasks()
        self._noise_pool: ThreadPoolExecutor | None = None  # CPU noise beside the caller

    def sample(self, logits: torch.Tensor, requests: list[Request]
               ) -> tuple[list[int], list[TokenLogprob | None]]:
        """One token per row, and its log-probabilities for the rows that ask for them
        (taken from the raw logits, before the grammar mask or anything below changes them)."""
        logprobs = LogprobRows(logits, requests)
        constrained = [i for i, r in enumerate(requests) if r.grammar is not None]
        if constrained:  # structured outputs: forbidden tokens -> -inf, before any choice
            self._masks.apply(logits, constrained, [requests[i].grammar for i in constrained])
        tokens = argmax_rows(logits)
        rows = [i for i, r in enumerate(requests)
                if not (r.params.greedy and not r.params.has_penalties)]
        if rows:
            tokens[rows] = self._sample_rows(logits[rows], [requests[i] for i in rows])
        return tokens.tolist(), logprobs.gather(tokens, len(requests))

    def forget(self, request_id: str) -> None:
        self._generators.pop(request_id, None)

    def _sample_rows(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """logits [R, V] (a copy) of rows that sample or carry penalties -> tokens [R]."""
        for row, request in zip(logits, requests):
            if request.params.has_penalties:
                apply_penalties(row, request)
        greedy = torch.tensor([r.params.greedy for r in requests], device=logits.device)
        probs = filtered_probs(logits, [r.params for r in requests])
        noise = torch.ones_like(probs)  # greedy rows draw nothing
        self.draw_noise([(row, self._generator(request, row.device))
                          for row, request in zip(noise, requests) if not request.params.greedy])
        drawn = argmax_rows(probs / noise)
        return torch.where(greedy, argmax_rows(logits), drawn)

    def draw_noise(self, rows: list[tuple[torch.Tensor, torch.Generator | np.random.Generator]]
                    ) -> None:
        """Fills each row with Exp(1) draws from its request's own generator. On CPU numpy's
        (ziggurat, written in place): torch's CPU exponential_ takes a logarithm per entry,
        one at a time, 3-5x as long for a 49k vocabulary (python -m loadtest.sampler_bench).
        numpy releases the GIL while it fills a row, so on CPU the rows are split over
        torch's threads (the noise is most of a 32-row step's sampling); a row's draws
        come from its own generator whichever thread makes them, so results do not change."""
        if not rows or rows[0][0].device.type != "cpu":
            for row, gen in rows:
                row.exponential_(generator=gen)
            return
        parts = min(torch.get_num_threads(), len(rows))
        if parts == 1:
            return exponential_rows(rows)
        if self._noise_pool is None:
            self._noise_pool = ThreadPoolExecutor(torch.get_num_threads() - 1,
                                                  thread_name_prefix="sampler-noise")
        helpers = [self._noise_pool.submit(exponential_rows, rows[i::parts])
                   for i in range(1, parts)]
        exponential_rows(rows[0::parts])  # the caller draws a share too
        for helper in helpers:
            helper.result()

    def _generator(self, request: Request, device: torch.device):
        gen = self._generators.get(request.request_id)
        if gen is None:
            gen = self._generators[request.request_id] = self._new_generator(request, device)
        return gen

    def _new_generator(self, request: Request, device: torch.device):
        seed = request.params.seed
        if seed is None:  # distinct per request, reproducible per engine run
            self._unseeded += 1
            seed = hash((self.base_seed, self._unseeded)) & (2**63 - 1)
        if device.type == "cpu":
            return np.random.Generator(np.random.PCG64(seed))
        return torch.Generator(device=device).manual_seed(seed)


def exponential_rows(rows: list[tuple[torch.Tensor, np.random.Generator]]) -> None:
    """Exp(1) draws into each CPU row from its generator, on the calling thread."""
    for row, gen in rows:
        noise = row.numpy()
        gen.standard_exponential(out=noise, dtype=np.float32)
        # numpy's float32 draws include 0 (twice in 20M here): p / 0 for a forbidden
        # token (p = 0) is NaN, which argmax would pick. torch's draws are never 0.
        np.maximum(noise, np.finfo(np.float32).tiny, out=noise)


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x [R, V] -> the index of each row's largest value (the first of ties), [R]. On CPU
    numpy's argmax: torch's took 66 us for one 49k-entry row here, numpy's 8 us."""
    if x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64):
        return torch.from_numpy(x.numpy().argmax(axis=-1))
    return x.argmax(dim=-1)


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


def filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """logits [R, V] -> probabilities [R, V] after each row's temperature, top-k, top-p and
    min-p (greedy rows get temperature 1; the caller takes their argmax anyway). Top-k and
    top-p run on the rows that ask for them only: a row without them pays no selection."""
    logits = logits / _column([p.temperature if p.temperature > 0 else 1.0 for p in params], logits)
    vocab = logits.shape[-1]
    k_rows = [i for i, p in enumerate(params) if 0 < p.top_k < vocab]
    if k_rows:
        logits[k_rows] = _top_k(logits[k_rows], [params[i].top_k for i in k_rows])
    probs = torch.softmax(logits, dim=-1)
    p_rows = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if p_rows:
        top_p = _column([params[i].top_p for i in p_rows], probs)
        probs[p_rows] = top_p_filter(probs[p_rows], top_p)
    if any(p.min_p > 0.0 for p in params):
        min_p = _column([p.min_p for p in params], probs)
        probs = probs.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0)
    return probs / probs.sum(dim=-1, keepdim=True)


def _top_k(logits: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """Keep each row's ks[row] largest logits (ties with the k-th included)."""
    kth_index = torch.tensor(ks, device=logits.device)[:, None] - 1
    kth = logits.topk(max(ks), dim=-1).values.gather(1, kth_index)
    return logits.masked_fill(logits < kth, float("-inf"))


def top_p_filter(probs: torch.Tensor, top_p: torch.Tensor,
                 candidates: tuple[int, ...] = TOP_P_CANDIDATES) -> torch.Tensor:
    """Keep each row's smallest set of most likely tokens whose mass reaches top_p (< 1),
    top_p [R, 1]. `candidates`: the widths tried in turn on CPU (TOP_P_CANDIDATES)."""
    if probs.is_cuda:  # a full sort is cheap there, and the shortcut's check would sync
        return _nucleus(probs, top_p, *probs.sort(dim=-1, descending=True))
    # on CPU sorting 50k-150k entries per row dominates sampling: try candidates first
    values, order = _most_likely(probs, candidates[0])
    kept = _nucleus(probs, top_p, values, order)
    wide = _short_of(values, top_p, torch.arange(probs.shape[0]))
    for width in (*candidates[1:], None):  # None: the whole vocabulary
        if wide.numel() == 0:
            break
        rows = probs[wide]
        values, order = _most_likely(rows, width)
        kept[wide] = _nucleus(rows, top_p[wide], values, order)
        wide = _short_of(values, top_p[wide], wide) if width else wide[:0]
    return kept


def _most_likely(probs: torch.Tensor, width: int | None):
    """Each row's `width` largest values and their indices, descending (None: all)."""
    if width is None or width >= probs.shape[-1]:
        return probs.sort(dim=-1, descending=True)
    return probs.topk(width, dim=-1)


def _short_of(values: torch.Tensor, top_p: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """The rows whose candidates (values) hold less than their top_p of the mass."""
    return rows[values.sum(dim=-1) < top_p[:, 0]]


def _nucleus(probs, top_p, values, order) -> torch.Tensor:
    """probs [R, V] -> kept [R, V], from each row's most likely tokens (values/order
    [R, C], descending): those with less than top_p of the mass strictly above them."""
    before = values.cumsum(dim=-1) - values
    return torch.zeros_like(probs).scatter_(1, order, values * (before < top_p))


def _column(values: list[float], like: torch.Tensor) -> torch.Tensor:
    """Per-row parameters as an [R, 1] tensor that broadcasts over the vocabulary."""
    return torch.tensor(values, device=like.device, dtype=like.dtype)[:, None]
