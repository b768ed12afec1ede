"""Priorities, per-key token budgets and the scheduler's metrics, end to end on loopback.

With one engine slot held, queued requests are granted chat turns first, then by the
`priority` param (bounded by the config), then in arrival order; a key that spent its
tokens-per-minute budget is `rate_limited` while another key is served; /metrics shows
every gauge and counter the scheduler issue names.
"""
from __future__ import annotations

import asyncio
import math
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from sched_clients import WsClient
from scheduler.config import SchedulerConfig

# The held request outlasts the queueing on any box; it is cancelled once all are queued.
HOLD_TOKENS, TOKENS = 4096, 4


async def wait_queued(controller, n: int) -> None:
    """Until the admission queue holds n requests (so arrival order is certain)."""
    deadline = time.perf_counter() + 30
    while controller.num_waiting < n:
        assert time.perf_counter() < deadline, "request never reached the queue"
        await asyncio.sleep(0.01)


async def test_chat_first_then_priority_then_arrival(server):
    # A bound no estimate reaches: this test is about grant order, not refusals (on a
    # loaded box the drain rate measured from one request makes a 4-deep queue look slow).
    sched = SchedulerConfig(max_running_requests=1, ttft_bound_s=3600.0,
                            priority_min=-10, priority_max=10, max_client_priority=10)
    url, app = server.start_app(sched)
    controller = server.runtime(app).scheduler.admission
    async with aiohttp.ClientSession() as session:
        clients = [await WsClient(session, url).__aenter__() for _ in range(5)]
        hold, bulk, urgent, chat, later = clients
        # A completion first, so the drain rate can be measured.
        warm = await hold.generate("warm", "Hello", TOKENS)
        await asyncio.wait_for(warm.done.wait(), 120)
        held = await hold.generate("hold", "Tell me a story.", HOLD_TOKENS)
        while not held.deltas:  # the one slot is taken
            await asyncio.sleep(0.01)
        # Until the drain rate is measured (min_busy_s of saturated time after a
        # completion), only one wave may queue; this test queues four.
        await asyncio.sleep(1.0)
        queued = {}
        for n, (client, send) in enumerate([
                (bulk, lambda c: c.generate("bulk", "One", TOKENS)),
                (urgent, lambda c: c.generate("urgent", "Two", TOKENS, priority=10)),
                (later, lambda c: c.generate("later", "Three", TOKENS)),
                (chat, lambda c: c.chat("chat", "Hello!", TOKENS))], start=1):
            result = await send(client)
            queued[result.id] = result
            await wait_queued(controller, n)
        await hold.cancel("hold")
        refused = await bulk.generate("bad", "x", TOKENS, priority=11)
        await asyncio.wait_for(asyncio.gather(*(r.done.wait() for r in
                                                [held, refused, *queued.values()])), 120)
        metrics = await scrape(session, url)
        for client in clients:
            await client.__aexit__()
    assert refused.error == "invalid_request" and "priority" in refused.message
    assert "[-10, 10]" in refused.message
    assert all(r.finish_reason == "length" for r in queued.values())
    order = sorted(queued, key=lambda i: queued[i].deltas[0])
    print(f"\ngrant order with one engine slot: {order}")
    assert order == ["chat", "urgent", "bulk", "later"]
    assert metrics["tokenwire_request_queue_time_seconds_count"] >= 6
    assert metrics["tokenwire_request_queue_time_seconds_sum"] > 0


async def test_key_token_budget_and_metrics(server):
    sched = SchedulerConfig(key_tokens_per_minute=60, retry_after_max_ms=30000)
    url, app = server.start_app(sched, api_keys=("key-a", "key-b"))
    async with aiohttp.ClientSession() as session:
        a = await WsClient(session, url, api_key="key-a").__aenter__()
        b = await WsClient(session, url, api_key="key-b").__aenter__()
        first = await a.generate("a1", "Hi", 50)  # prompt + 50 output: most of a minute's 60
        await asyncio.wait_for(first.done.wait(), 120)
        long_prompt = "one two three four five six seven eight nine ten " * 4
        spent = await a.generate("a2", long_prompt, TOKENS)
        other = await b.generate("b1", long_prompt, TOKENS)
        await asyncio.wait_for(asyncio.gather(spent.done.wait(), other.done.wait()), 120)
        metrics = await scrape(session, url, key="key-a")  # with keys on, /metrics needs one
        await a.__aexit__()
        await b.__aexit__()
    assert first.finish_reason == "length"
    assert spent.error == "rate_limited", spent
    # Until the bucket (refilling at 1 token/s) holds the ~40-token prompt.
    assert 1_000 <= spent.retry_after_ms <= 30_000
    assert other.finish_reason == "length"  # another key has its own budget
    assert metrics['tokenwire_admission_rejections_total{reason="rate_limited"}'] == 1
    for name in ("tokenwire_requests_waiting", "tokenwire_requests_running",
                 "tokenwire_kv_cache_usage_ratio", "tokenwire_admission_queue_requests",
                 "tokenwire_admission_queue_prompt_tokens", "tokenwire_admission_slots_used"):
        assert metrics[name] == 0, name
    # No GPU here: the NVML gauges are exported, as NaN.
    assert math.isnan(metrics["tokenwire_gpu_utilization_ratio"])
    assert math.isnan(metrics["tokenwire_gpu_memory_used_bytes"])
    assert metrics["tokenwire_request_queue_time_seconds_count"] >= 2
    assert metrics["tokenwire_admission_drain_rate_requests_per_second"] >= 0 or math.isnan(
        metrics["tokenwire_admission_drain_rate_requests_per_second"])
    assert metrics["tokenwire_admission_overloaded"] == 0
    assert metrics["tokenwire_process_resident_memory_bytes"] > 50 * 2**20


async def scrape(session: aiohttp.ClientSession, url: str,
                 key: str | None = None) -> dict[str, float]:
    """/metrics as {name or name{labels}: value}."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with session.get(url + "/metrics", headers=headers) as resp:
        assert resp.status == 200
        text = await resp.text()
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            values[sample.name + (f"{{{labels}}}" if labels else "")] = sample.value
    return values
