"""OpenAI-compatible HTTP: /v1/models, /v1/chat/completions, /v1/completions.

`stream: true` answers Server-Sent Events, one chunk per engine output, ending with
`data: [DONE]`; `stream_options.include_usage` adds a usage chunk before it. Errors are
OpenAI-shaped: {"error": {"message", "type", "param", "code"}}.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import math
import secrets
import time

from aiohttp import web

from engine.errors import EngineError
from gateway.auth import authenticate, check_origin, error_response
from gateway.openai_request import (ChatRequest, CommonRequest, CompletionRequest,
                                    bad_request, decode_body, message_text, sampling_params)
from gateway.protocol import ROLES, ProtocolError
from gateway.state import RUNTIME, Runtime
from gateway.stream import Stream

log = logging.getLogger(__name__)
_ids = itertools.count()
_OWNER = web.RequestKey("owner", str)  # the caller's key hash; None without auth


def _contained(handler):
    """The fault boundary of one HTTP request: an unexpected exception answers a 500 in
    OpenAI's error shape and logs one traceback; the server and its other requests go on."""
    @functools.wraps(handler)
    async def contained(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except Exception:  # noqa: BLE001 - one request's fault stays in that request
            log.exception("%s %s failed", request.method, request.path)
            raise _internal() from None
    return contained


def _internal() -> web.HTTPException:
    return error_response(web.HTTPInternalServerError, "internal error", "internal",
                          err_type="server_error")


@_contained
async def models(request: web.Request) -> web.Response:
    rt = _runtime(request)  # 503 until the model is loaded
    return web.json_response({"object": "list", "data": [
        {"id": rt.engine.model_name, "object": "model", "created": 0, "owned_by": "tokenwire",
         "max_model_len": rt.engine.max_model_len}]})


@_contained
async def chat_completions(request: web.Request) -> web.StreamResponse:
    rt = _runtime(request)
    req = await decode_body(request, ChatRequest)
    messages = [{"role": m.role, "content": message_text(m.content)} for m in req.messages]
    if not messages:
        raise bad_request("messages: must not be empty", "messages")
    for i, m in enumerate(messages):
        if m["role"] not in ROLES:
            raise bad_request(f"messages[{i}].role: must be one of {sorted(ROLES)}", "messages")
    return await _complete(request, rt, req, rt.engine.encode_chat(messages), chat=True)


@_contained
async def completions(request: web.Request) -> web.StreamResponse:
    rt = _runtime(request)
    req = await decode_body(request, CompletionRequest)
    prompt = req.prompt
    if isinstance(prompt, list) and any(isinstance(x, str) for x in prompt):
        if len(prompt) != 1:
            raise bad_request("prompt: only one prompt per request is supported", "prompt")
        prompt = prompt[0]
    if not prompt:
        raise bad_request("prompt: must not be empty", "prompt")
    return await _complete(request, rt, req, prompt, chat=False)


def _runtime(request: web.Request) -> Runtime:
    rt = request.app[RUNTIME]
    check_origin(request, rt.config)
    request[_OWNER] = authenticate(request, rt.config)
    if not rt.ready:
        code = "draining" if rt.status == "draining" else "overloaded"
        raise error_response(web.HTTPServiceUnavailable, f"not ready: {rt.reason}", code,
                             headers={"Retry-After": "1"})
    return rt


async def _complete(request: web.Request, rt: Runtime, req: CommonRequest, prompt,
                    chat: bool) -> web.StreamResponse:
    params = sampling_params(rt, req)
    if isinstance(prompt, str):
        prompt = rt.engine.encode(prompt)
    stream = Stream(f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}",
                    f"http-{next(_ids)}", "http")
    try:
        ticket = await rt.gate.admit(stream.id, None, "http", params.priority, len(prompt),
                                     request[_OWNER])
    except ProtocolError as exc:
        raise _refusal(exc) from None
    stream.admitted = time.perf_counter()
    stream.task = asyncio.current_task()  # what a drain cancels
    rt.http_streams.add(stream)
    try:
        if req.stream:
            return await _sse(request, rt, req, prompt, params, stream, chat)
        return await _whole(rt, prompt, params, stream, chat)
    except asyncio.CancelledError:
        if not stream.cancel_requested:
            raise  # the client hung up
        asyncio.current_task().uncancel()
        raise _draining() from None
    finally:
        ticket.release(stream.completion_tokens, stream.finish_reason)
        rt.http_streams.discard(stream)


