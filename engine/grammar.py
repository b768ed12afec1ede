"""Structured outputs with xgrammar: compiled grammars, per-request matchers, token masks.

    response_format (reduced) --key--> cache --miss--> compile pool --> CompiledGrammar
                                       (LRU, errors too)  (bounded wait; runs off the event
                                                           loop and off the engine loop)
    add_request:  request.grammar = GrammarMatcher(compiled)
    each step:    sampler fills the bitmask rows of constrained requests and applies them
                  to those rows of the logits only (xgrammar's CPU kernel / Triton on CUDA)
    book a token: matcher.accept_token(token); a terminated grammar finishes with `stop`

The tokenizer info is built for the width of the logits the sampler sees, so the bitmask
and the logits always agree on the vocabulary (a padded embedding's extra rows are never
sampled anyway).
"""
from __future__ import annotations

import asyncio
import json
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import torch
import xgrammar as xgr

from engine.errors import InvalidRequestError
from engine.json_numbers import bound_numbers
from engine.response_format import FIELD, grammar_key

JSON_OBJECT_SCHEMA = '{"type": "object"}'


class _Entry:
    """One cached compile: its future and how many callers wait on it now."""

    __slots__ = ("future", "waiters")

    def __init__(self, future: Future):
        self.future = future
        self.waiters = 0


class GrammarCompiler:
    """Compiles reduced response formats for one tokenizer on `threads` worker threads,
    keeping the latest `cache_size` results (refusals too) by canonical schema."""

    def __init__(self, tokenizer, vocab_size: int, stop_token_ids, *, threads: int,
                 cache_size: int, timeout_s: float, max_number_digits: int | None = None):
        self._vocabulary = (tokenizer, vocab_size, sorted(stop_token_ids))
        self.max_number_digits = max_number_digits  # None: numbers' digits unbounded
        self._compiler: xgr.GrammarCompiler | None = None  # built by the first compile
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="grammar-compile",
                                        initializer=_yield_to_decoding)
        self._cache: OrderedDict[str, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._build_lock = threading.Lock()
        self.cache_size = cache_size
        self.timeout_s = timeout_s
        self.num_compiles = 0  # compiles started (cache misses)

    async def compile_async(self, reduced: dict) -> xgr.CompiledGrammar:
        """The compiled grammar, awaited without blocking the event loop. A caller that is
        cancelled before its compile started withdraws it (when nobody else waits)."""
        entry = self._acquire(reduced)
        try:
            waiter = asyncio.shield(asyncio.wrap_future(entry.future))
            async with asyncio.timeout(self.timeout_s):  # wait_for could drop a cancel (3.11)
                result = await waiter
        except TimeoutError:
            raise self._timed_out() from None
        finally:
            self._release(reduced, entry)
        return _unwrap(result)

    def compile(self, reduced: dict) -> xgr.CompiledGrammar:
        """The same, blocking (the offline LLM path)."""
        entry = self._acquire(reduced)
        try:
            return _unwrap(entry.future.result(self.timeout_s))
        except FutureTimeout:
            raise self._timed_out() from None
        finally:
            self._release(reduced, entry)

    def prepare(self) -> None:
        """Read the vocabulary now (~0.4 s for a 49k vocabulary, mostly Python holding the
        GIL): a server does it while loading, so its first schema stalls no stream."""
        self._xgrammar()

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _acquire(self, reduced: dict) -> _Entry:
        key = grammar_key(reduced)
        with self._lock:
            entry = self._cache.get(key)
            if entry is None or entry.future.cancelled():
                entry = _Entry(self._pool.submit(self._build, reduced))
                self._cache[key] = entry
                self.num_compiles += 1
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
            self._cache.move_to_end(key)
            entry.waiters += 1
            return entry

    def _release(self, reduced: dict, entry: _Entry) -> None:
        with self._lock:
            entry.waiters -= 1
            key = grammar_key(reduced)
            if entry.waiters == 0 and entry.future.cancel() and self._cache.get(key) is entry:
                del self._cache[key]

    def _build(self, reduced: dict) -> xgr.CompiledGrammar | str:
        """Runs on a pool thread. A schema xgrammar refuses becomes a message (cached like
        a grammar, so a client retrying a bad schema costs no second compile)."""
        try:
            if reduced["type"] == "tool_calls":
                return self._xgrammar().compile_structural_tag(_tool_call_tag(reduced))
            schema = JSON_OBJECT_SCHEMA if reduced["type"] == "json_object" else reduced["schema"]
            if not isinstance(schema, str):
                schema = json.dumps(schema)
            # compact JSON: unbounded whitespace would let a model pad until max_tokens;
            # bounded numbers: so would endless digits (engine/json_numbers.py)
            grammar = xgr.Grammar.from_json_schema(schema, any_whitespace=False)
            if self.max_number_digits is not None:
                grammar = xgr.Grammar.from_ebnf(
                    bound_numbers(str(grammar), self.max_number_digits), root_rule_name="root")
            return self._xgrammar().compile_grammar(grammar)
        except Exception as exc:  # noqa: BLE001 - xgrammar reports bad schemas as RuntimeError
            return f"schema cannot be compiled: {str(exc).strip().splitlines()[-1]}"

    def _xgrammar(self) -> xgr.GrammarCompiler:
        """xgrammar's compiler over the vocabulary, built by `prepare()` or on first use
        (offline engines that never see a response_format skip reading the vocabulary)."""
        with self._build_lock:  # not _lock: the event loop must not wait on this
            if self._compiler is None:
                info = _tokenizer_info(*self._vocabulary)
                self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
            return self._compiler

    def _timed_out(self) -> InvalidRequestError:
        return InvalidRequestError(FIELD, f"schema took longer than {self.timeout_s:g} s to "
                                   "compile (grammar_compile_timeout_s)")


# How much lower than the engine's a compile thread's scheduling priority is (Linux nice).
COMPILE_NICENESS = 10


def _yield_to_decoding() -> None:
    """A compile thread takes the CPU the decode steps leave: on a box with as many cores as
    the engine has matmul threads, one large schema's compile (seconds) would otherwise slow
    every stream's steps while it runs."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), COMPILE_NICENESS)
    except OSError:  # a platform without per-thread priorities keeps the default
        pass


def _tokenizer_info(tokenizer, vocab_size: int, stop_ids: list[int]) -> xgr.TokenizerInfo:
    """xgrammar's reading of the vocabulary; a tokenizer in a child process hands over the
    child's reading (engine.tokenizer_process) instead of being read here."""
    child_read = getattr(tokenizer, "grammar_vocabulary", None)
    if child_read is None:
        return xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=stop_ids)
    encoded, vocab_type, add_prefix_space = child_read
    encoded = (list(encoded) + [""] * vocab_size)[:vocab_size]  # as from_huggingface pads
    return xgr.TokenizerInfo(encoded, vocab_type=xgr.VocabType(vocab_type),
                             vocab_size=vocab_size, stop_token_ids=stop_ids,
                             add_prefix_space=add_prefix_space)


