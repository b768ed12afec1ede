"""Secure by default: a server that could be reached from elsewhere needs keys, a web page
from another site cannot drive it from a visitor's browser, /metrics needs a key (or its
own port), and a key never comes back in a response header or a log line."""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys

import aiohttp
from loadtest.server_process import REPO, free_port

KEY = "sk-defaults-test-key-0123456789"


def test_a_non_loopback_bind_without_keys_refuses_to_start():
    serve = [sys.executable, "-m", "gateway.cli", "serve", "--host", "0.0.0.0",
             "--port", str(free_port()), "--device", "cpu"]
    refused = subprocess.run(serve, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "needs API keys" in refused.stderr and "--insecure-no-auth" in refused.stderr


async def _status(http: aiohttp.ClientSession, url: str, **kwargs) -> tuple[int, str | None]:
    """(101 or the refusal's HTTP status, the subprotocol the server chose)."""
    try:
        ws = await http.ws_connect(url, **kwargs)
    except aiohttp.WSServerHandshakeError as exc:
        return exc.status, None
    chosen = ws.protocol
    await ws.close()
    return 101, chosen


async def test_origins_default_to_the_servers_own_and_loopback(serve):
    server = serve()
    url, port = server.ws_url, server.port
    async with aiohttp.ClientSession() as http:
        got = {origin: (await _status(http, url, headers={"Origin": origin}))[0]
               for origin in (f"http://127.0.0.1:{port}", "http://localhost:3000",
                              "https://evil.example", "null")}
        async with http.post(server.base + "/v1/completions", json={"prompt": "Hi"},
                             headers={"Origin": "https://evil.example"}) as r:
            got["HTTP from https://evil.example"] = r.status
    assert got == {f"http://127.0.0.1:{port}": 101, "http://localhost:3000": 101,
                   "https://evil.example": 403, "null": 403,
                   "HTTP from https://evil.example": 403}


async def test_a_key_is_never_echoed_or_logged_and_metrics_need_one(serve, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text(KEY + "\n")
    metrics_port = free_port()
    server = serve("--api-key-file", str(keys), "--metrics-port", str(metrics_port),
                   "--log-level", "INFO", "--access-log")
    async with aiohttp.ClientSession() as http:
        await _status(http, server.ws_url + "?session_id=not-a-real-session-id",
                      headers={"Authorization": f"Bearer {KEY}"})
        await _status(http, server.ws_url)  # no key: 401
        alone = await _status(http, server.ws_url, protocols=(f"bearer.{KEY}",))
        beside = await _status(http, server.ws_url,
                               protocols=("tokenwire.v1", f"bearer.{KEY}"))
        async with http.get(server.base + "/metrics") as r:
            without_key = r.status
        async with http.get(server.base + "/metrics",
                            headers={"Authorization": f"Bearer {KEY}"}) as r:
            with_key = r.status
        async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as r:
            own_port = r.status, "tokenwire_requests_running" in await r.text()
    assert alone == (101, None) and beside == (101, "tokenwire.v1")
    assert (without_key, with_key, own_port) == (401, 200, (200, True))
    log = server.log_tail(1 << 20)
    assert KEY not in log and "not-a-real-session-id" not in log
    access = [json.loads(line.split("tokenwire.access: ", 1)[1]) for line in log.splitlines()
              if "tokenwire.access: " in line]
    key_id = hashlib.sha256(KEY.encode()).hexdigest()[:12]
    assert {"method": "GET", "path": "/v1/ws", "status": 101, "key": key_id}.items() <= \
        next(a for a in access if a["path"] == "/v1/ws" and a["status"] == 101).items()
    assert "refused GET /v1/ws: no API key" in log


def test_insecure_no_auth_serves_open_and_says_so():
    serve = [sys.executable, "-m", "gateway.cli", "serve", "--host", "0.0.0.0",
             "--port", str(free_port()), "--device", "cpu", "--model", "dummy:tiny",
             "--insecure-no-auth"]
    proc = subprocess.Popen(serve, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "listening on" in line:
                break
    finally:
        proc.terminate()
        proc.wait(30)
    assert any("without API keys (--insecure-no-auth)" in line for line in lines), lines
