"""make_session_store: the store a SessionStoreConfig's URL names."""
from __future__ import annotations

import dataclasses
import time

from gateway.sessions.sqlite import SqliteSessionStore
from gateway.sessions.store import (
    Clock,
    MemorySessionStore,
    SessionStore,
    SessionStoreConfig,
)


def make_session_store(config: SessionStoreConfig, *, clock: Clock = time.time) -> SessionStore:
    """The store `config.url` names."""
    if config.url.startswith(("redis://", "rediss://")):
        from gateway.sessions.redis import RedisSessionStore  # imports redis: when used

        return RedisSessionStore(config, clock=clock)
    limits = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
              if f.name != "url"}
    if config.url.startswith("sqlite://"):
        return SqliteSessionStore(config.sqlite_path, clock=clock, **limits)
    return MemorySessionStore(clock=clock, **limits)
