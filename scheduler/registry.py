"""ModelRegistry: the served models by name, each loaded on demand and unloaded when idle.

    resolve(name)      -> its ModelSlot (None: the default model), or UnknownModel
    await hold(slot)   -> the model loaded (one shared load however many wait), held until
                          release(slot): a held model is never unloaded
    release(slot)      -> once idle, unloaded after its keep_alive_s (0: at once, -1: never)

Loads run one at a time: a load is CPU- and memory-heavy, two at once would each take
twice as long and together could overrun the budget. Before a load, least recently used
idle models other than the default (it is what /ready reports) are unloaded until the
model's footprint fits `memory_budget` (its footprint
as measured at its last load; a model never loaded is taken to be as large as the
largest measured). A model that fails to load stays failed, answering its requests with
the loader's error, until an explicit load (POST /v1/models/{name}/load) retries it; so
does a loaded model whose engine dies (every loaded engine is watched).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

from engine import DeviceGate
from scheduler import heap
from scheduler.models import FAILED, READY, ModelSlot
from scheduler.policy import OVERLOADED
from scheduler.ticket import Rejected

log = logging.getLogger(__name__)
DEFAULT_ALIAS = "default"  # a request's model name that always means the default model


class UnknownModel(LookupError):
    """No model of that name is served: model_not_found (404 on HTTP)."""

    code = "model_not_found"

    def __init__(self, name: str, served: list[str]):
        super().__init__(f"the model {name[:200]!r} does not exist; this server serves "
                         + ", ".join(repr(s) for s in served))


class ModelUnavailable(RuntimeError):
    """The model failed to load (or its engine died): the loader's error, 503 on HTTP."""

    code = "model_unavailable"


class ModelBusy(RuntimeError):
    """An unload asked of a model that requests hold: 409 on HTTP."""

    code = "model_busy"


