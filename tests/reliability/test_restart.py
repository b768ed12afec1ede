"""Sessions survive kill -9: history from the SQLite store, prefix cache warm again."""
from __future__ import annotations

import asyncio

import aiohttp

from tests.sizes import size

from .harness import chat, connect, history, recv

NUM_SESSIONS = size(8, 20)  # the report quotes 20 (TOKENWIRE_FULL_SIZE=1)
TURNS_BEFORE = 3
BLOCK_SIZE = 16  # passed to the server: the prefix cache shares whole blocks only


async def _hold_session(http, server, index: int,
                        turns: int = TURNS_BEFORE) -> tuple[str, list[dict], int]:
    """Open a session, run its turns; returns (session_id, the history the client saw,
    the last turn's prompt_tokens)."""
    ws, hello = await connect(http, server)
    expected = []
    for turn in range(turns):
        content = f"Session {index}, turn {turn}: name a colour."
        text, end = await chat(ws, f"t{turn}", content)
        assert end["type"] == "done", end
        if text:  # an empty reply drops its user turn (sessions.LiveSession.end_turn)
            expected += [{"role": "user", "content": content},
                         {"role": "assistant", "content": text}]
    assert await history(ws) == expected
    await ws.close()
    return hello["session_id"], expected, end["usage"]["prompt_tokens"]


async def _hold_mid_turn(http, server) -> tuple[str, list[dict], int]:
    """A session with one finished turn and a second one still streaming: its client has
    seen deltas but no `done`, so the history it may expect after a crash is the first turn."""
    session_id, expected, prompt_tokens = await _hold_session(http, server, NUM_SESSIONS,
                                                              turns=1)
    ws, _ = await connect(http, server, session_id)
    await ws.send_json({"type": "chat", "id": "cut", "content": "Tell me a long story.",
                        "params": {"max_tokens": 2000, "ignore_eos": True}})
    while (await recv(ws))["type"] != "delta":
        pass
    return session_id, expected, prompt_tokens


async def _resume(http, server, session_id: str, expected: list[dict],
                  last_prompt_tokens: int) -> dict:
    """Resume and run two turns: the first warms the prefix cache with the restored
    history, the second must find the first's whole prompt there (its full blocks)."""
    ws, hello = await connect(http, server, session_id)
    stored = await history(ws)
    result = {"resumed": hello["resumed"], "same_id": hello["session_id"] == session_id,
              "history_ok": stored == expected, "turns": (len(stored) // 2, len(expected) // 2),
              "prompt": [], "cached": []}
    for turn in range(2):
        _, end = await chat(ws, f"after{turn}", f"And after the restart, turn {turn}?")
        assert end["type"] == "done", end
        result["prompt"].append(end["usage"]["prompt_tokens"])
        result["cached"].append(end["usage"]["cached_tokens"])
    await ws.close()
    # The restored history is in the prompt: it outgrows the last turn before the kill.
    result["in_prompt"] = result["prompt"][0] > last_prompt_tokens
    result["warm"] = result["cached"][1] >= result["prompt"][0] // BLOCK_SIZE * BLOCK_SIZE
    return result


async def test_sessions_resume_after_kill9(spawn, tmp_path, figures):
    # The default store: SQLite in the state directory (here a temporary one).
    server = spawn("--state-dir", str(tmp_path), "--block-size", str(BLOCK_SIZE),
                   name="restart").start()
    async with aiohttp.ClientSession() as http:
        held = await asyncio.gather(*(_hold_session(http, server, i)
                                      for i in range(NUM_SESSIONS)))
        cut_session = await _hold_mid_turn(http, server)
        server.kill9()
        assert (tmp_path / "sessions.db").is_file()
        server.start()  # same port, same store file
        results = await asyncio.gather(*(_resume(http, server, *session) for session in held))
        # The turn the kill cut off is not in the history (no question without its answer),
        # and the session goes on.
        cut = await _resume(http, server, *cut_session)
    intact = [r for r in results if r["resumed"] and r["same_id"] and r["history_ok"]]
    warm = [r for r in results if r["in_prompt"] and r["warm"]]
    figures(f"restart (kill -9) with {NUM_SESSIONS} sessions x {TURNS_BEFORE} turns",
            tried=NUM_SESSIONS,
            survived=len(intact), lost=NUM_SESSIONS - len(intact),
            notes=f"{sum(len(e) // 2 for _, e, _ in held)} turns stored; second turn after "
                  f"restart found the whole first turn's prompt (full blocks) in the prefix "
                  f"cache in {len(warm)}/{NUM_SESSIONS} sessions (cached tokens min "
                  f"{min(r['cached'][1] for r in results)})")
    assert len(intact) == NUM_SESSIONS, [r for r in results if r not in intact]
    assert cut["resumed"] and cut["history_ok"] and cut["in_prompt"] and cut["warm"], cut
    assert len(warm) == NUM_SESSIONS, [(r["prompt"], r["cached"]) for r in results]
