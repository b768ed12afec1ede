"""AdmissionController with a fake clock and a fake engine stats snapshot."""
import asyncio

import pytest

from common.errors import ConfigError
from engine.outputs import EngineStats
from scheduler.admission import AdmissionController
from scheduler.ticket import InvalidAdmission, Rejected
from scheduler.config import SchedulerConfig


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeEngine:
    def __init__(self):
        self.snapshot = EngineStats(num_total_blocks=100, num_free_blocks=100)

    def stats(self):
        return self.snapshot


def make(**kw):
    # A fast prior drain rate: these tests queue before any rate is measured.
    cfg = dict(max_running_requests=2, max_waiting_requests=4, max_inflight_per_socket=8,
               ttft_bound_s=2.0, initial_drain_rps=1000.0)
    cfg.update(kw)
    clock, engine = FakeClock(), FakeEngine()
    return AdmissionController(SchedulerConfig(**cfg), engine.stats, clock=clock), clock, engine


async def test_slots_then_queue_then_grant_in_priority_order():
    ctl, clock, _ = make(max_client_priority=9)
    running = [ctl.try_admit("generate") for _ in range(2)]
    assert all(t.state == "running" for t in running)
    bulk = ctl.try_admit("generate", priority=5)
    chat = ctl.try_admit("chat")
    urgent = ctl.try_admit("generate", priority=9)
    assert ctl.num_waiting == 3 and ctl.signals().num_waiting == 3
    clock.now = 0.5
    ctl.release(running[0], tokens_generated=3)
    assert await chat.wait() == 0.5  # chat first, despite arriving after bulk
    ctl.release(running[1])
    await urgent.wait()  # then the higher priority
    assert bulk.state == "queued"
    ctl.release(chat)
    await bulk.wait()
    assert ctl.num_running == 2 and ctl.num_waiting == 0


async def test_signals_report_the_oldest_slot_holder():
    ctl, clock, _ = make()
    assert ctl.signals().oldest_running_s is None
    first = ctl.try_admit("chat")
    clock.now = 0.5
    ctl.try_admit("chat")
    clock.now = 2.0
    assert ctl.signals().oldest_running_s == 2.0
    ctl.release(first)
    assert ctl.signals().oldest_running_s == 1.5


async def test_release_while_queued_frees_the_place():
    ctl, _, _ = make()
    for _ in range(2):
        ctl.try_admit("chat")
    queued = ctl.try_admit("chat", prompt_tokens=7)
    ctl.release(queued)
    ctl.release(queued)  # idempotent
    assert ctl.num_waiting == 0 and ctl.signals().waiting_prompt_tokens == 0
    with pytest.raises(Rejected):
        await queued.wait()


async def test_queued_past_ttft_bound_is_refused():
    ctl, _, _ = make(ttft_bound_s=0.05)
    for _ in range(2):
        ctl.try_admit("chat")
    late = ctl.try_admit("chat")
    with pytest.raises(Rejected) as info:
        await late.wait()
    assert info.value.code == "overloaded" and info.value.retry_after_ms > 0
    assert ctl.num_waiting == 0 and ctl.rejections["overloaded"] == 1


async def test_cancelled_waiter_does_not_leak_a_slot():
    ctl, _, _ = make()
    running = [ctl.try_admit("chat") for _ in range(2)]
    ticket = ctl.try_admit("chat")
    task = asyncio.create_task(ticket.wait())
    await asyncio.sleep(0)
    task.cancel()
    ctl.release(running[0])  # grants the ticket whose waiter is going away
    with pytest.raises(asyncio.CancelledError):
        await task
    ctl.release(ticket)  # the gateway's finally
    assert ctl.num_running == 1 and ctl.num_waiting == 0


async def test_per_socket_and_key_limits():
    ctl, _, _ = make(max_running_requests=8, max_inflight_per_socket=2, max_inflight_per_key=3)
    a = [ctl.try_admit("generate", socket_id="s1", api_key="k") for _ in range(2)]
    with pytest.raises(Rejected) as info:
        ctl.try_admit("generate", socket_id="s1", api_key="k")
    assert info.value.code == "rate_limited"
    ctl.try_admit("generate", socket_id="s2", api_key="k")
    with pytest.raises(Rejected):
        ctl.try_admit("generate", socket_id="s3", api_key="k")
    ctl.release(a[0])
    ctl.try_admit("generate", socket_id="s1", api_key="k")
    assert ctl.rejections == {"rate_limited": 2}


