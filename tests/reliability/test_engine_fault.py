"""A fault inside an engine step ends that step's requests, and only those; repeated
faults kill the engine, which /health reports.

The faults are injected in-process (the only way to reach inside the engine) into the
real app and engine on a loopback port, at three places: the model's forward pass, the
sampler, and the per-token work after sampling (detokenizer and stop strings). A spy on
`ModelRunner.execute` records which requests each failing step held. Real WebSocket
clients watch; the counts asserted come from the engine's own finish counters.
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
from gateway.runtime import RUNTIME
from scheduler.config import SchedulerConfig
from scheduler.door import Scheduler
from scheduler.models import ModelSlot

from .harness import recv

FAULT_SEED = 666_001  # a request with this seed makes its step (or itself) fail
SECRET = "injected fault 7f3a"  # must reach the log, never a client
SOCKETS, PER_SOCKET = 8, 8  # 64 concurrent requests around the faulty one
MAX_TOKENS = 16
PLACES = {"forward": "the forward pass", "sampler": "the sampler",
          "after_sampling": "one request after sampling"}
# Admission lets all 65 through to the engine, whose own queue holds what waits.
ADMIT_ALL = SchedulerConfig(max_running_requests=SOCKETS * PER_SOCKET + 1, ttft_bound_s=600,
                            max_inflight_per_socket=PER_SOCKET + 1)


class Faults:
    """Where and when to raise; `failed_batches` lists the request ids of each failed step."""

    def __init__(self, core, where: str, sticky: bool = False):
        self.where, self.sticky = where, sticky
        self.armed = False  # the step now running holds a marked request
        self.failed_batches: list[set[str]] = []
        runner = core.runner
        execute, forward, sample = runner.execute, runner.model.forward, runner.sampler.sample
        # the per-token work after sampling
        detokenize = getattr(core, "_detokenize", None)

        def spy_execute(batch):
            self.armed = self.sticky or any(r.params.seed == FAULT_SEED for r in batch.requests)
            try:
                return execute(batch)
            except Exception:
                self.failed_batches.append({r.request_id for r in batch.requests})
                raise

        def faulty(forward):  # LlamaModel's forward, or the C++ decode stack's
            def faulty_forward(*args, **kwargs):
                if self.where == "forward" and self.armed:
                    raise RuntimeError(SECRET)
                return forward(*args, **kwargs)
            return faulty_forward

        def faulty_sample(logits, requests):
            if self.where == "sampler" and self.armed:
                raise RuntimeError(SECRET)
            return sample(logits, requests)

        def faulty_detokenize(request, token, reason):
            if self.where == "after_sampling" and request.params.seed == FAULT_SEED:
                raise RuntimeError(SECRET)
            return detokenize(request, token, reason)

        runner.execute, runner.model.forward = spy_execute, faulty(forward)
        if runner.decode_stack is not None:  # decode-only steps' forward (engine.cpu_decode)
            runner.decode_stack.forward = faulty(runner.decode_stack.forward)
        runner.sampler.sample = faulty_sample
        if detokenize is not None:
            core._detokenize = faulty_detokenize  # noqa: SLF001


@pytest.fixture
async def serve():
    """`serve(**engine_config)` -> (ws url, http url, app, engine); all stopped at the end."""
    started = []

    async def start(**engine_overrides):
        torch.set_num_threads(1)
        config = EngineConfig(model="default", device="cpu", num_kv_blocks=256,
                              max_model_len=1024, **engine_overrides)
        engine = await asyncio.to_thread(AsyncEngine, config)
        await engine.start()
        app = build_app(GatewayConfig(port=0), Scheduler(ADMIT_ALL, ModelSlot(engine=engine)))
        runner = make_runner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        started.append((runner, engine))
        port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - port 0 chosen
        return f"ws://127.0.0.1:{port}/v1/ws", f"http://127.0.0.1:{port}", app, engine

    yield start
    for runner, engine in started:
        await runner.cleanup()
        await engine.stop()


def _generate(request_id: str, seed: int) -> dict:
    return {"type": "generate", "id": request_id, "prompt": f"Tell me about {request_id}.",
            "params": {"max_tokens": MAX_TOKENS, "ignore_eos": True, "seed": seed,
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


def _failed(entry: dict) -> bool:
    end = entry["end"]
    return (end["type"] == "error" and end["code"] == "internal") or \
        (end["type"] == "done" and end["finish_reason"] == "error")


def _completed(entry: dict) -> bool:
    end = entry["end"]
    return end["type"] == "done" and end["finish_reason"] == "length" and \
        end["usage"]["completion_tokens"] == MAX_TOKENS


@pytest.mark.parametrize("where", ["forward", "sampler", "after_sampling"])
async def test_step_fault_ends_only_its_requests(serve, where, figures, caplog):
    # 16 sequences per step: the faulty step holds some of the 65 requests, never all.
    url, _, _, engine = await serve(max_num_seqs=16)
    faults = Faults(engine.core, where)
    async with aiohttp.ClientSession() as http:
        sockets = [await http.ws_connect(url) for _ in range(SOCKETS)]
        for s, ws in enumerate(sockets):
            assert (await recv(ws))["type"] == "hello"
            if s == SOCKETS // 2:  # in the middle: its step also holds others' requests
                await sockets[0].send_json(_generate("faulty", FAULT_SEED))
            for i in range(PER_SOCKET):
                await ws.send_json(_generate(f"r{i}", s * 100 + i))
        ids = {f"r{i}" for i in range(PER_SOCKET)}
        seen = await asyncio.gather(*(_collect(ws, ids | {"faulty"} if s == 0 else ids)
                                      for s, ws in enumerate(sockets)))
        for ws in sockets:
            await ws.close()

    entries = [e for per_socket in seen for e in per_socket.values()]
    failed = sum(map(_failed, entries))
    completed = sum(map(_completed, entries))
    stats = engine.stats()
    in_failed_step = len(faults.failed_batches[0]) if faults.failed_batches else 1
    ended = "only the faulty one" if where == "after_sampling" else \
        f"the {in_failed_step} requests of the failed step"
    figures(f"engine fault in {PLACES[where]}", tried=len(entries),
            survived=completed, lost=len(entries) - completed - in_failed_step,
            notes=f"{SOCKETS * PER_SOCKET} concurrent requests around one faulty; {ended} "
                  f"ended with `error`; engine finish counts {stats.finish_reasons}")
    assert seen[0]["faulty"]["end"] is not None and _failed(seen[0]["faulty"])
    if where == "after_sampling":
        assert faults.failed_batches == []  # the step itself succeeded
    else:
        assert len(faults.failed_batches) == 1 and 1 < in_failed_step < len(entries)
    assert failed == in_failed_step == stats.finish_reasons.get("error")
    assert completed == len(entries) - in_failed_step == stats.finish_reasons.get("length")
    assert all(SECRET not in str(e["end"]) for e in entries)  # internals stay in the log
    assert SECRET in caplog.text
    assert engine.is_alive
    assert stats.num_running == 0 and stats.num_free_blocks == stats.num_total_blocks


async def _one(ws, request_id: str, seed: int) -> dict:
    await ws.send_json(_generate(request_id, seed))
    return (await _collect(ws, {request_id}))[request_id]


async def test_consecutive_faults_kill_the_engine(serve):
    # one sequence per step: the last request is still waiting when the engine dies
    url, http_url, app, engine = await serve(max_num_seqs=1, max_consecutive_failed_steps=3)
    faults = Faults(engine.core, "forward")
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(url)
        assert (await recv(ws))["type"] == "hello"
        assert _completed(await _one(ws, "ok0", 1))
        for i in range(2):  # two failed steps, then a good one: the count starts over
            assert _failed(await _one(ws, f"bad{i}", FAULT_SEED))
        assert _completed(await _one(ws, "ok1", 2))
        for i in range(2, 4):
            assert _failed(await _one(ws, f"bad{i}", FAULT_SEED))
        async with http.get(http_url + "/health") as resp:
            assert resp.status == 200 and engine.is_alive
        faults.sticky = True  # every step fails from now on: the third in a row is fatal
        await ws.send_json(_generate("bad4", 3))
        await ws.send_json(_generate("waiting", 4))
        ends = await _collect(ws, {"bad4", "waiting"})
        assert all(_failed(e) for e in ends.values())
        assert len(faults.failed_batches) == 5
        assert not engine.is_alive
        async with http.get(http_url + "/health") as resp:
            assert resp.status == 503
            assert (await resp.json())["engine_alive"] is False
        assert app[RUNTIME].status == "failed"
        after = (await _one(ws, "after", 5))["end"]  # refused at once, no hang
        assert after["code"] == "model_unavailable" and "engine is dead" in after["message"]
        await ws.close()
    stats = engine.stats()
    assert stats.num_free_blocks == stats.num_total_blocks
