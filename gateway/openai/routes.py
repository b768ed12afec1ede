"""OpenAI-compatible HTTP: /v1/models, /v1/chat/completions, /v1/completions.

A body becomes its prompts (chat: one, rendered by the chat template with any tools;
completions: one per prompt in a list) and SamplingParams; each prompt runs `n` samples
(choices.py) and the answer is shaped by answer.py, whole or as Server-Sent Events.
Errors are OpenAI-shaped: {"error": {"message", "type", "param", "code"}}; which OpenAI
parameter does what is support.py.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import logging
import math
import secrets
import time

import msgspec
from aiohttp import web

from engine.errors import EngineError, InvalidRequestError
from gateway.auth import OWNER, authenticate, check_origin
from gateway.errors import RequestError, bad_request, error_response, model_refusal
from gateway.messages import ROLES, message_dict
from gateway.openai.answer import Job, sse, whole
from gateway.openai.choices import plan
from gateway.openai.request import (ChatRequest, CommonRequest, CompletionRequest,
                                    decode_body, refused, sampling_params)
from gateway.openai.support import check
from gateway.openai.template import chat_echo, template_options
from gateway.params import given
from gateway.prompt_cache import PromptCache, prompt_cache
from gateway.runtime import RUNTIME, Runtime
from gateway.stream import Stream
from gateway.tools.plan import ToolPlan, for_request
from scheduler.models import ModelSlot
from scheduler.registry import ModelBusy, ModelUnavailable

log = logging.getLogger(__name__)
_ids = itertools.count()
_HOLDS_SLOT = web.RequestKey("holds_key_slot", bool)


def contained(handler):
    """The fault boundary of one HTTP request: an unexpected exception answers a 500 in
    OpenAI's error shape and logs one traceback; the server and its other requests go on.
    The request's slot of its key (taken by runtime_of) is given back however it ends."""
    @functools.wraps(handler)
    async def guarded(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except Exception:  # noqa: BLE001 - one request's fault stays in that request
            log.exception("%s %s failed", request.method, request.path)
            raise _internal() from None
        finally:
            if request.get(_HOLDS_SLOT):
                request.app[RUNTIME].give_key_slot(request[OWNER])
    return guarded


def _internal() -> web.HTTPException:
    return error_response(web.HTTPInternalServerError, "internal error", "internal",
                          err_type="server_error")


@contained
async def models(request: web.Request) -> web.Response:
    """Every configured model, loaded or not, with its state and memory."""
    rt = runtime_of(request)  # 503 until the default model is loaded
    return web.json_response({"object": "list", "data": [
        _model_card(rt, slot) for slot in rt.scheduler.models.slots]})


@contained
async def model(request: web.Request) -> web.Response:
    """One model by id (the SDKs' `models.retrieve`): a served one, else a 404."""
    return web.json_response(_model_card(request.app[RUNTIME], _named_model(request)))


@contained
async def load_model(request: web.Request) -> web.Response:
    """POST /v1/models/{model}/load: load it now (a failed one is retried)."""
    rt, slot = request.app[RUNTIME], _named_model(request)
    try:
        await rt.scheduler.models.load(slot)
    except ModelUnavailable as exc:
        raise error_response(web.HTTPServiceUnavailable, str(exc), exc.code,
                             err_type="server_error") from None
    return web.json_response(_model_card(rt, slot))


@contained
async def unload_model(request: web.Request) -> web.Response:
    """POST /v1/models/{model}/unload: unload it now; 409 model_busy while it serves."""
    rt, slot = request.app[RUNTIME], _named_model(request)
    if slot.given:
        raise bad_request(f"model {slot.name!r} is the caller's engine: it is not unloaded",
                          "model")
    try:
        await rt.scheduler.models.unload(slot)
    except ModelBusy as exc:
        raise error_response(web.HTTPConflict, str(exc), exc.code,
                             err_type="invalid_request_error") from None
    return web.json_response(_model_card(rt, slot))


def _named_model(request: web.Request) -> ModelSlot:
    """The model named in the path, by its exact name; a 404 model_not_found."""
    rt = runtime_of(request)
    name = request.match_info["model"]
    for slot in rt.scheduler.models.slots:
        if slot.name == name:
            return slot
    served = ", ".join(repr(n) for n in rt.scheduler.models.names())
    raise error_response(web.HTTPNotFound, f"The model '{name[:200]}' does not exist; "
                         f"this server serves {served}", "model_not_found",
                         err_type="invalid_request_error", param="model")


def _model_card(rt: Runtime, slot: ModelSlot) -> dict:
    """OpenAI's model object, with tokenwire's state, memory and keep-alive."""
    models = rt.scheduler.models
    return {"id": slot.name, "object": "model", "created": 0, "owned_by": "tokenwire",
            "max_model_len": slot.max_model_len, "state": models.state(slot),
            "reason": slot.reason or None, "memory_bytes": slot.memory_bytes,
            "keep_alive_s": slot.keep_alive_s, "loads": slot.loads,
            "running": models.holds(slot),
            "default": slot is models.default}


@contained
async def chat_completions(request: web.Request) -> web.StreamResponse:
    rt = runtime_of(request)
    req = await decode_body(request, ChatRequest, rt.config.body_timeout_s)
    check(req, rt.config.max_choices, chat=True)
    await _use_model(rt, req.model)
    tools = _tool_plan(rt, req)
    messages = _messages(req, tools is not None, rt.config.max_conversation_items)
    echo = chat_echo(req, messages)  # of the conversation as sent
    if tools is not None:
        messages = tools.messages(messages)
    template_tools = tools.template_tools() if tools is not None else None
    options = template_options(req, rt.config.max_chat_template_kwargs_bytes)
    prompt = await _tokenize(rt, lambda: rt.model.encode_chat(messages, template_tools,
                                                              **options), "messages")
    return await _complete(request, rt, req, [prompt], [echo], tools=tools)


def _tool_plan(rt: Runtime, req: ChatRequest) -> ToolPlan | None:
    tools = [(t.type, t.function) for t in req.tools or ()]
    fmt = "response_format" if given(req.response_format) else None
    try:
        return for_request(rt.config, rt.model, tools, req.tool_choice,
                           req.parallel_tool_calls, fmt)
    except RequestError as exc:
        raise refused(exc) from None


def _messages(req: ChatRequest, with_tools: bool, max_messages: int) -> list[dict]:
    """The messages as the chat template takes them; tool turns only with tools."""
    if not req.messages:
        raise bad_request("messages: must not be empty", "messages")
    if len(req.messages) > max_messages:
        raise bad_request(f"messages: at most {max_messages} messages "
                          "(max_conversation_items)", "messages", code="too_large")
    roles = ROLES | {"tool"} if with_tools else ROLES
    messages = []
    for i, m in enumerate(req.messages):
        try:
            message = message_dict(i, m.role, m.content, roles)
        except RequestError as exc:
            raise refused(exc) from None
        calls = msgspec.to_builtins(m.tool_calls) if m.tool_calls else None
        extra = {"name": m.name, "tool_calls": calls, "tool_call_id": m.tool_call_id}
        messages.append({**message, **{k: v for k, v in extra.items() if v is not None}})
    return messages


@contained
async def completions(request: web.Request) -> web.StreamResponse:
    rt = runtime_of(request)
    req = await decode_body(request, CompletionRequest, rt.config.body_timeout_s)
    check(req, rt.config.max_choices, chat=False)
    await _use_model(rt, req.model)
    prompt = _prompts(req.prompt)
    if len(prompt) * req.n > rt.config.max_choices:
        raise bad_request(f"prompt: {len(prompt)} prompts times n={req.n} is more than "
                          f"{rt.config.max_choices} choices", "prompt")
    model = rt.model
    ids = await _tokenize(rt, lambda: [model.encode(p) if isinstance(p, str) else p
                                       for p in prompt], "prompt")
    echoes = None
    if req.echo:
        echoes = await _tokenize(rt, lambda: [p if isinstance(p, str) else model.decode(p)
                                              for p in prompt], "prompt")
    return await _complete(request, rt, req, ids, echoes)


async def _use_model(rt: Runtime, name: str | None) -> None:
    """Bind this request to its model and hold it loaded (waiting for its load): 404
    model_not_found, 503 model_unavailable (the loader's error)."""
    try:
        rt.select_model(name)
        await rt.hold_model()
    except RequestError as exc:
        raise model_refusal(exc) from None


async def _tokenize(rt: Runtime, job, param: str):
    """Templates and tokenization off the event loop; too slow is a 400 too_large."""
    try:
        return await rt.tokenize(job)
    except RequestError as exc:
        raise bad_request(exc.message, param, code=exc.code) from None
    except InvalidRequestError as exc:  # the chat template refused the conversation
        raise bad_request(str(exc), param) from None


def _prompts(prompt: str | list) -> list[str | list[int]]:
    """OpenAI's four prompt forms as a list of prompts: a text, token ids, a list of
    texts, a list of token-id lists."""
    if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)):
        prompt = [prompt]
    kind = type(prompt[0]) if prompt else None
    if not prompt or not all(p and type(p) is kind for p in prompt):
        raise bad_request("prompt: must be a non-empty text, token-id list, or a list of "
                          "either (one kind, none empty)", "prompt")
    return prompt


