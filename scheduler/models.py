"""ModelSlot: a served model and the engine behind it, as the gateway sees it.

    state:  unloaded ──load()──> loading ──> ready ──engine dies──> failed
               ^                    └── load fails ──> failed
               └──────── unload() ─────────┘ (ready or failed)

The gateway reads what a model is (name, context length, chat template) and turns text
into token ids here; it never holds the engine. Requests reach the engine only through
an Admission (scheduler/door.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

import psutil

from scheduler import heap

if TYPE_CHECKING:
    from engine import (
        AsyncEngine,
        DeviceGate,
        EngineConfig,
        EngineStats,
        GateParty,
        SamplingParams,
    )

log = logging.getLogger(__name__)

UNLOADED, LOADING, READY, FAILED = "unloaded", "loading", "ready", "failed"
T = TypeVar("T")


def _rss() -> int:
    """The server's resident memory with its children's: a model's tokenizer process
    (engine.tokenizer_process) is part of what loading it costs."""
    process = psutil.Process()
    total = process.memory_info().rss
    for child in process.children():
        with contextlib.suppress(psutil.Error):  # one that just ended
            total += child.memory_info().rss
    return total


def served_name(source: str) -> str:
    """The name a model from `source` is served under when none is given (its own)."""
    from engine import served_name as engine_name  # imports torch: only when serving

    return engine_name(source)


class ModelSlot:
    """One model: an engine the caller started (`engine`, owned by the caller) or one
    built from `config` (loaded in a thread by `load()`, stopped by `stop()`). `on_ready`
    runs once the engine is ready (the entry point's process-wide settings). `name` is the
    name requests route by (None: the engine's own, known once loaded); `keep_alive_s`:
    idle seconds before the registry unloads it (0: after each request, -1: never);
    `preload`: loaded at start rather than on first use."""

    def __init__(self, engine: AsyncEngine | None = None, config: EngineConfig | None = None,
                 on_ready: Callable[[], None] | None = None, *, name: str | None = None,
                 keep_alive_s: float = -1, preload: bool = True):
        if (engine is None) == (config is None):
            raise ValueError("give exactly one of engine or config")
        self._engine: AsyncEngine | None = None
        self._config = config
        self._given = engine
        self._on_ready = on_ready
        self._name = name
        self.keep_alive_s = keep_alive_s
        self.preload = preload
        self.state, self.reason = (LOADING, "model loading") if preload else \
            (UNLOADED, "model not loaded")
        self.memory_bytes = 0  # what the process's RSS grew by when it last loaded
        self.loads = 0
        self.loaded_at_freeze = 0  # heap.freezes() when it last loaded (unload's collection)
        self._max_model_len: int | None = None  # kept once known: a socket's hello shows it
        self.dead = asyncio.Event()  # set once a ready engine died
        # Templates and tokenization run here, off the event loop. One thread: a fast
        # tokenizer's encode is not safe from several threads at once (it sets its
        # truncation state per call), and one bounded job at a time keeps a huge prompt
        # from taking more than its share.
        self._text_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")
        self._token_texts: dict[int, str] = {}  # bounded by the vocabulary
        self._gate: GateParty | None = None  # its turns at the device, across its loads

    def share_device(self, gate: DeviceGate) -> None:
        """Its engine's forward steps take their turns at `gate`, with the other models'
        (from its next load; an engine the caller started keeps its own)."""
        if self._given is None:
            self._gate = gate.party()

    # -- lifecycle -------------------------------------------------------------------------
    async def load(self) -> None:
        """Build (in a thread) and start the engine, or take the given one. A failure to
        load is kept in `state`/`reason`, not raised: /health and /ready report it."""
        if self._given is not None:
            self._set_ready(self._given)
            return
        from engine import AsyncEngine  # loads the model's code: only when one is built

        self.state, self.reason = LOADING, "model loading"
        before = _rss()  # after the engine's code is imported: that is not this model's
        try:
            engine = await asyncio.to_thread(AsyncEngine, self._engine_config(), gate=self._gate)
            await engine.start()
        except Exception as exc:  # noqa: BLE001 - reported by /health and /ready
            log.exception("model %s failed to load", self._name or self._config.model)
            self.state, self.reason = FAILED, f"model failed to load: {exc}"
            return
        self.memory_bytes = max(0, _rss() - before)
        self.loads += 1
        self._set_ready(engine)
        log.info("model %s loaded (%d MB); ready", self.name, self.memory_bytes >> 20)

    def _engine_config(self) -> EngineConfig:
        """Its config, `tokenizer_process` "auto" decided: on for a load while other models
        may be streaming (on demand, or a reload), off for a load at start."""
        if self._config.tokenizer_process != "auto":
            return self._config
        on_demand = self.loads > 0 or not self.preload
        return dataclasses.replace(self._config, tokenizer_process="on" if on_demand else "off")

    async def watch(self) -> None:
        """Return once the engine's loop has died (state failed, `dead` set)."""
        if self._engine is None:
            return  # the model did not load: state says so
        cause = await self._engine.wait_dead()
        self.state, self.reason = FAILED, f"engine is dead: {cause}"
        self.dead.set()

    async def stop(self) -> None:
        """Stop the engine this slot built (an engine given to it is the caller's)."""
        self._text_thread.shutdown(wait=False, cancel_futures=True)
        if self._given is None and self._engine is not None:
            with contextlib.suppress(Exception):
                await self._engine.stop()

    async def unload(self) -> None:
        """Stop the engine and drop it: its weights, KV pool and prefix cache go with the
        last reference (the registry calls this only while no request holds the model)."""
        if self._given is not None:
            raise ValueError("a model whose engine the caller started is not unloaded here")
        engine, self._engine = self._engine, None
        self._token_texts.clear()  # this model's tokenizer may not be the next load's
        self.state, self.reason = UNLOADED, "model not loaded"
        if engine is not None:
            with contextlib.suppress(Exception):
                await engine.stop()

    def _set_ready(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self.loaded_at_freeze = heap.freezes()  # before on_ready, which may freeze it
        self._max_model_len = engine.max_model_len
        if self._on_ready is not None:
            self._on_ready()
        if self.state == LOADING:
            self.state, self.reason = READY, ""

    # -- what the gateway reads ------------------------------------------------------------
    @property
    def given(self) -> bool:
        """Whether the engine was started by the caller (ready as soon as `load()` runs)."""
        return self._given is not None

    @property
    def alive(self) -> bool:
        return self._engine is not None and self._engine.is_alive

    @property
    def loaded(self) -> bool:
        return self.state == READY and self._engine is not None

    @property
    def name(self) -> str:
        if self._name is not None:
            return self._name
        if self._engine is not None or self._given is not None:
            return (self._engine or self._given).model_name
        return served_name(self._config.model)  # what the engine will call it

    @property
    def source(self) -> str:
        """What the model is loaded from (--model's SOURCE), or the given engine's name."""
        return self._config.model if self._config is not None else self._given.model_name

    @property
    def max_model_len(self) -> int | None:
        """The context length (None until the model has loaded once)."""
        return self._max_model_len

    @property
    def supports_tools(self) -> bool:
        return self._engine.chat_template_supports_tools

    @property
    def chat_template(self) -> str:
        return self._engine.tokenizer.chat_template or ""

    def stats(self) -> EngineStats | None:
        return self._engine.stats() if self._engine is not None else None

    @property
    def gate(self) -> GateParty | None:
        """Its engine's party at the device gate (turns, waits, device time: they only
        grow, across loads); None while no engine has been given one."""
        if self._gate is None and self._engine is not None:
            return self._engine.gate
        return self._gate

    # -- text <-> token ids ----------------------------------------------------------------
    async def off_loop(self, job: Callable[[], T], timeout: float) -> T:
        """Run `job` (a template render, a tokenization, a prompt's fitting: CPU work that
        grows with the client's input) on the tokenizer's thread, so the event loop never
        waits on it; TimeoutError once `timeout` seconds pass (the job, bounded by the
        input's size, still runs to its end, with no one waiting). asyncio.timeout, not
        wait_for: on Python 3.11 wait_for drops a cancellation that lands as the job ends
        (returning its result), and a cancelled request would run on to its end."""
        future = asyncio.get_running_loop().run_in_executor(self._text_thread, job)
        async with asyncio.timeout(timeout):
            return await future

    def encode(self, text: str) -> list[int]:
        return self._engine.encode(text)

    def encode_chat(self, messages: Sequence[dict], tools: list[dict] | None = None,
                    **template: object) -> list[int]:
        return self._engine.encode_chat(messages, tools, **template)

    def decode(self, token_ids: list[int]) -> str:
        return self._engine.tokenizer.decode(token_ids)

    def token_text(self, token_id: int) -> str:
        """One token's text as the tokenizer decodes it alone (as vLLM shows it): a token
        holding part of a UTF-8 character shows U+FFFD."""
        text = self._token_texts.get(token_id)
        if text is None:
            text = self._token_texts[token_id] = self._engine.tokenizer.decode([token_id])
        return text

    def validate(self, prompt: list[int], params: SamplingParams) -> None:
        """Raise what the engine would raise for this request, before admission."""
        self._engine.validate(prompt, params)

    # -- a session's KV in the engine's tiers (AsyncEngine.park etc.; 0: not loaded) -----
    @property
    def has_kv_tiers(self) -> bool:
        return self._engine is not None and self._engine.has_kv_tiers

    async def park_kv(self, token_ids: Sequence[int], retain_s: float | None = None) -> int:
        if self._engine is None:
            return 0
        return await self._engine.park(token_ids, retain_s)

    async def prefetch_kv(self, token_ids: Sequence[int]) -> int:
        return await self._engine.prefetch(token_ids) if self._engine is not None else 0

    async def forget_kv(self, token_ids: Sequence[int], keep_tokens: int = 0) -> int:
        if self._engine is None:
            return 0
        return await self._engine.forget(token_ids, keep_tokens)

    def engine(self) -> AsyncEngine:
        """The engine itself: for the scheduler's dispatch, not for the gateway."""
        return self._engine
