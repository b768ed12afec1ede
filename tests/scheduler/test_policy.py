"""Admission policy: pure functions under made-up signals and a fake clock."""
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest

from engine.errors import ConfigError
from scheduler.config import SchedulerConfig
from scheduler.policy import (ADMIT, OVERLOADED, QUEUE, RATE_LIMITED, REJECT,
                              AdmissionRequest, Signals, TokenBucket, decide,
                              estimate_wait_s, overload_cause)

CFG = SchedulerConfig(max_running_requests=4, max_waiting_requests=8,
                      max_waiting_prompt_tokens=1000, chat_reserved_fraction=0.25,
                      max_inflight_per_socket=2, max_inflight_per_key=3,
                      ttft_bound_s=2.0, queue_budget_fraction=0.5,
                      max_rss_bytes=1000, rss_leave_ratio=0.8,
                      gpu_util_enter=0.9, gpu_util_leave=0.7)


def saturated(**kw) -> Signals:
    base = dict(num_running=4, kv_usage=0.1, drain_rps=4.0, drain_tps=400.0)
    base.update(kw)
    return Signals(**base)


def test_free_slot_admits():
    d = decide(CFG, Signals(num_running=1), AdmissionRequest("generate"), None, 0.0)
    assert d.action == ADMIT


def test_full_engine_queues_within_budget():
    # 2 ahead + me = 3 requests at 4/s = 0.75 s <= 1 s budget
    r = AdmissionRequest("generate", queue_ahead=2)
    assert decide(CFG, saturated(num_waiting=2), r, None, 0.0).action == QUEUE


def test_wait_past_ttft_budget_is_refused_with_estimate():
    # 5 ahead + me = 6 requests at 4/s = 1.5 s; budget 1 s -> retry in about 0.5 s
    r = AdmissionRequest("generate", queue_ahead=5)
    d = decide(CFG, saturated(num_waiting=5), r, None, 0.0)
    assert (d.action, d.reason) == (REJECT, OVERLOADED)
    assert 450 <= d.retry_after_ms <= 550


def test_token_heavy_queue_uses_token_rate():
    r = AdmissionRequest("generate", prompt_tokens=300, queue_ahead=1, queue_ahead_tokens=300)
    d = decide(CFG, saturated(num_waiting=1, waiting_prompt_tokens=300), r, None, 0.0)
    assert d.action == REJECT  # 600 tokens at 400/s = 1.5 s > 1 s although 2 requests fit


def test_unmeasured_drain_queues_nothing():
    """A replica that just started has no drain rate: a request that finds no free slot is
    refused now, not after waiting out its queue budget for a slot that may not come."""
    s = Signals(num_running=4)
    d = decide(CFG, s, AdmissionRequest("chat", queue_ahead=0), None, 0.0)
    assert (d.action, d.reason, d.retry_after_ms) == (REJECT, OVERLOADED, 1000)
    assert "not measured" in d.detail
    assert decide(CFG, Signals(num_running=3), AdmissionRequest("chat"), None, 0.0).action == ADMIT


def test_prior_drain_rate_until_measured():
    prior = SchedulerConfig(max_running_requests=4, ttft_bound_s=2.0, initial_drain_rps=4.0)
    # Slots held 1 s (4 running at 4/s), started 0.2 s ago: the 1st queued waits 0.8 s,
    # the 2nd 1.05 s, over the 1 s budget.
    s = Signals(num_running=4, oldest_running_s=0.2)
    assert decide(prior, s, AdmissionRequest("chat", queue_ahead=0), None, 0.0).action == QUEUE
    d = decide(prior, s, AdmissionRequest("chat", queue_ahead=1), None, 0.0)
    assert (d.action, d.reason) == (REJECT, OVERLOADED)
    # A measured rate overrides the prior: 1/s makes even the first place too long a wait.
    measured = dataclasses.replace(s, drain_rps=1.0)
    assert decide(prior, measured, AdmissionRequest("chat"), None, 0.0).action == REJECT
    with pytest.raises(ConfigError):
        SchedulerConfig(initial_drain_rps=0.0)


def test_generate_cannot_use_chat_reserve():
    # generate may fill 6 of 8 places; chat may use all 8
    s = saturated(num_waiting=6, drain_rps=100.0)
    d = decide(CFG, s, AdmissionRequest("generate", queue_ahead=6), None, 0.0)
    assert (d.action, d.reason) == (REJECT, OVERLOADED)
    assert decide(CFG, s, AdmissionRequest("chat", queue_ahead=0), None, 0.0).action == QUEUE
    full = saturated(num_waiting=8, drain_rps=100.0)
    assert decide(CFG, full, AdmissionRequest("chat"), None, 0.0).reason == OVERLOADED


def test_prompt_token_bound():
    s = saturated(num_waiting=1, waiting_prompt_tokens=900, drain_tps=1e6)
    chat = AdmissionRequest("chat", prompt_tokens=150, queue_ahead=0)
    d = decide(CFG, s, chat, None, 0.0)
    assert (d.action, d.reason) == (REJECT, OVERLOADED) and "tokens" in d.detail


def test_rate_limits_come_first():
    s = saturated()
    d = decide(CFG, s, AdmissionRequest("chat", socket_inflight=2), "kv_usage", 0.0)
    assert d.reason == RATE_LIMITED
    assert decide(CFG, s, AdmissionRequest("chat", key_inflight=3), None, 0.0).reason == \
        RATE_LIMITED
    # Little's law: 4 running at 4/s -> a slot frees in about 1 s
    assert decide(CFG, s, AdmissionRequest("chat", socket_inflight=2), None, 0.0) \
        .retry_after_ms == 1000


