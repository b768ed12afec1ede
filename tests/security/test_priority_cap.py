"""`priority` capped per key on a real `tokenwire serve`: by default no client may ask for
more than a request that names none gets (0), so none can jump the queue; an operator
raises one key's cap with --key-max-priority KEY_ID=N. Beyond the cap a request is refused
(400 naming `priority` on HTTP, an invalid_request error on /v1/ws), never clamped."""
from __future__ import annotations

import hashlib

import aiohttp
import pytest

from loadtest.server_process import ServerProcess

KEY, TRUSTED = "sk-priority-test-key-0123456789", "sk-priority-trusted-key-012345"
TRUSTED_ID = hashlib.sha256(TRUSTED.encode()).hexdigest()[:12]  # as the access log shows
TINY = ["--model", "dummy:tiny", "--device", "cpu", "--num-threads", "1",
        "--attention-backend", "torch", "--num-kv-blocks", "64", "--session-store", "memory:"]


@pytest.fixture(scope="module")
def server():
    with ServerProcess([*TINY, "--api-key", KEY, "--api-key", TRUSTED,
                        "--key-max-priority", f"{TRUSTED_ID}=50"]) as server:
        yield server


async def _chat(http, server, key: str, priority: int) -> tuple[int, str | None, str]:
    async with http.post(server.base + "/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1,
            "priority": priority}, headers={"Authorization": f"Bearer {key}"}) as r:
        body = await r.json()
    error = body.get("error") or {}
    return r.status, error.get("param"), error.get("message", "")


async def test_http_priority_beyond_the_keys_cap_is_refused(server):
    async with aiohttp.ClientSession() as http:
        got = {(name, p): await _chat(http, server, key, p)
               for name, key in (("key", KEY), ("trusted", TRUSTED)) for p in (-5, 0, 1, 50, 51)}
    statuses = {k: v[0] for k, v in got.items()}
    assert statuses == {("key", -5): 200, ("key", 0): 200, ("key", 1): 400, ("key", 50): 400,
                        ("key", 51): 400, ("trusted", -5): 200, ("trusted", 0): 200,
                        ("trusted", 1): 200, ("trusted", 50): 200, ("trusted", 51): 400}
    assert got[("key", 1)][1] == "priority" and "at most 0" in got[("key", 1)][2]
    assert got[("trusted", 51)][1] == "priority" and "at most 50" in got[("trusted", 51)][2]


async def test_a_socket_request_beyond_the_cap_gets_invalid_request(server):
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url,
                                   headers={"Authorization": f"Bearer {KEY}"}) as ws:
            await ws.receive_json(timeout=30)  # hello
            await ws.send_json({"type": "generate", "id": "g", "prompt": "Hi",
                                "params": {"max_tokens": 1, "priority": 10}})
            error = await ws.receive_json(timeout=30)
    assert (error["type"], error["id"], error["code"]) == ("error", "g", "invalid_request")
    assert "priority" in error["message"] and "at most 0" in error["message"]
