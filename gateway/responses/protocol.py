"""WebSocket mode of the Responses API (`GET /v1/responses`, openai-python's
`client.responses.connect()`): a protocol object on a SocketCore.

    client: {"type": "response.create", ...the create body, generate?, stream_id?}
    server: the SSE events of that response, one per message (each with its
            sequence_number, and its `stream_id` when the create named a lane); `error`
            ({"type": "error", "error": {type, code, message, param}, status}) for a
            create that is refused

One response runs per lane at a time: without `stream_id` the socket is one lane, and a
second create while one runs gets `error` (code response_in_progress). `generate: false`
prefills the chain's prompt (its KV stays in the prefix cache) and answers
response.created, response.in_progress, response.completed with no output.

A chain's previous response is found in the store (so chains survive reconnects, restarts
and replicas), except this socket's last response, which the socket keeps (one, dropped
with the socket): one created with `store: false` lives only there; a stored one is used
while the store still holds its version (a version read instead of the record's, so a
response deleted or expired in the store is gone here too).
"""
from __future__ import annotations

import json
import logging

import msgspec

from gateway.errors import RequestError, field_error
from gateway.responses import stored
from gateway.responses.request import WsCreateRequest
from gateway.responses.run import Prepared, finish, prepare
from gateway.responses.shape import ResponseShape
from gateway.sockets.core import SocketCore
from gateway.sockets.outbox import OutboxFull
from gateway.sockets.requests import run_request
from gateway.stream import Stream

log = logging.getLogger(__name__)
MAX_LANE_CHARS = 64
SHAPE = "_shape"  # a frame's response, which stamps its sequence_number when written
_STATUS = {"not_found": 404, "previous_response_not_found": 400, "rate_limited": 429,
           "overloaded": 503, "draining": 503, "store_unavailable": 503, "internal": 500}


class _Lane:
    """The shaper of one lane's running response: its text and item events as the
    socket's writer takes them (stamped at write time, in write order)."""

    def __init__(self):
        self.shape: ResponseShape | None = None

    def delta_frame(self, stream: Stream, out) -> list[dict] | None:
        if not self.shape.generate or not out.delta_text:
            return None
        return [{**event, SHAPE: self.shape} for event in self.shape.feed(out.delta_text)]

    def done_frame(self, stream: Stream, now: float) -> list[dict] | None:
        if not self.shape.generate:
            return None
        return [{**event, SHAPE: self.shape} for event in self.shape.closing_items(stream)]