def runtime_of(request: web.Request) -> Runtime:
    """The app's runtime once the caller may use it: origin, key, the key's slot, ready."""
    rt = request.app[RUNTIME]
    check_origin(request, rt.config)
    request[OWNER] = authenticate(request, rt.config)
    try:
        rt.take_key_slot(request[OWNER])
    except RequestError as exc:
        raise _refusal(exc) from None
    request[_HOLDS_SLOT] = True
    if not rt.ready:
        code = "draining" if rt.status == "draining" else "overloaded"
        raise error_response(web.HTTPServiceUnavailable, f"not ready: {rt.reason}", code,
                             headers={"Retry-After": "1"})
    return rt


async def _complete(request: web.Request, rt: Runtime, req: CommonRequest,
                    prompts: list[list[int]], echoes: list[str] | None = None,
                    tools: ToolPlan | None = None) -> web.StreamResponse:
    chat = isinstance(req, ChatRequest)
    params = sampling_params(rt.config, req)
    if tools is not None and not given(req.response_format):
        params = dataclasses.replace(params, response_format=tools.constraint())
    for prompt in prompts:
        _validate(rt, prompt, params, chat)
    cache = _prompt_cache(rt, req)
    stream = Stream(f"{'chatcmpl' if chat else 'cmpl'}-{secrets.token_hex(12)}",
                    f"http-{next(_ids)}", "http")
    # Everything that can raise comes before admission: a slot is released only below.
    choices = plan(prompts, req.n, params, stream.engine_id, echoes)
    for choice in choices:
        choice.calls = tools.parser() if tools is not None else None
    try:
        admission = await rt.admit(stream, params.priority, sum(map(len, prompts)), None,
                                   request[OWNER])
    except RequestError as exc:
        raise _refusal(exc) from None
    stream.admitted = time.perf_counter()
    stream.task = asyncio.current_task()  # what a drain cancels
    rt.http_streams.add(stream)
    try:
        job = Job(rt, admission, req, stream, choices, prompts, tools)
        answer = await (sse(request, job) if req.stream else whole(job))
        _keep(rt, cache, stream, choices)
        return answer
    except asyncio.CancelledError:
        if not stream.cancel_requested:
            raise  # the client hung up
        asyncio.current_task().uncancel()
        raise _draining() from None
    finally:
        admission.release(stream.completion_tokens, stream.finish_reason)
        rt.http_streams.discard(stream)


