"""V1Protocol: what protocol v1's frames mean, on a SocketCore (docs/protocol.md).

    chat             one turn of the socket's session (gateway/ws/chat.py)
    generate         a stateless completion; many may run at once
    cancel           ends a running request with `done` cancelled
    session.update   system prompt and default params, saved, then `session.updated`
    session.history  the history as stored
    session.reset    clears the history
    ping             `pong` with the same `t`
"""
from __future__ import annotations

import contextvars
import logging

from gateway import params as wire
from gateway.errors import RequestError
from gateway.logprobs import ws_entries
from gateway.runtime import Runtime
from gateway.sessions.live import LiveSession
from gateway.sockets.core import SocketCore
from gateway.sockets.outbox import OutboxFull
from gateway.sockets.requests import run_request
from gateway.stream import Stream
from gateway.ws import frames as f
from gateway.ws.chat import ChatTurn

log = logging.getLogger(__name__)


class V1Protocol:
    """One /v1/ws socket: its frames' meaning, on the socket's core and session."""

    def __init__(self, core: SocketCore, resumed: bool, codec: f.Codec):
        self.core = core
        self.rt: Runtime = core.rt
        self.session: LiveSession = core.session
        self.resumed = resumed
        self.codec = codec
        self._handlers = {f.Chat: self._on_chat, f.Generate: self._on_generate,
                          f.Cancel: self._on_cancel, f.SessionUpdate: self._on_session_update,
                          f.Ping: self._on_ping}

    # -- WireProtocol ------------------------------------------------------------------------
    def encode(self, frame: dict) -> bytes | str:
        return self.codec.encode(frame)

    def hello(self) -> dict:
        return {"type": "hello", "protocol": f.PROTOCOL, "session_id": self.session.id,
                "resumed": self.resumed, "model": self.rt.model.name,
                "instance": self.rt.config.instance_id, "limits": self.rt.limits()}

    def draining_frame(self, reconnect_after_ms: int) -> dict:
        return {"type": "draining", "reconnect_after_ms": reconnect_after_ms}

    def handle(self, data: bytes | str) -> None:
        msg = None
        try:
            if self.codec.binary and isinstance(data, str):
                raise RequestError("invalid_json", "this socket speaks msgpack: send "
                                   "binary frames")
            msg = self.codec.decode(data)
            if isinstance(msg, f.Bare):
                self._on_bare(msg)
            else:
                self._handlers[type(msg)](msg)
        except RequestError as exc:
            self.put_error(exc)
        except OutboxFull:
            raise  # the reader closes the socket: its client is not reading
        except Exception:  # noqa: BLE001 - one frame's fault must not close the socket
            request_id = getattr(msg, "id", None)
            log.exception("frame %r on %s failed", request_id, self.core.tag)
            self.put_error(RequestError("internal", "internal error", request_id))

    # -- Shaper: the frames of a stream ------------------------------------------------------
    def delta_frame(self, stream: Stream, out) -> dict:
        frame = {"type": "delta", "id": stream.id, "text": out.delta_text,
                 "n": len(out.new_token_ids)}
        if stream.logprobs:
            frame["logprobs"] = ws_entries(out.logprobs or [], stream.model.token_text)
        return frame

    def done_frame(self, stream: Stream, now: float) -> dict:
        frame = {"type": "done", "id": stream.id, "finish_reason": stream.finish_reason or "stop",
                 "usage": {"prompt_tokens": stream.prompt_tokens,
                           "completion_tokens": stream.completion_tokens,
                           "cached_tokens": stream.cached_tokens},
                 "timing": stream.timing(now)}
        if stream.error:
            frame["error"] = stream.error
        return frame

    def put_error(self, exc: RequestError) -> None:
        self.core.outbox.put(f.error_frame(exc))

    def error_frame(self, exc: RequestError) -> dict:
        return f.error_frame(exc)

    def loading_frame(self, stream: Stream, model: str) -> dict:
        return {"type": "loading", "id": stream.id, "model": model}

    # -- client messages -----------------------------------------------------------------
    def params(self, request_id: str | None, *layers: wire.Params | dict | None):
        """SamplingParams from the layers; a refusal names `params.FIELD`."""
        try:
            return wire.resolve(self.rt.config, *layers)
        except wire.ParamError as exc:
            raise RequestError("invalid_request", f"params.{exc.field}: {exc.problem}",
                               request_id, param=exc.field) from None

    def request_context(self, msg: f.Chat | f.Generate) -> contextvars.Context:
        """The context a request's task runs in, bound to `params.model` (none: the
        socket's model); an unknown model is refused (model_not_found) here, before
        anything starts."""
        return self.rt.request_context(msg.params and msg.params.model, msg.id)

    def new_stream(self, request_id: str, kind: str) -> Stream:
        if self.rt.status == "draining":
            raise RequestError("draining", "the server is shutting down; reconnect later",
                               request_id)
        if request_id in self.core.streams:
            raise RequestError("duplicate_id", f"id: {request_id!r} is already running",
                               request_id)
        return Stream(request_id, self.core.new_engine_id(), kind, self)

    def _on_chat(self, msg: f.Chat) -> None:
        ChatTurn.start(self, msg)

    def _on_generate(self, msg: f.Generate) -> None:
        stream = self.new_stream(msg.id, "generate")
        params = self.params(msg.id, msg.params)
        context = self.request_context(msg)
        limit = self.rt.config.max_conversation_items
        if msg.messages is not None and len(msg.messages) > limit:
            raise RequestError("too_large", f"messages: at most {limit} messages "
                               "(max_conversation_items)", msg.id)
        if msg.messages is not None:
            prompt = [f.message_dict(i, m.role, m.content) for i, m in enumerate(msg.messages)]
        else:
            prompt = msg.prompt

        async def render(stream: Stream, _max_tokens: int) -> list[int]:
            model = self.rt.model  # the request's (its task's context)
            if isinstance(prompt, str):
                return await self.rt.tokenize(lambda: model.encode(prompt), stream.id)
            if prompt and isinstance(prompt[0], dict):
                return await self.rt.tokenize(lambda: model.encode_chat(prompt), stream.id)
            return prompt

        self.core.start(stream, run_request(self.core, stream, render, params,
                                            self.session.owner, self.put_error), context)

    def _on_cancel(self, msg: f.Cancel) -> None:
        stream = self.core.streams.get(msg.id)
        if stream is None:
            raise RequestError("not_found", f"id: no running request {msg.id!r}", msg.id)
        self.core.cancel(stream)

    def _on_session_update(self, msg: f.SessionUpdate) -> None:
        changes = {}
        if msg.params is not None and "model" in msg.params:
            # Kept as a default it would be echoed back yet never route a turn: refused.
            raise RequestError("invalid_request", "params.model: a session's model is "
                               "chosen when it connects (/v1/ws?model=NAME); send `model` "
                               "in a chat's or generate's params to run one request on "
                               "another", param="model")
        if msg.params is not None:
            self.params(None, msg.params)  # refuse bad defaults now, not on every turn
            changes["params"] = msg.params
        if msg.system is not None:
            changes["system"] = msg.system
        self.session.configure(**changes)
        self._save_then_reply()

    def _on_bare(self, msg: f.Bare) -> None:
        if msg.type == "session.history":
            self.core.outbox.put({"type": "session.history", "session_id": self.session.id,
                                  "system": self.session.system,
                                  "messages": list(self.session.messages)})
            return
        if self.session.active_turn is not None:
            raise RequestError("busy", "a chat turn is running; cancel it first")
        self.session.reset()
        self._save_then_reply()

    def _on_ping(self, msg: f.Ping) -> None:
        self.core.outbox.put({"type": "pong", "t": msg.t})

    def _save_then_reply(self) -> None:
        session = self.session
        reply = {"type": "session.updated", "session_id": session.id,
                 "system": session.system, "params": session.params,
                 "history_length": len(session.messages)}
        self.core.spawn(self.save(reply))

    async def save(self, reply: dict | None = None, request_id: str | None = None) -> bool:
        """Save the session; answer `reply` once saved, or the store's refusal."""
        error = await self.rt.sessions.save(self.session)
        if error is not None:
            retry_ms = getattr(error, "retry_after_ms", None)
            self.put_error(RequestError(error.code, str(error), request_id,
                                        retry_after_ms=retry_ms))
        elif reply is not None:
            self.core.outbox.put(reply)
        return error is None
