"""Runtime: what every handler of one app shares, stored under a typed AppKey.

    status: the model's (loading -> ready, or failed) until a drain, then "draining";
            failed wins over draining (an engine that died says why)
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from aiohttp import web

from gateway.config import GatewayConfig
from gateway.errors import RequestError
from gateway.metrics import Metrics
from gateway.sessions.registry import SessionRegistry
from gateway.stream import Stream
from scheduler.door import Admission, Ask, Scheduler
from scheduler.models import FAILED, ModelSlot
from scheduler.ticket import InvalidAdmission, Rejected


@dataclass
class Runtime:
    """The app's config, metrics, scheduler (the one door to the engine), sessions, and
    the open sockets and HTTP streams a drain must reach."""

    config: GatewayConfig
    metrics: Metrics
    scheduler: Scheduler
    sessions: SessionRegistry
    draining: bool = False
    connections: set = field(default_factory=set)  # open gateway.sockets.core.SocketCore
    http_streams: set = field(default_factory=set)  # running HTTP completions

    @property
    def model(self) -> ModelSlot:
        return self.scheduler.model

    @property
    def status(self) -> str:
        if self.draining and self.model.state != FAILED:
            return "draining"
        return self.model.state

    @property
    def reason(self) -> str:
        return "draining" if self.status == "draining" else self.model.reason

    @property
    def ready(self) -> bool:
        return self.status == "ready" and self.model.alive

    def limits(self) -> dict:
        """The `limits` object of protocol v1's `hello`."""
        return {"max_tokens": self.config.max_tokens_cap,
                "max_context": self.model.max_model_len,
                "max_message_bytes": self.config.max_message_bytes,
                "max_inflight": self.scheduler.config.max_inflight_per_socket}

    async def admit(self, stream: Stream, priority: int, prompt_tokens: int,
                    socket: object | None, owner: str | None) -> Admission:
        """An engine slot for `stream` (waiting in the queue if it must), or a
        RequestError: rate_limited or overloaded (with retry_after_ms), invalid_request."""
        ask = Ask("chat" if stream.kind == "chat" else "generate", priority, prompt_tokens,
                  socket, owner)
        try:
            return await self.scheduler.admit(ask)
        except InvalidAdmission as exc:
            raise RequestError(exc.code, f"params.{exc}", stream.id, param=exc.field) from None
        except Rejected as exc:
            self.metrics.rejections.labels(exc.code).inc()
            self.metrics.refusal_time.observe(time.perf_counter() - stream.received)
            raise RequestError(exc.code, str(exc), stream.id,
                               retry_after_ms=exc.retry_after_ms) from None


RUNTIME = web.AppKey("runtime", Runtime)
