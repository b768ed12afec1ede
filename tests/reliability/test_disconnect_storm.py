"""Clients (64; 200 with TOKENWIRE_FULL_SIZE=1) vanish mid-stream at seeded random moments: nothing leaks.

"Nothing" is checked from both sides: the server's /metrics (KV usage, running and
waiting requests, sockets, sessions back to zero) and the server process itself, probed
from outside (asyncio tasks, file descriptors and sockets no more than before the storm,
no socket open at all).
"""
from __future__ import annotations

import asyncio
import random

import aiohttp

from tests.sizes import size

from .harness import connect, generate_once, recv, settle

NUM_CLIENTS = size(64, 200)  # 64 drops mid-stream already prove nothing leaks
CONCURRENT = 24  # clients connected at once: enough to fill the engine's running slots
SEED = 20261123
IDLE = {"tokenwire_kv_cache_usage_ratio": 0.0, "tokenwire_requests_running": 0.0,
        "tokenwire_requests_waiting": 0.0, "tokenwire_websocket_connections_active": 0.0,
        "tokenwire_sessions_active": 0.0}


def _plan(rng: random.Random) -> dict:
    """When and how one client drops: after `deltas` deltas (0: at once) or after `sleep_s`,
    either by aborting its TCP connection or by a clean WebSocket close."""
    return {"requests": rng.randint(1, 3), "abort": rng.random() < 0.6,
            "deltas": rng.choice([0, 1, 2, 3, 5, 8, 13, None]),
            "sleep_s": rng.uniform(0.0, 0.5)}


async def _drop(ws, abort: bool) -> None:
    if abort:  # the peer vanishes: no close frame, the TCP connection is torn down
        ws._conn.transport.abort()  # noqa: SLF001 - aiohttp has no public abort
        ws._response.close()  # noqa: SLF001
    else:
        await ws.close()


async def _client(http, server, index: int, plan: dict) -> dict:
    """Run one client's plan; returns how many of its requests were still open (none
    finished) and how many had streamed at least one delta when it dropped."""
    ws, _ = await connect(http, server)
    open_ids = {f"r{r}" for r in range(plan["requests"])}
    for request_id in sorted(open_ids):
        await ws.send_json({"type": "generate", "id": request_id,
                            "prompt": f"Client {index} asks for story {request_id} about the sea.",
                            "params": {"max_tokens": 48, "ignore_eos": True,
                                       "temperature": 0.8, "seed": index}})
    streaming: set[str] = set()
    if plan["deltas"] is None:
        await asyncio.sleep(plan["sleep_s"])
    else:
        seen = 0
        while seen < plan["deltas"] and open_ids:
            frame = await recv(ws)
            assert frame["type"] in ("delta", "done"), frame  # no refusals on this server
            seen += frame["type"] == "delta"
            streaming.add(frame["id"])
            if frame["type"] == "done":
                open_ids.discard(frame["id"])
    await _drop(ws, plan["abort"])
    return {"open": len(open_ids), "streaming": len(open_ids & streaming)}


async def _storm(server, plans: list[dict]) -> list[dict]:
    slots = asyncio.Semaphore(CONCURRENT)

    async def client(index: int, plan: dict) -> dict:
        async with slots:
            return await _client(http, server, index, plan)

    async with aiohttp.ClientSession() as http:
        return await asyncio.gather(*(client(i, plan) for i, plan in enumerate(plans)))


async def _settled(server) -> tuple[dict, dict]:
    """/metrics once idle, and then a probe that reads the same twice in a row (sockets
    that just closed finish their handlers first). force_close: the scrapes themselves
    must not leave a keep-alive socket behind."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as http:
        metrics = await settle(http, server, IDLE)
    probes = [await asyncio.to_thread(server.probe)]
    for _ in range(20):
        await asyncio.sleep(0.25)
        probes.append(await asyncio.to_thread(server.probe))
        if probes[-1] == probes[-2]:
            break
    return metrics, probes[-1]


async def test_disconnect_storm_frees_everything(shared_server, figures):
    rng = random.Random(SEED)
    plans = [_plan(rng) for _ in range(NUM_CLIENTS)]
    first = await generate_once(shared_server, 8)  # warm: lazily made objects exist before the baseline
    _, before = await _settled(shared_server)

    results = await _storm(shared_server, plans)
    metrics, after = await _settled(shared_server)
    end = await generate_once(shared_server, 8)

    leaked = {k: metrics.get(k) for k, v in IDLE.items() if metrics.get(k) != v}
    leaked.update({k: (before[k], after[k]) for k in ("tasks", "fds", "sockets")
                   if after[k] > before[k]})
    leaked.update({f"task {name}": n for name, n in after["task_names"].items()
                   if n > before["task_names"].get(name, 0)})
    mid_stream = sum(r["open"] > 0 for r in results)
    figures(f"disconnect storm ({NUM_CLIENTS} clients, seeded)", tried=NUM_CLIENTS,
            survived=NUM_CLIENTS if not leaked else 0, lost=0 if not leaked else NUM_CLIENTS,
            notes=f"{mid_stream} clients dropped with requests open, "
                  f"{sum(r['open'] for r in results)} of "
                  f"{sum(p['requests'] for p in plans)} requests cut "
                  f"({sum(r['streaming'] for r in results)} after their first delta); "
                  f"{sum(p['abort'] for p in plans)} by TCP abort, the rest by close; "
                  f"after: KV usage {metrics.get('tokenwire_kv_cache_usage_ratio')}, "
                  f"tasks {after['tasks']}/{before['tasks']} (after/before), "
                  f"sockets {after['sockets']}, leaked {leaked or 'nothing'}; "
                  f"next client served: {end['type'] == 'done'}")
    assert first["type"] == "done", first
    assert mid_stream >= NUM_CLIENTS * 3 // 4, results  # the storm really cut live requests
    assert sum(r["streaming"] for r in results) >= NUM_CLIENTS // 4, results
    assert not leaked, (metrics, before, after)
    assert after["sockets"] == 0, after
    assert end["type"] == "done" and end["usage"]["completion_tokens"] == 8, end
    assert end["text"]