def test_token_bucket_refuses_then_refills():
    bucket = TokenBucket(size=600, tokens_per_minute=600, now=0.0)  # 10 tokens/s
    bucket.spend(550, now=0.0)
    r = AdmissionRequest("generate", prompt_tokens=100, bucket=bucket)
    d = decide(CFG, Signals(), r, None, 0.0)
    assert (d.reason, d.retry_after_ms) == (RATE_LIMITED, 5000)  # 50 missing at 10/s
    assert decide(CFG, Signals(), r, None, 5.0).action == ADMIT
    assert bucket.available(1e6) == 600  # never above its size
    bucket.spend(700, now=10.0)  # output tokens may drive it negative
    assert bucket.seconds_until(0, 10.0) == pytest.approx(55.0)  # 150 - 700 = -550


def test_every_overload_signal_enters():
    for s, name in ((Signals(kv_usage=0.95), "kv_usage"), (Signals(gpu_util=0.9), "gpu_util"),
                    (Signals(gpu_memory_used=99, gpu_memory_total=100), "gpu_memory"),
                    (Signals(rss_bytes=1000), "rss")):
        assert overload_cause(s, CFG, overloaded=False) == name
    d = decide(CFG, Signals(), AdmissionRequest("chat"), "kv_usage", 0.0)
    assert (d.action, d.reason) == (REJECT, OVERLOADED) and "kv_usage" in d.detail


def test_hysteresis_does_not_flap():
    """KV usage hovering between leave (0.85) and enter (0.95) keeps the current state."""
    state = None
    trace = []
    for usage in (0.5, 0.9, 0.94, 0.96, 0.9, 0.94, 0.88, 0.93, 0.86, 0.84, 0.9, 0.94):
        state = overload_cause(Signals(kv_usage=usage), CFG, state is not None)
        trace.append(state is not None)
    assert trace == [False, False, False, True, True, True, True, True, True, False,
                     False, False]


def test_rss_leave_ratio():
    assert overload_cause(Signals(rss_bytes=850), CFG, overloaded=True) == "rss"
    assert overload_cause(Signals(rss_bytes=790), CFG, overloaded=True) is None
    assert overload_cause(Signals(rss_bytes=999), CFG, overloaded=False) is None


def test_missing_signals_are_ignored():
    assert overload_cause(Signals(), CFG, overloaded=True) is None


def test_retry_after_is_clamped():
    c = SchedulerConfig(retry_after_min_ms=200, retry_after_max_ms=3000, max_running_requests=1,
                        ttft_bound_s=1.0)
    far = decide(c, Signals(num_running=1, num_waiting=50, drain_rps=0.5),
                 AdmissionRequest("chat", queue_ahead=50), None, 0.0)
    assert far.retry_after_ms == 3000
    near = decide(c, Signals(num_running=1, num_waiting=1, drain_rps=3.9),
                  AdmissionRequest("chat", queue_ahead=1), None, 0.0)
    assert near.action == REJECT and near.retry_after_ms == 200


def test_estimate_wait():
    assert estimate_wait_s(Signals(), 3, 10) is None
    assert estimate_wait_s(Signals(drain_rps=2.0), 3, 10) == 1.5
    assert estimate_wait_s(Signals(drain_rps=2.0, drain_tps=5.0), 3, 10) == 2.0


def test_estimate_wait_sees_lock_step_waves():
    # 4 slots at 4/s: each holds its slot 1 s. A wave that started 0.1 s ago frees its
    # first slot in 0.9 s, not in the average gap of 0.25 s ...
    wave = Signals(num_running=4, drain_rps=4.0, oldest_running_s=0.1)
    assert estimate_wait_s(wave, 1, 0) == pytest.approx(0.9)
    assert estimate_wait_s(wave, 3, 0) == pytest.approx(1.4)
    # ... and the refusal comes at once, where the average would have queued it.
    r = AdmissionRequest("generate", queue_ahead=1)
    assert decide(CFG, saturated(num_waiting=1), r, None, 0.0).action == QUEUE
    d = decide(CFG, saturated(num_waiting=1, oldest_running_s=0.1), r, None, 0.0)
    assert d.action == REJECT and 150 <= d.retry_after_ms <= 151  # 1.15 s vs a 1 s budget
    # A holder past the mean service time: a slot is due any moment.
    assert estimate_wait_s(Signals(num_running=4, drain_rps=4.0, oldest_running_s=3.0),
                           2, 0) == pytest.approx(0.25)


@pytest.mark.parametrize("kwargs,field", [
    (dict(max_waiting_requests=0), "max_waiting_requests"),
    (dict(kv_usage_enter=0.8, kv_usage_leave=0.9), "kv_usage_leave"),
    (dict(gpu_util_enter=0.9), "gpu_util_leave"),
    (dict(chat_reserved_fraction=1.0), "chat_reserved_fraction"),
    (dict(priority_min=5, priority_max=1), "priority_min"),
    (dict(ttft_bound_s=0), "ttft_bound_s"),
    (dict(max_rss_bytes=-1), "max_rss_bytes"),
    (dict(retry_after_min_ms=10, retry_after_max_ms=5), "retry_after_min_ms"),
])
def test_config_validation_names_the_field(kwargs, field):
    with pytest.raises(ConfigError) as info:
        SchedulerConfig(**kwargs)
    assert info.value.field == field


def test_scheduler_loads_no_torch():
    """Policy code, the door and the model slot (an engine is loaded only when one is
    built), and the ConfigError every layer shares import without torch."""
    code = ("import sys, scheduler.admission, scheduler.metrics, scheduler.door, "
            "scheduler.models, common.errors, engine.errors; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True,
                   cwd=Path(__file__).resolve().parents[2])
