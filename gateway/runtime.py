"""Runtime: what every handler of one app shares, stored under a typed AppKey.

    status: the model's (loading -> ready, or failed) until a drain, then "draining";
            failed wins over draining (an engine that died says why)
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from aiohttp import web

from gateway.config import GatewayConfig
from gateway.errors import RequestError
from gateway.metrics import Metrics
from gateway.sessions.registry import SessionRegistry
from gateway.stream import Stream
from gateway.tokens import ClientSecrets
from scheduler.door import Admission, Ask, Scheduler
from scheduler.models import FAILED, ModelSlot
from scheduler.ticket import InvalidAdmission, Rejected

T = TypeVar("T")


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
    # open sockets and HTTP requests per API key (its hash)
    key_holds: collections.Counter = field(default_factory=collections.Counter)
    tokens: ClientSecrets = field(init=False)  # ephemeral client secrets of the keys

    def __post_init__(self):
        self.tokens = ClientSecrets(self.config.client_secret_key, self.config.key_hashes)

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

    def take_key_slot(self, owner: str | None) -> None:
        """Count an open socket or HTTP request against its key's max_connections_per_key
        (give it back with give_key_slot); a RequestError (rate_limited) beyond it."""
        if owner is None:
            return
        if self.key_holds[owner] >= self.config.max_connections_per_key:
            raise RequestError("rate_limited", "too many open sockets and requests for this "
                               "API key (max_connections_per_key)", retry_after_ms=1000)
        self.key_holds[owner] += 1

    def give_key_slot(self, owner: str | None) -> None:
        if owner is None:
            return
        self.key_holds[owner] -= 1
        if self.key_holds[owner] <= 0:
            del self.key_holds[owner]

    async def tokenize(self, job: Callable[[], T], request_id: str | None = None) -> T:
        """Run a prompt's rendering and tokenization off the event loop within
        render_timeout_s; past it, a too_large RequestError."""
        try:
            return await self.model.off_loop(job, self.config.render_timeout_s)
        except asyncio.TimeoutError:
            raise RequestError("too_large", "the prompt took longer than "
                               f"{self.config.render_timeout_s:g} s to render and tokenize; "
                               "send a shorter one", request_id) from None

    def check_door(self, stream: Stream, priority: int, socket: object | None,
                   owner: str | None) -> None:
        """Refuse now (a RequestError, as admit's) if admission would refuse even an empty
        prompt: called before rendering, so a burst's refusals skip the tokenizer's queue."""
        with self._admission_errors(stream):
            self.scheduler.check_door(Ask(_kind(stream), priority, 0, socket, owner))

    async def admit(self, stream: Stream, priority: int, prompt_tokens: int,
                    socket: object | None, owner: str | None) -> Admission:
        """An engine slot for `stream` (waiting in the queue if it must), or a
        RequestError: rate_limited or overloaded (with retry_after_ms), invalid_request."""
        with self._admission_errors(stream):
            return await self.scheduler.admit(
                Ask(_kind(stream), priority, prompt_tokens, socket, owner))

    @contextlib.contextmanager
    def _admission_errors(self, stream: Stream):
        """The scheduler's refusals as RequestErrors, counted and timed for /metrics."""
        try:
            yield
        except InvalidAdmission as exc:
            raise RequestError(exc.code, f"params.{exc}", stream.id, param=exc.field) from None
        except Rejected as exc:
            self.metrics.rejections.labels(exc.code).inc()
            self.metrics.refusal_time.observe(time.perf_counter() - stream.received)
            raise RequestError(exc.code, str(exc), stream.id,
                               retry_after_ms=exc.retry_after_ms) from None


def _kind(stream: Stream) -> str:
    """Admission's class for a stream: chat turns run ahead of bulk generates."""
    return "chat" if stream.kind == "chat" else "generate"


RUNTIME = web.AppKey("runtime", Runtime)
