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

With a proposer (speculative decoding), a decoding request may compute its proposed tokens
after its last real one in the same step; booking keeps the accepted ones and rolls the
rejected ones back (their KV slots are overwritten later, blocks only they reached are freed):

    all_token_ids: [ ... t | d0 d1 d2 ]   scheduled: t d0 d1 d2 (4 new tokens)
    sampled:       [ d0 d1 x ]            d0 d1 accepted, x replaces d2
    after booking: [ ... t d0 d1 x ]      computed up to d1; x computes next step
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.block_manager import BlockManager, PrefixHit
from engine.forks import ForkWaitlist
from engine.request import Request, RequestStatus

if TYPE_CHECKING:  # the scheduler reads token ids only; it never loads torch
    from engine.outputs import SampledToken
    from engine.speculative import NgramProposer


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
                 eos_token_ids: frozenset[int] = frozenset(), max_model_len: int | None = None,
                 proposer: NgramProposer | None = None, spec_max_rows: int | None = None,
                 tier_load_cost: float = 0.0):
        self.blocks = block_manager
        self.tier_load_cost = tier_load_cost  # budget tokens per token loaded from a tier
        self.max_num_seqs = max_num_seqs
        self.token_budget = token_budget
        self.eos_token_ids = eos_token_ids
        self.max_model_len = max_model_len
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.forks = ForkWaitlist()
        self.num_preemptions = 0
        self.num_prefill_tokens = 0  # prompt tokens computed by steps (forks share theirs)
        self.proposer = proposer  # None: no speculative decoding
        self.spec_max_rows = spec_max_rows  # decode rows proposals may fill up to; None: any
        self.num_spec_proposed = 0  # tokens proposed and verified
        self.num_spec_accepted = 0  # of those, accepted
        self.num_spec_drafts = 0  # request-steps that verified a proposal

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
        spec_room = self._spec_room()
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            if num_new == 1 and spec_room > 0:
                proposed = self._propose(request, min(budget - 1, spec_room))
                spec_room -= proposed
                num_new += proposed
            if self._make_room(request, num_new, batch):
                batch.add(request, num_new)
                budget -= num_new
                index += 1
            else:
                break  # the request itself was preempted
        return budget

    def _spec_room(self) -> int:
        """Proposed tokens this step may hold: the decode rows below `spec_max_rows` that
        the decoding requests leave (each decodes one row anyway)."""
        if self.proposer is None:
            return 0
        if self.spec_max_rows is None:
            return self.token_budget
        decoding = sum(r.num_tokens - r.num_computed_tokens == 1 for r in self.running)
        return max(0, self.spec_max_rows - decoding)

    def _propose(self, request: Request, budget: int) -> int:
        """Set the request's proposed tokens for this step; how many. Never more than the
        budget, max_tokens or the context leave room for beside the token the step samples
        anyway, and none where that would take blocks another request needs."""
        if request.grammar is not None or request.params.has_penalties:
            return 0  # their sampling depends on each earlier token: verify one at a time
        room = min(budget, request.params.max_tokens - request.num_output_tokens - 1)
        if self.max_model_len is not None:
            room = min(room, self.max_model_len - request.num_tokens - 1)
        drafts = self.proposer.propose(request, room) if room > 0 else []
        if drafts and not self.blocks.can_allocate(request, 1 + len(drafts)):
            drafts = []
        request.spec_token_ids = drafts
        return len(drafts)

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
            hit = PrefixHit([]) if forked else self.blocks.lookup_prefix(
                request, self._tier_load_limit(budget))
            if hit.more_in_tiers:
                break  # the rest of its prefix loads in the next steps' budgets
            budget -= self._tier_load_charge(hit.num_loaded)
            cached = hit.block_ids
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

    def _tier_load_limit(self, budget: int) -> int | None:
        """Blocks a lookup may load from the tiers within `budget`, leaving a token to
        compute (None: loads are free)."""
        if not self.tier_load_cost:
            return None
        return int((budget - 1) // (self.blocks.block_size * self.tier_load_cost))

    def _tier_load_charge(self, num_blocks: int) -> int:
        """Budget tokens that loading `num_blocks` blocks from the tiers costs (rounded
        first, so float error never charges a token past what the limit allowed)."""
        return math.ceil(round(num_blocks * self.blocks.block_size * self.tier_load_cost, 6))

    def _preempt(self, request: Request) -> None:
        self.blocks.free(request)
        request.spec_token_ids = []
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.status = RequestStatus.WAITING
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def update_from_output(self, batch: ScheduledBatch, sampled: list[list[SampledToken]]
                           ) -> list[tuple[Request, list[SampledToken]]]:
        """Book a step's result (`sampled`: per batch request the tokens it got, in order:
        [] for a request still catching up, one token, or with proposed tokens the accepted
        ones and the one sampled after them). Each request's computed tokens advance (its
        newly full blocks join the prefix cache); the tokens are appended one by one until
        a token-level stop (eos, stop_token_ids, max_tokens, context) finishes the request
        and frees its blocks. Returns (request, tokens appended) for each request that got
        tokens, in batch order; `request.finish_reason` tells which of them finished."""
        booked = []
        for request, num_new, samples in zip(batch.requests, batch.num_new_tokens, sampled):
            self.num_prefill_tokens += max(0, min(num_new, request.num_prompt_tokens
                                                  - request.num_computed_tokens))
            num_rejected = self._book_proposal(request, samples)
            request.num_computed_tokens += num_new - num_rejected
            self.blocks.cache_full_blocks(request)
            if not samples:
                continue
            if request.num_output_tokens == 0:  # its prompt is computed: fork its samples
                self._fork(request, self.forks.take(request))
            booked.append((request, self._append(request, samples)))
            if num_rejected and not request.is_finished:
                self.blocks.trim(request, request.num_tokens)
        return booked

    def _book_proposal(self, request: Request, samples: list[SampledToken]) -> int:
        """Count the request's proposed tokens for this step and clear them; how many
        were rejected (their KV is not kept)."""
        num_proposed = len(request.spec_token_ids)
        if not num_proposed:
            return 0
        num_accepted = len(samples) - 1
        request.spec_token_ids = []
        self.proposer.record(request, num_proposed, num_accepted)
        self.num_spec_proposed += num_proposed
        self.num_spec_accepted += num_accepted
        self.num_spec_drafts += 1
        return num_proposed - num_accepted

    def _append(self, request: Request, samples: list[SampledToken]) -> list[SampledToken]:
        """Append the tokens up to and including the first that finishes the request."""
        for count, sample in enumerate(samples, 1):
            request.all_token_ids.append(sample.token_id)
            reason = self._check_stop(request, sample.token_id)
            if reason is not None:
                self.finish(request, reason)
                return samples[:count]
        return samples

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
        if self.proposer is not None:
            self.proposer.forget(request)
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
