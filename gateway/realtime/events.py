"""Client events of the Realtime API (text subset): msgspec schemas and decoding.

Decoding is two steps, as on /v1/ws: bytes -> a map (`invalid_json`), then the map's
`type` picks a schema (`unknown_event`, or `unsupported` for audio) that
msgspec checks field by field (`invalid_request`, naming the field). Every failure is a
RealtimeError carrying the client's `event_id` when it had a readable one.
"""
from __future__ import annotations

import secrets
from typing import Any, Literal

import msgspec

from gateway.errors import RequestError, field_message

UNSET = msgspec.UNSET
MAX_EVENT_ID_CHARS = 128


class RealtimeError(RequestError):
    """A client event that cannot be served; becomes an `error` server event (its type
    follows from the code: server.error). Its request id is the client's `event_id`."""

    def __init__(self, code: str, message: str, event_id: str | None = None,
                 param: str | None = None, retry_after_ms: int | None = None):
        super().__init__(code, message, event_id, param=param, retry_after_ms=retry_after_ms)

    @property
    def event_id(self) -> str | None:
        return self.request_id


class _Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    pass


class ContentPart(_Strict):
    type: str
    text: str | None = None


class Item(_Strict):
    """A message, function_call or function_call_output item (`item_reference` only
    inside response.input)."""

    type: Literal["message", "function_call", "function_call_output",
                  "item_reference"] = "message"
    id: str | None = None
    role: Literal["system", "user", "assistant"] | None = None
    content: list[ContentPart] | None = None
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | None = None
    object: Literal["realtime.item"] | None = None
    status: Literal["completed", "incomplete", "in_progress"] | None = None


class _Generation(_Strict):
    """Fields session.update and response.create share; the Any ones are refused as
    `unsupported` (audio, ...), so a client learns what it asked for is absent. `tools`
    are read by gateway/realtime/tools.py (a tool that is not a function is refused by
    its type, so each is a map here)."""

    instructions: str | None = None
    output_modalities: list[str] | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    temperature: float | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    audio: Any = UNSET
    prompt: Any = UNSET
    reasoning: Any = UNSET


class SessionConfig(_Generation):
    type: Literal["realtime"] = "realtime"
    model: str | None = None
    include: Any = UNSET
    tracing: Any = UNSET
    truncation: Any = UNSET


class ResponseConfig(_Generation):
    conversation: str | None = None  # "auto" (default) or "none": out-of-band
    metadata: dict[str, str] | None = None
    input: list[Item] | None = None


class _Event(_Strict):
    type: str
    event_id: str | None = None


class SessionUpdate(_Event, kw_only=True):
    session: SessionConfig


class ItemCreate(_Event, kw_only=True):
    item: Item
    previous_item_id: str | None = None


class ItemRef(_Event, kw_only=True):
    """conversation.item.retrieve and conversation.item.delete."""

    item_id: str


class ItemTruncate(_Event, kw_only=True):
    item_id: str
    content_index: int
    audio_end_ms: int


class ResponseCreate(_Event, kw_only=True):
    response: ResponseConfig | None = None


class ResponseCancel(_Event, kw_only=True):
    response_id: str | None = None


SCHEMAS: dict[str, type[_Event]] = {
    "session.update": SessionUpdate, "conversation.item.create": ItemCreate,
    "conversation.item.retrieve": ItemRef, "conversation.item.delete": ItemRef,
    "conversation.item.truncate": ItemTruncate, "response.create": ResponseCreate,
    "response.cancel": ResponseCancel,
}
AUDIO_EVENTS = frozenset({"input_audio_buffer.append", "input_audio_buffer.commit",
                          "input_audio_buffer.clear", "output_audio_buffer.clear"})
TEXT_PARTS = {"input_text", "text", "output_text"}
_decoder = msgspec.json.Decoder(float_hook=float)
_encoder = msgspec.json.Encoder()


def encode(frame: dict) -> str:
    """A server event as a JSON text frame."""
    return _encoder.encode(frame).decode()


