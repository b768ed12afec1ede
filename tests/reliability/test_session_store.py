"""Session stores (memory, SQLite, Redis on a real redis-server): roundtrip, persistence
across reopen, TTL, size cap, eviction, per-key quotas, versioned saves, threading, the
SQLite file's mode."""
from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import stat
import threading

import pytest
from services import RedisServer

from gateway.cli import serve
from gateway.sessions.factory import make_session_store
from gateway.sessions.redis import PREFIX, RedisSessionStore
from gateway.sessions.sqlite import SqliteSessionStore
from gateway.sessions.store import (
    MemorySessionStore,
    SessionConflictError,
    SessionRecord,
    SessionStoreConfig,
    SessionStoreUnavailableError,
    SessionTooLargeError,
    encode_record,
)


class FakeClock:
    """A settable clock that also records which threads read it."""

    def __init__(self, now: float = 1_000.0):
        self.now = now
        self.threads: set[int] = set()

    def __call__(self) -> float:
        self.threads.add(threading.get_ident())
        return self.now


KEY_A, KEY_B = "aa" * 32, "bb" * 32


def record(session_id: str, turns: int = 1, owner: str | None = "ab" * 32) -> SessionRecord:
    messages = []
    for i in range(turns):
        messages += [{"role": "user", "content": f"question {i} é✓"},
                     {"role": "assistant", "content": f"answer {i}"}]
    return SessionRecord(session_id, owner, "be brief", {"temperature": 0.0}, messages, 0.0)


@pytest.fixture(params=["memory", "sqlite", "redis"])
def make_store(request, tmp_path):
    def make(clock=None, **limits):
        clock = clock or FakeClock()
        if request.param == "memory":
            return MemorySessionStore(**limits, clock=clock)
        if request.param == "redis":
            url = request.getfixturevalue("redis_server").url
            return RedisSessionStore(SessionStoreConfig(url, **limits), clock=clock)
        return SqliteSessionStore(tmp_path / "sessions.db", **limits, clock=clock)

    return make


async def test_roundtrip(make_store):
    store = make_store()
    rec = record("s1", turns=2)
    await store.save(rec)
    loaded = await store.load("s1")
    assert loaded == rec
    assert loaded is not rec and loaded.messages is not rec.messages
    assert await store.load("unknown") is None
    await store.close()


async def test_caller_mutation_does_not_change_stored(make_store):
    store = make_store()
    rec = record("s1")
    await store.save(rec)
    rec.messages.append({"role": "user", "content": "unsaved"})
    assert len((await store.load("s1")).messages) == 2
    await store.close()


async def test_delete(make_store):
    store = make_store()
    await store.save(record("s1"))
    await store.delete("s1")
    await store.delete("never-there")
    assert await store.load("s1") is None
    await store.close()


async def test_ttl_expiry(make_store):
    clock = FakeClock(1_000.0)
    store = make_store(clock, ttl_s=60.0)
    await store.save(record("old"))
    clock.now += 59.0
    await store.save(record("young"))
    assert await store.load("old") is not None
    clock.now += 2.0  # "old" is now 61 s past its save, "young" 2 s
    assert await store.load("old") is None
    assert await store.load("young") is not None
    clock.now += 1_000.0
    assert await store.load("young") is None
    await store.close()


async def test_version_without_the_body(make_store):
    clock = FakeClock(1_000.0)
    store = make_store(clock, ttl_s=60.0)
    rec = record("s1")
    await store.save(rec)
    assert await store.version("s1") == rec.version == 1
    await store.save(rec)
    assert await store.version("s1") == 2
    assert await store.version("unknown") is None
    clock.now += 61.0  # expired: as absent as after a delete
    assert await store.version("s1") is None
    await store.save(record("s2"))
    await store.delete("s2")
    assert await store.version("s2") is None
    await store.close()


async def test_save_refreshes_ttl(make_store):
    clock = FakeClock()
    store = make_store(clock, ttl_s=10.0)
    rec = record("s1")
    await store.save(rec)
    clock.now += 8.0
    await store.save(rec)
    assert rec.updated_at == clock.now
    clock.now += 8.0
    assert await store.load("s1") is not None
    await store.close()


async def test_size_cap_raises_and_keeps_previous(make_store):
    store = make_store(max_bytes_per_session=400)
    rec = record("s1", turns=1)
    await store.save(rec)
    rec.messages.append({"role": "user", "content": "x" * 500})
    with pytest.raises(SessionTooLargeError) as info:
        await store.save(rec)
    assert "max_bytes_per_session" in str(info.value) and "400" in str(info.value)
    assert info.value.size > 400 and info.value.limit == 400
    assert len((await store.load("s1")).messages) == 2  # the last good save survives
    await store.close()


