"""SIGTERM with streams in flight (50 and 64 with TOKENWIRE_FULL_SIZE=1): `draining` to every client, then each stream's end,
then close 1012. Short streams finish inside the drain; long ones are ended at the drain
timeout; none just stops. WebSocket and SSE streams alike, within the drain's bound.
"""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from tests.sizes import size

from .harness import connect

NUM_STREAMS = size(24, 50)  # 24 on 32 engine slots; at full size 18 queue too
# Long enough for a 16-token stream to finish among 32 on a 2-core AVX2 box (at 12 s every
# stream is cut); 1024-token ones still take minutes on any CPU.
DRAIN_TIMEOUT_S = 20.0
SHORT_TOKENS, LONG_TOKENS = 16, 1024
STARTED_BEFORE_SIGTERM = NUM_STREAMS * 2 // 5  # streams with a first delta when the signal goes


async def _client(http, server, index: int, started: asyncio.Queue) -> dict:
    """One socket, one request; every frame until the socket closes."""
    ws, _ = await connect(http, server)
    long = index % 2 == 1
    await ws.send_json({"type": "chat" if index % 4 < 2 else "generate", "id": "s",
                        ("content" if index % 4 < 2 else "prompt"): f"Story {index}, please.",
                        "params": {"max_tokens": LONG_TOKENS if long else SHORT_TOKENS,
                                   "ignore_eos": True}})
    frames = []
    async for msg in ws:  # ends at the close frame
        if msg.type != aiohttp.WSMsgType.TEXT:
            break
        frames.append(msg.json())
        if frames[-1]["type"] == "delta" and sum(f["type"] == "delta" for f in frames) == 1:
            started.put_nowait(index)
    return {"long": long, "frames": frames, "close": ws.close_code}


def _outcome(client: dict) -> str:
    """finished_before | finished | cut | lost | no_draining, from one client's frames."""
    kinds = [f["type"] for f in client["frames"]]
    ends = [i for i, k in enumerate(kinds) if k in ("done", "error")]
    if len(ends) != 1 or any(k != "draining" for k in kinds[ends[0] + 1:]):
        return "lost"  # no end, two ends, or frames after the end other than draining
    if "draining" not in kinds:
        return "no_draining"
    end = client["frames"][ends[0]]
    if ends[0] < kinds.index("draining"):
        return "finished_before"
    if end["type"] == "done" and end["finish_reason"] in ("stop", "length"):
        return "finished"
    return "cut"  # done/cancelled with "server draining", or an error, at the timeout


async def test_sigterm_drains_streams_in_flight(spawn, figures):
    # The prior drain rate lets streams beyond the engine's slots queue on a server that
    # has measured none yet (without one they are refused at once).
    server = spawn("--drain-timeout", str(DRAIN_TIMEOUT_S), "--ttft-bound-s", "600",
                   "--initial-drain-rps", "1", name="drain").start()
    started: asyncio.Queue = asyncio.Queue()
    async with aiohttp.ClientSession() as http:
        clients = [asyncio.create_task(_client(http, server, i, started))
                   for i in range(NUM_STREAMS)]
        for _ in range(STARTED_BEFORE_SIGTERM):
            await asyncio.wait_for(started.get(), 180)
        server.terminate()
        signalled = time.monotonic()
        results = await asyncio.wait_for(asyncio.gather(*clients), DRAIN_TIMEOUT_S + 60)
        exit_code = await asyncio.to_thread(server.proc.wait, 60)
        exited_s = time.monotonic() - signalled
    outcomes = [_outcome(r) for r in results]
    count = {k: outcomes.count(k) for k in
             ("finished_before", "finished", "cut", "lost", "no_draining")}
    closes = {r["close"] for r in results}
    figures(f"SIGTERM with {NUM_STREAMS} streams in flight", tried=NUM_STREAMS,
            survived=count["finished_before"] + count["finished"] + count["cut"],
            lost=count["lost"] + count["no_draining"],
            notes=f"after `draining`: {count['finished']} finished, {count['cut']} ended at "
                  f"the {DRAIN_TIMEOUT_S:.0f} s drain timeout; {count['finished_before']} "
                  f"had finished before the signal reached them; close codes {closes}; "
                  f"process exited {exit_code} after {exited_s:.1f} s")
    assert count["lost"] == 0 and count["no_draining"] == 0, (count, results)
    assert count["finished_before"] <= NUM_STREAMS // 5, count  # really in flight
    assert count["finished"] >= 1 and count["cut"] >= 1, count  # both paths ran
    assert all(not r["long"] or _outcome(r) == "cut" for r in results), count
    assert closes == {1012}, closes
    assert exit_code == 0 and exited_s < DRAIN_TIMEOUT_S + 20


