"""The gateway's one admission seam: every chat, generate and HTTP completion passes `admit`.

For now it enforces two limits: requests in flight per socket (`rate_limited`) and the
engine's waiting queue depth (`overloaded`, with a retry hint).
SEAM (issue 4): the scheduler package replaces the body of `Gate.admit` with its
`scheduler.Admission` (bounded queues, KV/GPU signals with hysteresis, priorities); the
callers only rely on `await admit(...) -> Ticket` raising ProtocolError and on
`Ticket.release()`, so that swap stays inside this file.
"""
from __future__ import annotations

from collections.abc import Callable

from engine.outputs import EngineStats
from gateway.config import GatewayConfig
from gateway.metrics import Metrics
from gateway.protocol import ProtocolError


class Ticket:
    """Proof of admission; `release()` (idempotent) frees the slot when the request ends."""

    __slots__ = ("_owner", "_released")

    def __init__(self, owner: "InflightCounter | None"):
        self._owner = owner
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            if self._owner is not None:
                self._owner.count -= 1


class InflightCounter:
    """Requests admitted and not yet released on one socket."""

    __slots__ = ("count",)

    def __init__(self):
        self.count = 0


class Gate:
    """Admission control shared by every socket and HTTP request of one app."""

    def __init__(self, config: GatewayConfig, engine_stats: Callable[[], EngineStats | None],
                 metrics: Metrics):
        self.config = config
        self._engine_stats = engine_stats
        self._metrics = metrics

    async def admit(self, request_id: str | None, inflight: InflightCounter | None,
                    kind: str, priority: int = 0) -> Ticket:
        """Admit one request or raise ProtocolError (rate_limited / overloaded).

        kind: "chat" | "generate" | "http"; with priority, orders queued work once the
        scheduler queues (chat turns ahead of bulk generate).
        """
        del kind, priority  # SEAM: used by scheduler.Admission once it lands
        if inflight is not None and inflight.count >= self.config.max_inflight_per_socket:
            self._metrics.rejections.labels("rate_limited").inc()
            raise ProtocolError("rate_limited", f"at most {self.config.max_inflight_per_socket}"
                                " requests in flight per socket", request_id)
        stats = self._engine_stats()
        if stats is not None and stats.num_waiting >= self.config.max_engine_waiting:
            self._metrics.rejections.labels("overloaded").inc()
            raise ProtocolError("overloaded", "the engine queue is full; retry later",
                                request_id, retry_after_ms=self.config.overload_retry_after_ms)
        if inflight is not None:
            inflight.count += 1
        return Ticket(inflight)

    def overloaded(self) -> bool:
        """Whether new work would be refused now (for /ready)."""
        stats = self._engine_stats()
        return stats is not None and stats.num_waiting >= self.config.max_engine_waiting
