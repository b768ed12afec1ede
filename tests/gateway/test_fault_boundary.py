"""A fault stays in its request: an unexpected exception while handling one frame or one
HTTP request answers that request with `internal` (WS) or a 500 in OpenAI's shape, logs one
traceback, and the socket's other streams run on. The fault is a real exception raised on
the real dispatch path for one request id (the rest of the server is untouched)."""
from __future__ import annotations

import asyncio
import json
import logging

import aiohttp
import pytest

import gateway.params
from gateway.errors import RequestError
from gateway.runtime import RUNTIME
from gateway.sockets.outbox import CLOSE_SLOW_CONSUMER, Outbox, OutboxFull
from ws_helpers import open_ws, recv_type, recv_until

LONG = {"max_tokens": 24, "ignore_eos": True, "temperature": 0}


FAULTY_SEED = 4242


def _raise_for_faulty_seed(monkeypatch) -> None:
    """Make the params check, which every WS frame and HTTP body passes, raise RuntimeError
    for the request whose seed is FAULTY_SEED."""
    real = gateway.params.sampling_params

    def sampling_params(params, **kwargs):
        if params.seed == FAULTY_SEED:
            raise RuntimeError("injected fault")
        return real(params, **kwargs)

    monkeypatch.setattr(gateway.params, "sampling_params", sampling_params)


def _tracebacks(caplog) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.exc_info and "injected fault" in str(r.exc_info[1])]


async def test_a_frame_that_raises_answers_internal_and_spares_the_socket(
        base_url, monkeypatch, caplog):
    _raise_for_faulty_seed(monkeypatch)
    async with aiohttp.ClientSession() as s:
        ws, _ = await open_ws(s, base_url)
        await ws.send_json({"type": "generate", "id": "long", "prompt": "Hi", "params": LONG})
        await recv_type(ws, "delta")  # the other stream is running
        await ws.send_json({"type": "generate", "id": "boom", "prompt": "Hi",
                            "params": {"seed": FAULTY_SEED}})
        frames, done = await recv_until(ws, "long")
        errors = [f for f in frames if f["type"] == "error"]
        assert errors == [{"type": "error", "id": "boom", "code": "internal",
                           "message": "internal error"}]
        assert done["type"] == "done" and done["finish_reason"] == "length"
        assert done["usage"]["completion_tokens"] == LONG["max_tokens"]
        await ws.send_json({"type": "ping", "t": 2})
        assert (await recv_type(ws, "pong"))["t"] == 2
        await ws.close()
    assert len(_tracebacks(caplog)) == 1


async def _sse_events(resp) -> list[str]:
    raw = (await resp.read()).decode()
    return [e.removeprefix("data: ") for e in raw.split("\n\n") if e]


@pytest.mark.parametrize("stream", [False, True])
async def test_an_http_request_that_raises_answers_500_and_spares_the_others(
        base_url, monkeypatch, caplog, stream):
    _raise_for_faulty_seed(monkeypatch)
    body = {"prompt": "Hi", "stream": stream, **LONG}
    async with aiohttp.ClientSession() as s:
        other = asyncio.ensure_future(s.post(base_url + "/v1/completions", json=body))
        async with s.post(base_url + "/v1/completions", json={**body, "seed": FAULTY_SEED}) as r:
            assert r.status == 500
            assert (await r.json())["error"] == {"message": "internal error",
                                                 "type": "server_error", "param": None,
                                                 "code": "internal"}
        async with await other as r:
            assert r.status == 200
            if stream:
                events = await _sse_events(r)
                assert events[-1] == "[DONE]"
                assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
            else:
                assert (await r.json())["usage"]["completion_tokens"] == LONG["max_tokens"]
    assert len(_tracebacks(caplog)) == 1


async def test_a_full_outbox_in_a_request_task_closes_the_socket(server, base_url,
                                                                 monkeypatch):
    """A request task that cannot queue its reply (the client is not reading) closes the
    socket as the reader would, instead of dying unseen with the socket left open."""
    rt = server.apps[base_url][RUNTIME]
    real_admit, real_put = rt.admit, Outbox.put

    async def admit(stream, *args, **kwargs):
        if stream.id == "full":
            raise RequestError("overloaded", "try later", stream.id, retry_after_ms=10)
        return await real_admit(stream, *args, **kwargs)

    def put(outbox, frame):
        if frame.get("id") == "full":
            raise OutboxFull("injected")
        real_put(outbox, frame)

    monkeypatch.setattr(rt, "admit", admit)
    monkeypatch.setattr(Outbox, "put", put)
    async with aiohttp.ClientSession() as s:
        ws, _ = await open_ws(s, base_url)
        await ws.send_json({"type": "generate", "id": "full", "prompt": "Hi"})
        try:
            closed = await asyncio.wait_for(ws.receive(), 10)
        except asyncio.TimeoutError:
            closed = None  # the task died unseen and the socket stayed open
        assert closed is not None and closed.type == aiohttp.WSMsgType.CLOSE, closed
        assert closed.data == CLOSE_SLOW_CONSUMER, closed
