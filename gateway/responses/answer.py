"""A response over HTTP: one JSON Response object, or Server-Sent Events.

SSE frames carry OpenAI's `event:` line and the event as `data:`; there is no `[DONE]`:
the stream ends after response.completed (or .incomplete / .failed). A request cut by a
drain ends its stream with response.failed; over plain HTTP it is a 503.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time

from aiohttp import web

from gateway.errors import error_response
from gateway.openai.answer import SseSink  # the bounded SSE writer, shared
from gateway.responses.run import Prepared, finish, generate
from gateway.runtime import Runtime
from gateway.stream import Stream
from scheduler.door import Admission

log = logging.getLogger(__name__)


async def whole(rt: Runtime, admission: Admission, prepared: Prepared,
                stream: Stream) -> web.Response:
    async with contextlib.aclosing(generate(admission, prepared, stream)) as outputs:
        async for _ in outputs:
            pass
    await asyncio.shield(finish(rt, prepared, stream))
    now = time.perf_counter()
    rt.metrics.observe_delta(stream, 0, now)  # the whole answer is its first write
    rt.metrics.observe_done(stream, now)
    body = prepared.shape.final(stream)
    if prepared.shape.status == "failed" and stream.finish_reason == "error":
        raise error_response(web.HTTPInternalServerError, body["error"]["message"],
                             "internal", err_type="server_error")
    return web.json_response(body)


async def sse(request: web.Request, rt: Runtime, admission: Admission, prepared: Prepared,
              stream: Stream) -> web.StreamResponse:
    shape = prepared.shape
    async with contextlib.aclosing(generate(admission, prepared, stream)) as outputs:
        out = await anext(outputs, None)  # errors in the prompt still answer 400, not SSE
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        sink = SseSink(request, resp, rt.config.send_timeout_s)
        try:
            for event in shape.opening():
                await _write(sink, shape, event)
            while out is not None:
                if out.delta_text and prepared.generate:
                    for event in shape.feed(out.delta_text):
                        await _write(sink, shape, event)
                    rt.metrics.observe_delta(stream, len(out.new_token_ids),
                                             time.perf_counter())
                out = await anext(outputs, None)
        except asyncio.CancelledError:
            if not stream.cancel_requested:
                raise  # the client hung up: nobody to tell
            asyncio.current_task().uncancel()  # the drain cut it: end the stream properly
            stream.finish_reason, stream.error = "cancelled", "server draining"
        except ConnectionError:
            raise
        except Exception:  # noqa: BLE001 - past the headers a fault can only end the stream
            log.exception("response %s failed", stream.engine_id)
            stream.finish_reason, stream.error = "error", "internal error"
    await asyncio.shield(finish(rt, prepared, stream))
    rt.metrics.observe_done(stream, time.perf_counter())
    for event in shape.closing(stream):
        await _write(sink, shape, event)
    await sink.write_eof()
    return resp


async def _write(sink: SseSink, shape, event: dict) -> None:
    shape.stamp(event)
    await sink.write(_frame(event))


def _frame(event: dict) -> bytes:
    return (f"event: {event['type']}\ndata: ".encode()
            + json.dumps(event, ensure_ascii=False).encode() + b"\n\n")


async def follow(request: web.Request, rt: Runtime, log, after: int) -> web.StreamResponse:
    """A background run's events after sequence number `after`, as SSE, until its end
    (the run goes on if this client leaves)."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    sink = SseSink(request, resp, rt.config.send_timeout_s)
    async for event in log.follow(after):
        await sink.write(_frame(event))
    await sink.write_eof()
    return resp
