"""AsyncEngine: the engine for asyncio. The step loop runs on its own thread.

    event loop                              engine thread
    ----------                              -------------
    generate() --AddRequest---->  inbox -->  core.add_request
    abort()    --AbortRequest-->  inbox -->  core.abort_request
    mailbox    <--call_soon_threadsafe----  core.step() -> [RequestOutput, ...] (one batch/step)

Each request has a Mailbox (engine/mailbox.py): outputs that arrive while the consumer is
busy merge into its one slot, so a slow consumer costs constant memory and never stalls
the loop.

An engine that runs out of work tells its device gate party so (`idle`): the gate then
holds the device for the other engines only (engine/device_gate.py).

A failed step ends only its own requests (EngineCore.step). When the loop itself dies (too
many failed steps in a row, or a fault outside a step) every pending request ends with
`error`, `is_alive` turns false and `wait_dead()` returns: the caller decides what a dead
engine means for the process (`tokenwire serve` exits non-zero).
"""
from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from engine.config import EngineConfig
from engine.core import EngineCore
from engine.device_gate import GateParty
from engine.errors import EngineDeadError, EngineError, InvalidRequestError
from engine.host_memory import release_free_heap
from engine.mailbox import Mailbox
from engine.outputs import EngineStats, RequestOutput
from engine.sampling_params import SamplingParams

log = logging.getLogger(__name__)

# Seconds a CPU engine waits idle before handing freed heap back (a request arriving sooner
# reuses it, as the steps of a burst do).
IDLE_TRIM_S = 1.0


