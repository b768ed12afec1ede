"""Admission policy: a snapshot of the server's state in, a small Decision out.

Pure code: no torch, no sockets, no clocks (the caller passes `now`), so every rule is
testable with a fake clock and made-up signals.

    request --> rate limits -----> rate_limited   (per socket, per key, key token bucket)
            --> overload state --> overloaded     (KV / GPU util / GPU memory / RSS, hysteresis)
            --> free engine slot and nobody ahead --> admit
            --> queue bounds ----> overloaded     (requests, prompt tokens; chat has a reserve)
            --> estimated wait --> overloaded     (would break the time-to-first-token bound,
                                                   or cannot be estimated yet)
            --> queue

The wait is estimated from the drain rate measured while the engine is saturated, or,
before any is measured (a replica that just became ready), from the configured prior
`initial_drain_rps`. With neither, no request is queued: one that finds no free slot is
refused at once rather than refused late, after waiting out its queue budget.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from scheduler.config import SchedulerConfig

ADMIT, QUEUE, REJECT = "admit", "queue", "reject"
OVERLOADED, RATE_LIMITED = "overloaded", "rate_limited"
KINDS = ("chat", "generate")  # chat turns are served ahead of bulk generate


@dataclass(frozen=True, slots=True)
class Signals:
    """The server's load at one instant; None where a signal is unavailable."""

    num_waiting: int = 0  # our queue plus the engine's own waiting requests
    waiting_prompt_tokens: int = 0
    num_running: int = 0  # requests holding an engine slot
    oldest_running_s: float | None = None  # how long the oldest slot holder has held it
    kv_usage: float | None = None
    gpu_util: float | None = None
    gpu_memory_used: int | None = None
    gpu_memory_total: int | None = None
    rss_bytes: int | None = None
    drain_rps: float | None = None  # completions per second while saturated
    drain_tps: float | None = None  # prompt tokens drained per second while saturated


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    """What the policy knows about one incoming request."""

    kind: str  # "chat" | "generate"
    priority: int = 0
    prompt_tokens: int = 0
    socket_inflight: int = 0
    key_inflight: int = 0
    queue_ahead: int = 0  # queued requests that would be served before this one
    queue_ahead_tokens: int = 0
    bucket: "TokenBucket | None" = None


@dataclass(frozen=True, slots=True)
class Decision:
    """admit (run now), queue (wait for an engine slot) or reject with a reason."""

    action: str
    reason: str | None = None
    retry_after_ms: int | None = None
    detail: str = ""


class TokenBucket:
    """Tokens-per-minute budget of one API key. Spending may go negative (output tokens
    are charged after the fact); the key is refused until the bucket refills."""

    __slots__ = ("size", "rate_per_s", "tokens", "updated_at")

    def __init__(self, size: int, tokens_per_minute: int, now: float):
        self.size = size
        self.rate_per_s = tokens_per_minute / 60.0
        self.tokens = float(size)
        self.updated_at = now

    def available(self, now: float) -> float:
        elapsed = max(0.0, now - self.updated_at)
        return min(float(self.size), self.tokens + elapsed * self.rate_per_s)

    def spend(self, amount: int, now: float) -> None:
        self.tokens = self.available(now) - amount
        self.updated_at = now

    def seconds_until(self, amount: float, now: float) -> float:
        """Time until `amount` tokens are available (amount is capped at the size)."""
        deficit = min(amount, self.size) - self.available(now)
        return max(0.0, deficit / self.rate_per_s)


def overload_cause(signals: Signals, config: SchedulerConfig, overloaded: bool) -> str | None:
    """The signal that holds the server in overload, or None.

    Not overloaded: enter when a signal reaches its enter threshold. Overloaded: stay
    while any signal is above its (lower) leave threshold. That gap is the hysteresis.
    """
    for name, value, enter, leave in _overload_signals(signals, config):
        if value is None or enter is None:
            continue
        if (value > leave) if overloaded else (value >= enter):
            return name
    return None


def _overload_signals(s: Signals, c: SchedulerConfig):
    gpu_mem = None
    if s.gpu_memory_used is not None and s.gpu_memory_total:
        gpu_mem = s.gpu_memory_used / s.gpu_memory_total
    rss_leave = c.max_rss_bytes * c.rss_leave_ratio if c.max_rss_bytes else None
    return (
        ("kv_usage", s.kv_usage, c.kv_usage_enter, c.kv_usage_leave),
        ("gpu_util", s.gpu_util, c.gpu_util_enter, c.gpu_util_leave),
        ("gpu_memory", gpu_mem, c.gpu_memory_enter, c.gpu_memory_leave),
        ("rss", s.rss_bytes, c.max_rss_bytes, rss_leave),
    )


