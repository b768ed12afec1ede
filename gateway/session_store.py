"""Persistent chat sessions: what a WebSocket session needs to resume after a restart.

Two stores share one interface (`SessionStore`): `MemorySessionStore` for tests and
single-process use without persistence, and `SqliteSessionStore`, the embedded default,
which survives a crash of the server (SQLite in WAL mode, one file on local disk).

Every SQLite call runs on one dedicated thread that owns the only connection, so the
event loop never waits on disk and the connection is never shared between threads.
Both stores enforce the same limits: a TTL after the last save, a byte cap per
session (`SessionTooLargeError`) and a cap on the number of sessions (the least
recently saved are evicted first), and the same rule for concurrent writers: every
save carries the version it was loaded at, and a save never replaces a newer version
(`SessionConflictError`).
"""
from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from engine.errors import ConfigError

T = TypeVar("T")
Clock = Callable[[], float]


class SessionConflictError(RuntimeError):
    """The stored session is newer than the copy being saved; nothing was saved."""

    code = "busy"

    def __init__(self, session_id: str, expected: int, stored: int):
        super().__init__(
            f"session {session_id} was saved elsewhere since it was loaded (version "
            f"{stored}, this copy has {expected}); reconnect to resume it")
        self.session_id = session_id
        self.expected = expected
        self.stored = stored


class SessionTooLargeError(ValueError):
    """A session's serialized size is over `max_bytes_per_session`; nothing was saved."""

    code = "too_large"

    def __init__(self, session_id: str, size: int, limit: int):
        super().__init__(
            f"session {session_id} would take {size} bytes, over the limit of {limit} "
            f"bytes per session (max_bytes_per_session); reset the session or start a new one"
        )
        self.session_id = session_id
        self.size = size
        self.limit = limit


@dataclass
class SessionRecord:
    """One chat session as stored: who owns it, its settings and its finished turns."""

    session_id: str
    owner: str | None  # sha256 hex of the API key that made it; None without auth
    system: str | None
    params: dict = field(default_factory=dict)  # the session's default params
    messages: list[dict] = field(default_factory=list)  # [{"role", "content"}, ...]
    updated_at: float = 0.0  # set by the store's clock on every save
    version: int = 0  # the stored version this copy was loaded at; 0: never saved


class SessionStore(Protocol):
    """Where the gateway keeps sessions between sockets and across restarts.

    `save` is a compare-and-set on the version, atomic in the store (a transaction in
    SQLite; WATCH/MULTI or a script in Redis): it writes the record only if no newer
    version than `record.version` is stored, and then sets `record.version` to the new
    stored version (one more) and `record.updated_at`. Otherwise it raises
    `SessionConflictError` and changes nothing, so two processes (or two copies in one)
    that loaded the same version can never overwrite each other's turns.
    """

    async def load(self, session_id: str) -> SessionRecord | None: ...

    async def save(self, record: SessionRecord) -> None: ...

    async def delete(self, session_id: str) -> None: ...

    async def close(self) -> None: ...


DEFAULT_TTL_S = 7 * 24 * 3600.0
DEFAULT_MAX_SESSIONS = 10_000
DEFAULT_MAX_BYTES = 1 << 20


@dataclass(frozen=True, slots=True)
class SessionStoreConfig:
    """Limits of a session store; `path` is only used by the SQLite store."""

    path: str | None = None
    ttl_s: float = DEFAULT_TTL_S  # a session expires this long after its last save
    max_sessions: int = DEFAULT_MAX_SESSIONS  # beyond this, the least recently saved go
    max_bytes_per_session: int = DEFAULT_MAX_BYTES  # serialized JSON size of one session

    def __post_init__(self) -> None:
        if self.ttl_s <= 0:
            raise ConfigError("ttl_s", f"must be > 0, got {self.ttl_s}")
        if self.max_sessions < 1:
            raise ConfigError("max_sessions", f"must be >= 1, got {self.max_sessions}")
        if self.max_bytes_per_session < 64:
            raise ConfigError("max_bytes_per_session",
                              f"must be >= 64, got {self.max_bytes_per_session}")


def _encode(record: SessionRecord, limit: int) -> str:
    """The record's body as compact JSON, checked against the per-session byte cap."""
    body = json.dumps(
        {"owner": record.owner, "system": record.system, "params": record.params,
         "messages": record.messages},
        ensure_ascii=False, separators=(",", ":"),
    )
    size = len(body.encode("utf-8"))
    if size > limit:
        raise SessionTooLargeError(record.session_id, size, limit)
    return body


def _decode(session_id: str, body: str, updated_at: float, version: int) -> SessionRecord:
    data = json.loads(body)
    return SessionRecord(session_id, data["owner"], data["system"], data["params"],
                         data["messages"], updated_at, version)


