"""RedisSessionStore: sessions shared by every replica, in one Redis database.

    tokenwire:session:<id>   hash {version, updated_at, body}, expires ttl_s after its save
    tokenwire:sessions       sorted set <id> -> updated_at: the eviction and expiry order

A save is one Lua script, so Redis runs it atomically: the compare-and-set on `version`
(the rule of SessionStore), the write, the key's expiry, then the purge of expired ids
and the eviction of the least recently saved beyond max_sessions. Expiry is judged by
the store's clock on load, as SQLite does, and Redis also expires the key by itself.

Every call is bounded by `timeout_s` (connect, command, and the wait for a pooled
connection); a call that fails or times out raises SessionStoreUnavailableError and is
never retried here (a save that timed out may have landed: the version check turns a
blind retry into a conflict, never into a lost turn). The client reconnects on the next
call, so the store recovers by itself when Redis is back.
"""
from __future__ import annotations

import asyncio
import time

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from gateway.sessions.store import (
    Clock,
    SessionConflictError,
    SessionRecord,
    SessionStoreConfig,
    SessionStoreUnavailableError,
    decode_record,
    encode_record,
)

PREFIX = "tokenwire:"
# KEYS: session key, index. ARGV: expected version, body, now, ttl_s, max_sessions, id,
# key prefix. Returns {1, new version} or {0, stored version}. At most PURGE_BATCH
# expired ids are purged per save, so one save never does unbounded work.
_SAVE = """
local stored = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
local expected = tonumber(ARGV[1])
if stored > expected then return {0, stored} end
local now, ttl, id = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[6]
redis.call('HSET', KEYS[1], 'version', expected + 1, 'updated_at', ARGV[3], 'body', ARGV[2])
redis.call('PEXPIRE', KEYS[1], math.ceil(ttl * 1000))
redis.call('ZADD', KEYS[2], now, id)
local expired = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. (now - ttl), 'LIMIT', 0, 100)
for _, old in ipairs(expired) do
  redis.call('DEL', ARGV[7] .. old)
  redis.call('ZREM', KEYS[2], old)
end
local excess = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[5])
if excess > 0 then
  for _, old in ipairs(redis.call('ZRANGE', KEYS[2], 0, excess)) do
    if excess > 0 and old ~= id then
      redis.call('DEL', ARGV[7] .. old)
      redis.call('ZREM', KEYS[2], old)
      excess = excess - 1
    end
  end
end
return {1, expected + 1}
"""


class RedisSessionStore:
    """The SessionStore of `config.url` (redis:// or rediss://), asyncio all the way."""

    def __init__(self, config: SessionStoreConfig, *, clock: Clock = time.time):
        self.config = config
        self._clock = clock
        pool = aioredis.BlockingConnectionPool.from_url(
            config.url, max_connections=config.max_connections, timeout=config.timeout_s,
            socket_timeout=config.timeout_s, socket_connect_timeout=config.timeout_s,
            retry=Retry(NoBackoff(), 0), decode_responses=True)
        self._redis = aioredis.Redis(connection_pool=pool)
        self._save_script = self._redis.register_script(_SAVE)
        self._session_prefix = PREFIX + "session:"
        self._index = PREFIX + "sessions"

    async def load(self, session_id: str) -> SessionRecord | None:
        key = self._session_prefix + session_id
        version, updated_at, body = await self._call(
            self._redis.hmget(key, "version", "updated_at", "body"))
        if body is None:
            return None
        if float(updated_at) < self._clock() - self.config.ttl_s:
            await self.delete(session_id)
            return None
        return decode_record(session_id, body, float(updated_at), int(version))

    async def save(self, record: SessionRecord) -> None:
        body = encode_record(record, self.config.max_bytes_per_session)
        now = self._clock()
        saved, version = await self._call(self._save_script(
            keys=[self._session_prefix + record.session_id, self._index],
            args=[record.version, body, repr(now), self.config.ttl_s,
                  self.config.max_sessions, record.session_id, self._session_prefix]))
        if not saved:
            raise SessionConflictError(record.session_id, record.version, int(version))
        record.updated_at, record.version = now, int(version)

    async def delete(self, session_id: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(self._session_prefix + session_id).zrem(self._index, session_id)
            await self._call(pipe.execute())

    async def count(self) -> int:
        """Number of indexed sessions, expired ones included until they are purged."""
        return await self._call(self._redis.zcard(self._index))

    async def close(self) -> None:
        await self._redis.aclose()
        await self._redis.connection_pool.disconnect()

    async def _call(self, awaitable):
        """Await one Redis call within timeout_s; any failure is 'unavailable'."""
        try:
            async with asyncio.timeout(self.config.timeout_s):
                return await awaitable
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            raise SessionStoreUnavailableError(
                self.config.retry_after_ms, f"{type(exc).__name__}: {exc}") from exc