MIXED_PER_KIND, MIXED_DRAIN_S = size(12, 32), 2.0
MIXED_TOKENS = 2000  # far more than the drain leaves time for: every stream is cut


async def _ws_stream(http, server, index: int, started: asyncio.Queue) -> dict:
    """One socket, one long generate; every frame until the socket closes."""
    ws, _ = await connect(http, server)
    await ws.send_json({"type": "generate", "id": "g", "prompt": f"Story {index}, please.",
                        "params": {"max_tokens": MIXED_TOKENS, "ignore_eos": True}})
    frames = []
    async for msg in ws:
        if msg.type != aiohttp.WSMsgType.TEXT:
            break
        frames.append(msg.json())
        if frames[-1]["type"] == "delta" and sum(f["type"] == "delta" for f in frames) == 1:
            started.put_nowait(index)
    ends = [f for f in frames if f["type"] in ("done", "error") and f.get("id") == "g"]
    return {"kind": "ws", "ends": ends, "close": ws.close_code}


async def _sse_stream(http, server, index: int, started: asyncio.Queue) -> dict:
    """One streamed completion; every event until the response ends."""
    body = {"prompt": f"Story {index}, please.", "max_tokens": MIXED_TOKENS,
            "ignore_eos": True, "stream": True}
    events = []
    try:
        async with http.post(server.http_url + "/v1/completions", json=body) as resp:
            async for line in resp.content:
                if line.strip():
                    events.append(line.strip().removeprefix(b"data: "))
                    if len(events) == 1:
                        started.put_nowait(index)
    except aiohttp.ClientPayloadError:
        pass  # cut off without an end: `ends` below stays empty
    last = json.loads(events[-2]) if len(events) >= 2 and events[-1] == b"[DONE]" else {}
    ended = "error" in last or any(c.get("finish_reason") for c in last.get("choices", []))
    return {"kind": "sse", "ends": [last] if ended else [], "close": None}


async def test_sigterm_ends_ws_and_sse_streams_within_the_drain_bound(spawn, figures):
    """drain_timeout_s 2 with WS and SSE streams still generating: each ends with a terminal event
    (WS `done` cancelled, SSE an error event then [DONE]), the process exits within the
    drain timeout plus its one-second grace, and logs no traceback."""
    server = spawn("--drain-timeout", str(MIXED_DRAIN_S), "--ttft-bound-s", "600",
                   "--max-running-requests", str(2 * MIXED_PER_KIND), name="drain-mixed").start()
    started: asyncio.Queue = asyncio.Queue()
    async with aiohttp.ClientSession() as http:
        clients = [asyncio.create_task(run(http, server, i, started))
                   for i in range(MIXED_PER_KIND) for run in (_ws_stream, _sse_stream)]
        for _ in clients:  # every stream has produced output: all are in flight
            await asyncio.wait_for(started.get(), 300)
        server.terminate()
        signalled = time.monotonic()
        exit_code = await asyncio.to_thread(server.proc.wait, 60)
        exited_s = time.monotonic() - signalled
        results = await asyncio.wait_for(asyncio.gather(*clients), 30)
    ended = [r for r in results if len(r["ends"]) == 1]
    log = server.log()
    figures(f"SIGTERM with {MIXED_PER_KIND} WS + {MIXED_PER_KIND} SSE streams, drain timeout "
            f"{MIXED_DRAIN_S:.0f} s", tried=len(results),
            survived=len(ended), lost=len(results) - len(ended),
            notes=f"every stream cut at the deadline; process exited {exit_code} after "
                  f"{exited_s:.1f} s")
    assert len(ended) == len(results), [r for r in results if len(r["ends"]) != 1]
    assert all(r["ends"][0]["finish_reason"] == "cancelled" for r in ended
               if r["kind"] == "ws"), ended
    assert all(r["ends"][0]["error"]["code"] == "draining" for r in ended
               if r["kind"] == "sse"), ended
    assert {r["close"] for r in results if r["kind"] == "ws"} == {1012}
    assert "Traceback" not in log, log[-3000:]
    assert exit_code == 0 and exited_s < MIXED_DRAIN_S + 1.0, exited_s
