"""An exception inside the engine for one request ends that request, and only that one.

The fault is injected in-process (the only way to reach inside the engine): the real
app and engine on a loopback port, with EngineCore._append_token (detokenizer and stop
checks) raising for the requests whose seed marks them. Real WebSocket clients watch.
"""
from __future__ import annotations

import asyncio

import aiohttp
import pytest
import torch
from aiohttp import web

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from gateway.app import build_app, make_runner
from gateway.config import GatewayConfig

from .harness import recv

FAULT_MID = 666_001  # fails at its 4th token: after deltas were written
FAULT_FIRST = 666_002  # fails at its first token: nothing written yet
SECRET = "injected fault 7f3a"  # must reach the log, never a client
NORMAL = 6


def _inject(core) -> None:
    original = core._append_token  # noqa: SLF001 - the engine's per-token step

    def faulty(request, token):
        seed = request.params.seed
        if seed == FAULT_FIRST or (seed == FAULT_MID and request.num_output_tokens >= 3):
            raise RuntimeError(SECRET)
        return original(request, token)

    core._append_token = faulty  # noqa: SLF001


@pytest.fixture
async def faulty_server():
    torch.set_num_threads(1)
    config = EngineConfig(model="default", device="cpu", num_kv_blocks=256,
                          max_model_len=1024)
    engine = await asyncio.to_thread(AsyncEngine, config)
    _inject(engine.core)
    await engine.start()
    app = build_app(GatewayConfig(port=0), engine=engine)
    runner = make_runner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - port 0 chosen
    yield f"ws://127.0.0.1:{port}/v1/ws", engine
    await runner.cleanup()
    await engine.stop()


def _generate(request_id: str, seed: int, max_tokens: int = 24) -> dict:
    return {"type": "generate", "id": request_id, "prompt": f"Tell me about {request_id}.",
            "params": {"max_tokens": max_tokens, "ignore_eos": True, "seed": seed,
                       "temperature": 0.7}}


async def _collect(ws, ids: set[str]) -> dict[str, dict]:
    """Frames per id until each has its `done` or `error`: {id: {deltas, end}}."""
    seen = {i: {"deltas": 0, "end": None} for i in ids}
    while any(s["end"] is None for s in seen.values()):
        frame = await recv(ws)
        entry = seen[frame["id"]]
        assert entry["end"] is None, (frame, entry)  # nothing after a request's end
        if frame["type"] == "delta":
            entry["deltas"] += 1
        else:
            entry["end"] = frame
    return seen


async def test_engine_exception_ends_one_request(faulty_server, figures, caplog):
    url, engine = faulty_server
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(url)
        assert (await recv(ws))["type"] == "hello"
        other = await http.ws_connect(url)
        assert (await recv(other))["type"] == "hello"
        for i in range(NORMAL // 2):
            await ws.send_json(_generate(f"ok{i}", i))
            await other.send_json(_generate(f"ok{i}", 100 + i))
        await ws.send_json(_generate("mid", FAULT_MID))
        await ws.send_json(_generate("first", FAULT_FIRST))
        ids = {f"ok{i}" for i in range(NORMAL // 2)}
        mine, theirs = await asyncio.gather(_collect(ws, ids | {"mid", "first"}),
                                            _collect(other, ids))
        await ws.send_json(_generate("after", 7))
        after = await _collect(ws, {"after"})
        await ws.close()
        await other.close()

    normal = [s for k, s in mine.items() if k.startswith("ok")] + list(theirs.values())
    completed = [s for s in normal + [after["after"]] if s["end"]["type"] == "done"
                 and s["end"]["finish_reason"] == "length"
                 and s["end"]["usage"]["completion_tokens"] == 24]
    faults = [mine["mid"], mine["first"]]
    ends = [(f["end"]["type"], f["end"].get("finish_reason") or f["end"].get("code"),
             f["deltas"]) for f in faults]
    figures("engine exception in one request", tried=len(normal) + 1,
            survived=len(completed), lost=len(normal) + 1 - len(completed),
            notes=f"the 2 faulty requests ended with {ends} "
                  f"(type, reason/code, deltas before); {len(normal)} concurrent requests "
                  f"and 1 after all completed: {len(completed) == len(normal) + 1}")
    assert len(completed) == len(normal) + 1, (mine, theirs, after)
    assert mine["mid"]["deltas"] >= 1  # the mid-stream case really was mid-stream
    for fault in faults:
        end = fault["end"]
        assert (end["type"] == "error" and end["code"] == "internal") or \
            (end["type"] == "done" and end["finish_reason"] == "error"), end
        assert SECRET not in str(end)  # internals stay in the server log
    assert SECRET in caplog.text
    assert engine.is_alive
    stats = engine.stats()
    assert stats.num_running == 0 and stats.num_free_blocks == stats.num_total_blocks
