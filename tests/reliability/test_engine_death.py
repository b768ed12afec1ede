"""Consecutive failed engine steps exit a real `tokenwire serve` process non-zero, so a
supervisor restarts it. The server runs through faulty_serve.py, the CLI entry with a
forward-pass fault for requests seeded FAULT_SEED; everything else is real."""
from __future__ import annotations

import asyncio
import time

import aiohttp

from .faulty_serve import FAULT_SEED, MESSAGE
from .harness import connect, until_end

EXIT_BOUND_S = 10.0


async def _generate(ws, request_id: str, seed: int) -> dict:
    await ws.send_json({"type": "generate", "id": request_id, "prompt": "Hello",
                        "params": {"max_tokens": 4, "ignore_eos": True, "seed": seed}})
    return (await until_end(ws, request_id))[1]


def _failed(end: dict) -> bool:
    return end.get("finish_reason") == "error" or end.get("code") == "internal"


async def _health(http, server) -> int | None:
    try:
        async with http.get(server.http_url + "/health") as resp:
            return resp.status
    except aiohttp.ClientError:
        return None  # the listener is gone


async def test_consecutive_faults_exit_the_process(spawn, figures):
    server = spawn("--max-consecutive-failed-steps", "3", name="faulty",
                   module="tests.reliability.faulty_serve").start()
    async with aiohttp.ClientSession() as http:
        ws, _ = await connect(http, server)
        first = await _generate(ws, "ok", 1)
        faulty = [await _generate(ws, f"bad{i}", FAULT_SEED) for i in range(2)]
        alive_after_two = await _health(http, server)
        await ws.send_json({"type": "generate", "id": "bad2", "prompt": "Hello",
                            "params": {"max_tokens": 4, "seed": FAULT_SEED}})
        sent = time.monotonic()
        statuses = []
        while server.proc.poll() is None and time.monotonic() - sent < EXIT_BOUND_S + 5:
            statuses.append(await _health(http, server))
            await asyncio.sleep(0.02)
        rc = await asyncio.to_thread(server.proc.wait, 30)
        exited_after = time.monotonic() - sent
    figures("3 consecutive engine step faults", tried=1, survived=int(rc != 0), lost=0,
            notes=f"forward-pass fault in 3 steps in a row: the process exited {rc} after "
                  f"{exited_after:.1f} s; /health answers seen meanwhile "
                  f"{sorted(set(statuses), key=str)} (None: listener gone)")
    assert first.get("finish_reason") == "length", first
    assert all(_failed(end) for end in faulty), faulty
    assert alive_after_two == 200
    assert rc not in (0, None) and exited_after < EXIT_BOUND_S, (rc, exited_after)
    log = server.log()
    assert MESSAGE in log and "engine is dead" in log