async def test_key_token_bucket_charges_prompt_and_output():
    ctl, clock, _ = make(max_running_requests=8, key_tokens_per_minute=600)  # 10/s
    t = ctl.try_admit("generate", prompt_tokens=500, api_key="k")
    ctl.release(t, tokens_generated=100)  # bucket now empty
    with pytest.raises(Rejected) as info:
        ctl.try_admit("generate", prompt_tokens=50, api_key="k")
    assert (info.value.code, info.value.retry_after_ms) == ("rate_limited", 5000)
    ctl.try_admit("generate", prompt_tokens=50, api_key="other")  # keys are separate
    clock.now = 5.0
    ctl.try_admit("generate", prompt_tokens=50, api_key="k")


async def test_kv_overload_with_hysteresis_and_ready_flag():
    ctl, _, engine = make(max_running_requests=8)
    engine.snapshot = EngineStats(num_total_blocks=100, num_free_blocks=4)  # 96% used
    with pytest.raises(Rejected) as info:
        ctl.try_admit("chat")
    assert info.value.code == "overloaded" and ctl.overloaded == "kv_usage"
    engine.snapshot = EngineStats(num_total_blocks=100, num_free_blocks=10)  # 90%
    with pytest.raises(Rejected):
        ctl.try_admit("chat")  # still above the leave threshold
    engine.snapshot = EngineStats(num_total_blocks=100, num_free_blocks=20)  # 80%
    ctl.try_admit("chat")
    assert ctl.overloaded is None


async def test_drain_rate_feeds_retry_estimates():
    ctl, clock, _ = make(max_running_requests=1, max_waiting_requests=50, ttft_bound_s=2.0)
    first = ctl.try_admit("generate")
    queued = [ctl.try_admit("generate") for _ in range(1)]  # saturated from t=0
    for i in range(1, 9):  # one completion every 0.25 s: 4/s
        clock.now = i * 0.25
        ctl.release(first, finish_reason="length")
        first = queued.pop(0)
        queued.append(ctl.try_admit("generate"))
    assert ctl.signals().drain_rps == pytest.approx(4.0, rel=0.2)
    admitted = sum(_try(ctl) for _ in range(10))  # budget 1 s at 4/s: about 4 places
    assert 2 <= admitted <= 4
    with pytest.raises(Rejected) as info:
        ctl.try_admit("generate")
    assert 100 <= info.value.retry_after_ms <= 1000


async def test_drain_rate_counts_only_finished_requests():
    """Cancelled and failed requests free their slot early: counting them as completed
    work would promise retries sooner than the engine can keep."""
    ctl, clock, _ = make(max_running_requests=1, max_waiting_requests=50, ttft_bound_s=100.0)
    running = ctl.try_admit("generate")
    ctl.try_admit("generate")  # saturated from t=0
    for i, reason in enumerate(["cancelled", "error", None] * 4, start=1):
        clock.now = i * 0.1
        ctl.release(running, finish_reason=reason)
        running = next(iter(ctl._running.values()))  # noqa: SLF001 - the one granted next
        ctl.try_admit("generate")
    assert ctl.signals().drain_rps is None  # nothing finished: no rate yet
    for i in range(1, 5):
        clock.now = 1.2 + i * 0.5
        ctl.release(running, finish_reason="stop" if i % 2 else "length")
        running = next(iter(ctl._running.values()))  # noqa: SLF001
        ctl.try_admit("generate")
    assert ctl.signals().drain_rps == pytest.approx(2.0, rel=0.35)


def _try(ctl) -> bool:
    try:
        ctl.try_admit("generate")
        return True
    except Rejected:
        return False


async def test_stop_refuses_the_queue():
    ctl, _, _ = make()
    for _ in range(2):
        ctl.try_admit("chat")
    queued = ctl.try_admit("chat")
    await ctl.stop()
    with pytest.raises(Rejected):
        await queued.wait()


@pytest.mark.parametrize("args,field", [(("bulk",), "kind"),
                                        (("chat", 101), "priority"),
                                        (("chat", 0, -1), "prompt_tokens")])
async def test_bad_arguments_name_the_field(args, field):
    ctl, _, _ = make()
    with pytest.raises(InvalidAdmission) as info:
        ctl.try_admit(*args)
    assert info.value.field == field and info.value.code == "invalid_request"