def decide(config: SchedulerConfig, signals: Signals, request: AdmissionRequest,
           overload: str | None, now: float) -> Decision:
    """Admit, queue or refuse one request. `overload` is overload_cause's current answer."""
    if signals.drain_rps is None and config.initial_drain_rps is not None:
        signals = dataclasses.replace(signals, drain_rps=config.initial_drain_rps)
    refusal = _rate_limit(config, signals, request, now)
    if refusal is not None:
        return refusal
    if overload is not None:
        wait = estimate_wait_s(signals, signals.num_waiting, signals.waiting_prompt_tokens)
        return _reject(config, OVERLOADED, wait, f"overload signal: {overload}")
    if request.queue_ahead == 0 and signals.num_running < config.max_running_requests:
        return Decision(ADMIT)
    refusal = _queue_bounds(config, signals, request)
    if refusal is not None:
        return refusal
    return _wait_bound(config, signals, request)


def _rate_limit(c: SchedulerConfig, s: Signals, r: AdmissionRequest,
                now: float) -> Decision | None:
    service_s = _mean_service_s(s)
    if r.socket_inflight >= c.max_inflight_per_socket:
        return _reject(c, RATE_LIMITED, service_s, "too many requests in flight on this socket")
    if c.max_inflight_per_key is not None and r.key_inflight >= c.max_inflight_per_key:
        return _reject(c, RATE_LIMITED, service_s, "too many requests in flight for this key")
    if r.bucket is not None:
        wait = r.bucket.seconds_until(r.prompt_tokens, now)
        if wait > 0:
            return _reject(c, RATE_LIMITED, wait, "tokens-per-minute budget spent")
    return None


def _queue_bounds(c: SchedulerConfig, s: Signals, r: AdmissionRequest) -> Decision | None:
    chat = r.kind == "chat"
    max_requests = c.max_waiting_requests if chat else c.generate_waiting_limit
    max_tokens = c.max_waiting_prompt_tokens if chat else c.generate_waiting_tokens_limit
    if s.num_waiting >= max_requests:
        excess = s.num_waiting - max_requests + 1
        wait = excess / s.drain_rps if s.drain_rps else None
        return _reject(c, OVERLOADED, wait, "waiting queue is full")
    if s.waiting_prompt_tokens + r.prompt_tokens > max_tokens:
        excess = s.waiting_prompt_tokens + r.prompt_tokens - max_tokens
        wait = excess / s.drain_tps if s.drain_tps else None
        return _reject(c, OVERLOADED, wait, "waiting queue holds too many prompt tokens")
    return None


def _wait_bound(c: SchedulerConfig, s: Signals, r: AdmissionRequest) -> Decision:
    """Queue only if the request would reach an engine slot within its queue budget."""
    budget_s = c.ttft_bound_s * c.queue_budget_fraction
    wait = estimate_wait_s(s, r.queue_ahead + 1, r.queue_ahead_tokens + r.prompt_tokens)
    if wait is None:  # no rate measured and no prior: a queued request might wait it out
        return _reject(c, OVERLOADED, None, "no engine slot is free and the drain rate is "
                                            "not measured yet")
    if wait > budget_s:
        return _reject(c, OVERLOADED, wait - budget_s,
                       "estimated wait exceeds the time-to-first-token bound")
    return Decision(QUEUE)


def estimate_wait_s(s: Signals, requests: int, prompt_tokens: int) -> float | None:
    """Seconds until the last of `requests` (holding `prompt_tokens`) gets an engine slot.

    Slots free at the drain rate on average, but requests started together finish
    together: the first slot frees only when the oldest holder has served its mean
    service time. So: that remainder, then one slot per 1/drain_rps. Exact for lock-step
    waves, and on the safe side (never early) for staggered ones.
    """
    if not s.drain_rps:
        return None
    first = 1.0 / s.drain_rps  # the average gap, when the holders' ages are unknown
    service_s = _mean_service_s(s)
    if service_s is not None and s.oldest_running_s is not None:
        first = max(0.0, service_s - s.oldest_running_s)
    wait = first + max(0, requests - 1) / s.drain_rps
    if s.drain_tps:
        wait = max(wait, prompt_tokens / s.drain_tps)
    return wait


def _mean_service_s(s: Signals) -> float | None:
    """Little's law: running requests / completion rate = time one request holds a slot."""
    if not s.drain_rps or not s.num_running:
        return None
    return s.num_running / s.drain_rps


def _reject(c: SchedulerConfig, reason: str, wait_s: float | None, detail: str) -> Decision:
    """A refusal whose retry_after_ms is the estimate, clamped; unknown -> a second."""
    ms = 1000.0 if wait_s is None else wait_s * 1000.0
    ms = min(max(ms, c.retry_after_min_ms), c.retry_after_max_ms)
    return Decision(REJECT, reason, int(math.ceil(ms)), detail)

