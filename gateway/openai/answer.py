"""An OpenAI completion's answer: one JSON body, or Server-Sent Events.

`stream: true` answers one chunk per engine output of any choice (its `index` says which),
ending with `data: [DONE]`; `stream_options.include_usage` adds a usage chunk before it,
and with vLLM's `continuous_usage_stats` every chunk carries the usage so far.
A request that did not finish (cancelled, failed) ends with an OpenAI error event (SSE)
or a 503/500 (whole): never reported as `stop`.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass

from aiohttp import web

from engine.errors import EngineError
from gateway.errors import error_response
from gateway.logprobs import chat_logprobs, completion_logprobs
from gateway.openai.choices import Choice, conclude, merged
from gateway.errors import bad_request
from gateway.openai.request import ChatRequest, CommonRequest
from gateway.runtime import Runtime
from gateway.stream import Stream
from gateway.tools.plan import ToolPlan
from scheduler.door import Admission

log = logging.getLogger(__name__)


@dataclass
class Job:
    """One completion request: the request's own stream (admission, drain, metrics, usage)
    and its choices, run in its admitted engine slot."""

    rt: Runtime
    admission: Admission
    req: CommonRequest
    stream: Stream
    choices: list[Choice]
    prompts: list[list[int]]
    tools: ToolPlan | None = None

    @property
    def chat(self) -> bool:
        return isinstance(self.req, ChatRequest)

    def logprobs(self, choice: Choice, entries: list, offset: int) -> dict | None:
        """This choice's entries in the endpoint's shape; None when not asked."""
        if choice.params.logprobs is None:
            return None
        text = self.rt.model.token_text
        if self.chat:
            return chat_logprobs(entries, text)
        return completion_logprobs(entries, text, offset)


async def _outputs(job: Job):
    """(choice, output) pairs; engine errors before anything was written are 400s."""
    try:
        async with contextlib.aclosing(merged(job.admission, job.stream, job.choices)) as outputs:
            async for item in outputs:
                yield item
    except EngineError as exc:
        if job.stream.first_written is not None or exc.code == "internal":
            raise
        param = "messages" if job.chat else "prompt"
        if getattr(exc, "field", None) == "response_format":  # its schema did not compile
            param = "response_format"
        raise bad_request(str(exc), param, code=exc.code) from None


async def whole(job: Job) -> web.Response:
    async with contextlib.aclosing(_outputs(job)) as outputs:
        async for _ in outputs:
            pass
    stream, rt = job.stream, job.rt
    conclude(stream, job.choices, job.prompts)
    failure = _failure(stream)
    if failure is not None:
        cancelled = stream.finish_reason == "cancelled"  # 503, as for a drain; else 500
        raise error_response(web.HTTPServiceUnavailable if cancelled
                             else web.HTTPInternalServerError, failure["message"],
                             failure["code"], err_type="server_error",
                             headers={"Retry-After": "1"} if cancelled else None)
    now = time.perf_counter()
    rt.metrics.observe_delta(stream, 0, now)  # the whole answer is its first write
    rt.metrics.observe_done(stream, now)
    return web.json_response({**_head(job), "choices": [_whole_choice(job, c)
                                                        for c in job.choices],
                              "usage": _usage(stream)})


def _whole_choice(job: Job, c: Choice) -> dict:
    finish = c.stream.finish_reason
    if not job.chat:
        body = {"text": c.text}
    elif c.calls is None:
        body = {"message": {"role": "assistant", "content": c.text}}
    else:
        content, calls = c.calls.feed(c.text)
        rest, last = c.calls.finish()
        calls += last
        body = {"message": {"role": "assistant", "content": (content + rest) or None,
                            "tool_calls": [call.openai() for call in calls] or None}}
        finish = job.tools.finish_reason(bool(calls), finish)
    return {"index": c.index, **body, "finish_reason": finish,
            "logprobs": job.logprobs(c, c.logprobs, len(c.echo))}


async def sse(request: web.Request, job: Job) -> web.StreamResponse:
    stream = job.stream
    async with contextlib.aclosing(_outputs(job)) as outputs:
        item = await anext(outputs, None)  # errors in the prompt still answer 400, not SSE
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        sink = SseSink(request, resp, job.rt.config.send_timeout_s)
        try:
            for choice in job.choices:
                await _opening(sink, job, choice)
            while item is not None:
                await _sse_output(sink, job, *item)
                item = await anext(outputs, None)
        except asyncio.CancelledError:
            if not stream.cancel_requested:
                raise  # the client hung up: nobody to tell
            asyncio.current_task().uncancel()  # the drain cut it: end the stream properly
            stream.finish_reason = "cancelled"
        except ConnectionError:
            raise  # the client left: nobody to tell
        except Exception:  # noqa: BLE001 - past the headers a fault can only end the stream
            log.exception("stream %s failed", stream.engine_id)
            stream.finish_reason = "error"
    conclude(stream, job.choices, job.prompts)
    job.rt.metrics.observe_done(stream, time.perf_counter())
    await _closing(sink, job)
    return resp


class SseSink:
    """The SSE response, each write bounded by send_timeout: a client that stops reading
    is cut off (its connection aborted), which ends its request and frees its slot, as a
    WebSocket that does not drain is closed."""

    def __init__(self, request: web.Request, resp: web.StreamResponse, timeout: float):
        self._request, self._resp, self._timeout = request, resp, timeout

    async def write(self, data: bytes) -> None:
        await self._bounded(self._resp.write(data))

    async def write_eof(self) -> None:
        await self._bounded(self._resp.write_eof())

    async def _bounded(self, write) -> None:
        try:
            async with asyncio.timeout(self._timeout):  # wait_for could drop a cancel (3.11)
                await write
        except asyncio.TimeoutError:
            if self._request.transport is not None:
                self._request.transport.abort()
            raise ConnectionResetError(f"not read within {self._timeout:g} s") from None


async def _opening(resp: SseSink, job: Job, choice: Choice) -> None:
    """Chat: each choice opens with the assistant's role (then any echo); completions:
    with the echo."""
    if job.chat:
        await _event(resp, _chunk(job, choice, {"role": "assistant", "content": ""}))
        if choice.echo:
            await _event(resp, _chunk(job, choice, {"content": choice.echo}))
            choice.sent_chars = len(choice.echo)
    elif choice.echo:
        await _event(resp, _chunk(job, choice, choice.echo))
        choice.sent_chars = len(choice.echo)


async def _closing(resp: SseSink, job: Job) -> None:
    failure = _failure(job.stream)
    if failure is not None:
        await _event(resp, {"error": failure})
    elif job.req.stream_options is not None and job.req.stream_options.include_usage:
        await _event(resp, {**_head(job, chunk=True), "choices": [],
                            "usage": _usage(job.stream)})
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()


async def _sse_output(resp: SseSink, job: Job, choice: Choice, out) -> None:
    """One chunk; a cancelled or failed choice's last output carries only its text (the
    request's end is the error event written after it)."""
    finish = (choice.stream.finish_reason
              if out.finished and _failure(choice.stream) is None else None)
    logprobs = job.logprobs(choice, out.logprobs or [], choice.sent_chars)
    if not out.delta_text and finish is None and not out.logprobs:
        return
    choice.sent_chars += len(out.delta_text)
    if choice.calls is not None:
        await _tool_output(resp, job, choice, out, finish, logprobs)
    elif job.chat:
        delta = {"content": out.delta_text} if out.delta_text or out.logprobs else {}
        await _event(resp, _chunk(job, choice, delta, finish, logprobs))
    else:
        await _event(resp, _chunk(job, choice, out.delta_text, finish, logprobs))
    job.rt.metrics.observe_delta(job.stream, len(out.new_token_ids), time.perf_counter())


