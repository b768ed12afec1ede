"""SQLite store faults on real files: a corrupt file, a full disk, a lock held past the
timeout. Each call answers SessionStoreUnavailableError (with the config's
retry_after_ms) instead of a sqlite3 error, nothing stored is lost, `healthy` says so,
and the store recovers by itself once the file is usable again."""
from __future__ import annotations

import asyncio
import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from gateway.sessions.registry import SessionRegistry
from gateway.sessions.sqlite import SqliteSessionStore
from gateway.sessions.store import SessionRecord, SessionStoreUnavailableError

RETRY_AFTER_MS = 250
TIMEOUT_S = 0.3


def record(session_id: str, turns: int = 1, size: int = 20) -> SessionRecord:
    messages = []
    for i in range(turns):
        messages += [{"role": "user", "content": f"question {i} " + "x" * size},
                     {"role": "assistant", "content": f"answer {i}"}]
    return SessionRecord(session_id, "ab" * 32, None, {}, messages)


def store_at(path: Path, cls=SqliteSessionStore) -> SqliteSessionStore:
    return cls(path, retry_after_ms=RETRY_AFTER_MS, timeout_s=TIMEOUT_S)


async def unavailable(call) -> SessionStoreUnavailableError:
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(SessionStoreUnavailableError) as info:
        await call
    assert loop.time() - started < TIMEOUT_S + 1.0
    assert info.value.code == "store_unavailable"
    assert info.value.retry_after_ms == RETRY_AFTER_MS
    return info.value


def backup(path: Path, to: Path) -> None:
    """A consistent copy, and the WAL checkpointed into the file: what garbage then
    overwrites is all there is (no WAL frame left to mend it)."""
    with sqlite3.connect(path) as src, sqlite3.connect(to) as dst:
        src.backup(dst)
        src.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    src.close()
    dst.close()


def write_garbage(path: Path) -> None:
    path.write_bytes(os.urandom(path.stat().st_size))


async def test_corrupt_file_then_restored(tmp_path):
    path, good = tmp_path / "sessions.db", tmp_path / "good.db"
    store = store_at(path)
    kept, rec = record("kept", turns=2), record("live")
    await store.save(kept)
    await store.save(rec)
    backup(path, good)
    write_garbage(path)
    rec.messages += [{"role": "user", "content": "during"}, {"role": "assistant", "content": "ok"}]
    for call in (store.load("kept"), store.save(rec), store.delete("kept"), store.count()):
        error = await unavailable(call)
        assert isinstance(error.__cause__, sqlite3.DatabaseError)
        assert not store.healthy
    assert rec.version == 1  # the refused save changed nothing
    os.replace(good, path)  # restored: the store opens it anew on its next call
    await store.probe()
    assert store.healthy
    assert await store.load("kept") == kept
    await store.save(rec)  # the turn kept in memory is written by the next save
    assert (await store.load("live")).messages == rec.messages and rec.version == 2
    await store.close()


async def test_file_replaced_between_calls_is_reopened(tmp_path):
    """An open connection would go on reading its cached pages of the old file."""
    path, other = tmp_path / "sessions.db", tmp_path / "other.db"
    store, writer = store_at(path), store_at(other)
    await store.save(record("before"))
    await writer.save(record("restored"))
    await writer.close()
    os.replace(other, path)
    assert await store.load("restored") is not None
    assert await store.load("before") is None
    assert store.healthy
    await store.close()


class PageCappedStore(SqliteSessionStore):
    """The file cannot grow past `max_pages`: SQLite's own 'database or disk is full'."""

    max_pages = 4_294_967_294  # SQLite's default cap

    def _connection(self) -> sqlite3.Connection:
        conn = super()._connection()
        conn.execute(f"PRAGMA max_page_count = {self.max_pages}")  # on the store's thread
        return conn


@pytest.fixture(params=["tmpfs", "max_page_count"])
def full_disk(request, tmp_path):
    """(store, fill, make_room): a store whose file's disk fills up when asked. "tmpfs":
    a 1 MiB tmpfs (needs CAP_SYS_ADMIN: skipped without it) filled by a file;
    "max_page_count": the database capped at the pages it has."""
    if request.param == "max_page_count":
        store = store_at(tmp_path / "sessions.db", PageCappedStore)

        def fill() -> None:
            with sqlite3.connect(store.path) as conn:
                store.max_pages = conn.execute("PRAGMA page_count").fetchone()[0]
            conn.close()

        def make_room() -> None:
            store.max_pages = PageCappedStore.max_pages
        yield store, fill, make_room
        return
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = shutil.which("mount") and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(disk)],
        check=False, capture_output=True).returncode == 0
    if not mounted:
        pytest.skip("cannot mount a tmpfs here (needs CAP_SYS_ADMIN)")
    filler = disk / "filler"
    try:
        def fill() -> None:
            with open(filler, "wb", buffering=0) as f, pytest.raises(OSError):  # ENOSPC
                while True:
                    f.write(b"\0" * 4096)
        yield store_at(disk / "sessions.db"), fill, filler.unlink
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=True)


async def test_full_disk_refuses_saves_and_keeps_what_is_stored(full_disk):
    store, fill, make_room = full_disk
    rec = record("s1")
    await store.save(rec)
    fill()
    rec.messages += [{"role": "user", "content": "y" * 200_000},
                     {"role": "assistant", "content": "ok"}]
    error = await unavailable(store.save(rec))
    assert "full" in str(error.__cause__), error.__cause__
    assert not store.healthy and rec.version == 1
    await unavailable(store.save(record("s2", size=200_000)))
    stored = await store.load("s1")  # reading needs no room
    assert stored.version == 1 and len(stored.messages) == 2
    make_room()
    await store.save(rec)
    assert store.healthy
    assert (await store.load("s1")).messages == rec.messages
    await store.close()


async def test_lock_held_past_the_timeout(tmp_path):
    path = tmp_path / "sessions.db"
    store = store_at(path)
    rec = record("s1")
    await store.save(rec)
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process's write, never committed
    await unavailable(store.save(rec))
    await unavailable(store.delete("s1"))
    assert not store.healthy
    other.execute("ROLLBACK")
    # Now it locks the file whole: nothing, reads included, gets in.
    other.execute("PRAGMA locking_mode=EXCLUSIVE")
    other.execute("BEGIN EXCLUSIVE")
    for call in (store.load("s1"), store.save(rec), store.delete("s1")):
        await unavailable(call)
    other.close()
    assert (await store.load("s1")).version == rec.version == 1
    await store.save(rec)
    assert store.healthy and rec.version == 2
    await store.close()


async def test_registry_probes_the_store_until_it_is_back(tmp_path):
    """No client calls the store while /ready keeps the replica out of rotation: asking
    `healthy` probes it."""
    path, good = tmp_path / "sessions.db", tmp_path / "good.db"
    store = store_at(path)
    registry = SessionRegistry(store)
    await store.save(record("s1"))
    backup(path, good)
    write_garbage(path)
    with pytest.raises(SessionStoreUnavailableError):
        await registry.attach("s1", "ab" * 32)
    assert not registry.healthy
    await asyncio.sleep(0.5)  # the probe ran and failed: still unhealthy
    assert not registry.healthy
    os.replace(good, path)
    async with asyncio.timeout(5):
        while not registry.healthy:
            await asyncio.sleep(0.05)
    live, resumed = await registry.attach("s1", "ab" * 32)
    assert resumed and len(live.messages) == 2
    await store.close()
