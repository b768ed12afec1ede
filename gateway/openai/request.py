"""OpenAI request bodies: their msgspec schema (the sampling fields are Params', one
schema with /v1/ws) and how a body becomes SamplingParams, with 400s in OpenAI's error
shape naming the field. Which OpenAI parameter is honoured, accepted with no effect or
refused is gateway/openai/support.py's table."""
from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from aiohttp import web

from engine.sampling_params import SamplingParams
from gateway import params as wire
from gateway.config import GatewayConfig
from gateway.errors import RequestError, bad_request, error_response, field_error
from gateway.messages import ContentPart
from gateway.openai.support import CHAT_REFUSED, COMMON_REFUSED, COMPLETION_REFUSED, NO_EFFECT
from gateway.tools.plan import FunctionDef


class FunctionCall(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: str | dict[str, Any] = ""  # OpenAI's is JSON text; some clients send an object


class PastToolCall(msgspec.Struct, forbid_unknown_fields=True):
    """A call an assistant message made earlier in the conversation."""

    function: FunctionCall
    id: str = ""
    type: str = "function"


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[PastToolCall] | None = None
    tool_call_id: str | None = None


class Tool(msgspec.Struct, forbid_unknown_fields=True):
    function: FunctionDef
    type: str = "function"


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True):
    include_usage: bool = False
    include_obfuscation: bool = False  # no effect: there is no obfuscation padding here
    continuous_usage_stats: bool = False  # vLLM's: usage so far on every chunk


def _with_opaque(base: type, name: str, *fields: str) -> type:
    """`base` plus fields of any type (default None), judged by support.py's tables."""
    return msgspec.defstruct(name, [(field, Any, None) for field in fields], bases=(base,),
                             kw_only=True, forbid_unknown_fields=True)


class _Common(wire.Params, kw_only=True, forbid_unknown_fields=True):
    model: str | None = None
    max_completion_tokens: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    skip_special_tokens: bool = True  # vLLM's: false shows special tokens in the text
    prompt_cache_key: str | None = None  # gateway/prompt_cache.py
    prompt_cache_retention: str | None = None


# The sampling fields are Params' (one schema with /v1/ws). A field OpenAI does not define
# is a 400 naming it; the ones it defines are each honoured, accepted as having no effect,
# or refused (support.py).
CommonRequest = _with_opaque(_Common, "CommonRequest", *NO_EFFECT, *COMMON_REFUSED)


class _Chat(CommonRequest, kw_only=True):
    messages: list[ChatMessage]
    logprobs: bool | None = None  # chat's is a switch; top_logprobs is the count
    top_logprobs: int | None = None
    tools: list[Tool] | None = None
    parallel_tool_calls: bool | None = None
    # vLLM's chat-template extensions (gateway/openai/template.py)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    echo: bool = False


ChatRequest = _with_opaque(_Chat, "ChatRequest", "tool_choice", *CHAT_REFUSED)


class _Completion(CommonRequest, kw_only=True):
    # text, token ids, a list of texts, or a list of token-id lists: one choice per prompt
    prompt: str | list[str | int | list[int]]  # checked: one kind per list
    echo: bool = False
    best_of: int | None = None


CompletionRequest = _with_opaque(_Completion, "CompletionRequest", *COMPLETION_REFUSED)


async def decode_body(request: web.Request, schema: type[msgspec.Struct], timeout: float):
    """The body as `schema`; a body that takes longer than `timeout` to arrive is a 408."""
    try:
        async with asyncio.timeout(timeout):
            body = await request.read()
    except asyncio.TimeoutError:
        if request.transport is not None:
            request.transport.abort()
        raise error_response(web.HTTPRequestTimeout, f"the body did not arrive within "
                             f"{timeout:g} s", "timeout") from None
    try:
        return msgspec.json.decode(body, type=schema)
    except msgspec.ValidationError as exc:
        path, problem = field_error(exc)
        if problem == "unknown field":  # named alone, wherever it sits
            name = path.rpartition(".")[2]
            raise bad_request(f"{name}: unknown parameter", name) from None
        if problem == "required field missing":  # the object that lacks it
            path = path.rpartition(".")[0]
        raise bad_request(str(exc), path or None) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"body is not valid JSON: {exc}", None, code="invalid_json") from None


def refused(exc: RequestError) -> web.HTTPException:
    """A RequestError about one field as a 400 naming that field."""
    return bad_request(exc.message, exc.param)


def sampling_params(config: GatewayConfig, req: CommonRequest) -> SamplingParams:
    """The body's sampling fields as SamplingParams; a refusal names the field the client
    sent (max_completion_tokens, top_logprobs)."""
    params = wire.Params(**{name: getattr(req, name) for name in wire.PARAM_FIELDS})
    # OpenAI's newer name wins; an error about it names the field the client sent.
    names = {"max_tokens": "max_tokens" if req.max_completion_tokens is None
             else "max_completion_tokens", "logprobs": "logprobs"}
    if req.max_completion_tokens is not None:
        params.max_tokens = req.max_completion_tokens
    if isinstance(req, ChatRequest):
        params.logprobs = wire.UNSET
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs: needs logprobs: true", "top_logprobs")
        if req.logprobs:
            params.logprobs = req.top_logprobs or 0
            if req.top_logprobs is not None:
                names["logprobs"] = "top_logprobs"
    try:
        resolved = wire.resolve(config, params)
    except wire.ParamError as exc:
        name = names.get(exc.field, exc.field)
        raise bad_request(f"{name}: {exc.problem}", name) from None
    resolved.skip_special_tokens = req.skip_special_tokens  # typed bool by the schema
    return resolved
