"""RedisSessionStore: sessions shared by every replica, in one Redis database.

    tokenwire:session:<id>   hash {version, updated_at, body}, expires ttl_s after its save
    tokenwire:sessions       sorted set <id> -> updated_at: the eviction and expiry order
    tokenwire:owner:<key>    sorted set <id> -> updated_at: one key's sessions, same order
    tokenwire:session_owner  hash <id> -> its key (sha256 of the API key, or "none")
    tokenwire:session_bytes  hash <id> -> the size of its body
    tokenwire:owner_bytes    hash <key> -> the sizes of the key's sessions, summed

A save is one Lua script, so Redis runs it atomically: the compare-and-set on `version`
(the rule of SessionStore), the write, the key's expiry, then the purge of expired ids,
the eviction of the saving key's own least recently saved beyond its quotas, and of
anyone's least recently saved beyond max_sessions. A delete is one script too, so the
indexes and sums never disagree with the sessions. Expiry is judged by the store's clock
on load, as SQLite does, and Redis also expires the session's key by itself (its index
entries go with the purge).

Every call is bounded by `timeout_s` (connect, command, and the wait for a pooled
connection); a call that fails or times out raises SessionStoreUnavailableError and is
never retried here (a save that timed out may have landed: the version check turns a
blind retry into a conflict, never into a lost turn). The client reconnects on the next
call, so the store recovers by itself when Redis is back.
"""
from __future__ import annotations

import asyncio
import logging
import time

import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry

from gateway.sessions.store import (Clock, SessionConflictError, SessionRecord,
                                    SessionStoreConfig, SessionStoreUnavailableError,
                                    decode_record, encode_record, owner_key)

log = logging.getLogger(__name__)
PREFIX = "tokenwire:"
# KEYS: index, session_owner, session_bytes, owner_bytes.
# ARGV[1], ARGV[2]: the session and owner key prefixes; the scripts' own ARGV follow.
# `forget` removes one session and its entries everywhere (the owner unknown for a
# session saved before owners were indexed: it counts towards no key).
_FORGET = """
local index, owners, sizes, totals = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local sessions, owned = ARGV[1], ARGV[2]
local function forget(id)
  local key = redis.call('HGET', owners, id)
  if key then
    redis.call('ZREM', owned .. key, id)
    redis.call('HINCRBY', totals, key, -tonumber(redis.call('HGET', sizes, id) or '0'))
  end
  redis.call('DEL', sessions .. id)
  redis.call('ZREM', index, id)
  redis.call('HDEL', owners, id)
  redis.call('HDEL', sizes, id)
end
"""
_DELETE = _FORGET + "forget(ARGV[3])\n"
# ARGV[3..]: id, expected version, body, now, ttl_s, owner key, max_sessions,
# max_sessions_per_key, max_bytes_per_key ("none": off). Returns {1, new version} or
# {0, stored version}. At most 100 expired ids are purged per save, so one save never
# does unbounded work.
_SAVE = _FORGET + """
local id, expected, body = ARGV[3], tonumber(ARGV[4]), ARGV[5]
local now, ttl, key = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
local max_sessions, max_count, max_bytes = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local stored = tonumber(redis.call('HGET', sessions .. id, 'version') or '0')
if stored > expected then return {0, stored} end
forget(id)
redis.call('HSET', sessions .. id, 'version', expected + 1, 'updated_at', ARGV[6], 'body', body)
redis.call('PEXPIRE', sessions .. id, math.ceil(ttl * 1000))
redis.call('ZADD', index, now, id)
redis.call('ZADD', owned .. key, now, id)
redis.call('HSET', owners, id, key)
redis.call('HSET', sizes, id, #body)
redis.call('HINCRBY', totals, key, #body)
for _, old in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', '(' .. (now - ttl), 'LIMIT', 0, 100)) do
  forget(old)
end
-- the least recently saved of `order` other than this session, while `over()`
local function evict(order, over)
  while over() do
    local oldest = redis.call('ZRANGE', order, 0, 1)
    local victim = oldest[1] ~= id and oldest[1] or oldest[2]
    if not victim then return end
    forget(victim)
  end
end
local mine = owned .. key
evict(mine, function()
  return (max_count and redis.call('ZCARD', mine) > max_count)
    or (max_bytes and tonumber(redis.call('HGET', totals, key)) > max_bytes)
end)
evict(index, function() return redis.call('ZCARD', index) > max_sessions end)
return {1, expected + 1}
"""


class RedisSessionStore:
    """The SessionStore of `config.url` (redis:// or rediss://), asyncio all the way."""

    shared = True  # every replica uses it: an outage hits them all alike

    def __init__(self, config: SessionStoreConfig, *, clock: Clock = time.time):
        self.config = config
        self._clock = clock
        pool = aioredis.BlockingConnectionPool.from_url(
            config.url, max_connections=config.max_connections, timeout=config.timeout_s,
            socket_timeout=config.timeout_s, socket_connect_timeout=config.timeout_s,
            retry=Retry(NoBackoff(), 0), decode_responses=True)
        self._redis = aioredis.Redis(connection_pool=pool)
        self._save_script = self._redis.register_script(_SAVE)
        self._delete_script = self._redis.register_script(_DELETE)
        self._session_prefix = PREFIX + "session:"
        self._index = PREFIX + "sessions"
        self._keys = [self._index, PREFIX + "session_owner", PREFIX + "session_bytes",
                      PREFIX + "owner_bytes"]
        self._prefixes = [self._session_prefix, PREFIX + "owner:"]
        self.healthy = True  # False while the last call failed and no later one succeeded

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
        body, _ = encode_record(record, self.config.max_bytes_per_session)
        now, config = self._clock(), self.config
        saved, version = await self._call(self._save_script(
            keys=self._keys, args=[
                *self._prefixes, record.session_id, record.version, body, repr(now),
                config.ttl_s, owner_key(record.owner), config.max_sessions,
                _limit(config.max_sessions_per_key), _limit(config.max_bytes_per_key)]))
        if not saved:
            raise SessionConflictError(record.session_id, record.version, int(version))
        record.updated_at, record.version = now, int(version)

    async def version(self, session_id: str) -> int | None:
        version, updated_at = await self._call(self._redis.hmget(
            self._session_prefix + session_id, "version", "updated_at"))
        if version is None or float(updated_at) < self._clock() - self.config.ttl_s:
            return None
        return int(version)

    async def delete(self, session_id: str) -> None:
        await self._call(self._delete_script(keys=self._keys,
                                             args=[*self._prefixes, session_id]))

    async def count(self) -> int:
        """Number of indexed sessions, expired ones included until they are purged."""
        return await self._call(self._redis.zcard(self._index))

    async def probe(self) -> None:
        await self._call(self._redis.ping())

    async def close(self) -> None:
        await self._redis.aclose()
        await self._redis.connection_pool.disconnect()

    async def _call(self, awaitable):
        """Await one Redis call within timeout_s; any failure is 'unavailable'."""
        try:
            async with asyncio.timeout(self.config.timeout_s):
                result = await awaitable
        except (RedisError, OSError, asyncio.TimeoutError) as exc:
            if self.healthy:
                log.warning("session store failed: %s", exc)
            self.healthy = False
            raise SessionStoreUnavailableError(
                self.config.retry_after_ms, f"{type(exc).__name__}: {exc}") from exc
        if not self.healthy:
            log.info("session store is back")
        self.healthy = True
        return result


def _limit(quota: int | None) -> int | str:
    return "none" if quota is None else quota