@dataclass(frozen=True, slots=True)
class AddRequest:
    """Inbox command: queue a validated request (its grammar already compiled, if any)."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    parent_id: str | None = None
    grammar: object | None = None  # xgrammar's CompiledGrammar


@dataclass(frozen=True, slots=True)
class AbortRequest:
    """Inbox command: end a request."""

    request_id: str


@dataclass(frozen=True, slots=True)
class TierRequest:
    """Inbox command: `action` ("park", "prefetch" or "forget": BlockManager's methods)
    on a token sequence's blocks in the KV tiers; `done` gets the number of blocks."""

    action: str
    token_ids: tuple[int, ...]
    done: asyncio.Future
    args: tuple = ()  # the method's further arguments (park's retain_s, forget's keep)


Command = AddRequest | AbortRequest | TierRequest


class AsyncEngine:
    """Continuous-batching engine for asyncio callers.

    `generate()` is an async generator of incremental RequestOutputs; closing it early or
    calling `abort(request_id)` ends the request and frees its KV blocks.
    """

    def __init__(self, config: EngineConfig | None = None, core: EngineCore | None = None,
                 gate: GateParty | None = None):
        """`gate`: the engine's party at a device gate shared with other models' engines
        (None: a gate of its own); ignored with a ready `core`."""
        self.core = core or EngineCore(config or EngineConfig(), gate)
        self.core.grammars.prepare()  # here, where the server loads: not on a first schema
        self._mailboxes: dict[str, Mailbox] = {}
        self._inbox: list[Command] = []
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._dead: BaseException | None = None
        self._died = asyncio.Event()  # set on the event loop once the loop has died
        self._ids = itertools.count()
        self._stats = self.core.stats()
        self._on_cpu = self.core.config.resolved_device().type == "cpu"
        self._trim_due = self._on_cpu  # the load and warm-up's buffers too

    # -- properties the gateway needs ---------------------------------------------------
    @property
    def tokenizer(self):
        return self.core.tokenizer

    @property
    def model_name(self) -> str:
        return self.core.model_name

    @property
    def max_model_len(self) -> int:
        return self.core.max_model_len

    @property
    def has_kv_tiers(self) -> bool:
        """Whether blocks can go below the pool (park, prefetch and forget do anything)."""
        return self.core.kv_tiers is not None

    @property
    def gate(self) -> GateParty:
        """Its party at the device gate: the turns, waits and device time of its steps."""
        return self.core.gate

    @property
    def is_alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self._dead is None

    async def wait_dead(self) -> str:
        """Return, with the cause, once the engine loop has died (never after a clean stop)."""
        await self._died.wait()
        return f"{type(self._dead).__name__}: {self._dead}"

    def stats(self) -> EngineStats:
        """The snapshot taken after the latest step (cheap; safe from the event loop)."""
        return self._stats

    def encode_chat(self, messages: Sequence[dict], tools: list[dict] | None = None,
                    **template: object) -> list[int]:
        """EngineCore.encode_chat (`template`: its keyword options)."""
        return self.core.encode_chat(messages, tools, **template)

    @property
    def chat_template_supports_tools(self) -> bool:
        return self.core.chat_template_supports_tools

    def encode(self, text: str) -> list[int]:
        return self.core.encode(text)

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raise what `generate` would raise for this prompt and params, before starting."""
        self.core.validate(prompt_ids, params)

    # -- lifecycle ----------------------------------------------------------------------
    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        self.core.grammars.shutdown()
        self.core.close_tokenizer()
        if self.core.kv_tiers is not None:
            await asyncio.to_thread(self.core.kv_tiers.close)  # queued disk writes land
        self._fail_all("engine stopped")  # nothing will ever step these requests again

    # -- requests -----------------------------------------------------------------------
    async def generate(self, prompt: str | list[int], params: SamplingParams,
                       request_id: str | None = None,
                       parent_id: str | None = None) -> AsyncIterator[RequestOutput]:
        """Stream a request's outputs. Raises InvalidRequestError/PromptTooLongError at once.
        `parent_id`: another live sample of the same prompt, whose prompt blocks this one
        shares (`n > 1`: one prefill for all samples)."""
        if not self.is_alive:
            raise EngineDeadError(f"engine loop is not running: {self._dead!r}")
        request_id = request_id or f"req-{next(self._ids)}"
        prompt_ids = self.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.core.validate(prompt_ids, params)
        grammar = None
        if params.response_format is not None:  # compiled on its pool, never on a loop
            grammar = await self.core.grammars.compile_async(params.response_format)
        if request_id in self._mailboxes:
            raise InvalidRequestError("id", f"request {request_id!r} is already running")
        mailbox = self._mailboxes[request_id] = Mailbox()
        self._submit(AddRequest(request_id, prompt_ids, params, parent_id, grammar))
        finished = False
        try:
            while not finished:
                out = await mailbox.get()
                finished = out.finished
                yield out
        finally:
            self._mailboxes.pop(request_id, None)
            if not finished:
                self._submit(AbortRequest(request_id))

    def abort(self, request_id: str) -> None:
        """End a request; its generator yields a final output with finish_reason cancelled."""
        if request_id in self._mailboxes:
            self._submit(AbortRequest(request_id))

    # -- a sequence's KV in the tiers (a session's, parked while it idles) -------------
    async def park(self, token_ids: Sequence[int], retain_s: float | None = None) -> int:
        """Write the pool's full blocks of `token_ids` down to host RAM and through to
        disk (between steps; the disk writes on their own thread); how many were.
        `retain_s`: the disk tier keeps them that long at least (DiskTier)."""
        return await self._tier_call("park", token_ids, retain_s)

    async def prefetch(self, token_ids: Sequence[int]) -> int:
        """Load the tiers' blocks of `token_ids` into the pool ahead of a request that
        will ask for them; how many of its leading blocks the pool then holds."""
        return await self._tier_call("prefetch", token_ids)

    async def forget(self, token_ids: Sequence[int], keep_tokens: int = 0) -> int:
        """Delete the tiers' copies of the blocks of `token_ids`, but for those within its
        first `keep_tokens`; how many there were."""
        return await self._tier_call("forget", token_ids, keep_tokens)

    async def _tier_call(self, action: str, token_ids: Sequence[int], *args) -> int:
        if not self.is_alive or not self.has_kv_tiers:
            return 0
        done = self._loop.create_future()
        self._submit(TierRequest(action, tuple(token_ids), done, args))
        return await done

    def _submit(self, command: Command) -> None:
        with self._wake:
            self._inbox.append(command)
            self._wake.notify()

    # -- the engine thread ------------------------------------------------------------
    def _run(self) -> None:
        try:
            while self._wait_for_work():
                self._apply_inbox()
                try:
                    outputs = self.core.step() if self.core.has_work() else []
                finally:  # a fatal step still freed its requests' blocks: show it
                    self._stats = self.core.stats()
                if outputs:
                    self._loop.call_soon_threadsafe(self._dispatch, outputs)
                self._trim_due = self._on_cpu
                if not self.core.has_work():
                    self.core.gate.idle()  # the device is not held for it while it waits
        except BaseException as exc:  # noqa: BLE001 - the loop must report, not vanish
            log.critical("engine is dead: %s", exc, exc_info=exc)
            self._dead = exc
            self._loop.call_soon_threadsafe(self._on_death, f"engine is dead: {exc}")
        finally:
            self.core.gate.idle()

    def _wait_for_work(self) -> bool:
        """Blocks until there is work; a CPU engine idle for IDLE_TRIM_S after a step
        hands its freed step buffers back to the OS once (engine.host_memory)."""
        with self._wake:
            while not self._stopping and not self._inbox and not self.core.has_work():
                timeout = IDLE_TRIM_S if self._trim_due else None
                if not self._wake.wait(timeout) and self._trim_due:
                    self._trim_due = False
                    release_free_heap()
            return not self._stopping

    def _apply_inbox(self) -> None:
        with self._wake:
            commands, self._inbox = self._inbox, []
        for command in commands:
            match command:
                case AbortRequest(request_id):
                    self.core.abort_request(request_id)
                case AddRequest():
                    self._add(command)
                case TierRequest():
                    self._tier(command)

    def _add(self, command: AddRequest) -> None:
        try:
            self.core.add_request(command.request_id, command.prompt_token_ids,
                                  command.params, command.parent_id, command.grammar)
        except EngineError as exc:  # refused on this thread: end just this one request
            failed = RequestOutput(command.request_id, "", [], finished=True,
                                   finish_reason="error", error=str(exc))
            self._loop.call_soon_threadsafe(self._dispatch, [failed])

    def _tier(self, command: TierRequest) -> None:
        try:
            result = getattr(self.core.blocks, command.action)(command.token_ids,
                                                                *command.args)
        except Exception:  # noqa: BLE001 - a tier fault costs the cache, not the engine
            log.exception("KV tier %s failed", command.action)
            result = 0
        self._stats = self.core.stats()  # the tiers' bytes and counts, for /metrics
        self._loop.call_soon_threadsafe(_settle, command.done, result)

    def _dispatch(self, outputs: list[RequestOutput]) -> None:
        for out in outputs:
            mailbox = self._mailboxes.get(out.request_id)
            if mailbox is not None:
                mailbox.put(out)

    def _on_death(self, message: str) -> None:
        self._fail_all(message)
        self._died.set()

    def _fail_all(self, message: str) -> None:
        with self._wake:  # tier calls the loop never reached: nothing was done
            commands, self._inbox = self._inbox, []
        for command in commands:
            if isinstance(command, TierRequest):
                _settle(command.done, 0)
        for request_id, mailbox in list(self._mailboxes.items()):
            mailbox.put(RequestOutput(request_id, "", [], finished=True,
                                        finish_reason="error", error=message))


def _settle(done: asyncio.Future, result: int) -> None:
    if not done.done():  # its caller may have been cancelled
        done.set_result(result)
