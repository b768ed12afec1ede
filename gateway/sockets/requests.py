"""A request on a socket, whatever its wire format: render, admit, stream, done.

    rt.check_door(...)         -> refused at once if even an empty prompt would be (the
                                  pass holds the request's place until it asks admit)
    rt.using_model(...)        -> its model held loaded (the protocol's loading frame first
                                  when it must load)
    render(stream, max_tokens) -> prompt ids (None: the request was answered already)
    rt.admit(...)              -> an engine slot, or a RequestError (overloaded, ...)
    admission.generate(...)    -> each output folded into the stream, its delta queued
    before_done(stream)        -> the protocol's last word (a chat turn's save)
    outbox.put_done(stream)    -> the protocol's `done` frame(s)

A request refused before it streamed is answered by `refuse(error)`, the protocol's own
error frame; one that fails mid-stream ends with `done` (finish_reason error).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from engine.errors import EngineError
from engine.sampling_params import SamplingParams
from gateway.errors import RequestError
from gateway.sockets.core import SocketCore
from gateway.stream import Stream

log = logging.getLogger(__name__)

Render = Callable[[Stream, int], Awaitable["list[int] | None"]]


async def run_request(core: SocketCore, stream: Stream, render: Render,
                      params: SamplingParams, owner: str | None,
                      refuse: Callable[[RequestError], None],
                      before_done: Callable[[Stream], Awaitable[None]] | None = None) -> None:
    """Serve one request to its end; `owner` is the session's key hash (per-key limits)."""
    async with contextlib.AsyncExitStack() as held:
        admission = None
        try:
            door_pass = core.rt.check_door(stream, params.priority, core, owner)
            held.callback(door_pass.close)  # however the request ends before admit
            # The request's model, held loaded until the request ends (released last).
            stream.model = await held.enter_async_context(
                core.rt.using_model(stream.id, lambda model: _loading(core, stream, model)))
            prompt = await render(stream, params.max_tokens)
            if prompt is None:
                return
            door_pass.close()  # its place is now asked for as a slot
            admission = await core.rt.admit(stream, params.priority, len(prompt), core, owner)
            stream.admitted = time.perf_counter()
            stream.logprobs = params.logprobs is not None
            outputs = admission.generate(prompt, params, stream.engine_id)
            async with contextlib.aclosing(outputs):
                async for out in outputs:
                    stream.absorb(out)
                    core.outbox.put_delta(stream)
            if before_done is not None:
                await before_done(stream)
            core.outbox.put_done(stream)
        except asyncio.CancelledError:
            if not stream.cancel_requested:
                raise  # the socket closed: nothing to tell, the generator already aborted
            asyncio.current_task().uncancel()
            stream.finish_reason = "cancelled"
            core.outbox.put_done(stream)
        except RequestError as exc:
            refuse(exc)
        except Exception as exc:  # noqa: BLE001 - a request's failure must not kill the socket
            _failed(core, stream, exc, refuse)
        finally:
            if admission is not None:
                admission.release(stream.completion_tokens, stream.finish_reason)
            core.streams.pop(stream.id, None)


def _loading(core: SocketCore, stream: Stream, model) -> None:
    """Tell the client its request waits for its model's load (where its protocol can)."""
    frame = core.protocol.loading_frame(stream, model.name)
    if frame is not None:
        core.outbox.put(frame)


def _failed(core: SocketCore, stream: Stream, exc: Exception,
            refuse: Callable[[RequestError], None]) -> None:
    """Before anything streamed: an error frame with the engine's code; after: `done`
    with finish_reason error (the client keeps what it got)."""
    code = exc.code if isinstance(exc, EngineError) else "internal"
    if code == "internal":
        log.error("request %s failed", stream.engine_id, exc_info=exc)
    if stream.first_written is None and not stream.queued:
        message = str(exc) if code != "internal" else "internal error"
        refuse(RequestError(code, message, stream.id))
        return
    stream.finish_reason, stream.error = "error", "internal error"
    core.outbox.put_done(stream)
