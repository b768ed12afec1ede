"""While its replica lives, every socket of a session lands on it through HAProxy, and
its later turns find their history in that replica's prefix cache."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.reliability.harness import chat, connect

from .conftest import BLOCK_SIZE

pytestmark = pytest.mark.slow  # three replicas load the model: minutes on a 2-core box

NUM_SESSIONS = 6
RECONNECTS = 3


async def _session(http, lb) -> dict:
    """Open a session, then reconnect RECONNECTS times with one turn per socket; the
    first socket stays open throughout, so leastconn spreads the sessions."""
    first, hello = await connect(http, lb)
    session_id = hello["session_id"]
    _, end = await chat(first, "t0", f"Session {session_id}: describe the sea in one line.")
    assert end["type"] == "done", end
    seen = {"id": session_id, "replicas": [hello["instance"]], "warm": []}
    assert lb.sticky()[session_id] == hello["instance"]  # HAProxy learnt it from the 101
    prompt_tokens = end["usage"]["prompt_tokens"]
    for turn in range(1, RECONNECTS + 1):
        ws, hello = await connect(http, lb, session_id)
        assert hello["resumed"] and hello["session_id"] == session_id, hello
        _, end = await chat(ws, f"t{turn}", f"And turn {turn}?")
        assert end["type"] == "done", end
        await ws.close()
        seen["replicas"].append(hello["instance"])
        # The previous turn's whole prompt (its full blocks) was found in the cache:
        # only the replica that ran it has it.
        seen["warm"].append(end["usage"]["cached_tokens"]
                            >= prompt_tokens // BLOCK_SIZE * BLOCK_SIZE > 0)
        prompt_tokens = end["usage"]["prompt_tokens"]
    await first.close()
    return seen


async def test_session_sockets_stay_on_their_replica(cluster):
    async with aiohttp.ClientSession() as http:
        sessions = await asyncio.gather(*(_session(http, cluster.lb)
                                          for _ in range(NUM_SESSIONS)))
    for seen in sessions:
        assert len(set(seen["replicas"])) == 1, seen
        assert all(seen["warm"]), seen
    # leastconn spread the live sessions over more than one replica
    assert len({seen["replicas"][0] for seen in sessions}) > 1, sessions
