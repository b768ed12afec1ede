"""RealtimeProtocol: what OpenAI Realtime's client events mean, on a SocketCore.

Client events are handled in the order they arrive, on the reader; state changes are
applied at once and saved to the session store in the background (a refused save, e.g.
a session over max_bytes_per_session, undoes the change and answers `error`). Responses
run as requests on the socket (gateway/sockets/requests.py), each its own Stream whose
frames its Response shapes.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging

from gateway import params as wire
from gateway.errors import RequestError
from gateway.messages import fit_to_context
from gateway.realtime import events as ev
from gateway.realtime import server, tools
from gateway.realtime.conversation import Conversation, new_id
from gateway.realtime.events import RealtimeError
from gateway.realtime.prompt import for_template, response_messages
from gateway.realtime.response import Response
from gateway.runtime import Runtime
from gateway.sessions.live import LiveSession
from gateway.sockets.core import SocketCore
from gateway.sockets.outbox import OutboxFull
from gateway.sockets.requests import run_request
from gateway.stream import Stream
from gateway.tools.formats import format_for_model

log = logging.getLogger(__name__)
# Params' names as Realtime spells them.
_FIELD_NAMES = {"max_tokens": "max_output_tokens"}


class RealtimeProtocol:
    """One Realtime conversation on a socket, over a tokenwire session."""

    def __init__(self, core: SocketCore, resumed: bool):
        self.core = core
        self.rt: Runtime = core.rt
        self.session: LiveSession = core.session
        self.conversation = Conversation(self.session, self.rt.config.max_conversation_items)
        self.conversation_id = new_id("conv")
        self._dispatch = {
            "session.update": self._on_session_update, "conversation.item.create": self._on_create,
            "conversation.item.retrieve": self._on_retrieve,
            "conversation.item.delete": self._on_delete,
            "conversation.item.truncate": self._on_truncate,
            "response.create": self._on_response, "response.cancel": self._on_response_cancel}

    # -- WireProtocol ------------------------------------------------------------------------
    def encode(self, frame: dict) -> str:
        return ev.encode(frame)

    def hello(self) -> dict:
        return server.event("session.created", session=self._session_body())

    def draining_frame(self, reconnect_after_ms: int) -> dict:
        return server.error("draining", "the server is shutting down; reconnect with "
                            f"?session_id= after {reconnect_after_ms} ms", None)

    def handle(self, data: bytes | str) -> None:
        event_id = None
        try:
            event = ev.decode(data)
            event_id = event.event_id
            self._dispatch[event.type](event)
        except RequestError as exc:
            self.put(server.error(exc.code, exc.message, exc.request_id, exc.param,
                                  retry_after_ms=exc.retry_after_ms))
        except OutboxFull:
            raise  # the reader closes the socket: its client is not reading
        except Exception:  # noqa: BLE001 - one event's fault must not close the socket
            log.exception("event %r on %s failed", event_id, self.core.tag)
            self.put(server.error("internal", "internal error", event_id))

    def error_frame(self, exc: RequestError) -> dict:
        return server.error(exc.code, exc.message, exc.request_id, exc.param)

    def loading_frame(self, stream: Stream, model: str) -> None:
        return None  # OpenAI's Realtime API has no such event: the response waits

    def put(self, frame: dict) -> None:
        self.core.outbox.put(frame)

    def refuse(self, exc: RequestError) -> None:
        """A response refused by admission or the engine: `error` with its event_id, and
        the reason kept for its response.done."""
        stream = self.core.streams.get(exc.request_id)
        response = stream.shaper if stream is not None else None
        frame = server.error(exc.code, exc.message, response.event_id if response else None,
                             retry_after_ms=exc.retry_after_ms)
        if response is not None:
            response.error = {k: frame["error"][k] for k in ("type", "code", "message")}
        self.put(frame)

    def params(self, event_id: str | None, *layers: wire.Params | dict | None):
        """SamplingParams from the layers; a refusal names the field as Realtime does."""
        try:
            return wire.resolve(self.rt.config, *layers)
        except wire.ParamError as exc:
            name = _FIELD_NAMES.get(exc.field, exc.field)
            raise RealtimeError("invalid_request", f"{name}: {exc.problem}", event_id,
                                name) from None

    def _config_params(self, config: ev.SessionConfig | ev.ResponseConfig) -> wire.Params:
        """Realtime's sampling fields as Params ("inf": the server's cap)."""
        params = wire.Params()
        if config.max_output_tokens is not None:
            cap = self.rt.config.max_tokens_cap
            params.max_tokens = (cap if config.max_output_tokens == "inf"
                                 else config.max_output_tokens)
        if config.temperature is not None:
            params.temperature = config.temperature
        return params

    # -- session and conversation ---------------------------------------------------------
    def _session_body(self) -> dict:
        return server.session(self.session.id, self.rt.model.name, self.session.system,
                              self.session.params, self.rt.config.default_max_tokens,
                              self.session.tools)

    def _on_session_update(self, event: ev.SessionUpdate) -> None:
        config = event.session
        self._check_same_model(config.model, event.event_id)
        given = {name: value for name in wire.PARAM_FIELDS
                 if (value := getattr(self._config_params(config), name)) is not wire.UNSET}
        params = {**self.session.params, **given}
        self.params(event.event_id, params)  # refuse bad defaults now, not per response
        changes = {"params": params}
        if config.instructions is not None:
            changes["system"] = config.instructions
        if tools.given(config):
            changes["tools"] = {**self.session.tools, **tools.given(config)}
            tools.tool_plan(self.rt, changes["tools"], event.event_id, "session")
        undo = self.session.configure(**changes)
        self.put(server.event("session.updated", session=self._session_body()))
        self.core.spawn(self._persist(event.event_id, undo))

    def _check_same_model(self, name: str | None, event_id: str | None) -> None:
        """session.model may repeat the session's model (clients resend their whole
        session config) but not change it: the model is chosen when the session is
        created (/v1/realtime?model=NAME), as OpenAI's Realtime API does."""
        if name and self.rt.find_model(name, event_id) is not self.rt.model:
            raise RealtimeError("invalid_request", "session.model: the session's model "
                                f"is {self.rt.model.name!r}, chosen when it was created "
                                "(/v1/realtime?model=NAME); open another session for "
                                "another model", event_id, "session.model")

    def _on_create(self, event: ev.ItemCreate) -> None:
        message = ev.item_message(event.item, event.event_id)
        at = self.conversation.add(message, event.item.id, event.previous_item_id,
                                   event.event_id)
        item_id, _ = self.conversation.item(at)
        item = server.item_of(item_id, message)
        previous = self.conversation.previous_id(at)
        for kind in ("conversation.item.added", "conversation.item.done"):
            self.put(server.event(kind, item=item, previous_item_id=previous))
        self.core.spawn(self._persist(event.event_id, lambda: self._forget(item_id)))

    def _forget(self, item_id: str) -> None:
        try:
            self.conversation.delete(item_id, None)
        except RealtimeError:
            pass  # already deleted by the client

    def _on_retrieve(self, event: ev.ItemRef) -> None:
        item_id, message = self.conversation.item(
            self.conversation.index(event.item_id, event.event_id))
        self.put(server.event("conversation.item.retrieved",
                              item=server.item_of(item_id, message)))

    def _on_delete(self, event: ev.ItemRef) -> None:
        self.conversation.delete(event.item_id, event.event_id)
        self.put(server.event("conversation.item.deleted", item_id=event.item_id))
        self.core.spawn(self._persist(event.event_id))

    def _on_truncate(self, event: ev.ItemTruncate) -> None:
        self.conversation.truncate(event.item_id, event.content_index, event.audio_end_ms,
                                   event.event_id)
        self.put(server.event("conversation.item.truncated", item_id=event.item_id,
                              content_index=event.content_index,
                              audio_end_ms=event.audio_end_ms))
        self.core.spawn(self._persist(event.event_id))

    async def _persist(self, event_id: str | None, undo=None) -> bool:
        error = await self.rt.sessions.save(self.session)
        if error is None:
            return True
        if undo is not None:
            undo()
        self.put(server.error(error.code, str(error), event_id))
        return False

    # -- responses -------------------------------------------------------------------------
    def _on_response(self, event: ev.ResponseCreate) -> None:
        config = event.response or ev.ResponseConfig()
        if self.rt.status == "draining":
            raise RealtimeError("draining", "the server is shutting down; reconnect later",
                                event.event_id)
        in_band = config.conversation in (None, "auto")
        if not in_band and config.conversation != "none":
            raise RealtimeError("invalid_value", "response.conversation: must be \"auto\" or "
                                "\"none\"", event.event_id, "response.conversation")
        if in_band and self.session.active_turn is not None:
            raise RealtimeError("conversation_already_has_active_response", "a response is "
                                "already running in this conversation; cancel it first",
                                event.event_id)
        params = self.params(event.event_id, self.session.params, self._config_params(config))
        limit = self.rt.config.max_conversation_items
        if config.input is not None and len(config.input) > limit:
            raise RealtimeError("too_large", f"response.input: at most {limit} items "
                                "(max_conversation_items)", event.event_id, "response.input")
        plan = tools.tool_plan(self.rt, {**self.session.tools, **tools.given(config)},
                               event.event_id, "response")
        messages = for_template(response_messages(self.conversation, config,
                                                  self.session.system, event.event_id),
                                plan, format_for_model(self.rt.model,
                                                       self.rt.config.tool_call_parser))
        if plan is not None:
            params = dataclasses.replace(params, response_format=plan.constraint())
        response = Response(event.event_id, self.conversation_id if in_band else None,
                            params.max_tokens, config.metadata, plan)
        template_tools = plan.template_tools() if plan is not None else None
        self._start_response(response, messages, params, template_tools)

    def _start_response(self, response: Response, messages: list[dict], params,
                        template_tools: list[dict] | None) -> None:
        stream = Stream(response.id, self.core.new_engine_id(), "chat", response)
        if response.in_band:
            self.session.begin_turn(response.id)
        self.core.start(stream, self._run_response(stream, messages, params, template_tools))
        limit = self.rt.scheduler.config.max_inflight_per_socket
        rate_limits = server.rate_limits(limit, limit - len(self.core.streams))
        for frame in response.opening(rate_limits):  # before the task first runs
            self.put(frame)

    def _on_response_cancel(self, event: ev.ResponseCancel) -> None:
        response_id = event.response_id or self.session.active_turn
        stream = self.core.streams.get(response_id) if response_id else None
        if stream is None and event.response_id is None and len(self.core.streams) == 1:
            stream = next(iter(self.core.streams.values()))  # the one out-of-band response
        if stream is None:
            raise RealtimeError("response_cancel_not_active", "no response is running"
                                + (f" with id {response_id[:64]!r}" if response_id else ""),
                                event.event_id, "response_id" if response_id else None)
        stream.shaper.client_cancelled = True
        self.core.cancel(stream)

    async def _run_response(self, stream: Stream, messages: list[dict], params,
                            template_tools: list[dict] | None) -> None:
        response: Response = stream.shaper

        async def render(stream: Stream, max_tokens: int) -> list[int]:
            model = self.rt.model
            # The oldest non-system messages dropped until the reply fits the context.
            return await self.rt.tokenize(lambda: fit_to_context(
                lambda m: model.encode_chat(m, template_tools), messages, max_tokens,
                model.max_model_len), stream.id)

        try:
            await run_request(self.core, stream, render, params, self.session.owner,
                              self.refuse)
        finally:
            if response.in_band:
                self.session.release_turn(response.id)
        response.finish_items(stream)
        items = response.messages(stream) if response.in_band and stream.finish_reason else []
        previous, joined = await self._join(response, items) if items else (None, False)
        for frame in response.closing(stream, previous, joined):
            self.put(frame)

    async def _join(self, response: Response,
                    items: list[tuple[str, dict]]) -> tuple[str | None, bool]:
        """The reply's items join the conversation (and the store) before response.done:
        all of them, or (over max_conversation_items) none. (The id before the first,
        whether they were saved.)"""
        added = []
        try:
            for item_id, message in items:
                self.conversation.add(message, item_id, None, response.event_id)
                added.append(item_id)
        except RealtimeError as exc:
            self._forget_all(added)
            self.put(server.error(exc.code, exc.message, exc.event_id))
            return None, False
        previous = self.conversation.previous_id(self.conversation.index(added[0], None))
        saved = await asyncio.shield(self._persist(
            response.event_id, lambda: self._forget_all(added)))
        return previous, saved

    def _forget_all(self, item_ids: list[str]) -> None:
        for item_id in item_ids:
            self._forget(item_id)
