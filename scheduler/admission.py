"""AdmissionController: the gateway's one door into the engine.

    gateway: ticket = controller.try_admit(...)   # microseconds; raises Rejected
             await ticket.wait()                  # until an engine slot is free
             ... engine.generate(...) ...
             ticket.release(n_out, finish_reason) # always, in a finally

At most `max_running_requests` tickets hold engine slots; the rest wait in a bounded
priority queue here (chat turns first, then higher `priority`, then arrival order), so
the engine's own waiting queue stays short and refusals happen before any work.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections import Counter
from collections.abc import Callable

from scheduler.config import SchedulerConfig
from scheduler.policy import (ADMIT, KINDS, OVERLOADED, REJECT, AdmissionRequest, Decision,
                              Signals, TokenBucket, decide, overload_cause)
from scheduler.signals import DrainRate, ResourceSampler
from scheduler.ticket import (DONE, QUEUED, RUNNING, DoorPass, InvalidAdmission, Rejected,
                              Ticket)

FINISHED = frozenset({"stop", "length"})  # the finish reasons of completed work


class AdmissionController:
    """Admission, queueing and slot accounting in front of the engine.

    `engine_stats` returns the engine's latest EngineStats (kv_usage, num_waiting) or None
    while it loads; `sampler` gives GPU and RSS signals (None: those signals are off).
    `clock` is injectable for tests.
    """

    def __init__(self, config: SchedulerConfig, engine_stats: Callable[[], object] | None = None,
                 sampler: ResourceSampler | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.config = config
        self.engine_stats = engine_stats
        self.sampler = sampler
        self.clock = clock
        self.drain = DrainRate(config.drain_window_s)
        self.rejections: Counter[str] = Counter()
        self.expired = 0  # of the rejections, those of queued tickets past their budget
        self.queue_time_observers: list[Callable[[float], None]] = []
        self._running: dict[int, Ticket] = {}  # in grant order: the first is the oldest
        self._queue: dict[tuple[int, int], dict[int, Ticket]] = {}  # key -> FIFO bucket
        self._queued_tokens = 0
        self._num_queued = 0
        self._per_socket: Counter = Counter()
        self._per_key: Counter = Counter()
        self._buckets: dict[str, TokenBucket] = {}
        self._overload: str | None = None
        self._at_door = 0  # requests past check_door that have not asked for a slot yet
        self._ids = itertools.count()

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        if self.sampler is not None:
            self.sampler.start()

    async def stop(self) -> None:
        """Refuse everything still queued; stop sampling."""
        self.refuse_queued(OVERLOADED, self.config.retry_after_max_ms, "server stopping")
        if self.sampler is not None:
            await self.sampler.stop()

    def refuse_queued(self, code: str, retry_after_ms: int, message: str) -> None:
        """Refuse every queued ticket now (a drain's deadline, shutdown): each waiter gets
        Rejected, and no queued request takes a slot that a cancelled one gives back."""
        now = self.clock()
        for bucket in list(self._queue.values()):
            for ticket in list(bucket.values()):
                self._unqueue(ticket)
                ticket.state = DONE
                self._count_out(ticket, 0, now)
                if not ticket._future.done():
                    ticket._future.set_exception(Rejected(code, retry_after_ms, message))
        self._update_busy(now)

    # -- the door -----------------------------------------------------------------------
    def try_admit(self, kind: str, priority: int = 0, prompt_tokens: int = 0,
                  socket_id=None, api_key: str | None = None) -> Ticket:
        """Admit (a ticket that runs now), queue (a ticket to `wait()` on) or raise Rejected.

        Never awaits: the answer comes from counters and the latest signal samples.
        """
        now = self.clock()
        decision = self._decide(kind, priority, prompt_tokens, socket_id, api_key, now)
        ticket = Ticket(self, next(self._ids), kind, priority, prompt_tokens, socket_id,
                        api_key, now)
        self._count_in(ticket, now)
        if decision.action == ADMIT:
            self._grant(ticket, now)
        else:
            self._enqueue(ticket)
        self._update_busy(now)
        return ticket

    def check_door(self, kind: str, priority: int = 0, socket_id=None,
                   api_key: str | None = None) -> DoorPass:
        """Raise Rejected (or InvalidAdmission) if a request of no prompt tokens would be
        refused now. A longer prompt only makes refusal likelier, so a caller checks this
        before the work of rendering and tokenizing a prompt that would be refused anyway:
        a burst is then refused at the loop's latency, not behind the tokenizer's queue.

        The pass it returns holds the request's place until it asks for its slot
        (`try_admit`) or gives up: close it then. A burst whose frames all arrive before
        the first prompt is rendered is thereby refused at the door beyond the slots and
        queue places it can get, not after rendering."""
        self._decide(kind, priority, 0, socket_id, api_key, self.clock(),
                     at_door=self._at_door)
        self._at_door += 1
        return DoorPass(self)

    def _decide(self, kind: str, priority: int, prompt_tokens: int, socket_id,
                api_key: str | None, now: float, at_door: int = 0) -> Decision:
        """The policy's admit or queue decision; a refusal is counted and raised. The
        `at_door` requests (past the door, still rendering) count as ahead of this one."""
        self._check_args(kind, priority, prompt_tokens, api_key)
        signals = self.signals()
        self._update_overload(signals)
        ahead, ahead_tokens = self._ahead((KINDS.index(kind), -priority))
        if at_door:
            signals, ahead = _places_taken(signals, ahead, at_door,
                                           self.config.max_running_requests)
        request = AdmissionRequest(
            kind, priority, prompt_tokens,
            socket_inflight=self._per_socket[socket_id] if socket_id is not None else 0,
            key_inflight=self._per_key[api_key] if api_key is not None else 0,
            queue_ahead=ahead, queue_ahead_tokens=ahead_tokens,
            bucket=self._bucket(api_key, now))
        decision = decide(self.config, signals, request, self._overload, now)
        if decision.action == REJECT:
            self.rejections[decision.reason] += 1
            raise Rejected(decision.reason, decision.retry_after_ms, decision.detail)
        return decision

    def release(self, ticket: Ticket, tokens_generated: int = 0,
                finish_reason: str | None = None) -> None:
        """The request is over (finished, cancelled or failed); free its place. Idempotent.

        Only a request that finished (`stop`, `length`) counts toward the drain rate: a
        cancelled or failed one frees its slot early, and counting it would promise
        retries sooner than the engine can serve them."""
        if ticket.state == DONE:
            return
        now = self.clock()
        if ticket.state == QUEUED:
            self._unqueue(ticket)
        else:
            del self._running[ticket.id]
            if finish_reason in FINISHED:
                self.drain.record(now, ticket.prompt_tokens)
        ticket.state = DONE
        if ticket._future is not None and not ticket._future.done():
            ticket._future.cancel()
        self._count_out(ticket, tokens_generated, now)
        self._grant_waiting(now)
        self._update_busy(now)

    # -- signals ------------------------------------------------------------------------
    def signals(self) -> Signals:
        """The snapshot the policy decides on (also what /metrics and /ready report)."""
        # Busy time accrues up to now, not only up to the last admission or release: a
        # rate that has been measured long enough is used from the first request after.
        self._update_busy(self.clock())
        stats = self.engine_stats() if self.engine_stats is not None else None
        s = self.sampler
        oldest = next(iter(self._running.values()), None)
        return Signals(
            num_waiting=self._num_queued + (stats.num_waiting if stats else 0),
            waiting_prompt_tokens=self._queued_tokens,
            num_running=self.num_running,
            oldest_running_s=None if oldest is None else self.clock() - oldest.granted_at,
            kv_usage=stats.kv_usage if stats else None,
            gpu_util=s.gpu_util if s else None,
            gpu_memory_used=s.gpu_memory_used if s else None,
            gpu_memory_total=s.gpu_memory_total if s else None,
            rss_bytes=s.rss_bytes if s else None,
            drain_rps=self.drain.requests_per_s,
            drain_tps=self.drain.tokens_per_s)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return self._num_queued

    @property
    def num_at_door(self) -> int:
        """Requests past the door that have not asked for a slot yet (open passes)."""
        return self._at_door

    @property
    def overloaded(self) -> str | None:
        """The overload signal in force (for /ready), or None."""
        self._update_overload(self.signals())
        return self._overload

    def _update_overload(self, signals: Signals) -> None:
        self._overload = overload_cause(signals, self.config, self._overload is not None)

    # -- queue and accounting -------------------------------------------------------------
    def _check_args(self, kind: str, priority: int, prompt_tokens: int,
                    api_key: str | None) -> None:
        if kind not in KINDS:
            raise InvalidAdmission("kind", f"must be one of {KINDS}")
        c = self.config
        if not isinstance(priority, int) or not c.priority_min <= priority <= c.priority_max:
            raise InvalidAdmission("priority", f"must be an integer in "
                                               f"[{c.priority_min}, {c.priority_max}]")
        # Refused, not clamped: a client that asked for more than it may have is told so
        # rather than served at a priority it did not ask for.
        if priority > (cap := c.priority_cap(api_key)):
            raise InvalidAdmission("priority", f"at most {cap} for this API key "
                                               "(max_client_priority, key_max_priority)")
        if not isinstance(prompt_tokens, int) or prompt_tokens < 0:
            raise InvalidAdmission("prompt_tokens", "must be a non-negative integer")

    def _ahead(self, key: tuple[int, int]) -> tuple[int, int]:
        """Queued requests (and their prompt tokens) that would be served before `key`."""
        count = tokens = 0
        for other, bucket in self._queue.items():
            if other <= key:
                count += len(bucket)
                tokens += sum(t.prompt_tokens for t in bucket.values())
        return count, tokens

    def _enqueue(self, ticket: Ticket) -> None:
        loop = asyncio.get_running_loop()
        ticket._future = loop.create_future()
        # Expire at the queue budget, not the whole bound: the rest of ttft_bound_s is for
        # the prefill and first token once the ticket gets its slot.
        budget_s = self.config.ttft_bound_s * self.config.queue_budget_fraction
        ticket._timer = loop.call_later(budget_s, self._expire, ticket)
        self._queue.setdefault(ticket.queue_key, {})[ticket.id] = ticket
        self._num_queued += 1
        self._queued_tokens += ticket.prompt_tokens

    def _unqueue(self, ticket: Ticket) -> None:
        ticket._timer.cancel()
        bucket = self._queue[ticket.queue_key]
        del bucket[ticket.id]
        if not bucket:
            del self._queue[ticket.queue_key]
        self._num_queued -= 1
        self._queued_tokens -= ticket.prompt_tokens

    def _grant_waiting(self, now: float) -> None:
        while self._queue and self.num_running < self.config.max_running_requests:
            bucket = self._queue[min(self._queue)]
            ticket = next(iter(bucket.values()))
            self._unqueue(ticket)
            self._grant(ticket, now)
            if not ticket._future.done():  # done: its waiter was cancelled; release follows
                ticket._future.set_result(None)

    def _grant(self, ticket: Ticket, now: float) -> None:
        ticket.state = RUNNING
        ticket.granted_at = now
        self._running[ticket.id] = ticket
        for observe in self.queue_time_observers:
            observe(now - ticket.created_at)

    def _expire(self, ticket: Ticket) -> None:
        """A queued ticket outlived its queue budget: refuse it now, with a fresh estimate."""
        if ticket.state != QUEUED:
            return
        self._unqueue(ticket)
        ticket.state = DONE
        now = self.clock()
        self._count_out(ticket, 0, now)
        self._update_busy(now)
        self.rejections[OVERLOADED] += 1
        self.expired += 1
        rps = self.drain.requests_per_s
        retry_ms = 1000.0 * self._num_queued / rps if rps else 1000.0
        retry_ms = min(max(retry_ms, self.config.retry_after_min_ms),
                       self.config.retry_after_max_ms)
        if not ticket._future.done():
            ticket._future.set_exception(Rejected(
                OVERLOADED, int(retry_ms),
                "queued past its share of the time-to-first-token bound"))

    def _count_in(self, ticket: Ticket, now: float) -> None:
        if ticket.socket_id is not None:
            self._per_socket[ticket.socket_id] += 1
        if ticket.api_key is not None:
            self._per_key[ticket.api_key] += 1
            bucket = self._bucket(ticket.api_key, now)
            if bucket is not None:
                bucket.spend(ticket.prompt_tokens, now)

    def _count_out(self, ticket: Ticket, tokens_generated: int, now: float) -> None:
        _decrement(self._per_socket, ticket.socket_id)
        if ticket.api_key is None:
            return
        _decrement(self._per_key, ticket.api_key)
        bucket = self._buckets.get(ticket.api_key)
        if bucket is not None:
            bucket.spend(tokens_generated, now)

    def _bucket(self, api_key: str | None, now: float) -> TokenBucket | None:
        size = self.config.key_bucket_size
        if api_key is None or size is None:
            return None
        bucket = self._buckets.get(api_key)
        if bucket is None:
            bucket = self._buckets[api_key] = TokenBucket(
                size, self.config.key_tokens_per_minute, now)
        return bucket

    def _update_busy(self, now: float) -> None:
        """The drain rate is measured only while the engine is saturated."""
        saturated = self._num_queued > 0 or self.num_running >= self.config.max_running_requests
        self.drain.set_busy(now, saturated)


def _decrement(counter: Counter, key) -> None:
    if key is None:
        return
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]  # so per-socket counts do not outlive their sockets


def _places_taken(signals: Signals, ahead: int, at_door: int,
                  max_running: int) -> tuple[Signals, int]:
    """`signals` and the queued count ahead as if `at_door` requests had asked for their
    slots: free slots first, the rest queued ahead (their prompt sizes are not known yet)."""
    running = signals.num_running + at_door
    queued = max(0, running - max_running)
    return (dataclasses.replace(signals, num_running=running - queued,
                                num_waiting=signals.num_waiting + queued), ahead + queued)
