"""Prometheus view of the admission controller, read at scrape time (no per-request cost).

The gateway's Metrics already exports what the issue names (requests_waiting counts our
queue, request_queue_time, admission_rejections_total{reason}, kv_cache_usage_ratio and
the GPU gauges read from our sampler). This adds what only the scheduler knows: the
queue's prompt tokens, the measured drain rate, the overload state and the process RSS.
"""
from __future__ import annotations

import math

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from scheduler.admission import AdmissionController

P = "tokenwire_"


def register_metrics(registry: CollectorRegistry, controller: AdmissionController) -> None:
    registry.register(_SchedulerCollector(controller))


class _SchedulerCollector:
    def __init__(self, controller: AdmissionController):
        self._controller = controller

    def describe(self):
        return []  # values exist only at collect time

    def collect(self):
        c = self._controller
        s = c.signals()
        yield _gauge("admission_queue_requests", "Requests in the admission queue",
                     c.num_waiting)
        yield _gauge("admission_queue_prompt_tokens", "Prompt tokens in the admission queue",
                     s.waiting_prompt_tokens)
        yield _gauge("admission_slots_used", "Engine slots held by admitted requests",
                     s.num_running)
        yield _gauge("admission_drain_rate_requests_per_second", "Measured completions per "
                     "second while saturated, NaN until measured", s.drain_rps)
        yield _gauge("admission_overloaded", "1 while an overload signal holds (hysteresis)",
                     0 if c.overloaded is None else 1)
        yield _gauge("process_resident_memory_bytes", "Server process RSS (psutil sampler), "
                     "NaN before the first sample", s.rss_bytes)


def _gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily:
    return GaugeMetricFamily(P + name, doc, value=math.nan if value is None else value)
