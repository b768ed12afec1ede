"""ModelSlot: a served model and the engine behind it, as the gateway sees it.

    state:  loading ──load()──> ready ──engine dies──> failed
                       └── load fails ──> failed

The gateway reads what a model is (name, context length, chat template) and turns text
into token ids here; it never holds the engine. Requests reach the engine only through
an Admission (scheduler/door.py).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from engine import AsyncEngine, EngineConfig, EngineStats, SamplingParams

log = logging.getLogger(__name__)

LOADING, READY, FAILED = "loading", "ready", "failed"
T = TypeVar("T")


class ModelSlot:
    """One model: an engine the caller started (`engine`, owned by the caller) or one
    built from `config` (loaded in a thread by `load()`, stopped by `stop()`). `on_ready`
    runs once the engine is ready (the entry point's process-wide settings)."""

    def __init__(self, engine: AsyncEngine | None = None, config: EngineConfig | None = None,
                 on_ready: Callable[[], None] | None = None):
        if (engine is None) == (config is None):
            raise ValueError("give exactly one of engine or config")
        self._engine: AsyncEngine | None = None
        self._config = config
        self._given = engine
        self._on_ready = on_ready
        self.state = LOADING
        self.reason = "model loading"
        self.dead = asyncio.Event()  # set once a ready engine died
        # Templates and tokenization run here, off the event loop. One thread: a fast
        # tokenizer's encode is not safe from several threads at once (it sets its
        # truncation state per call), and one bounded job at a time keeps a huge prompt
        # from taking more than its share.
        self._text_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")
        self._token_texts: dict[int, str] = {}  # bounded by the vocabulary

    # -- lifecycle -------------------------------------------------------------------------
    async def load(self) -> None:
        """Build (in a thread) and start the engine, or take the given one. A failure to
        load is kept in `state`/`reason`, not raised: /health and /ready report it."""
        if self._given is not None:
            self._set_ready(self._given)
            return
        from engine import AsyncEngine  # loads the model's code: only when one is built

        try:
            engine = await asyncio.to_thread(AsyncEngine, self._config)
            await engine.start()
        except Exception as exc:  # noqa: BLE001 - reported by /health and /ready
            log.exception("model failed to load")
            self.state, self.reason = FAILED, f"model failed to load: {exc}"
            return
        self._set_ready(engine)
        log.info("model %s loaded; ready", engine.model_name)

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

    def _set_ready(self, engine: AsyncEngine) -> None:
        self._engine = engine
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
    def name(self) -> str:
        return self._engine.model_name

    @property
    def max_model_len(self) -> int:
        return self._engine.max_model_len

    @property
    def supports_tools(self) -> bool:
        return self._engine.chat_template_supports_tools

    @property
    def chat_template(self) -> str:
        return self._engine.tokenizer.chat_template or ""

    def stats(self) -> EngineStats | None:
        return self._engine.stats() if self._engine is not None else None

    # -- text <-> token ids ----------------------------------------------------------------
    async def off_loop(self, job: Callable[[], T], timeout: float) -> T:
        """Run `job` (a template render, a tokenization, a prompt's fitting: CPU work that
        grows with the client's input) on the tokenizer's thread, so the event loop never
        waits on it; TimeoutError once `timeout` seconds pass (the job, bounded by the
        input's size, still runs to its end, with no one waiting)."""
        future = asyncio.get_running_loop().run_in_executor(self._text_thread, job)
        return await asyncio.wait_for(future, timeout)

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

    def engine(self) -> AsyncEngine:
        """The engine itself: for the scheduler's dispatch, not for the gateway."""
        return self._engine
