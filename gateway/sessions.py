"""Sessions' wire side: live sessions shared by the sockets attached to them.

A session's record (history, system prompt, default params) lives in the SessionStore;
while any socket is attached, one LiveSession object holds it in memory so that two
sockets resuming the same id see one history and one active chat turn.
"""
from __future__ import annotations

import logging
import secrets
import time

from gateway.session_store import SessionRecord, SessionStore, SessionTooLargeError

log = logging.getLogger(__name__)

MAX_SESSION_ID_CHARS = 64


class LiveSession:
    """A session attached to at least one socket; `active_turn` is its running chat id."""

    __slots__ = ("record", "active_turn", "refs")

    def __init__(self, record: SessionRecord):
        self.record = record
        self.active_turn: str | None = None
        self.refs = 0

    @property
    def id(self) -> str:
        return self.record.session_id

    def chat_messages(self) -> list[dict]:
        """System prompt (if any) followed by the history, ready for the chat template."""
        system = [{"role": "system", "content": self.record.system}] if self.record.system else []
        return system + self.record.messages

    @classmethod
    def from_store(cls, record: SessionRecord) -> "LiveSession":
        """A session no socket holds, as stored. A stored history that ends with a user turn
        was saved by a server that died during that turn (every turn that ends is saved
        with its reply, or without its question): its client never got `done`, so the
        question is dropped, as for a turn that ends with no reply."""
        live = cls(record)
        live.end_turn("")
        return live

    def end_turn(self, reply: str) -> None:
        """Close the active turn: the reply joins the history, or an empty one drops the
        user turn so the history never holds a question without its answer."""
        if reply:
            self.record.messages.append({"role": "assistant", "content": reply})
        elif self.record.messages and self.record.messages[-1]["role"] == "user":
            self.record.messages.pop()
        self.active_turn = None


class SessionRegistry:
    """Attaches sockets to sessions, loading from and saving to the store."""

    def __init__(self, store: SessionStore):
        self.store = store
        self._live: dict[str, LiveSession] = {}

    def __len__(self) -> int:
        return len(self._live)

    async def attach(self, session_id: str | None, owner: str | None) -> tuple[LiveSession, bool]:
        """The session to use and whether it was resumed. An unknown id, or one that
        belongs to another key, gets a fresh session (the answer reveals nothing)."""
        live = await self._find(session_id, owner) if session_id else None
        resumed = live is not None
        if live is None:
            record = SessionRecord(new_session_id(), owner, None, {}, [], time.time())
            live = LiveSession(record)
        self._live[live.id] = live
        live.refs += 1
        return live, resumed

    async def _find(self, session_id: str, owner: str | None) -> LiveSession | None:
        if len(session_id) > MAX_SESSION_ID_CHARS:
            return None
        live = self._live.get(session_id)
        if live is None:
            record = await self.store.load(session_id)
            live = LiveSession.from_store(record) if record is not None else None
        if live is None or live.record.owner != owner:
            return None
        return live

    def detach(self, live: LiveSession) -> None:
        live.refs -= 1
        if live.refs <= 0 and self._live.get(live.id) is live:
            del self._live[live.id]

    async def save(self, live: LiveSession) -> str | None:
        """Persist the session; returns an error message when it is too large to store."""
        try:
            await self.store.save(live.record)
        except SessionTooLargeError as exc:
            return str(exc)
        return None


def new_session_id() -> str:
    """128 random bits, URL-safe: unguessable, so an id is as good as a capability."""
    return secrets.token_urlsafe(16)
