"""LiveSession: a session attached to at least one socket, and the one place it is edited.

Every change to a session's history, system prompt or default params goes through a
method here, whichever protocol asks for it (a /v1/ws chat turn, a Realtime item or
response), so the rules hold for all of them: one active turn per session, and a history
that never keeps a question without its answer. Saving is the registry's (registry.py).
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from gateway.sessions.store import SessionRecord

_UNCHANGED = object()


class LiveSession:
    """A session's record in memory, shared by the sockets attached to it; `active_turn`
    is its running turn's id (one per session, whichever socket started it)."""

    __slots__ = ("record", "active_turn", "refs", "pending_saves", "save_lock", "released")

    def __init__(self, record: SessionRecord):
        self.record = record
        self.active_turn: str | None = None
        self.refs = 0  # sockets attached
        self.pending_saves = 0  # saves started and not finished
        self.save_lock = asyncio.Lock()
        self.released = False  # out of the registry for good: a later attach loads anew

    @classmethod
    def from_store(cls, record: SessionRecord) -> "LiveSession":
        """A session no socket holds, as stored. A stored history that ends with a user turn
        was saved by a server that died during that turn (every turn that ends is saved
        with its reply, or without its question): its client never got `done`, so the
        question is dropped, as for a turn that ends with no reply."""
        live = cls(record)
        live.end_turn("")
        return live

    # -- reading -------------------------------------------------------------------------
    @property
    def id(self) -> str:
        return self.record.session_id

    @property
    def owner(self) -> str | None:
        return self.record.owner

    @property
    def system(self) -> str | None:
        return self.record.system

    @property
    def params(self) -> dict:
        """The session's default params, as the client sent them (validated when set)."""
        return self.record.params

    @property
    def messages(self) -> tuple[dict, ...]:
        """The history, oldest first (a read-only view: edit through the methods below)."""
        return tuple(self.record.messages)

    @property
    def num_messages(self) -> int:
        return len(self.record.messages)

    @property
    def tools(self) -> dict:
        """A Realtime session's tools, tool_choice and parallel_tool_calls ({}: none
        set)."""
        return self.record.tools or {}

    def message(self, at: int) -> dict:
        """A copy of one message of the history."""
        return dict(self.record.messages[at])

    def chat_messages(self) -> list[dict]:
        """System prompt (if any) followed by copies of the history, for the chat template."""
        system = [{"role": "system", "content": self.system}] if self.system else []
        return system + [dict(m) for m in self.record.messages]

    # -- turns ---------------------------------------------------------------------------
    def begin_turn(self, turn_id: str, user_content: str | None = None) -> None:
        """Make `turn_id` the active turn; a chat turn's question joins the history."""
        if user_content is not None:
            self.record.messages.append({"role": "user", "content": user_content})
        self.active_turn = turn_id

    def end_turn(self, reply: str) -> None:
        """Close the active turn: the reply joins the history, or an empty one drops the
        user turn so the history never holds a question without its answer."""
        if reply:
            self.record.messages.append({"role": "assistant", "content": reply})
        elif self.record.messages and self.record.messages[-1]["role"] == "user":
            self.record.messages.pop()
        self.active_turn = None

    def release_turn(self, turn_id: str) -> None:
        """End `turn_id` if it is still the active turn, leaving the history as it is."""
        if self.active_turn == turn_id:
            self.active_turn = None

    # -- settings and history ------------------------------------------------------------
    def configure(self, system=_UNCHANGED, params=_UNCHANGED,
                  tools=_UNCHANGED) -> Callable[[], None]:
        """Set the system prompt ("" or None: none), the default params and/or the tools;
        returns the undo (for a change the store then refuses)."""
        before = (self.record.system, self.record.params, self.record.tools)
        if system is not _UNCHANGED:
            self.record.system = system or None
        if params is not _UNCHANGED:
            self.record.params = dict(params)
        if tools is not _UNCHANGED:
            self.record.tools = tools or None

        def undo() -> None:
            self.record.system, self.record.params, self.record.tools = before

        return undo

    def reset(self) -> None:
        """Clear the history (system prompt and params stay)."""
        self.record.messages.clear()

    def insert(self, at: int, message: dict) -> None:
        """Insert a copy of a chat message ({"role", "content"}, and a tool call's or
        output's keys: SessionRecord.messages)."""
        self.record.messages.insert(at, dict(message))

    def delete(self, at: int) -> None:
        del self.record.messages[at]

    def truncate(self, at: int, num_chars: int) -> None:
        """Cut one message's text to its first `num_chars` characters."""
        message = self.record.messages[at]
        message["content"] = message["content"][:num_chars]