def decode(data: bytes | str) -> _Event:
    """Parse one client frame into its schema's Struct, or raise RealtimeError."""
    try:
        obj = _decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise RealtimeError("invalid_json", f"event is not valid JSON: {exc}") from None
    except RecursionError:
        raise RealtimeError("invalid_json", "event is nested too deeply") from None
    if not isinstance(obj, dict):
        raise RealtimeError("invalid_json", "an event must be a JSON object")
    event_id = obj.get("event_id")
    event_id = event_id[:MAX_EVENT_ID_CHARS] if isinstance(event_id, str) else None
    kind = obj.get("type")
    if not isinstance(kind, str):
        raise RealtimeError("invalid_request", "type: required string", event_id, "type")
    if kind in AUDIO_EVENTS:
        raise RealtimeError("unsupported", f"{kind[:64]}: audio is not supported by this "
                            "server (text only)", event_id, "type")
    schema = SCHEMAS.get(kind)
    if schema is None:
        raise RealtimeError("unknown_event", f"type: unknown event type {kind[:64]!r}",
                            event_id, "type")
    try:
        event = msgspec.convert(obj, schema)
    except msgspec.ValidationError as exc:
        message = field_message(exc)
        raise RealtimeError("invalid_request", message, event_id,
                            message.split(":", 1)[0]) from None
    _check_unsupported(event)
    return event


def _check_unsupported(event: _Event) -> None:
    """Audio and the like, named: the one place a text-only server refuses valid OpenAI
    input (tools of other types than function: gateway/realtime/tools.py)."""
    config = getattr(event, "session", None) or getattr(event, "response", None)
    where = "session" if isinstance(event, SessionUpdate) else "response"
    if config is not None:
        for name in config.__struct_fields__:
            if getattr(config, name) is not UNSET and name in _UNSUPPORTED_FIELDS:
                raise RealtimeError("unsupported", f"{where}.{name}: not supported by this "
                                    "server (text only)", event.event_id,
                                    f"{where}.{name}")
        if config.output_modalities not in (None, ["text"]):
            raise RealtimeError("unsupported", f"{where}.output_modalities: only [\"text\"] "
                                "is supported", event.event_id, f"{where}.output_modalities")


_UNSUPPORTED_FIELDS = frozenset({"audio", "prompt", "reasoning", "include", "tracing",
                                 "truncation"})


def item_message(item: Item, event_id: str | None, where: str = "item") -> dict:
    """A client's item as the chat message the conversation keeps (conversation.py):
    a message's text parts joined (audio or image content is `unsupported`), a
    function_call as an assistant tool call, a function_call_output as a tool message."""
    if item.type == "function_call":
        if not item.name:
            raise _missing(f"{where}.name", "a function_call item", event_id)
        call_id = item.call_id or f"call_{secrets.token_hex(12)}"
        return {"role": "assistant", "content": "", "tool_calls": [
            {"id": call_id, "type": "function",
             "function": {"name": item.name, "arguments": item.arguments or "{}"}}]}
    if item.type == "function_call_output":
        if item.call_id is None or item.output is None:
            raise _missing(f"{where}.call_id" if item.call_id is None else f"{where}.output",
                           "a function_call_output item", event_id)
        return {"role": "tool", "tool_call_id": item.call_id, "content": item.output}
    if item.type != "message" or item.role is None:
        raise RealtimeError("invalid_request", f"{where}: a message item with a role is "
                            "required", event_id, where)
    texts = []
    for i, part in enumerate(item.content or ()):
        if part.type not in TEXT_PARTS:
            raise RealtimeError("unsupported", f"{where}.content[{i}].type: {part.type[:32]!r}"
                                " is not supported (text only)", event_id,
                                f"{where}.content[{i}].type")
        texts.append(part.text or "")
    return {"role": item.role, "content": "".join(texts)}


def _missing(param: str, what: str, event_id: str | None) -> RealtimeError:
    return RealtimeError("invalid_request", f"{param}: required for {what}", event_id, param)
