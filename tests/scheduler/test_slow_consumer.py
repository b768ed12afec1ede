"""A client that stops reading: the others do not notice, and it costs the server a
constant amount of memory (its deltas merge into one mailbox slot per stream).

Each phase runs the same load: three reading clients with one request each, plus one
extra socket with eight requests. In the baseline phases the extra socket reads; in the
slow phases it stops reading until everyone else is done. Phases alternate (A B A B A B)
so that a noisy neighbour on the machine weighs on both alike, and the tail is compared
round by round: one neighbour's burst spoils one round, a stalled socket that slows the
server spoils all of them.
"""
from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import pytest

from sched_clients import RawWsClient, WsClient, percentile
from scheduler.config import SchedulerConfig

MAX_TOKENS = 32
SLOW_STREAMS = 8  # the gateway's default in-flight limit per socket
LONG_ID = "s" * 120  # long ids (128 characters at most) make delta frames large, so
#                      the stalled socket's buffers fill within a few dozen frames
SERVER_BUFFER = 4096  # the slow socket's server-side buffers (a constrained link)
ROUNDS = 5  # the median of five rounds outvotes two spoiled by a neighbour (CI saw 2 of 3)


async def test_slow_reader_does_not_hurt_others_and_costs_constant_memory(server):
    url, app = server.start_app(SchedulerConfig(max_running_requests=16),
                                send_timeout_s=60.0, heartbeat_s=60.0)
    rt = server.runtime(app)
    itl = {"baseline": [], "slow": []}
    median_ratios = []  # per round: the stalled round's p50 gap over the reading round's
    tail_ratios = []  # per round: the stalled round's p95 gap over the reading round's
    costs = []
    async with aiohttp.ClientSession() as session:
        readers = [await WsClient(session, url).__aenter__() for _ in range(3)]
        for round_ in range(ROUNDS):
            p50, p95 = {}, {}
            for kind in ("baseline", "slow"):
                gaps, cost = await run_phase(server, rt, url, readers, f"{kind[0]}{round_}",
                                             reading=kind == "baseline")
                itl[kind] += gaps
                p50[kind] = percentile(gaps, .5)
                p95[kind] = percentile(gaps, .95)
                if cost is not None:
                    costs.append(cost)
            median_ratios.append(p50["slow"] / p50["baseline"])
            tail_ratios.append(p95["slow"] / p95["baseline"])
        for client in readers:
            await client.__aexit__()
    base_p50, slow_p50 = percentile(itl["baseline"], .5), percentile(itl["slow"], .5)
    print(f"\nITL of the reading clients, p50/p99: baseline "
          f"{1000 * base_p50:.1f}/{1000 * percentile(itl['baseline'], .99):.1f} ms, with a "
          f"stalled reader {1000 * slow_p50:.1f}/{1000 * percentile(itl['slow'], .99):.1f} ms "
          f"({len(itl['slow'])} gaps); p50 and p95 stalled/baseline by round: "
          + ", ".join(f"{m:.2f}/{t:.2f}" for m, t in zip(median_ratios, tail_ratios)) + "; stalled socket's server-side cost: "
          + "; ".join(f"max {c['entries']} queued entries, {c['buffer']} B in the transport, "
                      f"{c['tokens']} tokens merged into {c['frames']} frames" for c in costs))
    # The median gap shows a server slowed in every step; the tail shows one slowed now
    # and then. Both are compared round by round (the median of the rounds' ratios): a
    # stalled socket that slows the server spoils every round, a neighbour's burst on the
    # shared box spoils one (pooled, CI once saw the p50 1.24x apart from such a burst).
    assert sorted(median_ratios)[ROUNDS // 2] <= 1.2
    assert sorted(tail_ratios)[ROUNDS // 2] <= 1.5
    for cost in costs:
        assert cost["entries"] <= 2 * SLOW_STREAMS  # one delta + one done per stream, at most
        assert cost["buffer"] <= 4 * SERVER_BUFFER
        assert cost["tokens"] == SLOW_STREAMS * MAX_TOKENS  # nothing lost in the merge
        assert cost["frames"] < cost["tokens"]  # merged while the socket was stalled


async def run_phase(server, rt, url, readers, tag, reading: bool):
    """One round of load; returns the readers' inter-token gaps and, when the extra
    socket stalled, what it cost the server meanwhile."""
    extra = RawWsClient()
    await extra.connect(url)
    conn = next(c for c in list(rt.connections) if c.session.id == extra.session_id)
    server.call(_constrain(conn))
    ids = {f"{LONG_ID}{tag}{i}" for i in range(SLOW_STREAMS)}
    for request_id in ids:
        await extra.send({"type": "generate", "id": request_id, "prompt": "Tell me a story.",
                          "params": {"max_tokens": MAX_TOKENS, "temperature": 0,
                                     "ignore_eos": True}})
    extra_reader = asyncio.create_task(extra.read_until_done(ids)) if reading else None
    results = [await c.generate(f"{tag}-{i}", f"Count from {i} to 30:", MAX_TOKENS)
               for i, c in enumerate(readers)]
    peak = {"entries": 0, "buffer": 0}
    while not all(r.done.is_set() for r in results):
        transport = conn.ws._req.transport  # noqa: SLF001 - the server side of the socket
        peak["entries"] = max(peak["entries"], len(conn.outbox._entries))  # noqa: SLF001
        peak["buffer"] = max(peak["buffer"], transport.get_write_buffer_size())
        await asyncio.sleep(0.02)
    if extra_reader is None:
        extra_reader = asyncio.create_task(extra.read_until_done(ids))
    await asyncio.wait_for(extra_reader, 60)
    extra.close()
    deltas = [f for f in extra.frames if f["type"] == "delta"]
    gaps = [gap for r in results for gap in r.itls()]
    assert all(r.finish_reason == "length" for r in results)
    if reading:
        return gaps, None
    return gaps, {**peak, "tokens": sum(f["n"] for f in deltas), "frames": len(deltas)}


async def _constrain(conn) -> None:
    """Give the slow socket small server-side buffers so backpressure shows within a few
    kilobytes instead of megabytes (runs on the server's loop)."""
    transport = conn.ws._req.transport  # noqa: SLF001
    transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF,
                                                  SERVER_BUFFER)
    transport.set_write_buffer_limits(high=SERVER_BUFFER)
    conn.ws._writer._limit = 512  # noqa: SLF001 - aiohttp checks for drain every N bytes


async def test_socket_that_does_not_drain_is_closed_and_its_requests_aborted(server):
    """A reader that never reads: within the send timeout the server closes its socket,
    aborts its requests (the engine stops generating for them and frees their KV blocks)
    and releases their admission slots."""
    send_timeout_s, long_run = 1.0, 400
    url, app = server.start_app(SchedulerConfig(max_running_requests=16),
                                send_timeout_s=send_timeout_s, heartbeat_s=60.0)
    rt, engine = server.runtime(app), server.engine
    before = engine.stats().generation_tokens
    stalled = RawWsClient()
    await stalled.connect(url)
    conn = next(c for c in list(rt.connections) if c.session.id == stalled.session_id)
    server.call(_constrain(conn))
    start = time.perf_counter()
    for i in range(SLOW_STREAMS):
        await stalled.send({"type": "generate", "id": f"{LONG_ID}{i}", "prompt": "Go on:",
                            "params": {"max_tokens": long_run, "temperature": 0,
                                       "ignore_eos": True}})
    while conn in rt.connections:
        assert time.perf_counter() - start < 60, "the stalled socket was never closed"
        await asyncio.sleep(0.05)
    closed_after = time.perf_counter() - start
    while engine.stats().num_running or rt.scheduler.admission.num_running:
        assert time.perf_counter() - start < 60, "its requests still run"
        await asyncio.sleep(0.05)
    generated = engine.stats().generation_tokens - before
    await asyncio.sleep(0.5)
    print(f"\nstalled socket closed {closed_after:.1f}s after its first request (send "
          f"timeout {send_timeout_s}s); {generated} of {SLOW_STREAMS * long_run} tokens "
          "generated before the abort")
    assert engine.stats().generation_tokens - before == generated  # nothing runs on
    assert generated < SLOW_STREAMS * long_run // 2
    assert engine.stats().kv_usage == 0.0  # every block back (the others are done)
    assert rt.scheduler.admission.num_waiting == 0
    assert not rt.scheduler.admission._per_socket  # noqa: SLF001 - no count outlives the socket
    with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
        while await asyncio.wait_for(stalled.recv(), 10) is not None:
            pass  # what the buffers held, then the close or a reset
        raise ConnectionResetError("closed")  # a close frame is as good as a reset
    stalled.close()
