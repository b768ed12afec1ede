"""OpenAI request bodies: their msgspec schema (the sampling fields are WireParams', one
schema with /v1/ws) and how a body becomes SamplingParams, with 400s in OpenAI's error
shape naming the field. Which OpenAI parameter is honoured, accepted with no effect or
refused is gateway/openai_params.py's table."""
from __future__ import annotations

import json
from typing import Any

import msgspec
from aiohttp import web

from gateway.auth import error_response
from gateway.params import PARAM_FIELDS, WireParams, build_params
from gateway.protocol import ContentPart, ProtocolError
from gateway.state import Runtime


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False
    include_obfuscation: bool = False  # no effect: there is no obfuscation padding here


class CommonRequest(WireParams, kw_only=True, forbid_unknown_fields=True):
    """The sampling fields are WireParams' (one schema with /v1/ws). A field OpenAI does not
    define is a 400 naming it; the ones it defines are each honoured, accepted as having
    no effect, or refused (gateway/openai_params.py)."""

    model: str | None = None
    max_completion_tokens: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    # accepted, no effect on the output
    user: Any = None
    metadata: Any = None
    store: Any = None
    service_tier: Any = None
    safety_identifier: Any = None
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    prediction: Any = None
    # refused unless absent or neutral
    logit_bias: Any = None


class ChatRequest(CommonRequest, kw_only=True):
    messages: list[ChatMessage]
    logprobs: bool | None = None  # chat's is a switch; top_logprobs is the count
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    parallel_tool_calls: Any = None
    audio: Any = None
    modalities: Any = None
    functions: Any = None
    function_call: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    moderation: Any = None


class CompletionRequest(CommonRequest, kw_only=True):
    # text, token ids, a list of texts, or a list of token-id lists: one choice per prompt
    prompt: str | list[str | int | list[int]]  # checked: one kind per list
    echo: bool = False
    best_of: int | None = None
    suffix: Any = None


async def decode_body(request: web.Request, schema: type[msgspec.Struct]):
    body = await request.read()
    try:
        return msgspec.json.decode(body, type=schema)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if "unknown field" in text:
            name = text.split("`")[1]
            raise bad_request(f"{name}: unknown parameter", name) from None
        param = text.rsplit("`$.", 1)[-1].rstrip("`") if "`$." in text else None
        raise bad_request(text, param) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"body is not valid JSON: {exc}", None, code="invalid_json") from None


def bad_request(message: str, param: str | None,
                code: str = "invalid_request") -> web.HTTPException:
    exc = error_response(web.HTTPBadRequest, message, code, err_type="invalid_request_error")
    if param is not None:  # name the field the way OpenAI does
        body = json.loads(exc.text)
        body["error"]["param"] = param
        exc.text = json.dumps(body)
    return exc


def refused(exc: ProtocolError) -> web.HTTPException:
    """A ProtocolError ("name: problem") as a 400 naming that field."""
    return bad_request(exc.message, exc.message.split(":", 1)[0].removeprefix("params."))


def sampling_params(rt: Runtime, req: CommonRequest):
    wire: dict[str, Any] = {k: getattr(req, k) for k in PARAM_FIELDS
                            if getattr(req, k) is not None}
    # OpenAI's newer name wins; an error about it names the field the client sent.
    limit_name = "max_tokens" if req.max_completion_tokens is None else "max_completion_tokens"
    if getattr(req, limit_name) is not None:
        wire["max_tokens"] = getattr(req, limit_name)
    logprobs_name = "logprobs"
    if isinstance(req, ChatRequest):
        wire.pop("logprobs", None)
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs: needs logprobs: true", "top_logprobs")
        if req.logprobs:
            wire["logprobs"] = req.top_logprobs or 0
            logprobs_name = "top_logprobs" if req.top_logprobs is not None else "logprobs"
    try:
        return build_params(rt.config, wire)
    except ProtocolError as exc:
        param, _, problem = exc.message.removeprefix("params.").partition(":")
        param = {"max_tokens": limit_name, "logprobs": logprobs_name}.get(param, param)
        raise bad_request(f"{param}:{problem}", param) from None
