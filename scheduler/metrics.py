"""Prometheus view of the admission controller, read at scrape time (no per-request cost).

The gateway owns the registry. `register_metrics` adds the scheduler's families to it,
skipping any name the registry already exports, so one registry never holds a name twice.
"""
from __future__ import annotations

import math

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from scheduler.admission import AdmissionController

P = "tokenwire_"


def register_metrics(registry: CollectorRegistry, controller: AdmissionController) -> set[str]:
    """Register the scheduler's metrics; returns the family names it added."""
    existing = {family.name for family in registry.collect()}
    collector = _SchedulerCollector(controller, existing)
    registry.register(collector)
    return {family.name for family in collector.collect()}


class _SchedulerCollector:
    """Yields the controller's counters and signals, except names exported elsewhere."""

    def __init__(self, controller: AdmissionController, skip: set[str]):
        self._controller = controller
        self._skip = skip

    def describe(self):
        return []  # values exist only at collect time

    def collect(self):
        for family in self._families():
            if family.name not in self._skip:
                yield family

    def _families(self):
        c = self._controller
        s = c.signals()
        rejections = CounterMetricFamily(P + "admission_rejections", "Requests refused at "
                                         "admission", labels=["reason"])
        for reason in ("overloaded", "rate_limited"):
            rejections.add_metric([reason], c.rejections[reason])
        yield rejections
        yield _gauge("requests_waiting", "Requests waiting for an engine slot (admission "
                     "queue plus the engine's own)", s.num_waiting)
        yield _gauge("requests_running", "Requests holding an engine slot", s.num_running)
        yield _gauge("kv_cache_usage_ratio", "Share of KV blocks in use", s.kv_usage)
        yield _gauge("gpu_utilization_ratio", "GPU utilization (NVML), NaN without a GPU",
                     s.gpu_util)
        yield _gauge("gpu_memory_used_bytes", "GPU memory used (NVML), NaN without a GPU",
                     s.gpu_memory_used)
        yield _gauge("admission_queue_prompt_tokens", "Prompt tokens in the admission queue",
                     s.waiting_prompt_tokens)
        yield _gauge("admission_drain_rate_requests_per_second", "Measured completions per "
                     "second while saturated, NaN until measured", s.drain_rps)
        yield _gauge("admission_overloaded", "1 while an overload signal holds (hysteresis)",
                     0 if c.overloaded is None else 1)
        yield _gauge("process_resident_memory_bytes", "Server process RSS (psutil)",
                     s.rss_bytes)


def _gauge(name: str, doc: str, value: float | None) -> GaugeMetricFamily:
    return GaugeMetricFamily(P + name, doc, value=math.nan if value is None else value)
