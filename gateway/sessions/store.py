"""The session store's interface: what a session needs to resume after a restart.

Three stores share one interface (`SessionStore`), chosen by URL (`--session-store`,
built by gateway/sessions/factory.py):

    memory:                 MemorySessionStore (here), this process only (tests)
    sqlite:///PATH          SqliteSessionStore (sqlite.py), the embedded default: one
                            file on local disk, survives a crash
    redis://HOST:PORT/DB    RedisSessionStore (redis.py), shared by replicas

All of them enforce the same limits: a TTL after the last save, a byte cap per session
(`SessionTooLargeError`), per-key quotas and a global cap on the number of sessions, and
the same rule for concurrent writers: every save carries the version it was loaded at,
and a save never replaces a newer version (`SessionConflictError`). A store that cannot
be reached or used (Redis down, a corrupt or full SQLite file) raises
`SessionStoreUnavailableError` within its timeout, and says so in `healthy` until a later
call succeeds.

Eviction, after each save, in this order (sessions without an owner, i.e. without auth,
count as one key):

    the saving key over max_sessions_per_key or max_bytes_per_key
        -> its own least recently saved sessions go (never another key's)
    all sessions over max_sessions
        -> the least recently saved go, whoever owns them
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

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
    # [{"role", "content"}, ...]; a Realtime tool call's message also has "tool_calls",
    # its output's is {"role": "tool", "tool_call_id", "content"} (chat completions' form)
    messages: list[dict] = field(default_factory=list)
    updated_at: float = 0.0  # set by the store's clock on every save
    version: int = 0  # the stored version this copy was loaded at; 0: never saved
    response: dict | None = None  # a stored Responses API response (responses/stored.py)
    tools: dict | None = None  # a Realtime session's tool fields (realtime/tools.py)
    model: str | None = None  # the model it talks to; None: the default (one model served)


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

    async def version(self, session_id: str) -> int | None:
        """The stored version of a live record (None: absent or expired), without reading
        its body: whether a copy saved earlier (at that version) is still the record."""
        ...

    async def delete(self, session_id: str) -> None: ...

    async def close(self) -> None: ...

    @property
    def healthy(self) -> bool:
        """False while the last call failed as unavailable and no later call succeeded."""
        ...

    shared: bool  # whether other replicas use the same store (Redis) or not (a file)

    async def probe(self) -> None:
        """One cheap call that updates `healthy` (raises SessionStoreUnavailableError)."""
        ...


DEFAULT_TTL_S = 7 * 24 * 3600.0
DEFAULT_MAX_SESSIONS = 10_000
DEFAULT_MAX_BYTES = 1 << 20
# One key may hold a tenth of the sessions and a quarter GiB (a quarter of the sessions
# at the byte cap each), so one busy key never fills the store for the others.
DEFAULT_MAX_SESSIONS_PER_KEY = 1_000
DEFAULT_MAX_BYTES_PER_KEY = 256 << 20
NO_OWNER = "none"  # the key of sessions made without auth (owners are sha256 hex)


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
    timeout_s: float = setting(1.0, "seconds one store call may take (Redis: connect, "
                               "command, pool; SQLite: waiting on another process's lock); "
                               "beyond it chat turns answer store_unavailable",
                               flag="--session-store-timeout")
    retry_after_ms: int = setting(1000, "retry_after_ms sent with store_unavailable",
                                  flag="--session-store-retry-after")
    max_connections: int = setting(64, "Redis connections per process; more callers wait",
                                   flag="--session-store-connections")
    max_sessions_per_key: int | None = setting(
        DEFAULT_MAX_SESSIONS_PER_KEY, "sessions one API key keeps (all sessions, without "
        "auth); beyond it that key's least recently saved go, never another key's")
    max_bytes_per_key: int | None = setting(
        DEFAULT_MAX_BYTES_PER_KEY, "serialized bytes of one API key's sessions (all "
        "sessions, without auth); beyond it that key's least recently saved go")

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
        for name in ("retry_after_ms", "max_connections", "max_sessions_per_key"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(name, f"must be >= 1, got {value}")
        if self.max_bytes_per_key is not None and \
                self.max_bytes_per_key < self.max_bytes_per_session:
            raise ConfigError("max_bytes_per_key", f"must be >= max_bytes_per_session "
                              f"({self.max_bytes_per_session}) or none, got "
                              f"{self.max_bytes_per_key}")

    @property
    def sqlite_path(self) -> str:
        """The file of a `sqlite://` URL: what follows the scheme, as in file:// URLs
        (sqlite:///var/lib/x.db is /var/lib/x.db, sqlite://x.db is x.db, relative)."""
        return self.url.removeprefix("sqlite://")


def encode_record(record: SessionRecord, limit: int) -> tuple[str, int]:
    """The record's body as compact JSON and its size in bytes (UTF-8), checked against
    the per-session byte cap; the size is what counts towards max_bytes_per_key."""
    fields = {"owner": record.owner, "system": record.system, "params": record.params,
              "messages": record.messages, **({"response": record.response}
                                              if record.response is not None else {}),
              **({"tools": record.tools} if record.tools is not None else {}),
              **({"model": record.model} if record.model is not None else {})}
    body = json.dumps(fields, ensure_ascii=False, separators=(",", ":"))
    size = len(body.encode("utf-8"))
    if size > limit:
        raise SessionTooLargeError(record.session_id, size, limit)
    return body, size


def owner_key(owner: str | None) -> str:
    """What the per-key quotas group sessions by: the owner, NO_OWNER without auth."""
    return NO_OWNER if owner is None else owner


def decode_record(session_id: str, body: str, updated_at: float, version: int) -> SessionRecord:
    data = json.loads(body)
    return SessionRecord(session_id, data["owner"], data["system"], data["params"],
                         data["messages"], updated_at, version, data.get("response"),
                         data.get("tools"), data.get("model"))


class _Row(NamedTuple):
    updated_at: float
    version: int
    body: str
    owner: str  # owner_key(record.owner)
    size: int


class MemorySessionStore:
    """Sessions in a dict, stored as JSON so callers never share mutable state with it."""

    healthy = True  # nothing here can fail
    shared = False

    def __init__(self, *, clock: Clock = time.time, **limits):
        self.config = SessionStoreConfig("memory:", **limits)
        self._clock = clock
        self._rows: dict[str, _Row] = {}  # in save order: the least recently saved first
        self._owned: dict[str, dict[str, None]] = {}  # owner key -> its ids in save order
        self._owned_bytes: dict[str, int] = {}

    async def load(self, session_id: str) -> SessionRecord | None:
        row = self._rows.get(session_id)
        if row is None:
            return None
        if row.updated_at < self._clock() - self.config.ttl_s:
            self._forget(session_id)
            return None
        return decode_record(session_id, row.body, row.updated_at, row.version)

    async def save(self, record: SessionRecord) -> None:
        body, size = encode_record(record, self.config.max_bytes_per_session)
        row = self._rows.get(record.session_id)
        if row is not None and row.version > record.version:
            raise SessionConflictError(record.session_id, record.version, row.version)
        self._forget(record.session_id)  # re-inserted last: dict order = save order
        owner = owner_key(record.owner)
        record.updated_at, record.version = self._clock(), record.version + 1
        self._rows[record.session_id] = _Row(record.updated_at, record.version, body,
                                             owner, size)
        self._owned.setdefault(owner, {})[record.session_id] = None
        self._owned_bytes[owner] = self._owned_bytes.get(owner, 0) + size
        while self._over_quota(owner):  # the one just saved is the key's newest
            self._forget(next(iter(self._owned[owner])))
        while len(self._rows) > self.config.max_sessions:
            self._forget(next(iter(self._rows)))

    async def version(self, session_id: str) -> int | None:
        row = self._rows.get(session_id)
        if row is None or row.updated_at < self._clock() - self.config.ttl_s:
            return None
        return row.version

    async def delete(self, session_id: str) -> None:
        self._forget(session_id)

    async def probe(self) -> None:
        pass

    async def close(self) -> None:
        self._rows.clear()
        self._owned.clear()
        self._owned_bytes.clear()

    def __len__(self) -> int:
        return len(self._rows)

    def _over_quota(self, owner: str) -> bool:
        max_count, max_bytes = self.config.max_sessions_per_key, self.config.max_bytes_per_key
        return (max_count is not None and len(self._owned[owner]) > max_count) or \
            (max_bytes is not None and self._owned_bytes[owner] > max_bytes)

    def _forget(self, session_id: str) -> None:
        row = self._rows.pop(session_id, None)
        if row is None:
            return
        owned = self._owned[row.owner]
        del owned[session_id]
        self._owned_bytes[row.owner] -= row.size
        if not owned:
            del self._owned[row.owner], self._owned_bytes[row.owner]
