"""RealtimeConnection: a /v1/ws Connection (same writer, outbox, admission, aborts on
close, drain) whose frames are Realtime events and whose turns are responses.

Client events are handled in the order they arrive, on the reader; state changes are
applied at once and saved to the session store in the background (a refused save, e.g.
a session over max_bytes_per_session, undoes the change and answers `error`).
"""
from __future__ import annotations

import asyncio
import logging

from gateway import protocol as p
from gateway.connection import Connection
from gateway.outbox import OutboxFull
from gateway.params import build_params
from gateway.realtime import events as ev
from gateway.realtime import server
from gateway.realtime.conversation import Conversation, new_id
from gateway.realtime.events import RealtimeError
from gateway.realtime.prompt import response_messages
from gateway.realtime.response import RealtimeStream, Response

log = logging.getLogger(__name__)


class RealtimeConnection(Connection):
    """One Realtime conversation on a socket, over a tokenwire session."""

    def __init__(self, rt, ws, session, resumed: bool):
        super().__init__(rt, ws, p.Codec(binary=False), session, resumed)
        self.tag = "rt" + self.tag
        self.conversation = Conversation(session, rt.config.max_conversation_items)
        self.conversation_id = new_id("conv")
        self._dispatch = {
            "session.update": self._on_session_update, "conversation.item.create": self._on_create,
            "conversation.item.retrieve": self._on_retrieve,
            "conversation.item.delete": self._on_delete,
            "conversation.item.truncate": self._on_truncate,
            "response.create": self._on_response, "response.cancel": self._on_response_cancel}

    # -- Connection's hooks --------------------------------------------------------------
    def _hello(self) -> dict:
        return server.event("session.created", session=self._session_body())

    def notify(self, frame: dict) -> None:
        if frame.get("type") == "draining":
            frame = server.error("draining", "the server is shutting down; reconnect with "
                                 f"?session_id= after {frame['reconnect_after_ms']} ms", None)
        super().notify(frame)

    def put_error(self, exc: p.ProtocolError) -> None:
        """A response refused by admission or the engine: `error` with its event_id, and
        the reason kept for its response.done."""
        stream = self.streams.get(exc.request_id)
        response = stream.response if isinstance(stream, RealtimeStream) else None
        frame = server.error(exc.code, exc.message, response.event_id if response else None,
                             retry_after_ms=exc.retry_after_ms)
        if response is not None:
            response.error = {k: frame["error"][k] for k in ("type", "code", "message")}
        self.outbox.put(frame)

    def _handle(self, data: bytes | str) -> None:
        event_id = None
        try:
            event = ev.decode(data)
            event_id = event.event_id
            self._dispatch[event.type](event)
        except RealtimeError as exc:
            self.outbox.put(server.error(exc.code, exc.message, exc.event_id, exc.param,
                                         retry_after_ms=exc.retry_after_ms))
        except p.ProtocolError as exc:  # params validation, shared with /v1/ws
            message = exc.message.replace("params.max_tokens", "max_output_tokens")
            message = message.replace("params.", "")
            self.outbox.put(server.error(exc.code, message, event_id, message.split(":")[0]))
        except OutboxFull:
            raise  # the reader closes the socket: its client is not reading
        except Exception:  # noqa: BLE001 - one event's fault must not close the socket
            log.exception("event %r on %s failed", event_id, self.tag)
            self.outbox.put(server.error("internal", "internal error", event_id))

    # -- session and conversation ---------------------------------------------------------
    def _session_body(self) -> dict:
        return server.session(self.session.id, self.rt.engine.model_name, self.session.record,
                              self.rt.config.default_max_tokens)

    def _on_session_update(self, event: ev.SessionUpdate) -> None:
        record, config = self.session.record, event.session
        params = dict(record.params)
        params.update(_wire_params(config.max_output_tokens, config.temperature,
                                   self.rt.config.max_tokens_cap))
        build_params(self.rt.config, params)  # refuse bad defaults now, not per response
        before = (dict(record.params), record.system)
        record.params = params
        if config.instructions is not None:
            record.system = config.instructions or None

        def undo() -> None:
            record.params, record.system = before

        self.outbox.put(server.event("session.updated", session=self._session_body()))
        self._spawn(self._persist(event.event_id, undo))

    def _on_create(self, event: ev.ItemCreate) -> None:
        role, text = ev.item_text(event.item, event.event_id)
        at = self.conversation.add(role, text, event.item.id, event.previous_item_id,
                                   event.event_id)
        item_id, _ = self.conversation.item(at)
        item = server.item(item_id, role, text)
        previous = self.conversation.previous_id(at)
        for kind in ("conversation.item.added", "conversation.item.done"):
            self.outbox.put(server.event(kind, item=item, previous_item_id=previous))
        self._spawn(self._persist(event.event_id, lambda: self._forget(item_id)))

    def _forget(self, item_id: str) -> None:
        try:
            self.conversation.delete(item_id, None)
        except RealtimeError:
            pass  # already deleted by the client

    def _on_retrieve(self, event: ev.ItemRef) -> None:
        item_id, message = self.conversation.item(
            self.conversation.index(event.item_id, event.event_id))
        self.outbox.put(server.event("conversation.item.retrieved", item=server.item(
            item_id, message["role"], message["content"])))

    def _on_delete(self, event: ev.ItemRef) -> None:
        self.conversation.delete(event.item_id, event.event_id)
        self.outbox.put(server.event("conversation.item.deleted", item_id=event.item_id))
        self._spawn(self._persist(event.event_id))

    def _on_truncate(self, event: ev.ItemTruncate) -> None:
        self.conversation.truncate(event.item_id, event.content_index, event.audio_end_ms,
                                   event.event_id)
        self.outbox.put(server.event("conversation.item.truncated", item_id=event.item_id,
                                     content_index=event.content_index,
                                     audio_end_ms=event.audio_end_ms))
        self._spawn(self._persist(event.event_id))

    async def _persist(self, event_id: str | None, undo=None) -> bool:
        error = await self.rt.sessions.save(self.session)
        if error is None:
            return True
        if undo is not None:
            undo()
        self.outbox.put(server.error(error.code, str(error), event_id))
        return False

    # -- responses -------------------------------------------------------------------------
    def _on_response(self, event: ev.ResponseCreate) -> None:
        config = event.response or ev.ResponseConfig()
        if self.rt.status == "draining":
            raise RealtimeError("draining", "the server is shutting down; reconnect later",
                                event.event_id, kind="server_error")
        in_band = config.conversation in (None, "auto")
        if not in_band and config.conversation != "none":
            raise RealtimeError("invalid_value", "response.conversation: must be \"auto\" or "
                                "\"none\"", event.event_id, "response.conversation")
        if in_band and self.session.active_turn is not None:
            raise RealtimeError("conversation_already_has_active_response", "a response is "
                                "already running in this conversation; cancel it first",
                                event.event_id)
        params = build_params(self.rt.config, self.session.record.params, _wire_params(
            config.max_output_tokens, config.temperature, self.rt.config.max_tokens_cap))
        messages = response_messages(self.conversation, config, self.session.record.system,
                                     event.event_id)
        response = Response(event.event_id, self.conversation_id if in_band else None,
                            params.max_tokens, config.metadata)
        self._start_response(response, messages, params)

    def _start_response(self, response: Response, messages: list[dict], params) -> None:
        stream = RealtimeStream(response, f"{self.tag}-{next(self._engine_ids)}")
        self.streams[stream.id] = stream
        if response.in_band:
            self.session.active_turn = response.id
        limit = self.rt.config.max_inflight_per_socket
        for frame in response.opening(server.rate_limits(limit, limit - len(self.streams))):
            self.outbox.put(frame)
        self._launch(stream, self._run_response(stream, messages, params))

    def _on_response_cancel(self, event: ev.ResponseCancel) -> None:
        response_id = event.response_id or self.session.active_turn
        stream = self.streams.get(response_id) if response_id else None
        if stream is None and event.response_id is None and len(self.streams) == 1:
            stream = next(iter(self.streams.values()))  # the one out-of-band response
        if not isinstance(stream, RealtimeStream):
            raise RealtimeError("response_cancel_not_active", "no response is running"
                                + (f" with id {response_id[:64]!r}" if response_id else ""),
                                event.event_id, "response_id" if response_id else None)
        stream.response.client_cancelled = stream.cancel_requested = True
        stream.task.cancel()

    async def _run_response(self, stream: RealtimeStream, messages: list[dict], params) -> None:
        response = stream.response

        async def render(_stream, max_tokens: int) -> list[int]:
            return self._fit(messages, max_tokens)

        try:
            await self._run(stream, render, params)
        finally:
            if response.in_band and self.session.active_turn == response.id:
                self.session.active_turn = None
        previous, joined = None, False
        if response.in_band and stream.finish_reason and stream.text:
            previous, joined = await self._join(stream)
        for frame in response.closing(stream, previous, joined):
            self.outbox.put(frame)

    async def _join(self, stream: RealtimeStream) -> tuple[str | None, bool]:
        """The reply joins the conversation (and the store) before response.done."""
        response = stream.response
        try:
            at = self.conversation.add("assistant", stream.text, response.item_id, None,
                                       response.event_id)
        except RealtimeError as exc:
            self.outbox.put(server.error(exc.code, exc.message, exc.event_id))
            return None, False
        saved = await asyncio.shield(self._persist(
            response.event_id, lambda: self._forget(response.item_id)))
        return self.conversation.previous_id(at), saved

    def _fit(self, messages: list[dict], max_tokens: int) -> list[int]:
        """The chat template's tokens, oldest non-system messages dropped until the reply
        fits the context (a single message that does not fit is the engine's too_large)."""
        engine = self.rt.engine
        first = 1 if messages and messages[0]["role"] == "system" else 0
        prompt = engine.encode_chat(messages)
        while len(prompt) + max_tokens > engine.max_model_len and len(messages) - first > 1:
            del messages[first]
            prompt = engine.encode_chat(messages)
        return prompt


def _wire_params(max_output_tokens, temperature, cap: int) -> dict:
    """Realtime fields -> the `params` map /v1/ws validates ("inf": the server's cap)."""
    params = {}
    if max_output_tokens is not None:
        params["max_tokens"] = cap if max_output_tokens == "inf" else max_output_tokens
    if temperature is not None:
        params["temperature"] = temperature
    return params
