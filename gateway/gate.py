"""Gate: the gateway's side of admission. Every chat, generate and HTTP completion passes
`await gate.admit(...)`, which returns the scheduler's Ticket (release it when the request
ends) or raises ProtocolError.

The policy and its bookkeeping are the scheduler's (scheduler.admission): per-socket and
per-key limits, the bounded priority queue, overload signals, retry_after_ms. What is the
gateway's is the glue: the wire error a refusal becomes, the rejection metric, and the
admission queue counted as waiting in /metrics.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

from engine.outputs import EngineStats
from gateway.config import GatewayConfig
from gateway.metrics import Metrics
from gateway.protocol import ProtocolError
from scheduler.admission import AdmissionController
from scheduler.ticket import InvalidAdmission, Rejected, Ticket
from scheduler.config import SchedulerConfig
from scheduler.metrics import register_metrics
from scheduler.signals import ResourceSampler

_KINDS = {"chat": "chat", "generate": "generate", "http": "generate"}  # HTTP is bulk


class Gate:
    """Admission control shared by every socket and HTTP request of one app."""

    def __init__(self, config: GatewayConfig, engine_stats: Callable[[], EngineStats | None],
                 metrics: Metrics, scheduler_config: SchedulerConfig | None = None):
        # The socket limit is the one `hello` announces: the gateway's.
        scheduler_config = dataclasses.replace(
            scheduler_config or SchedulerConfig(),
            max_inflight_per_socket=config.max_inflight_per_socket)
        self._engine_stats = engine_stats
        self._metrics = metrics
        self.sampler = ResourceSampler(scheduler_config.nvml_interval_s)
        self.controller = AdmissionController(scheduler_config, engine_stats, self.sampler)
        register_metrics(metrics.registry, self.controller)

    async def start(self) -> None:
        await self.controller.start()

    async def stop(self) -> None:
        await self.controller.stop()

    async def admit(self, request_id: str | None, socket: object | None,
                    kind: str, priority: int = 0, prompt_tokens: int = 0,
                    api_key: str | None = None, *, received: float) -> Ticket:
        """Admit one request, waiting for an engine slot if queued, or raise ProtocolError
        (rate_limited / overloaded with retry_after_ms / invalid_request). `socket`
        identifies the request's socket to the per-socket limit (None: HTTP); `received`
        (perf_counter) is when its request arrived, for the refusal-time histogram."""
        try:
            ticket = self.controller.try_admit(_KINDS[kind], priority, prompt_tokens,
                                               socket, api_key)
        except InvalidAdmission as exc:
            raise ProtocolError(exc.code, f"params.{exc}", request_id) from None
        except Rejected as exc:
            raise self._refusal(exc, request_id, received) from None
        try:
            await ticket.wait()
        except Rejected as exc:
            raise self._refusal(exc, request_id, received) from None
        except BaseException:
            ticket.release()  # cancelled while queued: give the place back
            raise
        return ticket

    def refuse_queued(self, code: str, retry_after_ms: int, message: str) -> None:
        """Refuse every request still waiting for an engine slot (the drain's deadline)."""
        self.controller.refuse_queued(code, retry_after_ms, message)

    def _refusal(self, exc: Rejected, request_id: str | None, received: float) -> ProtocolError:
        self._metrics.rejections.labels(exc.code).inc()
        self._metrics.refusal_time.observe(time.perf_counter() - received)
        return ProtocolError(exc.code, str(exc), request_id, retry_after_ms=exc.retry_after_ms)

    def stats(self) -> EngineStats | None:
        """The engine's stats with the admission queue counted as waiting (for /metrics)."""
        stats = self._engine_stats()
        if stats is None:
            return None
        return dataclasses.replace(stats, num_waiting=stats.num_waiting
                                   + self.controller.num_waiting)

    def gpu_sample(self) -> tuple[float, int] | None:
        s = self.sampler
        return None if s.gpu_util is None else (s.gpu_util, s.gpu_memory_used)

    def overloaded(self) -> bool:
        """Whether an overload signal holds now (for /ready)."""
        return self.controller.overloaded is not None