async def _tool_output(resp: SseSink, job: Job, choice: Choice, out, finish: str | None,
                       logprobs: dict | None) -> None:
    """Text as content deltas (a possible call start held back); each call, once whole,
    as one tool_calls delta carrying its id, name and arguments (OpenAI's clients join
    deltas by index, so a whole call is a valid stream)."""
    content, calls = choice.calls.feed(out.delta_text)
    if out.finished:
        rest, last = choice.calls.finish()
        content, calls = content + rest, calls + last
    if content or logprobs:
        await _event(resp, _chunk(job, choice, {"content": content}, None, logprobs))
    first = len(choice.calls.calls) - len(calls)
    for i, call in enumerate(calls):
        await _event(resp, _chunk(job, choice, {"tool_calls": [call.openai(first + i)]}))
    if finish is not None:
        finish = job.tools.finish_reason(bool(choice.calls.calls), finish)
        await _event(resp, _chunk(job, choice, {}, finish))


async def _event(resp: SseSink, obj: dict) -> None:
    await resp.write(b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n")


def _head(job: Job, chunk: bool = False) -> dict:
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if job.chat \
        else "text_completion"
    return {"id": job.stream.id, "object": kind, "created": int(time.time()),
            "model": job.rt.model.name}


def _chunk(job: Job, choice: Choice, delta, finish: str | None = None,
           logprobs: dict | None = None) -> dict:
    body = {"index": choice.index, "finish_reason": finish, "logprobs": logprobs}
    body.update({"delta": delta} if job.chat else {"text": delta})
    chunk = {**_head(job, chunk=True), "choices": [body]}
    options = job.req.stream_options
    if options is not None and options.include_usage and options.continuous_usage_stats:
        chunk["usage"] = _usage_so_far(job)  # vLLM's: usage on every chunk
    return chunk


def _usage_so_far(job: Job) -> dict:
    prompt = sum(map(len, job.prompts))
    completion = job.stream.completion_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def _failure(stream: Stream) -> dict | None:
    """OpenAI's error object for a request that ended without finishing its answer
    (cancelled or failed), None for `stop` and `length`: never reported as `stop`."""
    if stream.finish_reason in ("stop", "length"):
        return None
    if stream.finish_reason == "cancelled":
        code = "draining" if stream.cancel_requested else "cancelled"
        message = stream.error or "the request was cancelled"
    else:
        message, code = "internal error", "internal"
    return {"message": message, "type": "server_error", "param": None, "code": code}


def _usage(stream: Stream) -> dict:
    return {"prompt_tokens": stream.prompt_tokens, "completion_tokens": stream.completion_tokens,
            "total_tokens": stream.prompt_tokens + stream.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": stream.cached_tokens}}
