"""A real tokenwire server on loopback, shared by the gateway tests.

The server runs the way `tokenwire serve` does: its own thread and uvloop event loop, one
AsyncEngine on the default model (CPU), and any number of apps built on that engine with
different GatewayConfigs (auth, small limits, ...), each on its own port. Tests talk to it
with real clients (aiohttp, openai, wscat, Chromium) from their own event loops.
"""
from __future__ import annotations

import asyncio
import ssl as ssl_module
import threading
import time

import openai
import pytest
import torch
import uvloop
from aiohttp import web

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from gateway.app import build_app, make_runner
from gateway.cli.server import freeze_startup_heap
from gateway.config import GatewayConfig
from gateway.runtime import RUNTIME
from gateway.sessions.store import SessionStore
from scheduler.config import SchedulerConfig
from scheduler.door import Scheduler
from scheduler.models import ModelSlot

FAST = {"heartbeat_s": 5.0, "send_timeout_s": 5.0, "drain_timeout_s": 5.0}


class ServerThread:
    """An event loop thread holding one engine and the apps served from it."""

    def __init__(self):
        self.loop = uvloop.new_event_loop()
        self._runners: dict[str, web.AppRunner] = {}
        self.apps: dict[str, web.Application] = {}
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.engine: AsyncEngine = self.call(self._start_engine())

    def call(self, coro, timeout: float = 120.0):
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _start_engine(self) -> AsyncEngine:
        # One thread: other suites share the CI box's two cores.
        torch.set_num_threads(1)
        config = EngineConfig(model="default", device="cpu", num_kv_blocks=512,
                              max_model_len=2048, max_num_batched_tokens=512, max_num_seqs=4)
        engine = await asyncio.to_thread(AsyncEngine, config)
        await engine.start()
        return engine

    def start_app(self, scheduler: SchedulerConfig | None = None,
                  engine: AsyncEngine | None = None, store: SessionStore | None = None,
                  ssl: ssl_module.SSLContext | None = None, **overrides) -> str:
        """Serve a new app (GatewayConfig fields as keywords, admission limits in
        `scheduler`, the shared engine unless given one, sessions in `store`, else in
        memory; over TLS with `ssl`) on a free port; its base URL."""
        config = GatewayConfig(port=0, **{**FAST, **overrides})
        return self.call(self._start_app(config, scheduler, engine or self.engine, store, ssl))

    async def _start_app(self, config: GatewayConfig, scheduler: SchedulerConfig | None,
                         engine: AsyncEngine, store: SessionStore | None,
                         ssl: ssl_module.SSLContext | None = None) -> str:
        # As `tokenwire serve` does: the startup heap frozen once the engine is ready.
        model = ModelSlot(engine=engine, on_ready=freeze_startup_heap)
        app = build_app(config, Scheduler(scheduler or SchedulerConfig(), model), store)
        runner = make_runner(app, shutdown_timeout=1.0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=ssl)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001 - port 0 chosen
        url = f"{'https' if ssl else 'http'}://127.0.0.1:{port}"
        self._runners[url], self.apps[url] = runner, app
        return url

    def stop_app(self, url: str) -> None:
        self.call(self._runners.pop(url).cleanup())
        self.apps.pop(url)

    def close(self) -> None:
        for url in list(self._runners):
            self.stop_app(url)
        self.call(self.engine.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def all_blocks_free(self, timeout: float = 10.0) -> bool:
        """Whether every KV block is back in the free pool and no app's door still holds a
        place for a request that ended (waits up to timeout)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            s = self.engine.stats()
            if (s.num_free_blocks == s.num_total_blocks and not s.num_running
                    and not any(self._door_places(app) for app in list(self.apps.values()))):
                return True
            time.sleep(0.05)
        return False

    @staticmethod
    def _door_places(app: web.Application) -> int:
        """Admission's open passes and slots, over the app's models."""
        return sum(a.num_at_door + a.num_running
                   for a in app[RUNTIME].scheduler.admissions.values())


@pytest.fixture(scope="session")
def server():
    srv = ServerThread()
    yield srv
    srv.close()


@pytest.fixture(scope="session")
def base_url(server):
    """The default app: no auth, default limits."""
    return server.start_app()


@pytest.fixture
def client(base_url):
    """The openai SDK on the default app (a test file may define its own)."""
    return openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0)
