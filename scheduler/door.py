"""Scheduler: the gateway's one door to the engine.

    gateway                               scheduler                        engine
    -------                               ---------                        ------
    admission = await admit(Ask)  ──>  AdmissionController: admit,
                                       queue (bounded) or refuse
                                       (Rejected, InvalidAdmission)
    admission.generate(prompt, ...) ─────────────────────────────>  AsyncEngine.generate
        <── outputs, merged in the request's Mailbox ─────────────────────┘
    admission.release(tokens, finish)  ──>  the slot goes to the next in the queue

The gateway hands over token ids and SamplingParams and gets RequestOutputs back; it
never holds the engine. Admission decides from counters and the latest signal samples
(scheduler/policy.py); the engine's stats and NVML are read here, never per token.
"""
from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine import DeviceGate
from scheduler.admission import AdmissionController
from scheduler.config import SchedulerConfig
from scheduler.models import ModelSlot
from scheduler.registry import ModelRegistry
from scheduler.signals import ResourceSampler
from scheduler.ticket import DoorPass, Ticket

if TYPE_CHECKING:
    from engine import EngineStats, RequestOutput, SamplingParams


@dataclass(frozen=True, slots=True)
class Ask:
    """What admission weighs: the request's class (`chat` turns run ahead of bulk
    `generate`), its priority and prompt length, and whose it is (the socket, None for
    HTTP; the owner's key hash, None without auth) for the per-socket and per-key limits."""

    kind: str
    priority: int = 0
    prompt_tokens: int = 0
    socket: object | None = None
    owner: str | None = None


class Admission:
    """An admitted request's engine slot: dispatch its engine request(s) (one, or one per
    sample of `n`), then `release` it, always (idempotent)."""

    __slots__ = ("_ticket", "_model")

    def __init__(self, ticket: Ticket, model: ModelSlot):
        self._ticket = ticket
        self._model = model

    def generate(self, prompt: list[int], params: SamplingParams, request_id: str,
                 parent_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """The request's outputs as the engine produces them; closing the iterator aborts
        the request (its KV blocks freed). `parent_id` shares another live sample's
        prompt blocks (n > 1)."""
        return self._model.engine().generate(prompt, params, request_id, parent_id)

    def release(self, tokens_generated: int = 0, finish_reason: str | None = None) -> None:
        self._ticket.release(tokens_generated, finish_reason)


class Scheduler:
    """Admission, queueing and dispatch in front of the models' engines: `model` is the
    default model, `others` the rest (`--model` order), `memory_budget` the bytes their
    loaded engines may take together (None: no limit).

    Each model has its own AdmissionController (its queue, slots and backpressure, read
    from its own engine's stats); `admission` is the default model's, as it was when one
    model was served. The models' engines run on their own threads and take their forward
    steps in fair turns at one DeviceGate with `config.model_gate` on (off, the default: at
    once, as the OS schedules them; docs/models.md)."""

    def __init__(self, config: SchedulerConfig, model: ModelSlot,
                 sampler: ResourceSampler | None = None, *, others: tuple[ModelSlot, ...] = (),
                 memory_budget: int | None = None):
        self.config = config
        self.model = model
        gate = DeviceGate(config.model_gate_reserve_s) if config.model_gate == "on" else None
        self.models = ModelRegistry(
            [model, *others], memory_budget,
            config.max_running_requests + config.max_waiting_requests,
            config.retry_after_max_ms, gate)
        self.sampler = sampler if sampler is not None else ResourceSampler(
            config.nvml_interval_s)
        self.admission = AdmissionController(config, model.stats, self.sampler)
        self.admissions = {model: self.admission}
        for other in others:  # one sampler, started and stopped with the default's
            self.admissions[other] = AdmissionController(config, other.stats, self.sampler)

    async def start(self) -> None:
        await self.admission.start()

    async def stop(self) -> None:
        """Refuse everything still queued; stop sampling."""
        self.refuse_queued("overloaded", self.config.retry_after_max_ms, "server stopping")
        await self.admission.stop()

    async def admit(self, ask: Ask, model: ModelSlot | None = None) -> Admission:
        """An engine slot of `model` (the default: None) for this request, waiting in its
        queue if it must; raises Rejected (overloaded, rate_limited) or InvalidAdmission
        (a bad priority). The caller holds the model loaded (ModelRegistry.hold)."""
        model = model or self.model
        ticket = self.admissions[model].try_admit(ask.kind, ask.priority, ask.prompt_tokens,
                                                  ask.socket, ask.owner)
        try:
            await ticket.wait()
        except BaseException:
            ticket.release()  # refused or cancelled while queued: give the place back
            raise
        return Admission(ticket, model)

    def check_door(self, ask: Ask, model: ModelSlot | None = None) -> DoorPass:
        """Raise Rejected (or InvalidAdmission) if `model`'s door (the default's: None)
        refuses even an empty prompt now: checked before a prompt is rendered, so a
        refusal costs no tokenizer time. The pass holds the request's place until it
        asks for its slot (`admit`) or gives up: the caller closes it then."""
        return self.admissions[model or self.model].check_door(ask.kind, ask.priority,
                                                              ask.socket, ask.owner)

    def refuse_queued(self, code: str, retry_after_ms: int, message: str) -> None:
        """Refuse every request still waiting for an engine slot (a drain's deadline)."""
        for admission in self.admissions.values():
            admission.refuse_queued(code, retry_after_ms, message)

    def stats(self) -> EngineStats | None:
        """The engine's stats with the admission queue counted as waiting (for /metrics)."""
        stats = self.model.stats()
        if stats is None:
            return None
        return dataclasses.replace(stats, num_waiting=stats.num_waiting
                                   + self.admission.num_waiting)

    def gpu_sample(self) -> tuple[float, int] | None:
        """(utilization 0..1, memory bytes) from NVML, None where there is no GPU."""
        s = self.sampler
        return None if s.gpu_util is None else (s.gpu_util, s.gpu_memory_used)

    def overloaded(self) -> bool:
        """Whether an overload signal holds now on the default model (for /ready)."""
        return self.admission.overloaded is not None
