"""Test clients: a WebSocket client that runs many requests on one socket and times them."""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass
class Result:
    """What the client saw of one request (times from time.perf_counter)."""

    id: str
    sent: float
    deltas: list[float] = field(default_factory=list)  # arrival time of each delta frame
    tokens: int = 0
    end: float | None = None
    finish_reason: str | None = None
    error: str | None = None  # the error code, if refused
    retry_after_ms: int | None = None
    done: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def ttft(self) -> float:
        return self.deltas[0] - self.sent

    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.deltas, self.deltas[1:])]


class WsClient:
    """One socket; `generate` sends a request, a reader task sorts frames by id."""

    def __init__(self, session: aiohttp.ClientSession, url: str):
        self._session, self._url = session, url
        self.results: dict[str, Result] = {}
        self.ws = None
        self._reader = None

    async def __aenter__(self):
        self.ws = await self._session.ws_connect(self._url + "/v1/ws", compress=0)
        hello = json.loads((await self.ws.receive()).data)
        assert hello["type"] == "hello"
        self.session_id = hello["session_id"]
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc):
        await self.ws.close()
        self._reader.cancel()

    async def generate(self, request_id: str, prompt: str, max_tokens: int) -> Result:
        """Send one generate; the Result fills in as frames arrive (`done` is set at the end)."""
        params = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        frame = json.dumps({"type": "generate", "id": request_id, "prompt": prompt,
                            "params": params})
        result = self.results[request_id] = Result(request_id, time.perf_counter())
        await self.ws.send_str(frame)
        return result

    async def _read(self):
        async for msg in self.ws:
            frame = json.loads(msg.data)
            result = self.results.get(frame.get("id"))
            if result is None:
                continue
            now = time.perf_counter()
            if frame["type"] == "delta":
                result.deltas.append(now)
                result.tokens += frame["n"]
            elif frame["type"] in ("done", "error"):
                result.end = now
                result.finish_reason = frame.get("finish_reason")
                result.error = frame.get("code")
                result.retry_after_ms = frame.get("retry_after_ms")
                result.done.set()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]
