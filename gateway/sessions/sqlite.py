"""SqliteSessionStore: the embedded default store, one SQLite file (WAL) on local disk.

    sessions(session_id PK, updated_at, body, version, owner, bytes)
    index (updated_at):              expiry and the global eviction order
    index (owner, updated_at, bytes): one key's sessions in save order, with their sizes,
                                      counted and summed without reading a row

A save is one transaction: the compare-and-set on `version`, the write, the purge of
expired sessions, the saving key's own oldest beyond its quotas, then anyone's oldest
beyond max_sessions.

Every SQLite call runs on one dedicated thread that owns the only connection, so the
event loop never waits on disk and the connection is never shared between threads. Any
SQLite error (a corrupt file, a full disk, another process's lock held past timeout_s) is
a fault: the call raises SessionStoreUnavailableError and the connection is closed, so
the next call opens the file anew and the store recovers by itself once the file is
usable. A file replaced or written by someone else between calls (a restore from backup,
garbage) is seen by its stat and reopened too: an open connection would go on serving its
cached pages, or writing to a file that is no longer at the path. When it was replaced,
the -wal and -shm this store had open are the old file's, and are removed before the new
one is opened: SQLite would otherwise replay the old file's last commits onto it.

The file is created 0600 and the directories made for it 0700 (sqlite_file.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from gateway.sessions.sqlite_file import create_private, file_state, remove_if_same
from gateway.sessions.store import (
    NO_OWNER,
    Clock,
    SessionConflictError,
    SessionRecord,
    SessionStoreConfig,
    SessionStoreUnavailableError,
    decode_record,
    encode_record,
    owner_key,
)

T = TypeVar("T")
log = logging.getLogger(__name__)

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    updated_at REAL NOT NULL,
    body TEXT NOT NULL,
    version INTEGER NOT NULL DEFAULT 0,
    owner TEXT NOT NULL DEFAULT '{NO_OWNER}',
    bytes INTEGER NOT NULL DEFAULT 0
);
"""
# Columns a file written by an older tokenwire lacks; owner and bytes are filled in from
# each row's body.
_ADDED_COLUMNS = {"version": "INTEGER NOT NULL DEFAULT 0",
                  "owner": f"TEXT NOT NULL DEFAULT '{NO_OWNER}'",
                  "bytes": "INTEGER NOT NULL DEFAULT 0"}
_BACKFILL = (f"UPDATE sessions SET owner = coalesce(json_extract(body, '$.owner'), "
             f"'{NO_OWNER}'), bytes = length(CAST(body AS BLOB))")
_INDEXES = """
CREATE INDEX IF NOT EXISTS sessions_updated_at ON sessions (updated_at);
CREATE INDEX IF NOT EXISTS sessions_owner ON sessions (owner, updated_at, bytes);
"""
_UPSERT = ("INSERT INTO sessions (session_id, updated_at, body, version, owner, bytes) "
           "VALUES (:id, :now, :body, :version + 1, :owner, :bytes) "
           "ON CONFLICT(session_id) DO UPDATE SET updated_at = excluded.updated_at, "
           "body = excluded.body, version = excluded.version, owner = excluded.owner, "
           "bytes = excluded.bytes WHERE sessions.version <= :version")
# The key's sessions newest first (the one being saved before all): a row past the count
# quota, or whose running total of bytes is past the bytes quota, is one of the key's
# oldest, and goes.
_EVICT_OWN = """
DELETE FROM sessions WHERE session_id IN (
    SELECT session_id FROM (
        SELECT session_id, ROW_NUMBER() OVER newest AS n, SUM(bytes) OVER newest AS kept
        FROM sessions WHERE owner = :owner
        WINDOW newest AS (ORDER BY session_id = :id DESC, updated_at DESC, session_id DESC
                          ROWS UNBOUNDED PRECEDING))
    WHERE n > :max_count OR kept > :max_bytes)
"""
_EVICT_ANY = ("DELETE FROM sessions WHERE session_id IN (SELECT session_id FROM sessions "
              "WHERE session_id != ? ORDER BY updated_at, session_id LIMIT ?)")
_NO_LIMIT = 1 << 62  # a quota that is off


