"""Prometheus view of the admission controller, read at scrape time (no per-request cost).

The gateway's Metrics already exports what the issue names (requests_waiting counts our
queue, request_queue_time, admission_rejections_total{reason}, kv_cache_usage_ratio and
the GPU gauges read from our sampler). This adds what only the scheduler knows: the
queue's prompt tokens, the measured drain rate, the overload state and the process RSS.
"""
from __future__ import annotations

import math

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from scheduler.admission import AdmissionController
from scheduler.door import Scheduler

P = "tokenwire_"


def register_metrics(registry: CollectorRegistry, controller: AdmissionController) -> None:
    registry.register(_SchedulerCollector(controller))


def register_model_metrics(registry: CollectorRegistry, scheduler: Scheduler) -> None:
    """Per-model series, labelled `model` (the unlabelled admission and engine metrics
    stay the default model's, as they were with one model)."""
    registry.register(_ModelCollector(scheduler))


class _ModelCollector:
    def __init__(self, scheduler: Scheduler):
        self._scheduler = scheduler

    def describe(self):
        return []

    def collect(self):
        models = self._scheduler.models
        states = GaugeMetricFamily(P + "model_state", "1 for the model's state (loaded, "
                                   "loading, unloaded, failed)", labels=["model", "state"])
        memory = GaugeMetricFamily(P + "model_memory_bytes", "RSS the model's last load "
                                   "took", labels=["model"])
        loads = CounterMetricFamily(P + "model_loads", "Loads that succeeded",
                                    labels=["model"])
        held = GaugeMetricFamily(P + "model_requests_held", "Requests holding the model "
                                 "(running, queued or waiting for its load)", labels=["model"])
        queued = GaugeMetricFamily(P + "model_admission_queue_requests", "Requests in the "
                                   "model's admission queue", labels=["model"])
        for slot in models.slots:
            for state in ("loaded", "loading", "unloaded", "failed"):
                states.add_metric([slot.name, state], 1 if models.state(slot) == state else 0)
            memory.add_metric([slot.name], slot.memory_bytes)
            loads.add_metric([slot.name], slot.loads)
            held.add_metric([slot.name], models.holds(slot))
            queued.add_metric([slot.name], self._scheduler.admissions[slot].num_waiting)
        yield from (states, memory, loads, held, queued)
        yield from _gate_families(models.slots)


def _gate_families(slots):
    """Each model's turns at the device gate (engine/device_gate.py), across its loads."""
    turns = CounterMetricFamily(P + "model_gate_turns", "Forward steps the model's engine "
                                "ran at the device gate", labels=["model"])
    waited = CounterMetricFamily(P + "model_gate_wait_seconds", "Seconds the model's engine "
                                 "waited at the device gate for its turns", labels=["model"])
    used = CounterMetricFamily(P + "model_device_seconds", "Seconds the model's forward "
                               "steps held the device", labels=["model"])
    for slot in slots:
        party = slot.gate
        if party is not None:
            turns.add_metric([slot.name], party.turns)
            waited.add_metric([slot.name], party.wait_s)
            used.add_metric([slot.name], party.device_s)
    return turns, waited, used


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