def _draining() -> web.HTTPException:
    return error_response(web.HTTPServiceUnavailable, "server draining", "draining",
                          headers={"Retry-After": "1"})


def _refusal(exc: ProtocolError) -> web.HTTPException:
    """Admission's answer as HTTP: 400 for a bad param, 429 rate_limited, 503 overloaded."""
    if exc.code == "invalid_request":
        return bad_request(exc.message, exc.message.split(":", 1)[0].removeprefix("params."))
    retry_s = str(max(1, math.ceil((exc.retry_after_ms or 1000) / 1000)))
    cls = web.HTTPTooManyRequests if exc.code == "rate_limited" else web.HTTPServiceUnavailable
    return error_response(cls, exc.message, exc.code, headers={"Retry-After": retry_s})


async def _outputs(rt: Runtime, prompt, params, stream: Stream, chat: bool):
    """Engine outputs of one request; prompt errors become HTTP 400s before any output."""
    try:
        generator = rt.engine.generate(prompt, params, stream.engine_id)
        async with contextlib.aclosing(generator) as outputs:
            async for out in outputs:
                stream.absorb(out)
                yield out
    except EngineError as exc:
        if stream.first_written is not None or exc.code == "internal":
            raise
        param = "messages" if chat else "prompt"
        if getattr(exc, "field", None) == "response_format":  # its schema did not compile
            param = "response_format"
        raise bad_request(str(exc), param, code=exc.code) from None


async def _whole(rt: Runtime, prompt, params, stream: Stream, chat: bool) -> web.Response:
    async with contextlib.aclosing(_outputs(rt, prompt, params, stream, chat)) as outputs:
        async for _ in outputs:
            pass
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
    choice = ({"message": {"role": "assistant", "content": stream.text}} if chat
              else {"text": stream.text})
    return web.json_response({**_head(rt, stream, chat), "choices": [
        {"index": 0, **choice, "finish_reason": stream.finish_reason, "logprobs": None}],
        "usage": _usage(stream)})


async def _sse(request: web.Request, rt: Runtime, req: CommonRequest, prompt, params,
               stream: Stream, chat: bool) -> web.StreamResponse:
    async with contextlib.aclosing(_outputs(rt, prompt, params, stream, chat)) as outputs:
        out = await anext(outputs, None)  # errors in the prompt still answer 400, not SSE
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        try:
            if chat:
                await _event(resp, _chunk(rt, stream, chat,
                                          {"role": "assistant", "content": ""}))
            while out is not None:
                await _sse_output(resp, rt, stream, out, chat)
                out = await anext(outputs, None)
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
    rt.metrics.observe_done(stream, time.perf_counter())
    failure = _failure(stream)
    if failure is not None:
        await _event(resp, {"error": failure})
    elif req.stream_options is not None and req.stream_options.include_usage:
        await _event(resp, {**_head(rt, stream, chat, chunk=True), "choices": [],
                            "usage": _usage(stream)})
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def _sse_output(resp: web.StreamResponse, rt: Runtime, stream: Stream, out,
                      chat: bool) -> None:
    """One chunk; a cancelled or failed request's last output carries only its text (its
    end is the error event `_sse` writes after it)."""
    finish = stream.finish_reason if out.finished and _failure(stream) is None else None
    if not out.delta_text and finish is None:
        return
    if chat:
        delta = {"content": out.delta_text} if out.delta_text else {}
    else:
        delta = out.delta_text
    await _event(resp, _chunk(rt, stream, chat, delta, finish))
    rt.metrics.observe_delta(stream, len(out.new_token_ids), time.perf_counter())


async def _event(resp: web.StreamResponse, obj: dict) -> None:
    await resp.write(b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n")


def _head(rt: Runtime, stream: Stream, chat: bool, chunk: bool = False) -> dict:
    kind = ("chat.completion.chunk" if chunk else "chat.completion") if chat else "text_completion"
    return {"id": stream.id, "object": kind, "created": int(time.time()),
            "model": rt.engine.model_name}


def _chunk(rt: Runtime, stream: Stream, chat: bool, delta, finish: str | None = None) -> dict:
    body = {"index": 0, "finish_reason": finish, "logprobs": None}
    body.update({"delta": delta} if chat else {"text": delta})
    return {**_head(rt, stream, chat, chunk=True), "choices": [body]}


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