def _tool_call_tag(reduced: dict) -> xgr.StructuralTag:
    """The calls' grammar in the model's syntax, each call's arguments following its JSON
    schema (xgrammar's built-in tag for the syntax gives the per-function tags):

        auto       any text; a call ends the answer (after more calls, when parallel)
        required   only calls: one, or several separated by newlines when parallel
        named      exactly one call of that function
    """
    tag = xgr.get_builtin_structural_tag(
        reduced["format"], tools=reduced["tools"], tool_choice=reduced["tool_choice"],
        reasoning=False, parallel_tool_calls=False, max_whitespace_cnt=_TOOL_CALL_WHITESPACE)
    choice, parallel = reduced["tool_choice"], reduced["parallel_tool_calls"]
    if isinstance(choice, dict):
        return tag
    tags = tag.format.tags
    more = xgr.structural_tag.TagsWithSeparatorFormat(tags=tags, separator="\n")
    if choice == "required":
        calls = more.model_copy(update={"at_least_one": True, "stop_after_first": not parallel})
        return xgr.StructuralTag(format=calls)
    first = tag.format.model_copy(update={"at_least_one": False, "stop_after_first": True})
    if not parallel:
        return xgr.StructuralTag(format=first)
    return xgr.StructuralTag(format=xgr.structural_tag.SequenceFormat(elements=[first, more]))


# Whitespace between JSON tokens of a call's arguments: a little, as models write it, but
# bounded, so a model cannot pad a call until max_tokens.
_TOOL_CALL_WHITESPACE = 1


def _unwrap(result: xgr.CompiledGrammar | str) -> xgr.CompiledGrammar:
    if isinstance(result, str):
        raise InvalidRequestError(FIELD, result)
    return result


def new_matcher(compiled: xgr.CompiledGrammar) -> xgr.GrammarMatcher:
    return xgr.GrammarMatcher(compiled)


class TokenMasks:
    """One step's token bitmask [N, ceil(V/32)] int32: rows of constrained requests are
    filled by their matchers and applied to the same rows of the logits; other rows are
    neither filled nor touched. The host buffer is reused across steps (pinned on CUDA,
    so the copy does not wait; the step's single host sync orders reuse)."""

    def __init__(self):
        self._host: torch.Tensor | None = None

    def apply(self, logits: torch.Tensor, rows: list[int], matchers: list) -> None:
        """logits [N, V] masked in place at `rows` (the tokens `matchers` forbid -> -inf)."""
        host = self._buffer(*xgr.get_bitmask_shape(logits.shape[0], logits.shape[1]),
                            logits.device)
        for row, matcher in zip(rows, matchers):
            matcher.fill_next_token_bitmask(host, row)
        mask = host[:logits.shape[0]].to(logits.device, non_blocking=True)
        xgr.apply_token_bitmask_inplace(logits, mask, vocab_size=logits.shape[1], indices=rows)

    def _buffer(self, batch: int, width: int, device: torch.device) -> torch.Tensor:
        if self._host is None or self._host.shape[0] < batch or self._host.shape[1] != width:
            pinned = device.type == "cuda"
            self._host = torch.empty((batch, width), dtype=torch.int32, pin_memory=pinned)
        return self._host
