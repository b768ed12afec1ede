"""SessionRegistry: the live sessions shared by the sockets attached to them.

A session's record (history, system prompt, default params) lives in the SessionStore;
while any socket is attached, one LiveSession object holds it in memory so that sockets
resuming the same id see one history and one active turn:

    attach(id): in _live .......................... share it (refs += 1)
                else, a load of id in flight ........ await it, share its result
                else ................................ start the one load of id
    detach:     refs -= 1; with no socket and no save pending the session leaves _live,
                the store holding its last state, which is what the next attach loads

Saves of one session run one at a time, each a compare-and-set on the stored version,
so a stale copy (another process's, say) can never overwrite newer turns.

`healthy` is False while the store's last call failed: /ready then answers 503. Asking
starts one probe of the store, so a replica taken out of rotation (no client calls its
store any more) still sees the store come back.
"""
from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Callable

from gateway.sessions.live import LiveSession
from gateway.sessions.store import (
    SessionConflictError,
    SessionRecord,
    SessionStore,
    SessionStoreUnavailableError,
    SessionTooLargeError,
)

log = logging.getLogger(__name__)

MAX_SESSION_ID_CHARS = 64
# What a save may end with, answered to the client as an error.
SaveError = SessionTooLargeError | SessionConflictError | SessionStoreUnavailableError


class SessionRegistry:
    """Attaches sockets to sessions, loading from and saving to the store."""

    def __init__(self, store: SessionStore):
        self.store = store
        self._live: dict[str, LiveSession] = {}
        self._loading: dict[str, asyncio.Future[LiveSession | None]] = {}
        self._probe: asyncio.Future | None = None
        self.on_saved: Callable[[LiveSession], None] | None = None  # after each stored save

    def __len__(self) -> int:
        return len(self._live)

    @property
    def healthy(self) -> bool:
        """Whether the store's last call succeeded; when not, one probe of the store is
        started (none while one is under way), whose answer the next ask sees."""
        healthy = self.store.healthy
        if not healthy and self._probe is None:
            self._probe = asyncio.ensure_future(self._probe_store())
        return healthy

    @property
    def blocks_readiness(self) -> bool:
        """Whether the store's fault should take this replica out of rotation: only when the
        store is its own (a SQLite file), which other replicas can do without. A shared
        store (Redis) that is down is down for every replica alike; taking them all out
        would also stop what needs no store (generate, the HTTP API)."""
        return not self.healthy and not self.store.shared

    async def _probe_store(self) -> None:
        try:
            await self.store.probe()
        except (SessionStoreUnavailableError, RuntimeError):  # still down, or closed
            pass
        finally:
            self._probe = None

    async def attach(self, session_id: str | None, owner: str | None) -> tuple[LiveSession, bool]:
        """The session to use and whether it was resumed. An unknown id, or one that
        belongs to another key, gets a fresh session (the answer reveals nothing)."""
        live = await self._find(session_id, owner) if session_id else None
        resumed = live is not None
        if live is None:
            record = SessionRecord(new_session_id(), owner, None, {}, [], time.time())
            live = LiveSession(record)
            self._live[live.id] = live
        live.refs += 1  # no await since _find: the session cannot be released in between
        return live, resumed

    async def _find(self, session_id: str, owner: str | None) -> LiveSession | None:
        if len(session_id) > MAX_SESSION_ID_CHARS:
            return None
        live = self._live.get(session_id)
        while live is None:
            loaded = await self._load_shared(session_id)
            # A stored response shares the store, never a socket's session.
            if loaded is None or loaded.record.owner != owner or \
                    loaded.record.response is not None:
                return None
            if not loaded.released:  # else its last save is stored: load that
                live = self._live.setdefault(session_id, loaded)
        return live if live.record.owner == owner else None

    async def _load_shared(self, session_id: str) -> LiveSession | None:
        """One store load per id at a time: every socket asking meanwhile gets its result
        (shielded, so one caller's cancellation does not cancel the others' load)."""
        pending = self._loading.get(session_id)
        if pending is None:
            pending = asyncio.ensure_future(self._load(session_id))
            self._loading[session_id] = pending
            pending.add_done_callback(lambda _: self._loading.pop(session_id, None))
        return await asyncio.shield(pending)

    async def _load(self, session_id: str) -> LiveSession | None:
        record = await self.store.load(session_id)
        return LiveSession.from_store(record) if record is not None else None

    def detach(self, live: LiveSession) -> None:
        live.refs -= 1
        self._release_if_idle(live)

    def _release_if_idle(self, live: LiveSession) -> None:
        if live.refs <= 0 and live.pending_saves == 0 and self._live.get(live.id) is live:
            del self._live[live.id]
            live.released = True

    async def save(self, live: LiveSession) -> SaveError | None:
        """Persist the session; returns the error when the store refused it. The save runs
        to its end even if the caller is cancelled: the record's version must follow
        what the store holds."""
        live.pending_saves += 1
        return await asyncio.shield(asyncio.ensure_future(self._save(live)))

    async def _save(self, live: LiveSession) -> SaveError | None:
        try:
            async with live.save_lock:  # one at a time: each expects the last one's version
                await self.store.save(live.record)
            if self.on_saved is not None:
                self.on_saved(live)
        except SessionTooLargeError as exc:
            return exc
        except SessionStoreUnavailableError as exc:
            # The record keeps its version and its new turns: the next save that reaches
            # the store writes them all, or another replica's newer copy wins.
            log.warning("session save failed: %s", exc.__cause__ or exc)
            return exc
        except SessionConflictError as exc:
            # Not the id: session ids are capabilities and stay out of the log.
            log.warning("session save refused: version %d is stored, this copy has %d",
                        exc.stored, exc.expected)
            if self._live.get(live.id) is live:  # stale: later sockets load the newer one
                del self._live[live.id]
            live.released = True
            return exc
        finally:
            live.pending_saves -= 1
            self._release_if_idle(live)
        return None


def new_session_id() -> str:
    """128 random bits, URL-safe: unguessable, so an id is as good as a capability."""
    return secrets.token_urlsafe(16)
