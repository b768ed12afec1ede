"""SqliteSessionStore: the embedded default store, one SQLite file (WAL) on local disk.

Every SQLite call runs on one dedicated thread that owns the only connection, so the
event loop never waits on disk and the connection is never shared between threads. The
file's directory is created on first use.
"""
from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from gateway.sessions.store import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_TTL_S,
    Clock,
    SessionConflictError,
    SessionRecord,
    SessionStoreConfig,
    decode_record,
    encode_record,
)

T = TypeVar("T")

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
        self.config = SessionStoreConfig("sqlite://" + str(path), ttl_s, max_sessions,
                                         max_bytes_per_session)
        self.path = Path(path)
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
        body = encode_record(record, self.config.max_bytes_per_session)
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
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, isolation_level=None)
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
        return decode_record(session_id, row[1], row[0], row[2])

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
