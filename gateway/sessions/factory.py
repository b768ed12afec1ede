"""make_session_store: the store a SessionStoreConfig's URL names."""
from __future__ import annotations

import time

from gateway.sessions.store import MemorySessionStore
from gateway.sessions.sqlite import SqliteSessionStore
from gateway.sessions.store import Clock, SessionStore, SessionStoreConfig


def make_session_store(config: SessionStoreConfig, *, clock: Clock = time.time) -> SessionStore:
    """The store `config.url` names."""
    limits = (config.ttl_s, config.max_sessions, config.max_bytes_per_session)
    if config.url.startswith("sqlite://"):
        return SqliteSessionStore(config.sqlite_path, *limits, clock=clock)
    if config.url.startswith(("redis://", "rediss://")):
        from gateway.sessions.redis import RedisSessionStore  # imports redis: only when used

        return RedisSessionStore(config, clock=clock)
    return MemorySessionStore(*limits, clock=clock)
