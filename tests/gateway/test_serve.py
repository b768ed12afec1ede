"""`tokenwire serve` as its own process: up on the default model, drains on SIGTERM."""
from __future__ import annotations

import asyncio
import signal
import socket
import sys

import aiohttp

from ws_helpers import open_ws, recv_type


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_ready(session: aiohttp.ClientSession, url: str, proc, timeout: float = 180):
    deadline = asyncio.get_running_loop().time() + timeout
    while asyncio.get_running_loop().time() < deadline:
        assert proc.returncode is None, "tokenwire serve exited"
        try:
            async with session.get(url + "/ready") as r:
                if r.status == 200:
                    return
            async with session.get(url + "/health") as r:
                # 503: loading failed; the process stays up to say so
                assert r.status != 503, "tokenwire serve failed to load its model"
        except aiohttp.ClientConnectionError:
            pass  # not listening yet
        await asyncio.sleep(0.2)
    raise AssertionError("tokenwire serve did not become ready")


async def test_serve_finishes_running_turn_on_sigterm_then_exits(tmp_path):
    port = free_port()
    log = open(tmp_path / "serve.log", "wb")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), "--num-threads",
        "1", stdout=log, stderr=asyncio.subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as s:
            await wait_ready(s, url, proc)
            ws, hello = await open_ws(s, url)
            assert hello["model"] == "SmolLM2-135M-Instruct"
            await ws.send_json({"type": "generate", "id": "g", "prompt": "Hello",
                                "params": {"max_tokens": 24, "ignore_eos": True}})
            await recv_type(ws, "delta")
            proc.send_signal(signal.SIGTERM)
            frames = []
            async for msg in ws:  # until the server closes the socket
                frames.append(msg.json())
            kinds = [f["type"] for f in frames if f["type"] != "delta"]
            assert kinds == ["draining", "done"]  # the running turn was let finish
            assert frames[-1]["finish_reason"] == "length"
            assert ws.close_code == 1012
        assert await asyncio.wait_for(proc.wait(), 60) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        log.close()