class ResponsesProtocol:
    """response.create events on one socket, each a response run as a socket request."""

    def __init__(self, core: SocketCore, resumed: bool):
        self.core = core
        self.rt = core.rt
        self.owner = core.session.owner
        self.local: dict[str, stored.Stored] = {}  # the socket's last response (one)

    # -- WireProtocol ------------------------------------------------------------------------
    def encode(self, frame: dict) -> str:
        shape = frame.pop(SHAPE, None)
        if shape is not None:
            shape.stamp(frame)
        return json.dumps(frame, ensure_ascii=False)

    def hello(self) -> None:
        return None  # the Responses socket opens silently: the client speaks first

    def draining_frame(self, reconnect_after_ms: int) -> dict:
        return error_event(RequestError("draining", "the server is shutting down; reconnect "
                                        f"after {reconnect_after_ms} ms and continue the "
                                        "chain with previous_response_id"))

    def loading_frame(self, stream: Stream, model: str) -> None:
        return None  # OpenAI's Responses events have none: the response waits

    def handle(self, data: bytes | str) -> None:
        lane = None
        try:
            req = _decode(data)
            lane = req.stream_id
            self._create(req)
        except RequestError as exc:
            self.core.outbox.put(error_event(exc, lane))
        except OutboxFull:
            raise  # the reader closes the socket: its client is not reading
        except Exception:  # noqa: BLE001 - one event's fault must not close the socket
            log.exception("event on %s failed", self.core.tag)
            self.core.outbox.put(error_event(RequestError("internal", "internal error"), lane))

    # -- responses ---------------------------------------------------------------------------
    def _create(self, req: WsCreateRequest) -> None:
        if req.background:
            raise RequestError("invalid_request", "background: not supported over "
                               "WebSocket mode", param="background")
        if self.rt.status == "draining":
            raise RequestError("draining", "the server is shutting down; reconnect later")
        if req.stream_id is not None and len(req.stream_id) > MAX_LANE_CHARS:
            raise RequestError("invalid_request", f"stream_id: at most {MAX_LANE_CHARS} "
                               "characters", param="stream_id")
        limit = self.rt.scheduler.config.max_inflight_per_socket
        if len(self.core.streams) >= limit:  # before any work: lanes share the socket's cap
            raise RequestError("rate_limited", f"{limit} responses already run on this "
                               "socket (--max-inflight)", retry_after_ms=1000)
        key = f"lane:{req.stream_id}"
        if key in self.core.streams:
            raise RequestError("response_in_progress", "a response is already running on "
                               "this " + ("lane (stream_id)" if req.stream_id else "socket")
                               + "; wait for its end, or use another stream_id")
        stream = Stream(key, self.core.new_engine_id(), "chat", _Lane())
        self.core.start(stream, self._run(stream, req))

    async def _run(self, stream: Stream, req: WsCreateRequest) -> None:
        lane: _Lane = stream.shaper
        try:
            prepared = await prepare(self.rt, req, self.owner, generate=req.generate
                                     is not False, stream_id=req.stream_id, local=self.local)
        except RequestError as exc:
            self.core.streams.pop(stream.id, None)
            self.core.outbox.put(error_event(exc, req.stream_id))
            return
        lane.shape = prepared.shape
        for event in prepared.shape.opening():
            self.core.outbox.put({**event, SHAPE: prepared.shape})

        async def render(stream: Stream, max_tokens: int) -> list[int]:
            return prepared.prompt

        def refuse(exc: RequestError) -> None:
            self.core.outbox.put(error_event(exc, req.stream_id))

        await run_request(self.core, stream, render, prepared.turn.params, self.owner, refuse)
        await self._close(prepared, stream)

    async def _close(self, prepared: Prepared, stream: Stream) -> None:
        """Store the response, then its last events (the items' closing events went out
        already as the stream's done frame, unless it never streamed)."""
        streamed = stream.finish_reason is not None
        await finish(self.rt, prepared, stream, self.local)
        shape = prepared.shape
        events = [shape.end_event(stream)] if streamed and prepared.generate \
            else shape.closing(stream)
        for event in events:
            self.core.outbox.put({**event, SHAPE: prepared.shape})


def _decode(data: bytes | str) -> WsCreateRequest:
    try:
        event = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise RequestError("invalid_json", f"the message is not valid JSON: {exc}") from None
    kind = event.get("type") if isinstance(event, dict) else None
    if kind != "response.create":
        raise RequestError("unknown_event", f"type: {str(kind)[:40]!r} is not supported "
                           "(only response.create)", param="type")
    try:
        return msgspec.convert(event, WsCreateRequest)
    except msgspec.ValidationError as exc:
        path, problem = field_error(exc)
        if problem == "unknown field":
            path = path.rpartition(".")[2]
            problem = "unknown parameter"
        raise RequestError("invalid_request", f"{path}: {problem}" if path else problem,
                           param=path or None) from None


def error_event(exc: RequestError, stream_id: str | None = None) -> dict:
    kind = "server_error" if _STATUS.get(exc.code, 400) >= 500 else "invalid_request_error"
    event = {"type": "error", "status": _STATUS.get(exc.code, 400),
             "error": {"type": kind, "code": exc.code, "message": exc.message,
                       "param": exc.param}}
    if stream_id is not None:
        event["stream_id"] = stream_id
    return event
