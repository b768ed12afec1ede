"""A protocol v1 chat turn: one user message and its reply, in the socket's session.

    accepted:   the question joins the history, the turn becomes the session's active one
    render:     the session saved (a client that saw `done` finds its turn after a hard
                kill), then the history rendered off the event loop, oldest turns dropped
                until the reply fits
    before done: the reply joins the history and is saved
    any end:    the turn closes (a turn with no reply drops its question)
"""
from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from gateway.errors import RequestError
from gateway.messages import fit_to_context
from gateway.sockets.requests import run_request
from gateway.stream import Stream
from gateway.tools.fallback import without_tools
from gateway.tools.formats import format_for_model
from gateway.ws import frames as f

if TYPE_CHECKING:
    from gateway.ws.protocol import V1Protocol


class ChatTurn:
    """The state of one running turn: whether its question was saved, its reply kept."""

    def __init__(self, protocol: V1Protocol, stream: Stream):
        self.protocol = protocol
        self.session = protocol.session
        self.stream = stream
        self.started = False  # the question was saved: the turn must be closed
        self.ended = False

    @classmethod
    def start(cls, protocol: V1Protocol, msg: f.Chat) -> None:
        session = protocol.session
        stream = protocol.new_stream(msg.id, "chat")
        if session.active_turn is not None:
            raise RequestError("busy", f"chat turn {session.active_turn!r} is still running "
                               "in this session", msg.id)
        params = protocol.params(msg.id, session.params, msg.params)
        context = protocol.request_context(msg)
        session.begin_turn(msg.id, msg.content)
        turn = cls(protocol, stream)
        protocol.core.start(stream, turn.run(params), context)

    async def run(self, params) -> None:
        core = self.protocol.core
        try:
            await run_request(core, self.stream, self.render, params, self.session.owner,
                              self.protocol.put_error, before_done=self.end)
        finally:
            if self.started and not self.ended:  # cancelled, failed or refused
                await self.end(self.stream)
            elif not self.started:  # its save was refused (and answered): nothing to undo
                self.session.end_turn("")

    async def render(self, stream: Stream, max_tokens: int) -> list[int] | None:
        self.started = await self.protocol.save(request_id=stream.id)
        if not self.started:
            return None
        model = self.protocol.rt.model
        # A Realtime socket on this session may have added function calls: as text here.
        fmt = format_for_model(model, self.protocol.rt.config.tool_call_parser)
        messages = without_tools(fmt, self.session.chat_messages())
        # The history fitted to the context, one user turn and its reply dropped at a time.
        return await self.protocol.rt.tokenize(lambda: fit_to_context(
            model.encode_chat, messages, max_tokens, model.max_model_len, step=2), stream.id)

    async def end(self, stream: Stream) -> None:
        self.ended = True
        self.session.end_turn(stream.text)
        await asyncio.shield(self.protocol.save(request_id=stream.id))