async def test_eviction_of_least_recently_saved(make_store):
    clock = FakeClock()
    store = make_store(clock, max_sessions=3)
    records = {name: record(name) for name in ["a", "b", "c"]}
    for rec in records.values():
        clock.now += 1.0
        await store.save(rec)
    clock.now += 1.0
    await store.save(records["a"])  # refreshed: "b" is now the oldest
    clock.now += 1.0
    await store.save(record("d"))
    assert await store.load("b") is None
    for name in ["a", "c", "d"]:
        assert await store.load(name) is not None, name
    await store.close()


async def _save_all(store, clock: FakeClock, names: list[str], owner: str | None) -> None:
    for name in names:
        clock.now += 1.0
        await store.save(record(name, owner=owner))


async def _stored(store, names: list[str]) -> list[str]:
    return [name for name in names if await store.load(name) is not None]


async def test_a_keys_saves_never_evict_another_keys_sessions(make_store):
    clock = FakeClock()
    store = make_store(clock, max_sessions=5, max_sessions_per_key=3)
    a_names, b_names = ["a0", "a1"], [f"b{i}" for i in range(8)]
    await _save_all(store, clock, a_names, KEY_A)
    await _save_all(store, clock, b_names, KEY_B)
    assert await _stored(store, a_names) == a_names
    assert await _stored(store, b_names) == ["b5", "b6", "b7"]  # B's own oldest went
    await store.close()


async def test_a_keys_own_least_recently_saved_go_first(make_store):
    clock = FakeClock()
    store = make_store(clock, max_sessions_per_key=3)
    names = ["a0", "a1", "a2"]
    await _save_all(store, clock, names, KEY_A)
    clock.now += 1.0
    await store.save(await store.load("a0"))  # refreshed: "a1" is now A's oldest
    await _save_all(store, clock, ["a3"], KEY_A)
    assert await _stored(store, names + ["a3"]) == ["a0", "a2", "a3"]
    await store.close()


async def test_sessions_without_an_owner_count_as_one_key(make_store):
    clock = FakeClock()
    store = make_store(clock, max_sessions_per_key=2)
    await _save_all(store, clock, ["k0"], KEY_A)
    await _save_all(store, clock, ["n0", "n1", "n2"], None)
    assert await _stored(store, ["k0", "n0", "n1", "n2"]) == ["k0", "n1", "n2"]
    await store.close()


