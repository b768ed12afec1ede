"""Protocol v1's frames: client message schemas, decoding, and the server frames' shapes.

Decoding is two steps so each failure gets its own code: bytes -> a map (`invalid_json`),
then the map's `type` picks a schema (`unknown_type`) that msgspec checks field by field,
`params` included (`invalid_request`, naming the field).
"""
from __future__ import annotations

from typing import Any

import msgspec

from gateway.errors import RequestError, field_message
from gateway.messages import ContentPart, message_dict
from gateway.params import Params

PROTOCOL = "tokenwire.v1"
MSGPACK_SUBPROTOCOL = "tokenwire.msgpack"
MAX_ID_CHARS = 128


class _Msg(msgspec.Struct, forbid_unknown_fields=True):
    type: str


class RequestParams(Params, kw_only=True, forbid_unknown_fields=True):
    """A chat or generate frame's `params`: the sampling fields, and `model`, the served
    model this one request runs on (None: the socket's)."""

    model: str | None = None


class Chat(_Msg):
    id: str
    content: str
    params: RequestParams | None = None


class Message(msgspec.Struct, forbid_unknown_fields=True):
    role: str
    content: str | list[ContentPart]


class Generate(_Msg):
    id: str
    prompt: str | list[int] | None = None
    messages: list[Message] | None = None
    params: RequestParams | None = None


class Cancel(_Msg):
    id: str


class SessionUpdate(_Msg):
    """`params` stays the map the client sent: it is stored and echoed as sent (checked
    as Params before it is kept)."""

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
        """Parse one frame into its schema's Struct, or raise RequestError."""
        try:
            obj = self._decoder.decode(data)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise RequestError("invalid_json", f"frame is not valid: {exc}") from None
        except RecursionError:  # msgspec's decoders recurse per nesting level
            raise RequestError("invalid_json", "frame is not valid: nested too deeply") from None
        if not isinstance(obj, dict):
            raise RequestError("invalid_json", "frame must be an object (a map)")
        request_id = obj.get("id") if isinstance(obj.get("id"), str) else None
        kind = obj.get("type")
        if not isinstance(kind, str):
            raise RequestError("invalid_request", "type: required string", request_id)
        schema = SCHEMAS.get(kind)
        if schema is None:
            raise RequestError("unknown_type", f"type: unknown message type {kind[:64]!r}",
                               request_id)
        try:
            msg = msgspec.convert(obj, schema)
        except msgspec.ValidationError as exc:
            raise RequestError("invalid_request", field_message(exc), request_id) from None
        _check(msg)
        return msg


def _check(msg: _Msg) -> None:
    """Checks a schema cannot express: id sizes, prompt xor messages, roles."""
    request_id = getattr(msg, "id", None)
    if request_id is not None and not 0 < len(request_id) <= MAX_ID_CHARS:
        raise RequestError("invalid_request", f"id: must have 1..{MAX_ID_CHARS} characters")
    if isinstance(msg, Generate):
        if (msg.prompt is None) == (msg.messages is None):
            raise RequestError("invalid_request", "prompt: give exactly one of prompt or "
                               "messages", request_id)
        if msg.messages is not None:
            if not msg.messages:
                raise RequestError("invalid_request", "messages: must not be empty", request_id)
            for i, m in enumerate(msg.messages):
                try:
                    message_dict(i, m.role, m.content)
                except RequestError as exc:
                    exc.request_id = request_id
                    raise
        elif not msg.prompt:
            raise RequestError("invalid_request", "prompt: must not be empty", request_id)


def error_frame(exc: RequestError) -> dict:
    frame = {"type": "error", "code": exc.code, "message": exc.message}
    if exc.request_id is not None:
        frame["id"] = exc.request_id
    if exc.retry_after_ms is not None:
        frame["retry_after_ms"] = exc.retry_after_ms
    return frame
