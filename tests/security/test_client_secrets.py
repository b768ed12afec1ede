"""Ephemeral client secrets (POST /v1/realtime/client_secrets) on a real `tokenwire serve`:
minted with a key through the openai SDK, they open /v1/realtime and /v1/ws as that key
(its sessions), until they expire; nothing else takes them, and a forged, altered or
foreign-secret token is refused. Neither a token nor a key reaches the log."""
from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import os
import shutil
import struct
import time
from pathlib import Path

import aiohttp
import openai
import pytest
import websockets

from gateway.tokens import ClientSecrets
from loadtest.server_process import ServerProcess

KEY, OTHER_KEY = "sk-secrets-test-key-0123456789", "sk-secrets-other-key-9876543210"
SECRET = "s" * 40  # --client-secret-key: what every replica behind one balancer shares
JS = Path(__file__).parents[1] / "gateway" / "js"
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
TINY = ["--model", "dummy:tiny", "--device", "cpu", "--num-threads", "1",
        "--attention-backend", "torch", "--num-kv-blocks", "64", "--session-store", "memory:"]


@pytest.fixture(scope="module")
def server():
    with ServerProcess([*TINY, "--api-key", KEY, "--api-key", OTHER_KEY,
                        "--client-secret-key", SECRET, "--log-level", "INFO",
                        "--access-log"]) as server:
        yield server


def mint(server, key: str = KEY, **body):
    client = openai.OpenAI(base_url=server.base + "/v1", api_key=key)
    return client.realtime.client_secrets.create(**body)


async def realtime(server, token: str) -> tuple[int, dict | None]:
    """(101 or the refusal's status, the first event) for a browser-style connection."""
    url = server.ws_url.replace("/v1/ws", "/v1/realtime")
    try:
        async with websockets.connect(
                url, subprotocols=["realtime", f"openai-insecure-api-key.{token}"]) as ws:
            return 101, json.loads(await ws.recv())
    except websockets.InvalidStatus as exc:
        return exc.response.status_code, None


async def v1_hello(http, server, credential: str, session_id: str = "") -> dict | int:
    """The `hello` (or the refusal's status); a new session is saved (a system prompt) so
    that it can be resumed."""
    url = server.ws_url + (f"?session_id={session_id}" if session_id else "")
    try:
        async with http.ws_connect(url, protocols=("tokenwire.v1", f"bearer.{credential}")) \
                as ws:
            hello = await ws.receive_json(timeout=30)
            if not hello["resumed"]:
                await ws.send_json({"type": "session.update", "system": "Be brief."})
                assert (await ws.receive_json(timeout=30))["type"] == "session.updated"
            return hello
    except aiohttp.WSServerHandshakeError as exc:
        return exc.status


async def test_a_secret_opens_both_sockets_as_its_key(server):
    secret = mint(server, expires_after={"anchor": "created_at", "seconds": 120},
                  session={"type": "realtime", "model": "dummy:tiny"})
    assert secret.value.startswith("ek_") and 118 <= secret.expires_at - time.time() <= 121
    assert secret.session.type == "realtime"
    status, created = await realtime(server, secret.value)
    assert (status, created["type"]) == (101, "session.created")
    async with aiohttp.ClientSession() as http:
        hello = await v1_hello(http, server, secret.value)
        # The session it made belongs to KEY: KEY resumes it, OTHER_KEY does not.
        by_key = await v1_hello(http, server, KEY, hello["session_id"])
        by_other = await v1_hello(http, server, OTHER_KEY, hello["session_id"])
    assert hello["type"] == "hello"
    assert by_key["resumed"] is True and by_other["resumed"] is False
    log = server.log_tail(1 << 20)
    assert secret.value not in log and secret.value[3:] not in log and KEY not in log
    key_id = hashlib.sha256(KEY.encode()).hexdigest()[:12]
    assert f'"path": "/v1/realtime", "status": 101, ' in log and key_id in log


async def test_a_secret_is_refused_once_expired(server):
    secret = mint(server, expires_after={"anchor": "created_at", "seconds": 1})
    await asyncio.sleep(max(0.0, secret.expires_at - time.time()) + 0.2)
    assert (await realtime(server, secret.value))[0] == 401
    assert "refused GET /v1/realtime: an expired client secret" in server.log_tail(1 << 20)


