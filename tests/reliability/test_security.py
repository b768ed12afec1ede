"""Auth, Origin, session ownership, session id entropy, frame limit and log hygiene, on
one `tokenwire serve` process with two API keys, one allowed Origin and a 4 KiB frame cap.
"""
from __future__ import annotations

import base64
import json
import secrets

import aiohttp
import pytest

from .harness import chat, connect, history, recv

KEY_A, KEY_B = f"key-a-{secrets.token_hex(8)}", f"key-b-{secrets.token_hex(8)}"
WRONG_KEY = f"wrong-{secrets.token_hex(8)}"
PROMPT_CANARY = f"canary{secrets.token_hex(6)}"
GOOD_ORIGIN = "https://chat.example"
MAX_BYTES = 4096
NUM_IDS = 200


def auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def server(spawn):
    # Keys through the environment, as a deployment would pass them.
    return spawn("--allowed-origins", GOOD_ORIGIN, "--max-message-bytes", str(MAX_BYTES),
                 name="security", env={"TOKENWIRE_API_KEYS": f"{KEY_A},{KEY_B}"}).start()


async def _handshake_status(http, server, **kwargs) -> int:
    """101 when the upgrade happened, else the HTTP status the server answered."""
    try:
        ws = await http.ws_connect(server.ws_url, **kwargs)
    except aiohttp.WSServerHandshakeError as exc:
        return exc.status
    await ws.close()
    return 101


async def test_401_before_upgrade_and_403_foreign_origin(server, figures):
    cases = {  # name -> (ws_connect kwargs, expected status)
        "no key": ({}, 401),
        "wrong key": ({"headers": auth(WRONG_KEY)}, 401),
        "wrong key as subprotocol": ({"protocols": (f"bearer.{WRONG_KEY}",)}, 401),
        "key A": ({"headers": auth(KEY_A)}, 101),
        "key B as subprotocol": ({"protocols": ("tokenwire.v1", f"bearer.{KEY_B}")}, 101),
        "foreign Origin": ({"headers": {**auth(KEY_A), "Origin": "https://evil.example"}}, 403),
        "allowed Origin": ({"headers": {**auth(KEY_A), "Origin": GOOD_ORIGIN}}, 101),
    }
    async with aiohttp.ClientSession() as http:
        got = {name: await _handshake_status(http, server, **kw)
               for name, (kw, _) in cases.items()}
        async with http.post(server.http_url + "/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": "hi"}]}) as r:
            got["HTTP completion without key"] = r.status
    want = {name: status for name, (_, status) in cases.items()}
    want["HTTP completion without key"] = 401
    wrong = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    figures("auth and Origin checks", tried=len(want), survived=len(want) - len(wrong),
            lost=len(wrong), notes=f"statuses {got}")
    assert not wrong


async def test_session_of_key_a_not_resumable_with_key_b(server, figures):
    async with aiohttp.ClientSession() as http:
        ws, hello = await connect(http, server, headers=auth(KEY_A))
        _, end = await chat(ws, "t0", f"My code word is {PROMPT_CANARY}. Say hi.")
        assert end["type"] == "done", end
        owned = await history(ws)
        await ws.close()
        thief, stolen = await connect(http, server, hello["session_id"], headers=auth(KEY_B))
        thief_history = await history(thief)
        await thief.close()
        owner, back = await connect(http, server, hello["session_id"], headers=auth(KEY_A))
        owner_history = await history(owner)
        await owner.close()
    figures("session of key A resumed with key B", tried=1,
            survived=int(not stolen["resumed"]), lost=int(stolen["resumed"]),
            notes="key B got a fresh session with an empty history; key A resumed its own")
    assert not stolen["resumed"] and stolen["session_id"] != hello["session_id"]
    assert thief_history == [] and PROMPT_CANARY not in json.dumps(thief_history)
    assert back["resumed"] and owner_history == owned and len(owned) == 2