class SqliteSessionStore:
    """Sessions in one SQLite file (WAL), every call on a single dedicated thread.

    `shared` False: the file is this replica's, so a fault of it is this replica's alone.

    WAL with synchronous=NORMAL keeps every committed save across a crash of the
    process (kill -9); only a power loss may drop the last few commits. `limits` are
    SessionStoreConfig fields (ttl_s, max_sessions, timeout_s, ...).
    """

    shared = False

    def __init__(self, path: str | Path, *, clock: Clock = time.time, **limits):
        self.config = SessionStoreConfig("sqlite://" + str(path), **limits)
        self.path = Path(path)
        self.healthy = True  # False while the last call failed and no later one succeeded
        self._clock = clock
        # One worker thread owns the connection: SQLite calls are serialized and
        # never run on the event loop.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="session-store")
        self._conn: sqlite3.Connection | None = None
        self._file: tuple | None = None  # the file's stat after our last call
        self._sidecars: dict[Path, tuple] = {}  # -wal, -shm: (st_dev, st_ino) while open
        self._closed = False

    async def load(self, session_id: str) -> SessionRecord | None:
        return await self._run(self._load_sync, session_id)

    async def save(self, record: SessionRecord) -> None:
        # Encode on the loop so a too-large session fails before touching the thread.
        body, size = encode_record(record, self.config.max_bytes_per_session)
        row = {"id": record.session_id, "body": body, "bytes": size,
               "version": record.version, "owner": owner_key(record.owner)}
        record.updated_at = await self._run(self._save_sync, row)
        record.version += 1

    async def version(self, session_id: str) -> int | None:
        return await self._run(self._version_sync, session_id)

    async def delete(self, session_id: str) -> None:
        await self._run(self._delete_sync, session_id)

    async def count(self) -> int:
        """Number of stored sessions, expired ones included until they are purged."""
        return await self._run(self._count_sync)

    async def probe(self) -> None:
        """Open the file if need be, read it and take its write lock, then let go."""
        await self._run(self._probe_sync)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(self._executor, self._drop)
        self._executor.shutdown(wait=False)

    async def _run(self, fn: Callable[..., T], *args) -> T:
        if self._closed:
            raise RuntimeError("session store is closed")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._guarded, fn, *args)

    # -- on the store's thread ---------------------------------------------------------
    def _guarded(self, fn: Callable[..., T], *args) -> T:
        """fn(*args); any SQLite (or file) error closes the connection and is raised as
        store_unavailable. A conflict is an answer: the store works."""
        try:
            result = fn(*args)
        except SessionConflictError:
            self._answered()
            raise
        except (sqlite3.Error, OSError) as exc:
            self._drop()
            if self.healthy:
                log.warning("session store %s failed: %s; reopening it on the next call",
                            self.path, exc)
            self.healthy = False
            raise SessionStoreUnavailableError(
                self.config.retry_after_ms, f"{type(exc).__name__}: {exc}") from exc
        self._answered()
        return result

    def _answered(self) -> None:
        self._file = file_state(self.path)
        if self._conn is not None and not self._sidecars:
            names = (self.path.with_name(self.path.name + end) for end in ("-wal", "-shm"))
            self._sidecars = {name: state[:2] for name in names
                              if (state := file_state(name)) is not None}
        if not self.healthy:
            log.info("session store %s is back", self.path)
        self.healthy = True

    def _connection(self) -> sqlite3.Connection:
        state = file_state(self.path)
        if self._conn is not None and state != self._file:
            sidecars = self._sidecars
            self._drop()  # written by someone else since our last call
            if state is None or state[:2] != self._file[:2]:  # another file, or none
                remove_if_same(sidecars)
        if self._conn is None:
            self._conn = self._open()
        return self._conn

    def _open(self) -> sqlite3.Connection:
        create_private(self.path)
        conn = sqlite3.connect(self.path, isolation_level=None, timeout=self.config.timeout_s)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(sessions)")}
            for name in _ADDED_COLUMNS.keys() - columns:
                conn.execute(f"ALTER TABLE sessions ADD COLUMN {name} {_ADDED_COLUMNS[name]}")
            if "owner" not in columns:
                conn.execute(_BACKFILL)
            conn.executescript(_INDEXES)
        except BaseException:
            conn.close()
            raise
        return conn

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(sqlite3.Error):
                self._conn.close()
            self._conn = None
        self._sidecars = {}

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

    def _save_sync(self, row: dict) -> float:
        conn = self._connection()
        now = self._clock()
        with conn:  # one transaction: compare-and-set upsert, purge expired, evict
            conn.execute("BEGIN IMMEDIATE")
            if not conn.execute(_UPSERT, {**row, "now": now}).rowcount:
                stored = conn.execute("SELECT version FROM sessions WHERE session_id = ?",
                                      (row["id"],)).fetchone()[0]
                raise SessionConflictError(row["id"], row["version"], stored)
            conn.execute("DELETE FROM sessions WHERE updated_at < ?", (now - self.config.ttl_s,))
            self._evict(conn, row["id"], row["owner"])
        return now

    def _evict(self, conn: sqlite3.Connection, session_id: str, owner: str) -> None:
        """The key's own oldest beyond its quotas, then anyone's beyond max_sessions."""
        max_count = self.config.max_sessions_per_key or _NO_LIMIT
        max_bytes = self.config.max_bytes_per_key or _NO_LIMIT
        count, size = conn.execute("SELECT COUNT(*), TOTAL(bytes) FROM sessions "
                                   "WHERE owner = ?", (owner,)).fetchone()
        if count > max_count or size > max_bytes:
            conn.execute(_EVICT_OWN, {"owner": owner, "id": session_id,
                                      "max_count": max_count, "max_bytes": max_bytes})
        excess = conn.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] - \
            self.config.max_sessions
        if excess > 0:
            conn.execute(_EVICT_ANY, (session_id, excess))

    def _version_sync(self, session_id: str) -> int | None:
        row = self._connection().execute("SELECT updated_at, version FROM sessions "
                                         "WHERE session_id = ?", (session_id,)).fetchone()
        if row is None or row[0] < self._clock() - self.config.ttl_s:
            return None
        return row[1]

    def _delete_sync(self, session_id: str) -> None:
        self._connection().execute("DELETE FROM sessions WHERE session_id = ?", (session_id,))

    def _count_sync(self) -> int:
        return self._connection().execute("SELECT COUNT(*) FROM sessions").fetchone()[0]

    def _probe_sync(self) -> None:
        conn = self._connection()
        with conn:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("SELECT 1 FROM sessions LIMIT 1").fetchone()
