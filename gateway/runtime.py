"""Runtime: what every handler of one app shares, stored under a typed AppKey.

    status: the default model's (loading -> ready, or failed) until a drain, then
            "draining"; failed wins over draining (an engine that died says why)
    model:  the model the current task is bound to (select_model: a request's `model`,
            a socket's ?model=), else the default; held loaded by hold_model/using_model
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TypeVar

from aiohttp import web

from engine.errors import PromptTooLongError
from gateway.config import GatewayConfig
from gateway.errors import RequestError
from gateway.metrics import Metrics
from gateway.sessions.kv import SessionKV
from gateway.sessions.registry import SessionRegistry
from gateway.stream import Stream
from gateway.tokens import ClientSecrets
from scheduler.door import Admission, Ask, Scheduler
from scheduler.models import FAILED, UNLOADED, ModelSlot
from scheduler.registry import ModelRegistry, ModelUnavailable, UnknownModel
from scheduler.ticket import DoorPass, InvalidAdmission, Rejected

T = TypeVar("T")

# The model a request's task works with. A context variable, not an argument: the model is
# chosen once where the request (or socket) starts, and the tasks it starts inherit it,
# so the code that renders, admits and streams reads `rt.model` as it did with one model.
_BOUND: contextvars.ContextVar[ModelSlot | None] = contextvars.ContextVar("tokenwire_model",
                                                                         default=None)


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
    session_kv: SessionKV = field(init=False)  # sessions' KV parked and prefetched

    def __post_init__(self):
        self.tokens = ClientSecrets(self.config.client_secret_key, self.config.key_hashes)
        self.session_kv = SessionKV(self.scheduler.models, self.config.kv_park_idle_s,
                                    self.config.render_timeout_s,
                                    self.config.tool_call_parser)
        self.sessions.on_saved = self.session_kv.saved

    @property
    def model(self) -> ModelSlot:
        """The model this task is bound to (select_model), else the default model."""
        return _BOUND.get() or self.scheduler.model

    @property
    def default_model(self) -> ModelSlot:
        return self.scheduler.model

    @property
    def status(self) -> str:
        if self.draining and self.default_model.state != FAILED:
            return "draining"
        return self.default_model.state

    @property
    def reason(self) -> str:
        return "draining" if self.status == "draining" else self.default_model.reason

    @property
    def ready(self) -> bool:
        """The default model loaded and alive (or unloaded by an explicit unload or its
        keep-alive: it loads again on the next request), not draining."""
        return (self.status == "ready" and self.default_model.alive) or \
            self.status == UNLOADED

    def find_model(self, name: str | None, request_id: str | None = None) -> ModelSlot:
        """The model `name` routes to (None: the default); a RequestError model_not_found
        naming the served ones."""
        try:
            return self.scheduler.models.resolve(name)
        except UnknownModel as exc:
            raise RequestError(exc.code, str(exc), request_id, param="model") from None

    def select_model(self, name: str | None, request_id: str | None = None) -> ModelSlot:
        """Bind this task (and the tasks it starts from now on) to find_model(name)."""
        slot = self.find_model(name, request_id)
        _BOUND.set(slot)
        return slot

    async def hold_model(self, request_id: str | None = None) -> ModelSlot:
        """Hold the bound model loaded (loading it first if it must) until this task ends:
        a held model is never unloaded. A RequestError model_unavailable when it cannot
        load (the loader's error)."""
        slot, models = self.model, self.scheduler.models
        asyncio.current_task().add_done_callback(lambda _: models.release(slot))
        await _hold(models, slot, request_id)
        return slot

    def request_context(self, name: str | None, request_id: str) -> contextvars.Context:
        """A copy of this task's context for a request's own task, bound to the model
        `name` routes to (None or "": this task's model, a socket's); a RequestError
        model_not_found as select_model's."""
        context = contextvars.copy_context()
        if name:
            context.run(self.select_model, name, request_id)
        return context

    @contextlib.asynccontextmanager
    async def using_model(self, request_id: str | None = None,
                          on_load: Callable[[ModelSlot], None] | None = None
                          ) -> AsyncIterator[ModelSlot]:
        """hold_model for a block rather than the task's life; `on_load(model)` runs when
        the hold must wait for the model to load."""
        slot, models = self.model, self.scheduler.models
        try:
            await _hold(models, slot, request_id,
                        None if on_load is None else lambda: on_load(slot))
            yield slot
        finally:
            models.release(slot)

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
        render_timeout_s; past it, or for a prompt refused by its length before encoding,
        a too_large RequestError."""
        try:
            return await self.model.off_loop(job, self.config.render_timeout_s)
        except asyncio.TimeoutError:
            raise RequestError("too_large", "the prompt took longer than "
                               f"{self.config.render_timeout_s:g} s to render and tokenize; "
                               "send a shorter one", request_id) from None
        except PromptTooLongError as exc:
            raise RequestError("too_large", str(exc), request_id) from None

    def check_door(self, stream: Stream, priority: int, socket: object | None,
                   owner: str | None) -> DoorPass:
        """Refuse now (a RequestError, as admit's) if admission would refuse even an empty
        prompt: called before rendering, so a burst's refusals skip the tokenizer's queue.
        The pass holds the request's place: close it before `admit`, or on giving up."""
        with self._admission_errors(stream):
            return self.scheduler.check_door(Ask(_kind(stream), priority, 0, socket, owner),
                                             self.model)

    async def admit(self, stream: Stream, priority: int, prompt_tokens: int,
                    socket: object | None, owner: str | None) -> Admission:
        """An engine slot for `stream` (waiting in the queue if it must), or a
        RequestError: rate_limited or overloaded (with retry_after_ms), invalid_request."""
        with self._admission_errors(stream):
            return await self.scheduler.admit(
                Ask(_kind(stream), priority, prompt_tokens, socket, owner), self.model)

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


async def _hold(models: ModelRegistry, slot: ModelSlot, request_id: str | None,
                on_load: Callable[[], None] | None = None) -> None:
    """ModelRegistry.hold, its refusals as RequestErrors: model_unavailable (the loader's
    error), overloaded (too many waiting for the load)."""
    try:
        await models.hold(slot, on_load)
    except ModelUnavailable as exc:
        raise RequestError(exc.code, str(exc), request_id) from None
    except Rejected as exc:
        raise RequestError(exc.code, str(exc), request_id,
                           retry_after_ms=exc.retry_after_ms) from None


RUNTIME = web.AppKey("runtime", Runtime)
