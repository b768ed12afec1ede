"""The app's shared state, stored under typed AppKeys."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from aiohttp import web

from engine.async_engine import AsyncEngine
from engine.outputs import EngineStats
from gateway.gate import Gate
from gateway.config import GatewayConfig
from gateway.metrics import Metrics
from gateway.sessions import SessionRegistry


@dataclass
class Runtime:
    """Everything handlers share: the engine (None while it loads), limits, registries.

    status: "loading" -> "ready" -> "draining"; "failed" if the model did not load or the
    engine died (then `engine_dead` is set: the process should exit for a restart).
    """

    config: GatewayConfig
    metrics: Metrics
    gate: Gate
    sessions: SessionRegistry
    engine: AsyncEngine | None = None
    status: str = "loading"
    reason: str = "model loading"
    connections: set = field(default_factory=set)  # open gateway.connection.Connection
    http_streams: set = field(default_factory=set)  # running HTTP completions (for drain)
    engine_dead: asyncio.Event = field(default_factory=asyncio.Event)

    def engine_stats(self) -> EngineStats | None:
        return self.engine.stats() if self.engine is not None else None

    @property
    def ready(self) -> bool:
        return self.status == "ready" and self.engine is not None and self.engine.is_alive


RUNTIME = web.AppKey("runtime", Runtime)
