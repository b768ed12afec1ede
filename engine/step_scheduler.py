"""StepScheduler: continuous batching under a per-step token budget (vLLM v1's one rule).

Every step, each running request gets min(num_tokens - num_computed_tokens, budget left)
new tokens, then waiting requests are admitted while budget and blocks last. Chunked
prefill (a long prompt spans steps), prefix hits (computed starts past the cached blocks)
and decode (one new token) all fall out of that rule. When blocks run out, the most
recently admitted running request is preempted: its blocks are freed and it is recomputed
later (its output so far is kept, so the recompute lands on the same state).

The scheduler both plans a step (`schedule`) and books its result (`update_from_output`:
computed tokens advance, sampled tokens are appended, token-level stops finish and free
their requests), so the engine core only drives schedule -> execute -> update_from_output.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.block_manager import BlockManager
from engine.forks import ForkWaitlist
from engine.request import Request, RequestStatus

if TYPE_CHECKING:  # the scheduler reads token ids only; it never loads torch
    from engine.outputs import SampledToken


@dataclass
class ScheduledBatch:
    """One step's work: requests in order with how many new tokens each computes."""

    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    def add(self, request: Request, num_new: int) -> None:
        self.requests.append(request)
        self.num_new_tokens.append(num_new)

    @property
    def total_tokens(self) -> int:
        return sum(self.num_new_tokens)


class StepScheduler:
    """Owns the waiting queue and the running list; the block manager owns the blocks."""

    def __init__(self, block_manager: BlockManager, max_num_seqs: int, token_budget: int, *,
                 eos_token_ids: frozenset[int] = frozenset(), max_model_len: int | None = None):
        self.blocks = block_manager
        self.max_num_seqs = max_num_seqs
        self.token_budget = token_budget
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.forks = ForkWaitlist()
        self.num_preemptions = 0
        self.num_prefill_tokens = 0  # prompt tokens computed by steps (forks share theirs)

    def add(self, request: Request, parent: Request | None = None) -> None:
        """Queue a request; a sample of `parent` (the same prompt, `n > 1`) shares the
        parent's prompt blocks instead of computing them again."""
        if parent is None or parent.is_finished:
            self.waiting.append(request)
        elif parent.num_output_tokens == 0:
            self.forks.wait_for(parent, request)  # until the parent's prompt is computed
        elif parent.block_ids and parent.status is RequestStatus.RUNNING:
            self._fork(parent, [request])
        else:
            self.waiting.append(request)  # the prefix cache may still hold the prompt

    def _fork(self, parent: Request, children: list[Request]) -> None:
        for child in reversed(children):  # next in line, in arrival order
            self.blocks.fork(parent, child)
            self.waiting.appendleft(child)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self._schedule_running(batch, self.token_budget)
        if not batch.preempted:
            self._schedule_waiting(batch, budget)
        return batch

    def _schedule_running(self, batch: ScheduledBatch, budget: int) -> int:
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if self._make_room(request, num_new, batch):
                batch.add(request, num_new)
                budget -= num_new
                index += 1
            else:
                break  # the request itself was preempted
        return budget

    def _make_room(self, request: Request, num_new: int, batch: ScheduledBatch) -> bool:
        """Allocate blocks for `request`, preempting from the back of `running` if needed."""
        while not self.blocks.allocate(request, num_new):
            victim = self.running.pop()
            self._preempt(victim)
            batch.preempted.append(victim)
            if victim is request:
                return False
        return True

    def _schedule_waiting(self, batch: ScheduledBatch, budget: int) -> None:
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            forked = bool(request.block_ids)  # holds its parent's prompt blocks already
            cached = [] if forked else self.blocks.find_cached_prefix(request)
            num_computed = (request.num_computed_tokens if forked
                            else len(cached) * self.blocks.block_size)
            num_new = min(request.num_tokens - num_computed, budget)
            request.num_computed_tokens = num_computed
            if not self.blocks.allocate(request, num_new, cached):
                request.num_computed_tokens = num_computed if forked else 0
                if forked and not self.running:  # nothing will free blocks: let go of
                    self.blocks.free(request)  # the shared ones, recompute as a prompt
                    request.num_computed_tokens = 0
                break
            if request.num_preemptions == 0:
                request.num_cached_tokens = num_computed
            self.waiting.popleft()
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            batch.add(request, num_new)
            budget -= num_new

    def _preempt(self, request: Request) -> None:
        self.blocks.free(request)
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def update_from_output(self, batch: ScheduledBatch, sampled: list[SampledToken | None]
                           ) -> list[tuple[Request, SampledToken]]:
        """Book a step's result (`sampled`: one entry per batch request, None for a request
        still catching up). Each request's computed tokens advance (its newly full blocks
        join the prefix cache); a sampled token is appended and a token-level stop (eos,
        stop_token_ids, max_tokens, context) finishes the request and frees its blocks.
        Returns (request, sampled) for each request that got a token, in batch order;
        `request.finish_reason` tells which of them finished."""
        booked = []
        for request, num_new, sample in zip(batch.requests, batch.num_new_tokens, sampled):
            self.num_prefill_tokens += max(0, min(num_new, request.num_prompt_tokens
                                                  - request.num_computed_tokens))
            request.num_computed_tokens += num_new
            self.blocks.cache_full_blocks(request)
            if sample is None:
                continue
            if request.num_output_tokens == 0:  # its prompt is computed: fork its samples
                self._fork(request, self.forks.take(request))
            request.all_token_ids.append(sample.token_id)
            reason = self._check_stop(request, sample.token_id)
            if reason is not None:
                self.finish(request, reason)
            booked.append((request, sample))
        return booked

    def _check_stop(self, request: Request, token: int) -> str | None:
        params = request.params
        if request.grammar is not None:  # the sampler's mask allowed only accepted tokens
            if not request.grammar.accept_token(token):
                return "error"
            if request.grammar.is_terminated():
                return "stop"
        if token in params.stop_token_ids or (token in self.eos_token_ids
                                               and not params.ignore_eos):
            return "stop"
        if request.num_output_tokens >= params.max_tokens or (
                self.max_model_len is not None and request.num_tokens >= self.max_model_len):
            return "length"
        return None

    def finish(self, request: Request, reason: str) -> None:
        """Remove a request (finished or aborted) wherever it is and free its blocks."""
        if request.status is RequestStatus.RUNNING:
            self.running.remove(request)
        elif request.status is RequestStatus.WAITING and not self.forks.discard(request):
            self.waiting.remove(request)
        heir = self.forks.orphan(request)
        if heir is not None:  # it ended before its first token: its samples go on
            self.waiting.appendleft(heir)
        self.blocks.free(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
