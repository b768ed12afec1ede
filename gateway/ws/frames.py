"""WebSocket protocol v1: client message schemas, decoding and encoding of frames.

Decoding is two steps so each failure gets its own code: bytes -> a map (`invalid_json`),
then the map's `type` picks a schema (`unknown_type`) that msgspec checks field by field
(`invalid_request`, naming the field).
"""
from __future__ import annotations

import re
from typing import Any

import msgspec

PROTOCOL = "tokenwire.v1"
MSGPACK_SUBPROTOCOL = "tokenwire.msgpack"
BEARER_PREFIX = "bearer."
MAX_ID_CHARS = 128


class ProtocolError(Exception):
    """A client message that cannot be served; becomes an `error` frame."""

    def __init__(self, code: str, message: str, request_id: str | None = None,
                 retry_after_ms: int | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id
        self.retry_after_ms = retry_after_ms

    def frame(self) -> dict:
        msg = {"type": "error", "code": self.code, "message": self.message}
        if self.request_id is not None:
            msg["id"] = self.request_id
        if self.retry_after_ms is not None:
            msg["retry_after_ms"] = self.retry_after_ms
        return msg


class _Msg(msgspec.Struct, forbid_unknown_fields=True):
    type: str


class Chat(_Msg):
    id: str
    content: str
    params: dict[str, Any] | None = None


class ContentPart(msgspec.Struct):
    """One part of a message's content; only `text` parts are served."""

    type: str
    text: str = ""


class Message(msgspec.Struct, forbid_unknown_fields=True):
    role: str
    content: str | list[ContentPart]


class Generate(_Msg):
    id: str
    prompt: str | list[int] | None = None
    messages: list[Message] | None = None
    params: dict[str, Any] | None = None


class Cancel(_Msg):
    id: str


class SessionUpdate(_Msg):
    system: str | None = None
    params: dict[str, Any] | None = None


class Bare(_Msg):
    """session.history and session.reset: no fields besides `type`."""


class Ping(_Msg):
    t: Any = None


SCHEMAS: dict[str, type[_Msg]] = {
    "chat": Chat, "generate": Generate, "cancel": Cancel, "session.update": SessionUpdate,
    "session.history": Bare, "session.reset": Bare, "ping": Ping,
}
ROLES = frozenset({"system", "developer", "user", "assistant"})  # developer = system


def message_dict(index: int, role: str, content, roles=ROLES) -> dict:
    """A chat message as the chat template takes it: `developer` is a system message,
    content parts are joined. Raises ProtocolError naming the field."""
    if role not in roles:
        raise ProtocolError("invalid_request",
                            f"messages[{index}].role: must be one of {sorted(roles)}")
    return {"role": "system" if role == "developer" else role,
            "content": content_text(index, content)}


def content_text(index: int, content: str | list[ContentPart] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    for j, part in enumerate(content):
        if part.type != "text":
            raise ProtocolError("invalid_request", f"messages[{index}].content[{j}].type: "
                                f"only text parts are supported, not {part.type[:32]!r}")
    return "".join(part.text for part in content)


class Codec:
    """JSON text frames, or msgpack binary frames when the client chose that subprotocol."""

    def __init__(self, binary: bool):
        self.binary = binary
        # A JSON float beyond a double (1e309) decodes to infinity, so the field it sits in
        # refuses it by name instead of the whole frame failing to parse.
        self._decoder = (msgspec.msgpack.Decoder() if binary
                         else msgspec.json.Decoder(float_hook=float))
        self._encoder = msgspec.msgpack.Encoder() if binary else msgspec.json.Encoder()

    def encode(self, msg: dict) -> bytes | str:
        data = self._encoder.encode(msg)
        return data if self.binary else data.decode()

    def decode(self, data: bytes | str) -> _Msg:
        """Parse one frame into its schema's Struct, or raise ProtocolError."""
        try:
            obj = self._decoder.decode(data)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise ProtocolError("invalid_json", f"frame is not valid: {exc}") from None
        except RecursionError:  # msgspec's decoders recurse per nesting level
            raise ProtocolError("invalid_json", "frame is not valid: nested too deeply") from None
        if not isinstance(obj, dict):
            raise ProtocolError("invalid_json", "frame must be an object (a map)")
        request_id = obj.get("id") if isinstance(obj.get("id"), str) else None
        kind = obj.get("type")
        if not isinstance(kind, str):
            raise ProtocolError("invalid_request", "type: required string", request_id)
        schema = SCHEMAS.get(kind)
        if schema is None:
            raise ProtocolError("unknown_type", f"type: unknown message type {kind[:64]!r}",
                                request_id)
        try:
            msg = msgspec.convert(obj, schema)
        except msgspec.ValidationError as exc:
            raise ProtocolError("invalid_request", field_message(exc), request_id) from None
        _check(msg)
        return msg


def field_message(exc: msgspec.ValidationError) -> str:
    # msgspec says "Expected `str`, got `int` - at `$.content`"; lead with the field.
    text = str(exc)
    field = re.fullmatch(r"Object (missing required|contains unknown) field `(\w+)`"
                         r"(?: - at `\$\.(.+)`)?", text)
    if field:
        problem, name, parent = field.groups()
        path = f"{parent}.{name}" if parent else name
        return f"{path}: {'required field missing' if problem[0] == 'm' else 'unknown field'}"
    if " - at `$." in text:
        message, path = text.rsplit(" - at `$.", 1)
        return f"{path.rstrip('`')}: {message}"
    return text


def _check(msg: _Msg) -> None:
    """Checks a schema cannot express: id sizes, prompt xor messages, roles."""
    request_id = getattr(msg, "id", None)
    if request_id is not None and not 0 < len(request_id) <= MAX_ID_CHARS:
        raise ProtocolError("invalid_request", f"id: must have 1..{MAX_ID_CHARS} characters")
    if isinstance(msg, Generate):
        if (msg.prompt is None) == (msg.messages is None):
            raise ProtocolError("invalid_request", "prompt: give exactly one of prompt or "
                                "messages", request_id)
        if msg.messages is not None:
            if not msg.messages:
                raise ProtocolError("invalid_request", "messages: must not be empty", request_id)
            for i, m in enumerate(msg.messages):
                try:
                    message_dict(i, m.role, m.content)
                except ProtocolError as exc:
                    exc.request_id = request_id
                    raise
        elif not msg.prompt:
            raise ProtocolError("invalid_request", "prompt: must not be empty", request_id)