async def test_byte_quota_evicts_the_keys_own_oldest(make_store):
    clock = FakeClock()
    _, size = encode_record(record("a0", turns=2, owner=KEY_A), 1 << 20)
    store = make_store(clock, max_bytes_per_session=2 * size,
                       max_bytes_per_key=2 * size + size // 2)
    for name, owner in [("b0", KEY_B), ("a0", KEY_A), ("a1", KEY_A), ("a2", KEY_A)]:
        clock.now += 1.0
        await store.save(record(name, turns=2, owner=owner))
    # A's three sessions were over 2.5 sessions' worth: its oldest went, B's (older) stayed.
    assert await _stored(store, ["a0", "a1", "a2", "b0"]) == ["a1", "a2", "b0"]
    grown = await store.load("a2")  # one session growing past the rest of A's room
    grown.messages += grown.messages
    clock.now += 1.0
    await store.save(grown)
    assert await _stored(store, ["a1", "a2", "b0"]) == ["a2", "b0"]
    assert len((await store.load("a2")).messages) == 8
    await store.close()


async def test_the_global_cap_applies_after_the_quotas(make_store):
    clock = FakeClock()
    store = make_store(clock, max_sessions=4, max_sessions_per_key=3)
    await _save_all(store, clock, ["a0", "a1", "a2"], KEY_A)
    await _save_all(store, clock, ["b0", "b1"], KEY_B)
    assert await _stored(store, ["a0", "a1", "a2", "b0", "b1"]) == ["a1", "a2", "b0", "b1"]
    await store.close()


async def test_quotas_switched_off(make_store):
    clock = FakeClock()
    store = make_store(clock, max_sessions=50, max_sessions_per_key=None,
                       max_bytes_per_key=None)
    names = [f"a{i}" for i in range(12)]
    await _save_all(store, clock, names, KEY_A)
    assert await _stored(store, names) == names
    await store.close()


async def test_redis_quota_bookkeeping_matches_the_sessions(redis_server):
    """After saves, evictions, expiry and deletes, the per-key sets and byte sums hold
    exactly the stored sessions."""
    clock = FakeClock()
    config = SessionStoreConfig(redis_server.url, ttl_s=100.0, max_sessions=6,
                                max_sessions_per_key=3, max_bytes_per_session=1_000,
                                max_bytes_per_key=1_200)
    store = RedisSessionStore(config, clock=clock)
    for i in range(10):
        clock.now += 1.0
        await store.save(record(f"s{i}", turns=1 + i % 4, owner=[KEY_A, KEY_B, None][i % 3]))
    await store.delete("s9")
    clock.now += 95.0  # the first few saves have expired
    await store.save(record("late", owner=KEY_B))
    client = store._redis  # the layout itself is under test
    live = set(await client.zrange(PREFIX + "sessions", 0, -1))
    owners = await client.hgetall(PREFIX + "session_owner")
    sizes = await client.hgetall(PREFIX + "session_bytes")
    assert set(owners) == set(sizes) == live
    for key in ("none", KEY_A, KEY_B):
        mine = set(await client.zrange(PREFIX + "owner:" + key, 0, -1))
        assert mine == {sid for sid, owner in owners.items() if owner == key}
        total = int(await client.hget(PREFIX + "owner_bytes", key) or 0)
        assert total == sum(int(sizes[sid]) for sid in mine), key
    for sid in live:
        assert await client.exists(PREFIX + "session:" + sid), sid
    await store.close()


async def test_save_never_overwrites_a_newer_version(make_store):
    store = make_store()
    rec = record("s1")
    assert rec.version == 0
    await store.save(rec)
    assert rec.version == 1
    first, second = await store.load("s1"), await store.load("s1")
    first.messages.append({"role": "user", "content": "kept"})
    await store.save(first)
    assert first.version == 2
    second.messages.append({"role": "user", "content": "stale"})
    with pytest.raises(SessionConflictError) as info:
        await store.save(second)
    assert info.value.code == "busy" and (info.value.expected, info.value.stored) == (1, 2)
    assert second.version == 1
    stored = await store.load("s1")
    assert stored.version == 2 and stored.messages[-1]["content"] == "kept"
    await store.save(first)  # the newest copy goes on saving
    assert (await store.load("s1")).version == 3
    await store.close()


async def test_sqlite_adds_versions_to_an_older_file(tmp_path):
    path = tmp_path / "sessions.db"
    with sqlite3.connect(path) as conn:  # the schema before sessions had versions
        conn.execute("CREATE TABLE sessions (session_id TEXT PRIMARY KEY, "
                     "updated_at REAL NOT NULL, body TEXT NOT NULL)")
        conn.execute("INSERT INTO sessions VALUES ('old', 1e12, '{\"owner\":null,"
                     "\"system\":null,\"params\":{},\"messages\":[]}')")
    store = SqliteSessionStore(path)
    old = await store.load("old")
    assert old is not None and old.version == 0
    await store.save(old)
    assert (await store.load("old")).version == 1
    await store.close()


async def test_sqlite_older_file_counts_its_sessions_towards_their_keys(tmp_path):
    path = tmp_path / "sessions.db"
    with sqlite3.connect(path) as conn:  # the schema before owners were indexed
        conn.execute("CREATE TABLE sessions (session_id TEXT PRIMARY KEY, updated_at REAL "
                     "NOT NULL, body TEXT NOT NULL, version INTEGER NOT NULL DEFAULT 0)")
        for i, owner in enumerate([KEY_A, KEY_A, KEY_B]):
            body, _ = encode_record(record(f"old{i}", owner=owner), 1 << 20)
            conn.execute("INSERT INTO sessions VALUES (?, ?, ?, 1)", (f"old{i}", 1e3 + i, body))
    clock = FakeClock(2_000.0)
    store = SqliteSessionStore(path, max_sessions_per_key=2, clock=clock)
    await store.save(record("new", owner=KEY_A))
    assert await _stored(store, ["old0", "old1", "old2", "new"]) == ["old1", "old2", "new"]
    await store.close()


def test_sqlite_file_is_private(tmp_path):
    found = tmp_path / "srv"
    found.mkdir()
    found.chmod(0o755)
    path = found / "state" / "tokenwire" / "sessions.db"
    before = os.umask(0o022)
    try:
        asyncio.run(_save_and_check_modes(path))
    finally:
        os.umask(before)
    for directory in (path.parent, path.parent.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory
    assert stat.S_IMODE(found.stat().st_mode) == 0o755  # one it found keeps its mode


async def _save_and_check_modes(path) -> None:
    store = SqliteSessionStore(path)
    await store.save(record("s1"))
    names = [path.name, path.name + "-wal", path.name + "-shm"]
    modes = {name: stat.S_IMODE((path.parent / name).stat().st_mode) for name in names}
    await store.close()
    assert modes == dict.fromkeys(names, 0o600)


async def test_sqlite_survives_reopen_and_uses_wal(tmp_path):
    path = tmp_path / "sessions.db"
    store = SqliteSessionStore(path)
    await store.save(record("s1", turns=3))
    await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    reopened = SqliteSessionStore(path)
    loaded = await reopened.load("s1")
    assert loaded is not None and len(loaded.messages) == 6
    assert loaded.messages[0]["content"] == "question 0 é✓"
    await reopened.close()


async def test_sqlite_closed_store_refuses(tmp_path):
    store = SqliteSessionStore(tmp_path / "s.db")
    await store.close()
    with pytest.raises(RuntimeError, match="closed"):
        await store.load("s1")


async def test_concurrent_saves_run_off_the_loop(tmp_path):
    clock = FakeClock()
    store = SqliteSessionStore(tmp_path / "s.db", max_sessions=1_000, clock=clock)
    ticks = 0
    saving = True

    async def ticker():
        nonlocal ticks
        while saving:
            ticks += 1
            await asyncio.sleep(0)

    tick_task = asyncio.create_task(ticker())
    await asyncio.gather(*(store.save(record(f"s{i}", turns=4)) for i in range(300)))
    saving = False
    await tick_task
    assert await store.count() == 300
    assert threading.get_ident() not in clock.threads  # SQLite ran only on its thread
    assert len(clock.threads) == 1
    assert ticks > 10  # the loop kept running other coroutines while saves were pending
    await store.close()


def test_config_validation():
    with pytest.raises(ValueError, match="ttl_s"):
        SessionStoreConfig(ttl_s=0)
    with pytest.raises(ValueError, match="max_sessions"):
        SessionStoreConfig(max_sessions=0)
    with pytest.raises(ValueError, match="max_bytes_per_session"):
        SessionStoreConfig(max_bytes_per_session=1)
    with pytest.raises(ValueError, match="max_sessions_per_key"):
        SessionStoreConfig(max_sessions_per_key=0)
    with pytest.raises(ValueError, match="max_bytes_per_key"):
        SessionStoreConfig(max_bytes_per_session=4096, max_bytes_per_key=4095)
    SessionStoreConfig(max_sessions_per_key=None, max_bytes_per_key=None)


def test_quota_flags():
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    args = parser.parse_args(["--session-store", "memory:", "--max-sessions-per-key", "none",
                              "--max-bytes-per-key", "65536",
                              "--max-session-bytes", "4096"])
    config = serve.session_store_config(args, {})
    assert (config.max_sessions_per_key, config.max_bytes_per_key) == (None, 65536)
    defaults = serve.session_store_config(parser.parse_args([]), {})
    assert defaults.max_sessions_per_key < defaults.max_sessions
    assert defaults.max_bytes_per_session <= defaults.max_bytes_per_key


async def test_make_session_store(tmp_path, redis_server):
    memory = make_session_store(SessionStoreConfig())
    path = tmp_path / "state" / "tokenwire" / "s.db"  # its directory is made on first use
    sqlite_store = make_session_store(SessionStoreConfig(f"sqlite://{path}", ttl_s=5))
    redis_store = make_session_store(SessionStoreConfig(redis_server.url, max_sessions=9))
    assert isinstance(memory, MemorySessionStore)
    assert isinstance(sqlite_store, SqliteSessionStore) and sqlite_store.config.ttl_s == 5
    assert isinstance(redis_store, RedisSessionStore) and redis_store.config.max_sessions == 9
    for store in (sqlite_store, redis_store):
        await store.save(record("s1"))
        assert (await store.load("s1")).version == 1
        await store.close()
    assert path.is_file()
    await memory.close()


async def _all_unavailable(store: RedisSessionStore, rec: SessionRecord,
                           delete: bool = True) -> None:
    loop = asyncio.get_running_loop()
    calls = [store.load("s1"), store.save(rec), store.count()]
    for call in calls + ([store.delete("s1")] if delete else []):
        started = loop.time()
        with pytest.raises(SessionStoreUnavailableError) as info:
            await call
        assert loop.time() - started < 2.0 and info.value.retry_after_ms == 250
        assert info.value.code == "store_unavailable"


async def test_redis_down_or_hung_is_unavailable_within_the_timeout_then_recovers(tmp_path):
    redis = RedisServer(tmp_path / "redis", persist=True).start()
    store = RedisSessionStore(SessionStoreConfig(redis.url, timeout_s=0.5, retry_after_ms=250))
    rec = record("s1")
    try:
        await store.save(rec)
        redis.stop()  # down: connections refused
        await _all_unavailable(store, rec)
        assert rec.version == 1  # the refused saves changed nothing
        redis.start()  # same port, its data reloaded: the client reconnects by itself
        await store.save(rec)
        assert (await store.load("s1")).version == rec.version == 2
        redis.freeze()  # hung: every call must end within the timeout all the same
        await _all_unavailable(store, rec, delete=False)
        redis.thaw()
        # The hung save may have landed once Redis woke up: either way the session is whole.
        stored = await store.load("s1")
        assert stored.version in (2, 3) and stored.messages == rec.messages
    finally:
        await store.close()
        redis.thaw()
        redis.stop()