async def test_session_ids_are_128_bit_random(server, figures):
    async with aiohttp.ClientSession() as http:
        ids = []
        for _ in range(NUM_IDS):
            ws, hello = await connect(http, server, headers=auth(KEY_A))
            ids.append(hello["session_id"])
            await ws.close()
    raw = [base64.urlsafe_b64decode(i + "=" * (-len(i) % 4)) for i in ids]
    ones = sum(bin(int.from_bytes(r, "big")).count("1") for r in raw)
    ratio = ones / (128 * len(raw))
    figures("session ids", tried=NUM_IDS, survived=len(set(raw)), lost=NUM_IDS - len(set(raw)),
            notes=f"all {len({len(r) for r in raw}) == 1 and len(raw[0]) * 8}-bit, "
                  f"distinct: {len(set(raw)) == NUM_IDS}, share of 1 bits {ratio:.4f}")
    assert all(len(r) == 16 for r in raw)  # 128 bits, URL-safe base64 without padding
    assert len(set(raw)) == NUM_IDS
    assert len({r[:4] for r in raw}) == NUM_IDS  # no shared 32-bit prefix: not a counter
    # 25,600 bits: a fair source is within 0.02 of one half (over 6 sigma) but for a bug.
    assert abs(ratio - 0.5) < 0.02, ratio


async def test_frames_over_the_limit_close_1009(server, figures):
    async with aiohttp.ClientSession() as http:
        ws, _ = await connect(http, server, headers=auth(KEY_A))
        head = '{"type":"ping","t":"'
        at_limit = head + "x" * (MAX_BYTES - len(head) - 2) + '"}'
        assert len(at_limit) == MAX_BYTES
        await ws.send_str(at_limit)
        pong = await recv(ws)  # exactly at the limit: served
        await ws.send_str(at_limit[:-2] + 'x"}')  # one byte over
        closed = await ws.receive(timeout=30)
        binary, _ = await connect(http, server, headers=auth(KEY_A))
        await binary.send_bytes(b"\x00" * (MAX_BYTES * 4))
        closed_binary = await binary.receive(timeout=30)
    figures("frames over max_message_bytes", tried=2,
            survived=int(closed.data == 1009) + int(closed_binary.data == 1009), lost=0,
            notes=f"a {MAX_BYTES}-byte frame is served (pong); {MAX_BYTES + 1} bytes (text) "
                  f"and {MAX_BYTES * 4} bytes (binary) close with {closed.data} and "
                  f"{closed_binary.data}")
    assert pong["type"] == "pong" and len(pong["t"]) == MAX_BYTES - len(head) - 2
    assert closed.type == aiohttp.WSMsgType.CLOSE and closed.data == 1009, closed
    assert closed_binary.type == aiohttp.WSMsgType.CLOSE and closed_binary.data == 1009


async def test_no_secret_or_prompt_in_logs_at_default_level(server, figures):
    """Runs last in this module: the log then holds every request above, failed auth,
    chat turns with the canary prompt, and an HTTP completion with it."""
    async with aiohttp.ClientSession() as http:
        async with http.post(server.http_url + "/v1/chat/completions", headers=auth(KEY_B),
                             json={"messages": [{"role": "user", "content": PROMPT_CANARY}],
                                   "max_tokens": 4}) as r:
            assert r.status == 200
            assert (await r.json())["choices"][0]["message"]["content"] is not None
        ws, hello = await connect(http, server, headers=auth(KEY_A))  # ids are capabilities
        await ws.close()
    log = server.log()
    secrets_ = {"API key A": KEY_A, "API key B": KEY_B, "wrong key tried": WRONG_KEY,
                "prompt text": PROMPT_CANARY, "session id": hello["session_id"]}
    found = [name for name, value in secrets_.items() if value in log]
    figures("secrets and prompts in the log (default level INFO)", tried=len(secrets_),
            survived=len(secrets_) - len(found), lost=len(found),
            notes=f"{len(log.splitlines())} log lines grepped; found: {found or 'none'}")
    assert "INFO" in log  # the default level really logs
    assert not found, found
