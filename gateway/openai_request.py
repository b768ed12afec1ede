"""OpenAI request bodies: their msgspec schema (the sampling fields are WireParams', one
schema with /v1/ws) and how a body becomes a prompt's SamplingParams, with 400s in
OpenAI's error shape naming the field."""
from __future__ import annotations

import json
from typing import Any

import msgspec
from aiohttp import web

from gateway.auth import error_response
from gateway.params import PARAM_FIELDS, WireParams, build_params
from gateway.protocol import ProtocolError
from gateway.state import Runtime


class ContentPart(msgspec.Struct):
    type: str
    text: str = ""


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class CommonRequest(WireParams, kw_only=True, forbid_unknown_fields=False):
    """The sampling fields are WireParams' (one schema with /v1/ws); unknown fields are
    ignored as OpenAI's own API ignores them."""

    model: str | None = None
    max_completion_tokens: int | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None


class ChatRequest(CommonRequest, kw_only=True):
    messages: list[ChatMessage]


class CompletionRequest(CommonRequest, kw_only=True):
    prompt: str | list[str | int]  # text, token ids, or a list holding one text


async def decode_body(request: web.Request, schema: type[msgspec.Struct]):
    body = await request.read()
    try:
        req = msgspec.json.decode(body, type=schema)
    except msgspec.ValidationError as exc:
        text = str(exc)
        param = text.rsplit("`$.", 1)[-1].rstrip("`") if "`$." in text else None
        raise bad_request(text, param) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"body is not valid JSON: {exc}", None, code="invalid_json") from None
    if req.n != 1:
        raise bad_request("n: only n=1 is supported", "n")
    return req


def message_text(content: str | list[ContentPart] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part.text for part in content if part.type == "text")


def bad_request(message: str, param: str | None,
                code: str = "invalid_request") -> web.HTTPException:
    exc = error_response(web.HTTPBadRequest, message, code, err_type="invalid_request_error")
    if param is not None:  # name the field the way OpenAI does
        body = json.loads(exc.text)
        body["error"]["param"] = param
        exc.text = json.dumps(body)
    return exc


def sampling_params(rt: Runtime, req: CommonRequest):
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
        raise bad_request(f"{param}:{problem}", param) from None
