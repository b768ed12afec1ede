"""SessionRegistry over a real SQLite store: one live session per id, shared loads, saves
that follow the stored version, and a session's owner kept apart from other keys."""
from __future__ import annotations

import asyncio

from gateway.sessions.store import SessionConflictError, SessionRecord
from gateway.sessions.registry import SessionRegistry
from gateway.sessions.sqlite import SqliteSessionStore

OWNER = "ab" * 32


async def _stored_session(store: SqliteSessionStore, owner: str | None = OWNER) -> str:
    record = SessionRecord("sid", owner, None, {}, [{"role": "user", "content": "q"},
                                                    {"role": "assistant", "content": "a"}])
    await store.save(record)
    return record.session_id


async def test_concurrent_attaches_share_one_live_session(tmp_path):
    store = SqliteSessionStore(tmp_path / "s.db")
    registry = SessionRegistry(store)
    sid = await _stored_session(store)
    attached = await asyncio.gather(*(registry.attach(sid, OWNER) for _ in range(8)),
                                    registry.attach(sid, "cd" * 32), registry.attach(sid, None))
    mine, others = attached[:8], attached[8:]
    assert all(resumed and live is mine[0][0] for live, resumed in mine)
    assert mine[0][0].refs == 8 and len(mine[0][0].record.messages) == 2
    # Another key (or none) never gets the session, even while its load is shared.
    assert all(not resumed and live.id != sid for live, resumed in others)
    for live, _ in attached:
        registry.detach(live)
    assert len(registry) == 0
    await store.close()


async def test_session_stays_live_until_its_last_save_ends(tmp_path):
    store = SqliteSessionStore(tmp_path / "s.db")
    registry = SessionRegistry(store)
    sid = await _stored_session(store)
    live, _ = await registry.attach(sid, OWNER)
    live.record.messages += [{"role": "user", "content": "q2"},
                             {"role": "assistant", "content": "a2"}]
    saving = asyncio.ensure_future(registry.save(live))
    await asyncio.sleep(0)  # the save is under way on the store's thread
    registry.detach(live)
    again, resumed = await registry.attach(sid, OWNER)
    assert resumed and again is live  # not a copy loaded before the save landed
    assert await saving is None
    registry.detach(again)
    assert len(registry) == 0 and live.released
    reloaded, _ = await registry.attach(sid, OWNER)
    assert reloaded is not live and reloaded.record.messages == live.record.messages
    await store.close()


async def test_cancelled_save_still_lands_and_next_save_follows_it(tmp_path):
    store = SqliteSessionStore(tmp_path / "s.db")
    registry = SessionRegistry(store)
    live, _ = await registry.attach(await _stored_session(store), OWNER)
    caller = asyncio.ensure_future(registry.save(live))
    await asyncio.sleep(0)
    caller.cancel()  # a socket that closed mid-save
    await asyncio.gather(caller, return_exceptions=True)
    assert await registry.save(live) is None  # no conflict with its own cancelled save
    assert (await store.load(live.id)).version == live.record.version == 3
    await store.close()


async def test_stale_copy_in_another_process_cannot_overwrite(tmp_path):
    """Two registries on one store file, as two replicas: the later writer of a version
    is refused, the turn already stored stays, and its next socket loads the newer one."""
    path = tmp_path / "s.db"
    stores = [SqliteSessionStore(path), SqliteSessionStore(path)]
    first, second = (SessionRegistry(s) for s in stores)
    sid = await _stored_session(stores[0])
    (a, _), (b, _) = await first.attach(sid, OWNER), await second.attach(sid, OWNER)
    a.record.messages += [{"role": "user", "content": "kept"},
                          {"role": "assistant", "content": "yes"}]
    b.record.messages += [{"role": "user", "content": "stale"},
                          {"role": "assistant", "content": "no"}]
    assert await first.save(a) is None
    error = await second.save(b)
    assert isinstance(error, SessionConflictError) and error.code == "busy"
    assert (await stores[1].load(sid)).messages[-2]["content"] == "kept"
    fresh, resumed = await second.attach(sid, OWNER)
    assert resumed and fresh is not b and fresh.record.messages == a.record.messages
    for store in stores:
        await store.close()
