"""A request's place at the door: its Ticket (queued, then running, then done) and the two
ways the door says no (Rejected: overloaded or rate-limited; InvalidAdmission: a bad
argument). The AdmissionController (scheduler/admission.py) issues and books tickets."""
from __future__ import annotations

import asyncio

from scheduler.policy import KINDS, OVERLOADED

QUEUED, RUNNING, DONE = "queued", "running", "done"


class Rejected(Exception):
    """A refusal: `code` is `overloaded` or `rate_limited`; retry after `retry_after_ms`."""

    def __init__(self, code: str, retry_after_ms: int, message: str):
        super().__init__(message)
        self.code = code
        self.retry_after_ms = retry_after_ms


class InvalidAdmission(ValueError):
    """An admission argument is out of range (`field` names it): invalid_request."""

    code = "invalid_request"

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field


class DoorPass:
    """A request let past the door that has not asked for its slot yet (its prompt is
    rendering): later arrivals count it ahead of them until `close()`. Idempotent."""

    __slots__ = ("_controller",)

    def __init__(self, controller):
        self._controller = controller

    def close(self) -> None:
        if self._controller is not None:
            self._controller._at_door -= 1
            self._controller = None


class Ticket:
    """One admitted request: queued until granted an engine slot, running until released."""

    __slots__ = ("id", "kind", "priority", "prompt_tokens", "socket_id", "api_key",
                 "created_at", "granted_at", "state", "_future", "_timer", "_controller")

    def __init__(self, controller, ticket_id, kind, priority, prompt_tokens, socket_id,
                 api_key, now):
        self._controller = controller
        self.id, self.kind, self.priority = ticket_id, kind, priority
        self.prompt_tokens, self.socket_id, self.api_key = prompt_tokens, socket_id, api_key
        self.created_at = now
        self.granted_at: float | None = None
        self.state = QUEUED
        self._future: asyncio.Future | None = None  # set while queued
        self._timer: asyncio.TimerHandle | None = None  # its expiry at the TTFT bound

    @property
    def queue_key(self) -> tuple[int, int]:
        return KINDS.index(self.kind), -self.priority

    @property
    def queue_time_s(self) -> float | None:
        return None if self.granted_at is None else self.granted_at - self.created_at

    async def wait(self) -> float:
        """Wait for an engine slot; returns seconds queued. Raises Rejected if the wait
        outlives its queue budget (the slot would come too late for the TTFT bound)."""
        if self.state == QUEUED:
            await self._future
        if self.state != RUNNING:
            raise Rejected(OVERLOADED, self._controller.config.retry_after_min_ms,
                           "request was released before it got an engine slot")
        return self.queue_time_s

    def release(self, tokens_generated: int = 0, finish_reason: str | None = None) -> None:
        """The request is over: free its place (AdmissionController.release). Idempotent."""
        self._controller.release(self, tokens_generated, finish_reason)