async def test_a_secret_opens_nothing_but_the_sockets(server):
    token = mint(server).value
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
        async with http.post(server.base + "/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}) as r:
            chat = r.status
        async with http.get(server.base + "/metrics") as r:
            metrics = r.status
        async with http.post(server.base + "/v1/realtime/client_secrets") as r:
            another = r.status
    assert (chat, metrics, another) == (401, 401, 401)


async def test_forged_altered_and_foreign_secrets_are_refused(server):
    token = mint(server).value
    body = token[3:]
    altered = "ek_" + body[:20] + ("A" if body[20] != "A" else "B") + body[21:]
    # Its own key id and MAC, a later expiry: only the MAC can tell.
    raw = bytearray(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    raw[1:9] = struct.pack(">Q", int(time.time()) + 86400)
    extended = "ek_" + base64.urlsafe_b64encode(bytes(raw)).rstrip(b"=").decode()
    owner = hashlib.sha256(KEY.encode()).hexdigest()
    later = int(time.time()) + 300
    foreign = ClientSecrets("x" * 40, frozenset({owner})).mint(owner, later)
    # The same secret (another replica's, say) is accepted: nothing is stored per token.
    replica = ClientSecrets(SECRET, frozenset({owner})).mint(owner, later)
    got = {name: (await realtime(server, value))[0] for name, value in
           {"altered": altered, "extended": extended, "foreign": foreign, "truncated": token[:-4],
            "garbage": "ek_not-a-token", "replica": replica}.items()}
    assert got == {"altered": 401, "extended": 401, "foreign": 401, "truncated": 401, "garbage": 401,
                   "replica": 101}


async def test_minting_needs_a_key_and_a_valid_body(server):
    async with aiohttp.ClientSession() as http:
        async with http.post(server.base + "/v1/realtime/client_secrets") as r:
            without_key = r.status
        answers = []
        for body in ({"expires_after": {"seconds": 7201}},
                     {"session": {"type": "realtime", "instructions": "be brief"}},
                     {"session": {"model": "gpt-realtime"}}):
            async with http.post(server.base + "/v1/realtime/client_secrets", json=body,
                                 headers={"Authorization": f"Bearer {KEY}"}) as r:
                answers.append((r.status, (await r.json())["error"]["param"]))
    assert without_key == 401
    assert answers == [(400, "expires_after.seconds"), (400, "session.instructions"),
                       (400, "session.model")]


async def test_the_browser_page_trades_its_key_for_a_secret(server):
    """Chromium on the page: the key typed in opens the socket through a client secret
    (the server's log shows the mint, then the 101), and no storage keeps the key."""
    for tool in (JS / "node_modules" / "playwright-core", CHROMIUM):
        if not tool.exists():
            pytest.fail(f"{tool} missing: run bash scripts/setup_browser.sh")
    before = len(access_log(server))
    proc = await asyncio.create_subprocess_exec(
        shutil.which("node") or "node", str(JS / "browser_secret.js"), server.base + "/", KEY,
        env={**os.environ, "CHROMIUM": str(CHROMIUM)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()[-2000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert KEY not in result["storage"] and "tokenwire.key" not in result["storage"]
    page = []  # the page's requests; a socket is logged once it has closed
    for _ in range(50):
        page = [(a["path"], a["status"]) for a in access_log(server)[before:]]
        if ("/v1/ws", 101) in page:
            break
        await asyncio.sleep(0.1)
    # Before the key is typed the page's sockets get 401; after, a mint, then the socket.
    minted = page.index(("/v1/realtime/client_secrets", 200))
    after = set(page[minted:])
    assert ("/v1/ws", 101) in after, page
    assert after <= {("/v1/realtime/client_secrets", 200), ("/v1/ws", 101)}, page


def access_log(server) -> list[dict]:
    return [json.loads(line.split("tokenwire.access: ", 1)[1])
            for line in server.log_tail(1 << 20).splitlines() if "tokenwire.access: " in line]