def _prompt_cache(rt: Runtime, req: CommonRequest) -> PromptCache:
    try:
        return prompt_cache(req.prompt_cache_key, req.prompt_cache_retention,
                            rt.config.max_prompt_cache_key_chars)
    except RequestError as exc:
        raise refused(exc) from None


def _keep(rt: Runtime, cache: PromptCache, stream: Stream, choices) -> None:
    """A request that asked for it parks each prompt with its first sample's output."""
    if cache.retain_s is None or stream.finish_reason not in ("stop", "length"):
        return
    for choice in choices:
        if choice.parent_id is None:
            rt.session_kv.keep(rt.model, choice.prompt + choice.token_ids, cache.retain_s)


def _validate(rt: Runtime, prompt: list[int], params, chat: bool) -> None:
    """What the engine would refuse, as a 400 before admission."""
    try:
        rt.model.validate(prompt, params)
    except InvalidRequestError as exc:
        param = exc.field
        if param in ("prompt", "messages"):
            param = "messages" if chat else "prompt"
        elif param == "logprobs" and chat:
            param = "top_logprobs"
        raise bad_request(str(exc), param, code=exc.code) from None
    except EngineError as exc:
        raise bad_request(str(exc), "messages" if chat else "prompt", code=exc.code) from None


def _draining() -> web.HTTPException:
    return error_response(web.HTTPServiceUnavailable, "server draining", "draining",
                          headers={"Retry-After": "1"})


def _refusal(exc: RequestError) -> web.HTTPException:
    """Admission's answer as HTTP: 400 for a bad param, 429 rate_limited, 503 overloaded."""
    if exc.code == "invalid_request":
        return refused(exc)
    retry_s = str(max(1, math.ceil((exc.retry_after_ms or 1000) / 1000)))
    cls = web.HTTPTooManyRequests if exc.code == "rate_limited" else web.HTTPServiceUnavailable
    return error_response(cls, exc.message, exc.code, headers={"Retry-After": retry_s})