async def test_metrics_read_the_controller_at_scrape_time():
    from prometheus_client import CollectorRegistry, generate_latest

    from scheduler.metrics import register_metrics

    ctl, _, _ = make()
    registry = CollectorRegistry()
    register_metrics(registry, ctl)
    for _ in range(2):
        ctl.try_admit("chat")
    ctl.try_admit("chat", prompt_tokens=30)
    text = generate_latest(registry).decode()
    assert "tokenwire_admission_queue_requests 1.0" in text
    assert "tokenwire_admission_queue_prompt_tokens 30.0" in text
    assert "tokenwire_admission_slots_used 2.0" in text
    assert "tokenwire_admission_drain_rate_requests_per_second NaN" in text
    assert "tokenwire_admission_overloaded 0.0" in text


async def test_busy_time_counts_up_to_now():
    """A rate measured over enough saturated time is used by the next request, even when
    nothing was admitted or released in between."""
    ctl, clock, _ = make(max_running_requests=1, initial_drain_rps=None)
    first = ctl.try_admit("generate")
    clock.now = 0.2
    ctl.release(first, finish_reason="stop")  # one completion while saturated
    ctl.try_admit("generate")  # saturated again
    assert ctl.signals().drain_rps is None  # 0.2 s of busy time: not enough yet
    clock.now = 1.0
    assert ctl.signals().drain_rps is not None
    ctl.try_admit("generate")  # queued on the measured rate, not refused as unknown
    assert ctl.num_waiting == 1


async def test_priority_is_capped_per_key():
    """Above max_client_priority (0: a request that names none) is refused, naming the
    field; key_max_priority raises the cap for one key, by its id (its hash's first 12)."""
    trusted = "0123456789ab" + "f" * 52
    ctl, _, _ = make(key_max_priority=("0123456789AB=50",))
    for api_key in (None, "e" * 64):
        with pytest.raises(InvalidAdmission, match="priority: at most 0 for this API key"):
            ctl.try_admit("generate", priority=1, api_key=api_key)
        ctl.try_admit("generate", priority=-3, api_key=api_key)
    ctl.try_admit("generate", priority=50, api_key=trusted)
    with pytest.raises(InvalidAdmission, match="at most 50"):
        ctl.try_admit("generate", priority=51, api_key=trusted)
    with pytest.raises(ConfigError, match="key_max_priority"):
        SchedulerConfig(key_max_priority=("not-a-key-id=5",))
    with pytest.raises(ConfigError, match="max_client_priority"):
        SchedulerConfig(max_client_priority=101)


async def test_check_door_refuses_what_an_empty_prompt_would_not_get():
    ctl, _, _ = make(max_running_requests=1, max_waiting_requests=1)
    ctl.check_door("chat").close()  # a free slot: open; its place given back unused
    assert ctl.num_running == 0 and ctl.num_waiting == 0
    running, queued = ctl.try_admit("chat"), ctl.try_admit("chat")
    assert (running.state, queued.state) == ("running", "queued")
    with pytest.raises(Rejected) as refused:
        ctl.check_door("chat")  # the queue is full: refused before any prompt is made
    assert refused.value.code == "overloaded"
    assert ctl.rejections["overloaded"] == 1 and ctl.num_waiting == 1
    with pytest.raises(InvalidAdmission):
        ctl.check_door("chat", priority=99)
    ctl.release(queued)
    ctl.check_door("chat")  # a place in the queue again


async def test_a_pass_holds_its_place_until_closed():
    """A burst's frames all reach the door before any prompt is rendered: the passes
    given so far take the slots, then the queue places, and the rest are refused there."""
    ctl, _, _ = make(max_running_requests=2, max_waiting_requests=1, initial_drain_rps=None)
    passes = [ctl.check_door("generate"), ctl.check_door("generate")]  # the two slots
    with pytest.raises(Rejected, match="not measured"):  # nowhere to queue with no rate
        ctl.check_door("generate")
    passes[0].close()
    passes[0].close()  # idempotent: one place given back, not two
    passes[0] = ctl.check_door("generate")
    with pytest.raises(Rejected):
        ctl.check_door("generate")
    for p in passes:
        p.close()
    # With a drain rate: two slots, then the one queue place, then refused.
    ctl, _, _ = make(max_running_requests=2, max_waiting_requests=1)
    passes = [ctl.check_door("chat") for _ in range(3)]
    with pytest.raises(Rejected, match="waiting queue is full"):
        ctl.check_door("chat")
    # A pass turned into a slot request gives its place to the ticket.
    passes.pop().close()
    ticket = ctl.try_admit("chat")
    assert ticket.state == "running" and ctl.num_waiting == 0
