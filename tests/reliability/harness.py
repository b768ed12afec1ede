"""A real `tokenwire serve` subprocess on loopback and small WebSocket client helpers.

The reliability suite talks to the server exactly as a user would: a process started by
the CLI, HTTP and WebSocket over TCP, signals from outside.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

from .probe import PROBE_FILE_ENV

REPO = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 180.0
FRAME_TIMEOUT_S = 60.0
# The codes docs/protocol.md lists for `error` frames.
ERROR_CODES = frozenset({
    "invalid_json", "invalid_request", "unknown_type", "duplicate_id", "not_found", "busy",
    "too_large", "overloaded", "rate_limited", "unauthorized", "draining", "internal",
    "store_unavailable"})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`tokenwire serve` (through probe.py) on 127.0.0.1; stderr goes to `log_path`."""

    def __init__(self, log_path: Path, *args: str, port: int | None = None,
                 env: dict | None = None, module: str = "tests.reliability.probe"):
        self.port = port or free_port()
        self.module = module  # the entry point: probe.py, or a launcher that injects faults
        # One engine thread: other suites share the CI box's two cores.
        self.args = ["--host", "127.0.0.1", "--port", str(self.port), "--device", "cpu",
                     "--num-threads", "1", *args]
        self.log_path = log_path
        self.probe_path = log_path.with_suffix(".probe.json")
        self.env = {**os.environ, PROBE_FILE_ENV: str(self.probe_path), **(env or {})}
        self.proc: subprocess.Popen | None = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://127.0.0.1:{self.port}/v1/ws"

    def start(self) -> "ServerProcess":
        log = open(self.log_path, "ab")  # appended across restarts
        self.proc = subprocess.Popen(
            [sys.executable, "-m", self.module, "serve", *self.args], cwd=REPO,
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        log.close()
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    pass
                if _http_status(self.port, "/ready") == 200:
                    return
                # 503 on /health: loading failed; the process stays up to say so
                if _http_status(self.port, "/health") == 503:
                    raise RuntimeError(f"server failed to load:\n{self.log()}")
            except OSError:
                pass
            time.sleep(0.25)
        raise TimeoutError(f"server not ready after {READY_TIMEOUT_S}s:\n{self.log()}")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def terminate(self) -> None:
        self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        """Teardown: SIGTERM, then SIGKILL if it has not gone in 20 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill9()

    def probe(self, timeout: float = 10.0) -> dict:
        """What the server holds now: tasks, fds, TCP connections (see probe.py)."""
        self.probe_path.unlink(missing_ok=True)
        self.proc.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + timeout
        while not self.probe_path.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no probe answer in {timeout}s")
            time.sleep(0.05)
        return json.loads(self.probe_path.read_text())

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _http_status(port: int, path: str) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        head = s.recv(64).decode(errors="replace")
    return int(head.split()[1]) if head.startswith("HTTP/") else 0


async def connect(http: aiohttp.ClientSession, server: ServerProcess,
                  session_id: str | None = None, **kwargs):
    """Open a socket and read its `hello`; returns (ws, hello)."""
    params = {"session_id": session_id} if session_id else None
    ws = await http.ws_connect(server.ws_url, params=params, **kwargs)
    hello = await recv(ws)
    assert hello["type"] == "hello", hello
    return ws, hello


async def recv(ws, timeout: float = FRAME_TIMEOUT_S) -> dict:
    """The next JSON frame; fails on a close or a non-text frame. (Not receive(timeout=):
    aiohttp restarts that timeout at every heartbeat ping, so it never fires.)"""
    msg = await asyncio.wait_for(ws.receive(), timeout)
    if msg.type != aiohttp.WSMsgType.TEXT:
        raise AssertionError(f"expected a text frame, got {msg.type} {msg.data!r} {msg.extra!r}")
    return json.loads(msg.data)


async def until_end(ws, request_id: str, timeout: float = FRAME_TIMEOUT_S):
    """Collect one request's frames up to its `done` or `error`; returns (text, last)."""
    parts = []
    while True:
        frame = await recv(ws, timeout)
        if frame.get("id") != request_id:
            continue
        if frame["type"] == "delta":
            parts.append(frame["text"])
        elif frame["type"] in ("done", "error"):
            return "".join(parts), frame


async def generate_once(server: ServerProcess, max_tokens: int) -> dict:
    """One short generate on a new socket; its `done` (or error) frame plus the text."""
    async with aiohttp.ClientSession() as http:
        ws, _ = await connect(http, server)
        await ws.send_json({"type": "generate", "id": "once", "prompt": "Hello",
                            "params": {"max_tokens": max_tokens, "ignore_eos": True}})
        text, end = await until_end(ws, "once")
        await ws.close()
    return {**end, "text": text}


async def chat(ws, request_id: str, content: str, max_tokens: int = 8) -> tuple[str, dict]:
    await ws.send_json({"type": "chat", "id": request_id, "content": content,
                        "params": {"max_tokens": max_tokens, "temperature": 0}})
    return await until_end(ws, request_id)


async def history(ws) -> list[dict]:
    await ws.send_json({"type": "session.history"})
    while True:
        frame = await recv(ws)
        if frame["type"] == "session.history":
            return frame["messages"]


async def scrape(http: aiohttp.ClientSession, server: ServerProcess) -> dict[str, float]:
    """Unlabelled tokenwire_ samples from /metrics, by name."""
    async with http.get(server.http_url + "/metrics") as resp:
        text = await resp.text()
    values = {}
    for line in text.splitlines():
        if line.startswith("tokenwire_") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


async def settle(http, server, want: dict[str, float], timeout: float = 30.0) -> dict:
    """Scrape until every metric in `want` has its value (or the timeout); returns the last."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        values = await scrape(http, server)
        if all(values.get(k) == v for k, v in want.items()):
            return values
        if asyncio.get_running_loop().time() > deadline:
            return values
        await asyncio.sleep(0.1)
