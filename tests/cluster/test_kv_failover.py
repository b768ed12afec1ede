"""A session's KV fails over with it (docs/sessions.md, "Failover across replicas"): two
replicas share a Redis session store and one --kv-disk-dir behind the shipped HAProxy
config; a long session's turn runs on one, its socket closes (its blocks are parked to the
shared directory), that replica is killed -9, and the session resumes through HAProxy on
the other, whose next turn loads the history from the dead replica's block files: cached
tokens, the reply of a session that was never interrupted, and a TTFT far below a cold
re-prefill of the same turn (a third server, `--kv-tiers off --no-prefix-caching`),
printed side by side.

Its own small cluster (the package's `cluster` fixture has no shared disk tier and a
large pool): two replicas, one redis-server, one HAProxy, all on loopback.
"""
from __future__ import annotations

import asyncio
import shutil
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import pytest

from loadtest.haproxy_process import HaproxyProcess
from tests.reliability.harness import ServerProcess, connect
from tests.reliability.kv_turns import (BLOCK, LONG_SENTENCES, MIN_CACHED, POOL_BLOCKS, chat,
                                        figures, text, tier_metric, wait_for_metric)
from tests.services import RedisServer
from tests.sizes import FULL_SIZE

pytestmark = pytest.mark.slow  # three servers load the model and prefill a long history

# A ratio shrinks with the prefill it saves: the CI session is a third of the full one.
MIN_SPEEDUP = 5.0 if FULL_SIZE else 3.0
# No refusals from the TTFT estimate: the box is slow and shared.
FLAGS = ("--block-size", str(BLOCK), "--num-kv-blocks", str(POOL_BLOCKS),
         "--ttft-bound-s", "600")
# Right after a kill -9, HAProxy's own retry (redispatch) usually finds the live replica;
# until its health checks mark the dead one down a client may still see a refusal or a
# 502/503, and reconnects as a real client would: a few times, a short pause apart.
RECONNECT_ATTEMPTS, RECONNECT_PAUSE_S = 10, 0.5
QUESTION = "Which place was it? One word."


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    """({"r1": server, "r2": server} behind HAProxy, sharing Redis and a block
    directory, each named so in hello.instance; HAProxy; the cold server)."""
    tmp = tmp_path_factory.mktemp("kv-failover")
    redis = RedisServer(tmp / "redis").start()
    shared = tmp / "kv"
    pair = {name: ServerProcess(tmp / f"{name}.log", "--session-store", redis.url,
                                "--instance-id", name, "--kv-disk-dir", str(shared), *FLAGS)
            for name in ("r1", "r2")}
    cold = ServerProcess(tmp / "cold.log", "--state-dir", str(tmp / "cold"), *FLAGS,
                         "--kv-tiers", "off", "--no-prefix-caching")
    try:
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(ServerProcess.start, [*pair.values(), cold]))
        with HaproxyProcess([f"127.0.0.1:{r.port}" for r in pair.values()]) as lb:
            yield pair, lb, cold
    finally:
        for server in (*pair.values(), cold):
            server.stop()
        redis.stop()
        shutil.rmtree(shared, ignore_errors=True)  # tens to hundreds of MB of fp32 KV


async def reconnect(http, lb, session_id: str) -> tuple:
    """(ws, hello, refusals seen) for the session, through HAProxy."""
    for refusals in range(RECONNECT_ATTEMPTS):
        try:
            ws, hello = await connect(http, lb, session_id)
            return ws, hello, refusals
        except (aiohttp.WSServerHandshakeError, aiohttp.ClientConnectionError):
            if refusals == RECONNECT_ATTEMPTS - 1:
                raise
            await asyncio.sleep(RECONNECT_PAUSE_S)


async def uninterrupted(http, server, history: str) -> tuple[str, str, dict]:
    """The same two turns on one socket of the cold server: (first reply, reply, figures)."""
    ws, _ = await connect(http, server)
    first, end = await chat(ws, "long", history)
    assert end["type"] == "done", end
    reply, end = await chat(ws, "after", QUESTION)
    await ws.close()
    return first, reply, figures(end)


async def test_a_session_fails_over_with_its_kv(replicas):
    pair, lb, cold = replicas
    history = text("Ardnamurchan", LONG_SENTENCES)
    async with aiohttp.ClientSession() as http:
        ws, hello = await connect(http, lb)
        holder = pair[hello["instance"]]
        first, end = await chat(ws, "long", history)
        prompt_blocks = figures(end)["prompt"] // BLOCK
        await ws.close()  # its last socket: parked, through to the shared directory
        await wait_for_metric(http, holder, "kv_tier_stores_total", "disk", prompt_blocks)
        holder.kill9()
        ws, resumed, refusals = await reconnect(http, lb, hello["session_id"])
        reply, end = await chat(ws, "after", QUESTION)
        await ws.close()
        from_disk = await tier_metric(http, pair[resumed["instance"]],
                                      "kv_tier_hit_tokens_total", "disk")
        cold_first, cold_reply, cold_fig = await uninterrupted(http, cold, history)
    fig = figures(end)
    print(f"\nfailover {hello['instance']} -> {resumed['instance']} ({refusals} client "
          f"retries): cached {fig['cached']}/{fig['prompt']} ({from_disk:.0f} from disk) "
          f"TTFT {fig['ttft_ms']:.0f} ms | cold re-prefill cached {cold_fig['cached']}/"
          f"{cold_fig['prompt']} TTFT {cold_fig['ttft_ms']:.0f} ms | "
          f"{cold_fig['ttft_ms'] / max(fig['ttft_ms'], 1e-3):.1f}x")
    assert resumed["resumed"] and resumed["instance"] != hello["instance"]
    assert fig["cached"] >= MIN_CACHED
    assert from_disk >= fig["cached"] - BLOCK  # the dead replica's files, not a prefill
    assert (first, reply) == (cold_first, cold_reply)  # same greedy turns as uninterrupted
    assert fig["ttft_ms"] * MIN_SPEEDUP <= cold_fig["ttft_ms"]