class ModelRegistry:
    """The models in --model order (the first is the default), their holds and loads.
    Their engines take turns at `device_gate` (engine/device_gate.py; None: each engine
    a gate of its own, so they step at once)."""

    def __init__(self, slots: list[ModelSlot], memory_budget: int | None = None,
                 max_load_waiters: int = 160, retry_after_ms: int = 1000,
                 device_gate: DeviceGate | None = None):
        if not slots:
            raise ValueError("at least one model is served")
        self.slots = slots
        for slot in slots:
            slot.share_device(device_gate or DeviceGate())
        self.memory_budget = memory_budget
        # Requests that may wait for one model's load; beyond, `overloaded` (a load can
        # take a minute: its waiters are bounded like the admission queue they go to).
        self.max_load_waiters = max_load_waiters
        self.retry_after_ms = retry_after_ms
        self._holds: dict[ModelSlot, int] = {s: 0 for s in slots}
        self._last_used: dict[ModelSlot, float] = {s: 0.0 for s in slots}
        self._loads: dict[ModelSlot, asyncio.Task] = {}
        self._timers: dict[ModelSlot, asyncio.TimerHandle] = {}
        self._load_lock = asyncio.Lock()
        self._went_idle = asyncio.Event()  # set when a hold ends (a load over budget waits)
        self._tasks: set[asyncio.Task] = set()  # the keep-alive unloads under way
        self._watchers: dict[ModelSlot, asyncio.Task] = {}  # each loaded engine's death
        # Before the first load of several models: what a load imports, imported while no
        # model streams yet (engine.loader.import_loading_code)
        self._loading_code_imported = False

    @property
    def default(self) -> ModelSlot:
        return self.slots[0]

    def names(self) -> list[str]:
        return [s.name for s in self.slots]

    def resolve(self, name: str | None) -> ModelSlot:
        """The model `name` routes to: None or "" is the default; with one model served,
        every name is that model (clients may send any `model`, as before several were
        served); "default" is the default model unless a model is served under that name
        (the README's examples send it, and must not break when a second model is added);
        else UnknownModel."""
        if not name or len(self.slots) == 1:
            return self.default
        for slot in self.slots:
            if slot.name == name:
                return slot
        if name == DEFAULT_ALIAS:
            return self.default
        raise UnknownModel(name, self.names())

    def state(self, slot: ModelSlot) -> str:
        """loaded, loading, unloaded or failed (as /v1/models shows it)."""
        return "loaded" if slot.state == READY else slot.state

    def holds(self, slot: ModelSlot) -> int:
        return self._holds[slot]

    # -- holding ---------------------------------------------------------------------------
    async def hold(self, slot: ModelSlot, on_load: Callable[[], None] | None = None) -> None:
        """Hold `slot` loaded, loading it (or joining its load) first; ModelUnavailable
        when it cannot load, Rejected (overloaded) when too many wait for its load. Every
        hold, even a refused one, ends with release(slot). `on_load` runs once the hold
        is taken if it must wait for a load (a client told its request waits)."""
        self._holds[slot] += 1
        if not slot.loaded and self._holds[slot] > self.max_load_waiters:
            raise Rejected(OVERLOADED, self.retry_after_ms, f"model {slot.name!r} is "
                           f"loading and {self.max_load_waiters} requests wait for it")
        self._touch(slot)
        if on_load is not None and not slot.loaded and slot.state != FAILED:
            on_load()
        await self.ensure_loaded(slot)

    def release(self, slot: ModelSlot) -> None:
        self._holds[slot] -= 1
        self._touch(slot)
        if self._holds[slot] == 0:
            self._schedule_idle_unload(slot)
            self._went_idle.set()

    async def ensure_loaded(self, slot: ModelSlot) -> None:
        if slot.state == FAILED:
            raise ModelUnavailable(slot.reason)
        if slot.loaded:
            return
        task = self._loads.get(slot)
        if task is None:
            task = self._loads[slot] = asyncio.create_task(self._load(slot))
            task.add_done_callback(lambda _: self._loads.pop(slot, None))
        await asyncio.shield(task)  # one waiter cancelled does not cancel the others' load
        if not slot.loaded:
            raise ModelUnavailable(slot.reason)

    # -- load and unload -------------------------------------------------------------------
    async def preload(self, slot: ModelSlot) -> None:
        """Load at start; a failure stays in the slot's state (/health, /v1/models)."""
        with contextlib.suppress(ModelUnavailable):
            await self.ensure_loaded(slot)
        self._schedule_idle_unload(slot)

    async def load(self, slot: ModelSlot) -> None:
        """Load now (POST .../load): a failed model is retried (a dead engine stopped and
        dropped first)."""
        if slot.state == FAILED and not slot.given:
            await self._unload(slot)
        self._touch(slot)
        await self.ensure_loaded(slot)
        self._schedule_idle_unload(slot)

    async def unload(self, slot: ModelSlot) -> None:
        """Unload now (POST .../unload); ModelBusy while requests hold it."""
        if self._holds[slot] or slot in self._loads:
            raise ModelBusy(f"model {slot.name!r} has {self._holds[slot]} requests "
                            "running or waiting for it")
        await self._unload(slot)

    async def _load(self, slot: ModelSlot) -> None:
        async with self._load_lock:
            if slot.loaded:
                return
            if not self._loading_code_imported and len(self.slots) > 1:
                await asyncio.to_thread(_import_loading_code)
                self._loading_code_imported = True
            await self._make_room(slot)
            await slot.load()
            if slot.loaded:
                self._watch(slot)

    def _watch(self, slot: ModelSlot) -> None:
        """Mark the model failed once its engine dies (ModelSlot.watch): its requests are
        answered model_unavailable, the others serve on, a load retries it."""
        task = self._watchers[slot] = asyncio.get_running_loop().create_task(slot.watch())
        task.add_done_callback(lambda _: self._watch_ended(slot, task))

    def _watch_ended(self, slot: ModelSlot, task: asyncio.Task) -> None:
        if self._watchers.get(slot) is task:
            del self._watchers[slot]
        if slot.state == FAILED:
            log.error("model %s failed: %s", slot.name, slot.reason)

    async def _make_room(self, slot: ModelSlot) -> None:
        """Unload idle models, least recently used first, until `slot` fits the budget;
        wait for a hold to end while what is loaded is all in use."""
        if self.memory_budget is None:
            return
        need = slot.memory_bytes or max((s.memory_bytes for s in self.slots), default=0)
        while self._in_use_bytes() + need > self.memory_budget:
            idle = [s for s in self.slots[1:] if s is not slot and s.loaded
                    and not s.given and self._holds[s] == 0]
            if not idle:
                if not any(s.loaded and s is not slot for s in self.slots[1:]):
                    log.warning("model %s does not fit the memory budget beside the "
                                "default model; loading it anyway", slot.name)
                    return
                self._went_idle.clear()  # loads run one at a time: the only waiter
                await self._went_idle.wait()
                continue
            victim = min(idle, key=self._last_used.__getitem__)
            log.info("unloading %s to fit %s in the %d MB budget", victim.name,
                     slot.name, self.memory_budget >> 20)
            await self._unload(victim)

    def _in_use_bytes(self) -> int:
        return sum(s.memory_bytes for s in self.slots if s.loaded)

    async def _unload(self, slot: ModelSlot) -> None:
        if not slot.loaded and slot.state != FAILED:
            return
        self._cancel_idle_unload(slot)
        watcher = self._watchers.pop(slot, None)
        if watcher is not None:  # a clean stop is no death
            watcher.cancel()
        # slot.unload marks the slot unloaded before its first await: a hold that comes
        # while the engine stops then waits for a load of its own, where one that found
        # the slot still "loaded" would lose the engine under its request
        await slot.unload()
        if watcher is not None:  # its frame holds the engine until it ends
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
        start = time.perf_counter()
        _return_memory(slot.loaded_at_freeze)
        log.info("model %s unloaded (its memory returned in %.0f ms)", slot.name,
                 (time.perf_counter() - start) * 1e3)

    # -- keep-alive ------------------------------------------------------------------------
    def _touch(self, slot: ModelSlot) -> None:
        self._last_used[slot] = time.monotonic()
        self._cancel_idle_unload(slot)

    def _cancel_idle_unload(self, slot: ModelSlot) -> None:
        timer = self._timers.pop(slot, None)
        if timer is not None:
            timer.cancel()

    def _schedule_idle_unload(self, slot: ModelSlot) -> None:
        if slot.keep_alive_s < 0 or slot.given or not slot.loaded or self._holds[slot]:
            return
        self._timers[slot] = asyncio.get_running_loop().call_later(
            slot.keep_alive_s, self._spawn_expire, slot)

    def _spawn_expire(self, slot: ModelSlot) -> None:
        task = asyncio.get_running_loop().create_task(self._expire(slot))
        self._tasks.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(self._tasks.discard)

    async def _expire(self, slot: ModelSlot) -> None:
        self._timers.pop(slot, None)
        if self._holds[slot] == 0 and slot not in self._loads:
            await self._unload(slot)

    async def stop(self) -> None:
        for task in [*self._loads.values(), *self._tasks, *self._watchers.values()]:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        for timer in self._timers.values():
            timer.cancel()
        for slot in self.slots:
            await slot.stop()


def _import_loading_code() -> None:
    from engine import import_loading_code  # imports torch: only with models to load

    import_loading_code()


def _return_memory(loaded_at: int) -> None:
    """Collect the unloaded engine's cycles (`loaded_at`: heap.freezes() when it loaded)
    and hand the freed heap back to the OS."""
    from engine import release_free_heap  # glibc keeps freed step buffers otherwise

    heap.collect_unloaded(loaded_at)
    release_free_heap()
