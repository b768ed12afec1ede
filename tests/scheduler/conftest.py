"""A real server on loopback for the scheduler's end-to-end tests.

One AsyncEngine on the default model (CPU) runs on a server thread with its own uvloop
event loop, like `tokenwire serve`; each test serves a fresh app on it with its own
SchedulerConfig, and talks to it with real clients from the test's event loop.
"""
from __future__ import annotations

import asyncio
import threading

import pytest
import torch
import uvloop
from aiohttp import web

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from gateway.app import build_app
from gateway.config import GatewayConfig
from gateway.runtime import RUNTIME
from scheduler.config import SchedulerConfig
from scheduler.door import Scheduler
from scheduler.models import ModelSlot


class Server:
    """A server thread: one engine, and apps built on it on demand."""

    def __init__(self):
        self.loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._runners: list[web.AppRunner] = []
        self.engine: AsyncEngine = self.call(self._start_engine())

    def call(self, coro, timeout: float = 120.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start_engine(self) -> AsyncEngine:
        torch.set_num_threads(1)  # other suites share the CI box's two cores
        config = EngineConfig(model="default", device="cpu", num_kv_blocks=256,
                              max_model_len=1024, max_num_batched_tokens=512, max_num_seqs=16)
        engine = await asyncio.to_thread(AsyncEngine, config)
        await engine.start()
        return engine

    def start_app(self, scheduler: SchedulerConfig, **gateway) -> tuple[str, web.Application]:
        """Serve an app with these limits on a free port: (base URL, app)."""
        config = GatewayConfig(port=0, **{"heartbeat_s": 5.0, **gateway})
        return self.call(self._start_app(config, scheduler))

    async def _start_app(self, config, scheduler):
        app = build_app(config, Scheduler(scheduler, ModelSlot(engine=self.engine)))
        runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=5.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self._runners.append(runner)
        port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - port 0 chosen
        return f"http://127.0.0.1:{port}", app

    def runtime(self, app: web.Application):
        return app[RUNTIME]

    def close(self) -> None:
        for runner in self._runners:
            self.call(runner.cleanup())
        self.call(self.engine.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.fixture(scope="session")
def server():
    srv = Server()
    yield srv
    srv.close()
