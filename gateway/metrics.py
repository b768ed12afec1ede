"""Prometheus metrics (prefix tokenwire_), one CollectorRegistry per app.

Latency histograms and socket gauges are kept by the gateway as frames are written;
engine-side counters and gauges are read from the engine's stats snapshot at scrape time,
so they cost nothing between scrapes.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from engine.outputs import EngineStats

P = "tokenwire_"
_LATENCY_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
                    1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
_ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15,
                0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
# A refusal at the door takes microseconds of policy; what it waits for is the event loop.
_REFUSAL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

# (util 0..1, memory bytes) of the GPU, or None where there is none (the scheduler's
# NVML sampler plugs in here; it samples off the event loop).
GpuSampler = Callable[[], "tuple[float, int] | None"]


class Metrics:
    """Every metric docs/http-api.md lists, registered in this object's own registry."""

    def __init__(self, engine_stats: Callable[[], EngineStats | None],
                 gpu_sampler: GpuSampler | None = None):
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram(P + "time_to_first_token_seconds", "Request received to first "
                              "token written", buckets=_LATENCY_BUCKETS, registry=r)
        self.itl = Histogram(P + "inter_token_latency_seconds", "Gap between tokens, "
                             "measured when their frame is written", buckets=_ITL_BUCKETS,
                             registry=r)
        self.e2e = Histogram(P + "e2e_request_latency_seconds", "Request received to done "
                             "written", buckets=_LATENCY_BUCKETS, registry=r)
        self.queue_time = Histogram(P + "request_queue_time_seconds", "Request received to "
                                    "admitted", buckets=_LATENCY_BUCKETS, registry=r)
        self.ws_active = Gauge(P + "websocket_connections_active", "Open WebSockets",
                               registry=r)
        self.sessions_active = Gauge(P + "sessions_active", "Sessions in memory: attached to a "
                                     "socket, or saving after their last one closed",
                                     registry=r)
        self.rejections = Counter(P + "admission_rejections", "Requests refused at "
                                  "admission", ["reason"], registry=r)
        self.refusal_time = Histogram(P + "admission_refusal_seconds", "Request received to "
                                      "its refusal by admission (at the door or from the "
                                      "queue)", buckets=_REFUSAL_BUCKETS, registry=r)
        self.requests = Counter(P + "requests", "Finished requests", ["finish_reason"],
                                registry=r)
        self.connection_refusals = Counter(P + "connection_refusals", "Connections refused "
                                           "or cut before a request: caps, slow heads, "
                                           "slow bodies", ["reason"], registry=r)
        self.previous_responses = Counter(
            P + "responses_previous", "Responses continuing a chain, by where their "
            "previous response came from: a socket's own last one (socket: its store "
            "version checked, its record not read) or the store", ["source"], registry=r)
        r.register(_EngineCollector(engine_stats, gpu_sampler))

    def observe_delta(self, stream, n: int, now: float) -> None:
        """A frame with `n` of a request's tokens was written (n 0: a whole response)."""
        gap = stream.written(now)
        if gap is None:
            self.ttft.observe(now - stream.received)
        elif n > 0:
            # Tokens that arrive together in one frame share the gap since the last frame.
            for _ in range(n):
                self.itl.observe(gap / n)

    def observe_done(self, stream, now: float) -> None:
        """A request's `done` (or last SSE chunk) was written."""
        self.e2e.observe(now - stream.received)
        if stream.admitted is not None:
            self.queue_time.observe(stream.admitted - stream.received)
        self.requests.labels(stream.finish_reason or "stop").inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector:
    """Reads the engine's latest stats snapshot at scrape time."""

    def __init__(self, engine_stats, gpu_sampler):
        self._engine_stats = engine_stats
        self._gpu_sampler = gpu_sampler

    def describe(self):
        return []  # families are only known at collect time; skip the registry's dry run

    def collect(self):
        s = self._engine_stats() or EngineStats()
        yield _gauge("requests_running", "Requests in the engine's running batch", s.num_running)
        yield _gauge("requests_waiting", "Requests waiting in the engine", s.num_waiting)
        yield _gauge("kv_cache_usage_ratio", "Share of KV blocks in use", s.kv_usage)
        gpu = self._gpu_sampler() if self._gpu_sampler else None
        util, mem = gpu if gpu is not None else (math.nan, math.nan)  # NaN: no GPU here
        yield _gauge("gpu_utilization_ratio", "GPU utilization (NVML), NaN without a GPU", util)
        yield _gauge("gpu_memory_used_bytes", "GPU memory used (NVML), NaN without a GPU", mem)
        yield _counter("prompt_tokens", "Prompt tokens prefilled", s.prompt_tokens)
        yield _counter("generation_tokens", "Tokens generated", s.generation_tokens)
        yield _counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache",
                       s.prefix_cache_queries)
        yield _counter("prefix_cache_hits", "Prompt tokens found in the prefix cache",
                       s.prefix_cache_hits)
        yield _counter("prefill_tokens", "Prompt tokens computed (cache hits and n>1 forks "
                       "compute none)", s.prefill_tokens)
        yield _counter("fork_shared_tokens", "Prompt tokens n>1 samples shared with their "
                       "first sample instead of computing", s.fork_shared_tokens)
        yield _counter("preemptions", "Requests preempted for KV blocks", s.num_preemptions)
        yield _counter("spec_decode_num_drafts", "Speculative decoding: request-steps that "
                       "verified proposed tokens", s.spec_draft_steps)
        yield _counter("spec_decode_num_draft_tokens", "Speculative decoding: tokens proposed "
                       "and verified", s.spec_proposed_tokens)
        yield _counter("spec_decode_num_accepted_tokens", "Speculative decoding: proposed "
                       "tokens accepted", s.spec_accepted_tokens)
        yield from _tier_families(s.kv_tiers)


# (metric, help, TierStats field, counter?) per KV tier (labelled tier="host"|"disk")
_TIER_SERIES = (
    ("kv_tier_hit_tokens", "Prompt tokens loaded from the KV tier into the pool", "hits", True),
    ("kv_tier_used_bytes", "Bytes the KV tier holds", "bytes", False),
    ("kv_tier_capacity_bytes", "Bytes the KV tier may hold", "capacity", False),
    ("kv_tier_stores", "Blocks written to the KV tier", "stores", True),
    ("kv_tier_loads", "Blocks loaded from the KV tier into the pool", "loads", True),
    ("kv_tier_store_seconds", "Seconds spent writing blocks to the KV tier", "store_seconds",
     True),
    ("kv_tier_load_seconds", "Seconds spent loading blocks from the KV tier", "load_seconds",
     True),
    ("kv_tier_dropped_blocks", "Blocks the KV tier let go to stay within its bounds",
     "dropped", True),
    ("kv_tier_corrupt_blocks", "Block files that failed their check (deleted, re-prefilled)",
     "corrupt", True),
)


def _tier_families(tiers: dict):
    """Per-tier series; none where the tiers are off."""
    for name, doc, attr, is_counter in _TIER_SERIES:
        family = (CounterMetricFamily if is_counter else GaugeMetricFamily)(
            P + name, doc, labels=["tier"])
        for tier, stats in tiers.items():
            family.add_metric([tier], getattr(stats, attr))
        yield family


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(P + name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(P + name, doc, value=value)
