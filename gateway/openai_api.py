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
from typing import Any

import msgspec
from aiohttp import web

from engine.errors import EngineError
from gateway.auth import authenticate, check_origin, error_response
from gateway.params import PARAM_FIELDS, WireParams, build_params
from gateway.protocol import ROLES, ProtocolError
from gateway.state import RUNTIME, Runtime
from gateway.stream import Stream

log = logging.getLogger(__name__)
_ids = itertools.count()
_OWNER = web.RequestKey("owner", str)  # the caller's key hash; None without auth


class _Part(msgspec.Struct):
    type: str
    text: str = ""


class _ChatMessage(msgspec.Struct):
    role: str
    content: str | list[_Part] | None = None


class _StreamOptions(msgspec.Struct):
    include_usage: bool = False


class _Common(WireParams, kw_only=True, forbid_unknown_fields=False):
    """The sampling fields are WireParams' (one schema with /v1/ws); unknown fields are
    ignored as OpenAI's own API ignores them."""

    model: str | None = None
    max_completion_tokens: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: _StreamOptions | None = None


class ChatRequest(_Common, kw_only=True):
    messages: list[_ChatMessage]


class CompletionRequest(_Common, kw_only=True):
    prompt: str | list[str | int]  # text, token ids, or a list holding one text


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
    req = await _decode(request, ChatRequest)
    messages = [{"role": m.role, "content": _text(m.content)} for m in req.messages]
    if not messages:
        raise _bad("messages: must not be empty", "messages")
    for i, m in enumerate(messages):
        if m["role"] not in ROLES:
            raise _bad(f"messages[{i}].role: must be one of {sorted(ROLES)}", "messages")
    return await _complete(request, rt, req, rt.engine.encode_chat(messages), chat=True)


@_contained
async def completions(request: web.Request) -> web.StreamResponse:
    rt = _runtime(request)
    req = await _decode(request, CompletionRequest)
    prompt = req.prompt
    if isinstance(prompt, list) and any(isinstance(x, str) for x in prompt):
        if len(prompt) != 1:
            raise _bad("prompt: only one prompt per request is supported", "prompt")
        prompt = prompt[0]
    if not prompt:
        raise _bad("prompt: must not be empty", "prompt")
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


async def _decode(request: web.Request, schema: type[msgspec.Struct]):
    body = await request.read()
    try:
        req = msgspec.json.decode(body, type=schema)
    except msgspec.ValidationError as exc:
        text = str(exc)
        param = text.rsplit("`$.", 1)[-1].rstrip("`") if "`$." in text else None
        raise _bad(text, param) from None
    except msgspec.DecodeError as exc:
        raise _bad(f"body is not valid JSON: {exc}", None, code="invalid_json") from None
    if req.n != 1:
        raise _bad("n: only n=1 is supported", "n")
    return req


def _text(content: str | list[_Part] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part.text for part in content if part.type == "text")


def _bad(message: str, param: str | None, code: str = "invalid_request") -> web.HTTPException:
    exc = error_response(web.HTTPBadRequest, message, code, err_type="invalid_request_error")
    if param is not None:  # name the field the way OpenAI does
        body = json.loads(exc.text)
        body["error"]["param"] = param
        exc.text = json.dumps(body)
    return exc


def _params(rt: Runtime, req: _Common):
    wire: dict[str, Any] = {k: getattr(req, k) for k in PARAM_FIELDS
                            if getattr(req, k) is not None}
    # OpenAI's newer name wins; an error about it names the field the client sent.
    limit_name = "max_tokens" if req.max_completion_tokens is None else "max_completion_tokens"
    if getattr(req, limit_name) is not None:
        wire["max_tokens"] = getattr(req, limit_name)
    try:
        return build_params(rt.config, wire)
    except ProtocolError as exc:
        param, _, problem = exc.message.removeprefix("params.").partition(":")
        param = limit_name if param == "max_tokens" else param
        raise _bad(f"{param}:{problem}", param) from None


async def _complete(request: web.Request, rt: Runtime, req: _Common, prompt,
                    chat: bool) -> web.StreamResponse:
    params = _params(rt, req)
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
        return _bad(exc.message, exc.message.split(":", 1)[0].removeprefix("params."))
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
        raise _bad(str(exc), "messages" if chat else "prompt", code=exc.code) from None


async def _whole(rt: Runtime, prompt, params, stream: Stream, chat: bool) -> web.Response:
    async with contextlib.aclosing(_outputs(rt, prompt, params, stream, chat)) as outputs:
        async for _ in outputs:
            pass
    failure = _failure(stream)
    if failure is not None:
        cancelled = failure["code"] == "cancelled"
        raise error_response(web.HTTPServiceUnavailable if cancelled
                             else web.HTTPInternalServerError, failure["message"],
                             failure["code"], err_type="server_error",
                             headers={"Retry-After": "1"} if cancelled else None)
    now = time.perf_counter()
    stream.written(now)
    rt.metrics.ttft.observe(now - stream.received)
    rt.metrics.observe_done(stream, now)
    choice = ({"message": {"role": "assistant", "content": stream.text}} if chat
              else {"text": stream.text})
    return web.json_response({**_head(rt, stream, chat), "choices": [
        {"index": 0, **choice, "finish_reason": stream.finish_reason, "logprobs": None}],
        "usage": _usage(stream)})


async def _sse(request: web.Request, rt: Runtime, req: _Common, prompt, params,
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
    _observe(rt, stream, len(out.new_token_ids), time.perf_counter())


def _observe(rt: Runtime, stream: Stream, n: int, now: float) -> None:
    gap = stream.written(now)
    if gap is None:
        rt.metrics.ttft.observe(now - stream.received)
    else:
        for _ in range(n):
            rt.metrics.itl.observe(gap / n)


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
