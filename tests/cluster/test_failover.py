"""kill -9 of the replica that holds 20 live chat sessions: each resumes through HAProxy
on another replica with every turn that ended with `done`, and none other."""
from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.reliability.harness import chat, connect, history, recv

pytestmark = pytest.mark.slow  # three replicas load the model: minutes on a 2-core box

NUM_SESSIONS = 20
NUM_CUT = 5  # of them, mid-turn (deltas seen, no `done`) when the replica dies
TURNS = 2


async def _open(http, lb, index: int):
    """A session with TURNS finished turns; its socket stays open. Returns
    (ws, hello, the history its client saw)."""
    ws, hello = await connect(http, lb)
    expected = []
    for turn in range(TURNS):
        content = f"Session {index}, turn {turn}: name a fruit."
        text, end = await chat(ws, f"t{turn}", content)
        assert end["type"] == "done", end
        if text:  # an empty reply drops its user turn
            expected += [{"role": "user", "content": content},
                         {"role": "assistant", "content": text}]
    return ws, hello, expected


async def _start_long_turn(ws) -> None:
    """A turn still streaming: wait for its first delta so the server is generating."""
    await ws.send_json({"type": "chat", "id": "cut", "content": "Tell me a long story.",
                        "params": {"max_tokens": 200, "ignore_eos": True}})
    while (await recv(ws))["type"] != "delta":
        pass


async def _resume(http, lb, session_id: str, expected: list[dict]) -> dict:
    ws, hello = await connect(http, lb, session_id)
    result = {"resumed": hello["resumed"], "history_ok": await history(ws) == expected,
              "replica": hello["instance"]}
    _, end = await chat(ws, "after", "Still there?")
    result["next_turn"] = end["type"]
    await ws.close()
    return result


def _pin_new_sockets(lb, name: str, on: bool) -> None:
    """Put every other server in (out of) drain, so new sockets all go to `name`."""
    for other in lb.servers_up():
        if other != name:
            lb.command(f"set server replicas/{other} state {'drain' if on else 'ready'}")


async def test_kill9_sessions_resume_on_another_replica(cluster):
    victim = cluster.replicas[0]
    name = cluster.name(victim)
    async with aiohttp.ClientSession() as http:
        _pin_new_sockets(cluster.lb, name, True)
        try:
            held = await asyncio.gather(*(_open(http, cluster.lb, i)
                                          for i in range(NUM_SESSIONS)))
        finally:
            _pin_new_sockets(cluster.lb, name, False)
        assert {hello["instance"] for _, hello, _ in held} == {name}
        await asyncio.gather(*(_start_long_turn(ws) for ws, _, _ in held[:NUM_CUT]))
        victim.kill9()
        results = await asyncio.gather(*(_resume(http, cluster.lb, hello["session_id"], expected)
                                         for _, hello, expected in held))
        for ws, _, _ in held:
            await ws.close()
    cluster.restart(victim)
    lost = [r for r in results if not (r["resumed"] and r["history_ok"])]
    assert not lost, lost
    assert all(r["replica"] in {"r1", "r2", "r3"} - {name} for r in results), results
    assert all(r["next_turn"] == "done" for r in results), results
