"""The session store's interface: what a session needs to resume after a restart.

Three stores share one interface (`SessionStore`), chosen by URL (`--session-store`,
built by gateway/sessions/factory.py):

    memory:                 MemorySessionStore (here), this process only (tests)
    sqlite:///PATH          SqliteSessionStore (sqlite.py), the embedded default: one
                            file on local disk, survives a crash
    redis://HOST:PORT/DB    RedisSessionStore (redis.py), shared by replicas

All of them enforce the same limits: a TTL after the last save, a byte cap per session
(`SessionTooLargeError`) and a cap on the number of sessions (the least recently saved
are evicted first), and the same rule for concurrent writers: every save carries the
version it was loaded at, and a save never replaces a newer version
(`SessionConflictError`). A store that cannot be reached raises
`SessionStoreUnavailableError` within its timeout.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from common.errors import ConfigError
from common.settings import setting

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


class SessionStoreUnavailableError(ConnectionError):
    """The store did not answer within its timeout (Redis down, say); nothing is known to
    be saved. Clients retry after `retry_after_ms`; the store reconnects by itself."""

    code = "store_unavailable"

    def __init__(self, retry_after_ms: int, cause: str):
        super().__init__(f"the session store is unavailable ({cause}); chat turns and "
                         f"session changes are refused until it is back, retry later")
        self.retry_after_ms = retry_after_ms


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


SCHEMES = ("memory:", "sqlite://", "redis://", "rediss://")


@dataclass(frozen=True, slots=True)
class SessionStoreConfig:
    """Which store (`url`, see the module docstring) and its limits. The timeouts bound
    every call to a networked store (Redis); an unreachable one is reported to clients
    as `store_unavailable` with `retry_after_ms`."""

    url: str = setting("memory:", "memory:, sqlite:///PATH or redis://HOST:PORT/DB "
                       "(tokenwire serve: sqlite:///STATE_DIR/sessions.db)",
                       flag="--session-store", metavar="URL")
    ttl_s: float = setting(DEFAULT_TTL_S, "seconds a session lives after its last save",
                           flag="--session-ttl")
    max_sessions: int = setting(DEFAULT_MAX_SESSIONS, "sessions kept; beyond it the least "
                                "recently saved go")
    max_bytes_per_session: int = setting(DEFAULT_MAX_BYTES, "largest serialized session; a "
                                         "turn beyond it answers too_large",
                                         flag="--max-session-bytes")
    timeout_s: float = setting(1.0, "seconds one Redis call (connect, command, pool) may "
                               "take; beyond it chat turns answer store_unavailable",
                               flag="--session-store-timeout")
    retry_after_ms: int = setting(1000, "retry_after_ms sent with store_unavailable",
                                  flag="--session-store-retry-after")
    max_connections: int = setting(64, "Redis connections per process; more callers wait",
                                   flag="--session-store-connections")

    def __post_init__(self) -> None:
        bare = self.url.rstrip("/") in ("sqlite:", "redis:", "rediss:")  # no path or host
        if not self.url.startswith(SCHEMES) or bare:
            raise ConfigError("url", f"must be memory:, sqlite:///PATH or "
                              f"redis://HOST:PORT/DB, got {self.url!r}")
        if self.ttl_s <= 0:
            raise ConfigError("ttl_s", f"must be > 0, got {self.ttl_s}")
        if self.max_sessions < 1:
            raise ConfigError("max_sessions", f"must be >= 1, got {self.max_sessions}")
        if self.max_bytes_per_session < 64:
            raise ConfigError("max_bytes_per_session",
                              f"must be >= 64, got {self.max_bytes_per_session}")
        if not self.timeout_s > 0:
            raise ConfigError("timeout_s", f"must be > 0, got {self.timeout_s}")
        for name in ("retry_after_ms", "max_connections"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")

    @property
    def sqlite_path(self) -> str:
        """The file of a `sqlite://` URL: what follows the scheme, as in file:// URLs
        (sqlite:///var/lib/x.db is /var/lib/x.db, sqlite://x.db is x.db, relative)."""
        return self.url.removeprefix("sqlite://")


def encode_record(record: SessionRecord, limit: int) -> str:
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


def decode_record(session_id: str, body: str, updated_at: float, version: int) -> SessionRecord:
    data = json.loads(body)
    return SessionRecord(session_id, data["owner"], data["system"], data["params"],
                         data["messages"], updated_at, version)


class MemorySessionStore:
    """Sessions in a dict, stored as JSON so callers never share mutable state with it."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S,
                 max_sessions: int = DEFAULT_MAX_SESSIONS,
                 max_bytes_per_session: int = DEFAULT_MAX_BYTES,
                 *, clock: Clock = time.time):
        self.config = SessionStoreConfig("memory:", ttl_s, max_sessions, max_bytes_per_session)
        self._clock = clock
        self._rows: dict[str, tuple[float, int, str]] = {}  # id -> (updated_at, version, body)

    async def load(self, session_id: str) -> SessionRecord | None:
        row = self._rows.get(session_id)
        if row is None:
            return None
        if row[0] < self._clock() - self.config.ttl_s:
            del self._rows[session_id]
            return None
        return decode_record(session_id, row[2], row[0], row[1])

    async def save(self, record: SessionRecord) -> None:
        body = encode_record(record, self.config.max_bytes_per_session)
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
