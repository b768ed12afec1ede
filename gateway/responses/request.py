"""The body of `POST /v1/responses` (and of a WebSocket `response.create`): its msgspec
schema, and the input items decoded one by one so a bad item is a 400 naming it
(`input[2].content[0].type`).

Every field OpenAI defines is honoured, accepted as having no effect, or refused by name
(REFUSED below); a field OpenAI does not define is `unknown parameter`, as on chat
completions.
"""
from __future__ import annotations

from typing import Any, Literal

import msgspec

from gateway.errors import RequestError, field_error

# Fields that cannot change what is generated: accepted whatever their value.
NO_EFFECT = ("user", "safety_identifier", "service_tier", "prompt_cache_options",
             "max_tool_calls", "model")


def _given(value) -> bool:
    return value is not None


def _set(value) -> bool:
    return value not in (None, {}, [], "")


# field -> (is the given value refused?, why).
REFUSED = {
    "reasoning": (_given, "the models served here do not reason"),
    "include": (_set, "no extra output can be included"),
    "top_logprobs": (lambda v: v not in (None, 0), "log-probabilities are not supported "
                     "on /v1/responses"),
    "conversation": (_given, "the Conversations API is not served; chain responses with "
                     "previous_response_id"),
    "prompt": (_given, "prompt templates are not supported"),
    "context_management": (_set, "not supported"),
    "moderation": (_given, "moderation is not supported"),
    "image": (_given, "image output is not supported"),
    "access_programs": (_given, "not supported"),
    "background_options": (_given, "not supported"),
}


def invalid(message: str, param: str | None, code: str = "invalid_request") -> RequestError:
    """A refused request naming its field: a 400 over HTTP, an `error` event on a socket."""
    return RequestError(code, message, param=param)


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class Part(_Strict, kw_only=True):
    """A text content part of a message item (input_text, output_text)."""

    type: str
    text: str = ""
    annotations: list | None = None  # output_text's, echoed back by the SDKs
    logprobs: list | None = None
    prompt_cache_breakpoint: dict | None = None


class MessageItem(_Strict, kw_only=True):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[Part]
    id: str | None = None
    status: str | None = None
    phase: str | None = None


class FunctionCallItem(_Strict, kw_only=True):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: str | None = None
    namespace: str | None = None


class FunctionCallOutputItem(_Strict, kw_only=True):
    type: Literal["function_call_output"]
    call_id: str
    output: str | list[Part]
    id: str | None = None
    status: str | None = None
    name: str | None = None


Item = MessageItem | FunctionCallItem | FunctionCallOutputItem
_ITEMS = {"message": MessageItem, "function_call": FunctionCallItem,
          "function_call_output": FunctionCallOutputItem}


class TextFormat(_Strict, kw_only=True):
    """`text.format`: flat, as the Responses API spells it (name and schema beside type)."""

    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict | None = None
    description: str | None = None
    strict: bool | None = None


class TextConfig(_Strict, kw_only=True):
    format: TextFormat | None = None
    verbosity: Literal["low", "medium", "high"] | None = None  # no effect on a small model


class StreamOptions(_Strict, kw_only=True):
    include_obfuscation: bool | None = None  # no effect: there is no obfuscation padding


class FunctionTool(_Strict, kw_only=True):
    """A function the model may call, flat as the Responses API declares it."""

    type: str
    name: str = ""
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class _Create(_Strict, kw_only=True):
    input: str | list[dict[str, Any]] | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Any = None  # "none" | "auto" | "required" | {"type": "function", "name"}
    parallel_tool_calls: bool | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: TextConfig | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    background: bool | None = None
    truncation: Literal["auto", "disabled"] | None = None
    prompt_cache_key: str | None = None  # gateway/prompt_cache.py
    prompt_cache_retention: str | None = None


CreateRequest = msgspec.defstruct(
    "CreateRequest", [(name, Any, None) for name in (*NO_EFFECT, *REFUSED)],
    bases=(_Create,), kw_only=True, forbid_unknown_fields=True)


class _WsCreate(CreateRequest, kw_only=True):
    """A WebSocket `response.create`: the create body plus the socket's own fields."""

    type: Literal["response.create"]
    generate: bool | None = None
    stream_id: str | None = None


WsCreateRequest = _WsCreate


def check(req: CreateRequest) -> None:
    """Raise a 400 naming the first field this request sets that is refused."""
    for name, (is_refused, why) in REFUSED.items():
        if is_refused(getattr(req, name)):
            raise invalid(f"{name}: {why}", name)
    if req.metadata is not None and len(req.metadata) > 16:
        raise invalid("metadata: at most 16 pairs", "metadata")


def decode_items(raw: str | list[dict] | None) -> list[Item]:
    """`input` as typed items: a string is one user message; each item's `type` (default
    "message") picks its schema, and an error names the item and its field."""
    if raw is None:
        return []
    if isinstance(raw, str):
        return [MessageItem(role="user", content=raw)]
    items = []
    for i, item in enumerate(raw):
        kind = item.get("type", "message")
        schema = _ITEMS.get(kind) if isinstance(kind, str) else None
        if schema is None:
            raise invalid(f"input[{i}].type: {str(kind)[:40]!r} is not supported (only "
                              f"{', '.join(_ITEMS)})", f"input[{i}].type")
        try:
            items.append(msgspec.convert(item, schema))
        except msgspec.ValidationError as exc:
            path, problem = field_error(exc)
            param = f"input[{i}]" + (f".{path}" if path else "")
            raise invalid(f"{param}: {problem}", param) from None
    return items
