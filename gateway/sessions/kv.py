"""SessionKV: a session's KV cache kept across idle time, reconnects, restarts and failover.

    a save of the session (each turn's start and end) -> the idle timer restarts
    idle for kv_park_idle_s, or its last socket closed -> park: the history's blocks go
        down to the engine's host tier and through to disk, so the pool may reuse them
    resumed (?session_id=) ----------------------------> prefetch: the tiers' blocks of
        the history load back into the pool before the first turn asks for them

The history's token ids are rendered as a turn's prompt begins (the chat template, no
generation prompt), so they name the blocks the next turn's prefix lookup will ask for.
All of it is best effort: a failure costs a re-prefill, never the session.

Requests outside sessions drive the tiers the same way: a finished request that asked for
it (prompt_cache_key, prompt_cache_retention) or a stored response parks its prompt and
output (`keep`), and a deleted response forgets its own turn's blocks (`drop`).
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from engine.errors import PromptTooLongError
from gateway.sessions.live import LiveSession
from gateway.tools.fallback import without_tools
from gateway.tools.formats import format_for_model
from scheduler.models import ModelSlot
from scheduler.registry import ModelRegistry, UnknownModel

log = logging.getLogger(__name__)

STOP_WAIT_S = 5.0


class SessionKV:
    """Parks and prefetches sessions' blocks through their model's engine tiers.
    `idle_s`: seconds without a save before an open session is parked (0: only on close)."""

    def __init__(self, models: ModelRegistry, idle_s: float, render_timeout_s: float,
                 tool_call_parser: str = "auto"):
        self._models = models
        self.idle_s = idle_s
        self._render_timeout_s = render_timeout_s
        self._tool_call_parser = tool_call_parser
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task] = set()

    def saved(self, live: LiveSession) -> None:
        """The session changed: park it once it has been idle for idle_s."""
        self._cancel_timer(live.id)
        if self.idle_s > 0:
            self._timers[live.id] = asyncio.get_running_loop().call_later(
                self.idle_s, self._idle, live)

    def closed(self, live: LiveSession) -> None:
        """Its last socket closed: park it now."""
        self._cancel_timer(live.id)
        self._spawn(self._apply(live, ModelSlot.park_kv))

    def resumed(self, live: LiveSession) -> None:
        self._spawn(self._apply(live, ModelSlot.prefetch_kv))

    def keep(self, slot: ModelSlot, token_ids: list[int], retain_s: float | None) -> None:
        """A finished request's prompt and output: parked now, as an idle session's;
        `retain_s`: kept on disk that long at least (None: as a session's blocks)."""
        if slot.loaded and slot.has_kv_tiers:
            self._spawn(self._tier_call(slot.park_kv(token_ids, retain_s), "park"))

    def drop(self, slot: ModelSlot, render: Callable[[], tuple[list[int], int]]) -> None:
        """Forget a deleted response's blocks: `render` (run off the loop) gives its
        sequence and how many of its leading tokens it shares with the turns before it,
        whose blocks stay."""
        if slot.loaded and slot.has_kv_tiers:
            self._spawn(self._tier_call(self._forget(slot, render), "forget"))

    async def _forget(self, slot: ModelSlot, render) -> None:
        token_ids, shared = await slot.off_loop(render, self._render_timeout_s)
        await slot.forget_kv(token_ids, shared)

    @staticmethod
    async def _tier_call(call: Awaitable, what: str) -> None:
        try:
            await call
        except PromptTooLongError:  # a chain past the context: no KV holds it whole
            return
        except Exception:  # noqa: BLE001 - the cache's loss, never the request's
            log.exception("KV %s failed", what)

    async def stop(self) -> None:
        """Parks under way (the sockets a shutdown closed) get STOP_WAIT_S to land."""
        for session_id in list(self._timers):
            self._cancel_timer(session_id)
        tasks = list(self._tasks)
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_WAIT_S)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _idle(self, live: LiveSession) -> None:
        self._timers.pop(live.id, None)
        self._spawn(self._apply(live, ModelSlot.park_kv))

    def _cancel_timer(self, session_id: str) -> None:
        timer = self._timers.pop(session_id, None)
        if timer is not None:
            timer.cancel()

    def _spawn(self, job: Awaitable[None]) -> None:
        task = asyncio.ensure_future(job)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _apply(self, live: LiveSession,
                     action: Callable[[ModelSlot, list[int]], Awaitable[int]]) -> None:
        if not live.num_messages:
            return
        try:
            slot = self._models.resolve(live.record.model)
        except UnknownModel:  # the session's model is no longer served
            return
        if not slot.loaded or not slot.has_kv_tiers:
            return
        try:
            tokens = await slot.off_loop(lambda: self._render(slot, live),
                                         self._render_timeout_s)
            await action(slot, tokens)
        except PromptTooLongError:  # a history past the context: no KV holds it whole
            return
        except Exception:  # noqa: BLE001 - the cache's loss, never the session's
            log.exception("session KV %s failed", action.__name__)

    def _render(self, slot: ModelSlot, live: LiveSession) -> list[int]:
        """The history as the next turn's prompt begins (ws/chat.py renders it so)."""
        messages = without_tools(format_for_model(slot, self._tool_call_parser),
                                 live.chat_messages())
        return slot.encode_chat(messages, add_generation_prompt=False)
