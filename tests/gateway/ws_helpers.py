"""Small helpers shared by the gateway tests (imported by name: tests/gateway is on sys.path)."""
from __future__ import annotations

import asyncio
import json

import aiohttp

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig


async def open_ws(session: aiohttp.ClientSession, url: str, **kwargs):
    """Connect to url's /v1/ws; returns (socket, its hello frame)."""
    ws = await session.ws_connect(url + "/v1/ws", **kwargs)
    hello = await ws.receive_json()
    assert hello["type"] == "hello"
    return ws, hello


async def recv_until(ws: aiohttp.ClientWebSocketResponse, request_id: str,
                     timeout: float = 60.0) -> tuple[list[dict], dict]:
    """Frames of one request up to its `done` (or `error`): (all frames, the last one)."""
    frames = []
    async with asyncio.timeout(timeout):
        while True:
            msg = await ws.receive()
            assert msg.type == aiohttp.WSMsgType.TEXT, msg
            frame = json.loads(msg.data)
            frames.append(frame)
            if frame.get("id") == request_id and frame["type"] in ("done", "error"):
                return frames, frame


async def recv_type(ws: aiohttp.ClientWebSocketResponse, kind: str, timeout: float = 30.0) -> dict:
    """The next frame of a type, skipping others."""
    async with asyncio.timeout(timeout):
        while True:
            frame = await ws.receive_json()
            if frame["type"] == kind:
                return frame


async def tiny_engine(max_model_len: int = 256) -> AsyncEngine:
    """A small started engine with random weights, for tests that stop or break it while
    the shared one keeps serving the other tests. Call it on the server's loop."""
    config = EngineConfig(model="dummy:tiny", device="cpu", num_kv_blocks=64,
                          max_model_len=max_model_len)
    engine = await asyncio.to_thread(AsyncEngine, config)
    await engine.start()
    return engine
