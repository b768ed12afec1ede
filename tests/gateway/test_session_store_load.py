"""The Redis session store under load, on the server's own event loop while it streams.

2,500 sessions (10,000 with TOKENWIRE_FULL_SIZE=1; four turns each) are saved and loaded back through RedisSessionStore on
the loop that serves the sockets, 250 sessions a second, while clients stream
generates from the same server;
a probe on that loop measures how late its timers fire (event-loop lag). Printed: save
and load latency p50/p99, loop lag p50/p99/max, tokens streamed meanwhile.
"""
from __future__ import annotations

import asyncio
import time

import aiohttp
from ws_helpers import open_ws

from gateway.sessions.redis import RedisSessionStore
from gateway.sessions.store import SessionRecord, SessionStoreConfig
from tests.sizes import size

SESSIONS = size(2_500, 10_000)
RATE = 250  # sessions per second, each one save and one load (10 s in all; 40 s at full size)
STREAMS = 4
# The target is 5 ms; a 2-core CI box shared with the engine's thread (which holds the GIL
# between torch ops) stalls the loop now and then, so the assertion is looser.
LAG_P99_BOUND_S = 0.05


def _record(i: int) -> SessionRecord:
    messages = []
    for turn in range(4):
        messages += [{"role": "user", "content": f"Session {i} asks question {turn}? " * 3},
                     {"role": "assistant", "content": f"An answer of some length {turn}. " * 6}]
    return SessionRecord(f"load-{i:05d}", None, "Be brief.", {"temperature": 0.7}, messages)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _lag_probe(stop: asyncio.Event, lags: list[float]) -> None:
    """How much later than asked a 1 ms timer fires, over and over."""
    while not stop.is_set():
        start = time.perf_counter()
        await asyncio.sleep(0.001)
        lags.append(max(0.0, time.perf_counter() - start - 0.001))


async def _probe_only(seconds: float) -> list[float]:
    """The loop's lag with no store load: what streaming alone costs it."""
    stop, lags = asyncio.Event(), []
    probe = asyncio.create_task(_lag_probe(stop, lags))
    await asyncio.sleep(seconds)
    stop.set()
    await probe
    return lags


async def _workload(url: str) -> dict:
    """Runs on the server's loop: each session saved then loaded back, sessions starting
    at RATE per second (open loop: a closed loop at full speed would saturate any loop)."""
    # A long timeout: this measures latency; a box stalled for a second is not an outage.
    # Every session has no owner (one key): the per-key quotas are off, as without auth.
    store = RedisSessionStore(SessionStoreConfig(url, max_sessions=SESSIONS, timeout_s=10.0,
                                                 max_sessions_per_key=None,
                                                 max_bytes_per_key=None))
    stop, lags = asyncio.Event(), []
    probe = asyncio.create_task(_lag_probe(stop, lags))
    saves, loads, mismatched = [], [], 0

    async def one(i: int) -> None:
        nonlocal mismatched
        record = _record(i)
        start = time.perf_counter()
        await store.save(record)
        saves.append(time.perf_counter() - start)
        start = time.perf_counter()
        loaded = await store.load(record.session_id)
        loads.append(time.perf_counter() - start)
        mismatched += loaded != record

    try:
        tasks, start = [], time.perf_counter()
        for i in range(SESSIONS):
            delay = start + i / RATE - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        stored = await store.count()
    finally:
        stop.set()
        await probe
        await store.close()
    return {"saves": saves, "loads": loads, "lags": lags, "mismatched": mismatched,
            "stored": stored, "seconds": time.perf_counter() - start}


async def _stream(url: str, stop: asyncio.Event, counts: list[int]) -> None:
    async with aiohttp.ClientSession() as s:
        ws, _ = await open_ws(s, url)
        n = 0
        while not stop.is_set():
            n += 1
            await ws.send_json({"type": "generate", "id": f"g{n}", "prompt": "Tell me a story.",
                                "params": {"max_tokens": 32, "ignore_eos": True}})
            while (frame := await ws.receive_json(timeout=60))["type"] != "done":
                assert frame["type"] == "delta", frame
                counts.append(frame["n"])
        await ws.close()


async def test_redis_store_under_load_while_streaming(server, redis_server):
    url = server.start_app()
    stop, counts = asyncio.Event(), []
    streams = [asyncio.create_task(_stream(url, stop, counts)) for _ in range(STREAMS)]
    while not counts:  # the server is streaming before the store load starts
        await asyncio.sleep(0.01)
    streamed_before = len(counts)
    try:
        baseline = await asyncio.to_thread(server.call, _probe_only(3.0))
        result = await asyncio.to_thread(server.call, _workload(redis_server.url), 600)
    finally:
        stop.set()
        await asyncio.gather(*streams)
        server.stop_app(url)
    saves, loads, lags = result["saves"], result["loads"], result["lags"]
    ms = {name: (1000 * _pct(v, .5), 1000 * _pct(v, .99)) for name, v in
          (("save", saves), ("load", loads), ("lag", lags), ("alone", baseline))}
    print(f"\n{SESSIONS} sessions saved and loaded on Redis in {result['seconds']:.1f} s "
          f"(offered {RATE}/s) while {STREAMS} sockets streamed {len(counts) - streamed_before}"
          f" deltas: save p50 {ms['save'][0]:.2f} ms p99 {ms['save'][1]:.2f} ms; load p50 "
          f"{ms['load'][0]:.2f} ms p99 {ms['load'][1]:.2f} ms; event-loop lag p50 "
          f"{ms['lag'][0]:.2f} ms p99 {ms['lag'][1]:.2f} ms max {1000 * max(lags):.1f} ms "
          f"(target p99 < 5 ms; streaming alone: p50 {ms['alone'][0]:.2f} ms p99 "
          f"{ms['alone'][1]:.2f} ms)")
    assert len(saves) == len(loads) == SESSIONS and result["mismatched"] == 0
    assert result["stored"] == SESSIONS
    assert len(counts) > streamed_before  # the server streamed meanwhile
    assert _pct(lags, .99) < LAG_P99_BOUND_S
