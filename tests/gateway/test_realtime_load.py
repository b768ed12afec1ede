"""Concurrent /v1/realtime conversations x 3 turns on the default model, each on the
official SDK's client: every response ends in response.done (parsed strictly), none
hangs, and once the sockets close no KV block, server task, socket or session is left."""
from __future__ import annotations

import asyncio

from realtime_helpers import connect, recv, say

from gateway.runtime import RUNTIME
from scheduler.config import SchedulerConfig
from tests.sizes import size

# 24 already queue past the engine's slots; TOKENWIRE_FULL_SIZE=1 runs 64.
CONVERSATIONS, TURNS = size(24, 64), 3
QUESTIONS = ["Name a colour.", "Name a fruit.", "Name an animal."]


async def conversation(base_url: str, index: int) -> list[str]:
    statuses = []
    async with connect(base_url) as conn:
        await recv(conn)
        await conn.session.update(session={"type": "realtime", "max_output_tokens": 4,
                                           "instructions": f"You are assistant {index}."})
        await recv(conn)
        for question in QUESTIONS[:TURNS]:
            _, done = await say(conn, question)
            assert done.response.usage.output_tokens <= 4
            statuses.append(done.response.status)
    return statuses


def server_tasks(server) -> int:
    async def count() -> int:
        return len(asyncio.all_tasks())
    return server.call(count())


async def settled(check, timeout: float = 20.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


async def test_concurrent_conversations_3_turns_all_end_and_leave_nothing(server):
    # All responses are admitted and queue (the 2-core CI box takes minutes for them),
    # rather than refused by the default 5 s time-to-first-token estimate.
    # A fresh server has no measured drain rate and refuses what its free slots cannot take
    # at once (the cold-start rule); a prior rate lets these wait their turn instead.
    url = server.start_app(scheduler=SchedulerConfig(ttft_bound_s=600.0, initial_drain_rps=1.0))
    rt = server.apps[url][RUNTIME]
    tasks_before = server_tasks(server)
    try:
        results = await asyncio.wait_for(asyncio.gather(
            *(conversation(url, i) for i in range(CONVERSATIONS))), 540)
        assert len(results) == CONVERSATIONS
        assert all(s in ("completed", "incomplete") for r in results for s in r)
        assert sum(len(r) for r in results) == CONVERSATIONS * TURNS
        assert await settled(lambda: not rt.connections and len(rt.sessions) == 0)
        assert await settled(lambda: server_tasks(server) <= tasks_before)
        assert server.all_blocks_free()
        assert rt.scheduler.admission.num_waiting == 0
    finally:
        server.stop_app(url)
