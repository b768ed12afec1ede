"""Nothing a client holds is held for ever: a stalled SSE reader loses its stream (and its
engine slot) within --send-timeout, a slow request head or body is cut within its
timeout, and connections are capped in all, per address and per key."""
from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time

import aiohttp
import pytest

from loadtest.server_process import REPO, free_port, http_get

KEY_A, KEY_B = "sk-slow-clients-key-a-0123456789", "sk-slow-clients-key-b-0123456789"
TIMEOUT_S = 1.0  # short: the tests below wait each of these timeouts out


@pytest.fixture(scope="module")
def server(serve, tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys"
    keys.write_text(f"{KEY_A}\n{KEY_B}\n")
    return serve("--api-key-file", str(keys), "--send-timeout", str(TIMEOUT_S),
                 "--header-timeout", str(TIMEOUT_S), "--body-timeout", str(TIMEOUT_S),
                 "--max-connections", "40", "--max-connections-per-key", "2",
                 "--max-running-requests", "1", "--initial-drain-rps", "0.01")


def _auth(key: str) -> dict:
    return {"Authorization": f"Bearer {key}"}


def _closed_within(sock: socket.socket, seconds: float, drip: bytes = b"") -> float | None:
    """Seconds until the server closed `sock` (dripping a byte a second meanwhile), or
    None if it was still open after `seconds`."""
    started = time.monotonic()
    sock.settimeout(0.5)
    while time.monotonic() - started < seconds:
        try:
            if drip:
                sock.sendall(drip)
            if sock.recv(4096) == b"":
                return time.monotonic() - started
        except socket.timeout:
            continue
        except OSError:  # reset
            return time.monotonic() - started
    return None


def test_a_slow_request_head_is_cut_within_the_header_timeout(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        took = _closed_within(sock, 4 * TIMEOUT_S, drip=b"X")
    assert took is not None and took < TIMEOUT_S + 1.5


def test_the_next_head_on_a_kept_alive_connection_is_timed_too(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        took = _closed_within(sock, 4 * TIMEOUT_S, drip=b"X")
    assert took is not None and took < TIMEOUT_S + 1.5


def test_a_slow_body_is_cut_within_the_body_timeout(server):
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                     f"{KEY_A}\r\nContent-Type: application/json\r\nContent-Length: 1000"
                     f"\r\n\r\n{{\"prompt\": ".encode())
        started = time.monotonic()
        sock.settimeout(4 * TIMEOUT_S)
        answer = sock.recv(4096)
    assert answer.startswith(b"HTTP/1.1 408") or answer == b""
    assert time.monotonic() - started < TIMEOUT_S + 1.5


async def test_a_stalled_sse_reader_frees_its_slot_within_the_send_timeout(server):
    """Slot held by a client that stops reading a 16-choice stream with 20 alternatives a
    token (its chunks fill the buffers fast); the next request (one engine slot) runs."""
    body = ('{"messages": [{"role": "user", "content": "Tell a long story."}], "n": 16, '
            '"stream": true, "logprobs": true, "top_logprobs": 20, "max_tokens": 1500, '
            '"ignore_eos": true}').encode()
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", server.port))
    stalled.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                    f"{KEY_A}\r\nContent-Type: application/json\r\nContent-Length: "
                    f"{len(body)}\r\n\r\n".encode() + body)
    try:
        await asyncio.sleep(2)  # admitted and streaming into full buffers
        async with aiohttp.ClientSession() as http:
            started = time.monotonic()
            async with http.post(server.base + "/v1/completions", headers=_auth(KEY_B),
                                 json={"prompt": "Hi", "max_tokens": 2},
                                 timeout=aiohttp.ClientTimeout(total=180)) as r:
                assert r.status == 200
            waited = time.monotonic() - started
    finally:
        stalled.close()
    print(f"\nthe next request waited {waited:.1f} s for the stalled stream's slot")
    assert waited < 120


async def test_connections_per_key_are_capped(server):
    async with aiohttp.ClientSession() as http:
        held = [await http.ws_connect(server.ws_url, headers=_auth(KEY_A)) for _ in range(2)]
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(server.ws_url, headers=_auth(KEY_A))
        other = await http.ws_connect(server.ws_url, headers=_auth(KEY_B))
        await held.pop().close()
        again = await http.ws_connect(server.ws_url, headers=_auth(KEY_A))
        for ws in (*held, other, again):
            await ws.close()
    assert refused.value.status == 429


def test_connections_in_all_are_capped(server):
    held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(40)]
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.settimeout(5)
            answer = sock.recv(4096)
    finally:
        for sock in held:
            sock.close()
    assert answer.startswith(b"HTTP/1.1 503") and b"too_many_connections" in answer


def _local_address() -> str | None:
    """This machine's first non-loopback IPv4 address, if it has one."""
    out = subprocess.run(["hostname", "-I"], capture_output=True, text=True).stdout.split()
    addresses = [a for a in out if "." in a and not a.startswith("127.")]
    return addresses[0] if addresses else None


def test_connections_per_address_are_capped():
    address = _local_address()
    if address is None:
        pytest.skip("no non-loopback address on this machine")
    port = free_port()
    serve = [sys.executable, "-m", "gateway.cli", "serve", "--host", "0.0.0.0", "--port",
             str(port), "--device", "cpu", "--model", "dummy:tiny", "--api-key", KEY_A,
             "--max-connections-per-ip", "3", "--log-level", "WARNING"]
    proc = subprocess.Popen(serve, cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while http_get(f"http://127.0.0.1:{port}/health")[0] != 200:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.5)
        held = [socket.create_connection((address, port)) for _ in range(3)]
        with socket.create_connection((address, port)) as sock:
            sock.settimeout(5)
            refused = sock.recv(4096)
        loopback = [socket.create_connection(("127.0.0.1", port)) for _ in range(5)]
        for sock in held + loopback:
            sock.close()
    finally:
        proc.terminate()
        proc.wait(30)
    assert refused.startswith(b"HTTP/1.1 503") and b"too_many_connections" in refused