class MemorySessionStore:
    """Sessions in a dict, stored as JSON so callers never share mutable state with it."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S,
                 max_sessions: int = DEFAULT_MAX_SESSIONS,
                 max_bytes_per_session: int = DEFAULT_MAX_BYTES,
                 *, clock: Clock = time.time):
        self.config = SessionStoreConfig(None, ttl_s, max_sessions, max_bytes_per_session)
        self._clock = clock
        self._rows: dict[str, tuple[float, int, str]] = {}  # id -> (updated_at, version, body)

    async def load(self, session_id: str) -> SessionRecord | None:
        row = self._rows.get(session_id)
        if row is None:
            return None
        if row[0] < self._clock() - self.config.ttl_s:
            del self._rows[session_id]
            return None
        return _decode(session_id, row[2], row[0], row[1])

    async def save(self, record: SessionRecord) -> None:
        body = _encode(record, self.config.max_bytes_per_session)
        row = self._rows.get(record.session_id)
        if row is not None and row[1] > record.version:
            raise SessionConflictError(record.session_id, record.version, row[1])
        self._rows.pop(record.session_id, None)  # re-insert: dict order = save order
        record.updated_at, record.version = self._clock(), record.version + 1
        self._rows[record.session_id] = (record.updated_at, record.version, body)
        while len(self._rows) > self.config.max_sessions:
            del self._rows[next(iter(self._rows))]

    async def delete(self, session_id: str) -> None:
        self._rows.pop(session_id, None)

    async def close(self) -> None:
        self._rows.clear()

    def __len__(self) -> int:
        return len(self._rows)


_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    updated_at REAL NOT NULL,
    body TEXT NOT NULL,
    version INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS sessions_updated_at ON sessions (updated_at);
"""


class SqliteSessionStore:
    """Sessions in one SQLite file (WAL), every call on a single dedicated thread.

    WAL with synchronous=NORMAL keeps every committed save across a crash of the
    process (kill -9); only a power loss may drop the last few commits.
    """

    def __init__(self, path: str, ttl_s: float = DEFAULT_TTL_S,
                 max_sessions: int = DEFAULT_MAX_SESSIONS,
                 max_bytes_per_session: int = DEFAULT_MAX_BYTES,
                 *, clock: Clock = time.time):
        self.config = SessionStoreConfig(str(path), ttl_s, max_sessions, max_bytes_per_session)
        self._clock = clock
        # One worker thread owns the connection: SQLite calls are serialized and
        # never run on the event loop.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="session-store")
        self._conn: sqlite3.Connection | None = None
        self._closed = False

    async def load(self, session_id: str) -> SessionRecord | None:
        return await self._run(self._load_sync, session_id)

    async def save(self, record: SessionRecord) -> None:
        # Encode on the loop so a too-large session fails before touching the thread.
        body = _encode(record, self.config.max_bytes_per_session)
        record.updated_at = await self._run(self._save_sync, record.session_id, body,
                                            record.version)
        record.version += 1

    async def delete(self, session_id: str) -> None:
        await self._run(self._delete_sync, session_id)

    async def count(self) -> int:
        """Number of stored sessions, expired ones included until they are purged."""
        return await self._run(self._count_sync)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._executor, self._close_sync)
        self._executor.shutdown(wait=False)

    async def _run(self, fn: Callable[..., T], *args) -> T:
        if self._closed:
            raise RuntimeError("session store is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            conn = sqlite3.connect(self.config.path, isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=5000")
            conn.executescript(_SCHEMA)
            columns = [row[1] for row in conn.execute("PRAGMA table_info(sessions)")]
            if "version" not in columns:  # a file written before sessions had versions
                conn.execute("ALTER TABLE sessions ADD COLUMN version INTEGER NOT NULL DEFAULT 0")
            self._conn = conn
        return self._conn

    def _load_sync(self, session_id: str) -> SessionRecord | None:
        conn = self._connection()
        row = conn.execute("SELECT updated_at, body, version FROM sessions WHERE session_id = ?",
                           (session_id,)).fetchone()
        if row is None:
            return None
        if row[0] < self._clock() - self.config.ttl_s:
            conn.execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))
            return None
        return _decode(session_id, row[1], row[0], row[2])

    def _save_sync(self, session_id: str, body: str, version: int) -> float:
        conn = self._connection()
        now = self._clock()
        with conn:  # one transaction: compare-and-set upsert, purge expired, evict
            conn.execute("BEGIN IMMEDIATE")
            written = conn.execute(
                "INSERT INTO sessions (session_id, updated_at, body, version) "
                "VALUES (?, ?, ?, ?) ON CONFLICT(session_id) DO UPDATE SET "
                "updated_at = excluded.updated_at, body = excluded.body, "
                "version = excluded.version WHERE sessions.version <= ?",
                (session_id, now, body, version + 1, version)).rowcount
            if not written:
                stored = conn.execute("SELECT version FROM sessions WHERE session_id = ?",
                                      (session_id,)).fetchone()[0]
                raise SessionConflictError(session_id, version, stored)
            conn.execute("DELETE FROM sessions WHERE updated_at < ?", (now - self.config.ttl_s,))
            excess = self._count_sync() - self.config.max_sessions
            if excess > 0:
                conn.execute(
                    "DELETE FROM sessions WHERE session_id IN (SELECT session_id FROM sessions "
                    "WHERE session_id != ? ORDER BY updated_at ASC LIMIT ?)", (session_id, excess))
        return now

    def _delete_sync(self, session_id: str) -> None:
        self._connection().execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))

    def _count_sync(self) -> int:
        return self._connection().execute("SELECT COUNT(*) FROM sessions").fetchone()[0]

    def _close_sync(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def make_session_store(config: SessionStoreConfig, *, clock: Clock = time.time) -> SessionStore:
    """The store a config asks for: SQLite at `config.path`, else in memory."""
    limits = (config.ttl_s, config.max_sessions, config.max_bytes_per_session)
    if config.path is None:
        return MemorySessionStore(*limits, clock=clock)
    return SqliteSessionStore(config.path, *limits, clock=clock)
