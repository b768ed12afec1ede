"""The choices of one OpenAI completion: prompts x n samples, run side by side.

    prompts [p0, p1], n = 2  ->  choice 0: p0 sample 0 (parent)   choice 2: p1 sample 0 (parent)
                                 choice 1: p0 sample 1 (forks 0)  choice 3: p1 sample 1 (forks 2)

Sample j of a prompt draws from seed + j (when a seed is given) and shares its parent's
prompt KV blocks (the engine's fork: one prefill per prompt). Each choice is its own
engine request; `merged` interleaves their outputs in arrival order, and closing it
aborts every choice still running.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator

from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from gateway.stream import Stream
from gateway.tools.parser import CallParser
from scheduler.door import Admission

_SEEDS = 2**63


@dataclasses.dataclass(eq=False)
class Choice:
    """One sample of one prompt: its engine request and what it produced."""

    index: int
    prompt: list[int]
    params: SamplingParams
    stream: Stream
    parent_id: str | None  # the engine id of the prompt's first sample
    echo: str = ""  # the prompt's text, shown before the completion (completions' echo)
    logprobs: list = dataclasses.field(default_factory=list)
    token_ids: list[int] = dataclasses.field(default_factory=list)  # what it generated
    sent_chars: int = 0  # characters of this choice's text already streamed
    calls: CallParser | None = None  # reads tool calls out of the text (chat with tools)

    @property
    def text(self) -> str:
        return self.echo + self.stream.text


def plan(prompts: list[list[int]], n: int, params: SamplingParams, engine_id: str,
         echoes: list[str] | None = None) -> list[Choice]:
    """The choices in OpenAI's order; choice 0's engine request is `engine_id` itself."""
    def request_id(index: int) -> str:
        return f"{engine_id}-{index}" if index else engine_id

    choices = []
    for p, prompt in enumerate(prompts):
        for j in range(n):
            index = p * n + j
            seed = None if params.seed is None else (params.seed + j) % _SEEDS
            choices.append(Choice(
                index, prompt, dataclasses.replace(params, seed=seed),
                Stream(str(index), request_id(index), "http"),
                request_id(p * n) if j else None, echoes[p] if echoes else ""))
    return choices


async def merged(admission: Admission, stream: Stream, choices: list[Choice]
                 ) -> AsyncIterator[tuple[Choice, RequestOutput]]:
    """Every choice's outputs as they come (each folded into its choice first, its tokens
    counted on the request's `stream`); an engine error of any choice is raised here."""
    queue: asyncio.Queue = asyncio.Queue(maxsize=len(choices))  # a slow reader: the
    # engine's one-slot mailboxes merge while the pumps wait here
    tasks = [asyncio.create_task(_pump(admission, c, queue)) for c in choices]
    running = len(choices)
    try:
        while running:
            choice, out, exc = await queue.get()
            if exc is not None:
                raise exc
            stream.completion_tokens += choice.stream.absorb(out)
            choice.token_ids.extend(out.new_token_ids)
            if out.logprobs:
                choice.logprobs.extend(out.logprobs)
            running -= out.finished
            yield choice, out
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def _pump(admission: Admission, choice: Choice, queue: asyncio.Queue) -> None:
    try:
        generator = admission.generate(choice.prompt, choice.params, choice.stream.engine_id,
                                       choice.parent_id)
        async with contextlib.aclosing(generator) as outputs:
            async for out in outputs:
                await queue.put((choice, out, None))
    except Exception as exc:  # noqa: BLE001 - handed to the reader, which decides
        await queue.put((choice, None, exc))


def conclude(stream: Stream, choices: list[Choice], prompts: list[list[int]]) -> None:
    """Fold the choices into the request's own stream: usage counts each prompt once; the
    request ends as its first choice that did not finish (cancelled, error), else as its
    first choice. A drain that cut it has set `cancelled` already."""
    stream.prompt_tokens = sum(len(p) for p in prompts)
    stream.completion_tokens = sum(c.stream.completion_tokens for c in choices)
    stream.cached_tokens = sum(c.stream.cached_tokens for c in choices if c.parent_id is None)
    if stream.finish_reason is not None:
        return
    unfinished = [c.stream for c in choices if c.stream.finish_reason not in ("stop", "length")]
    if unfinished:
        stream.finish_reason = unfinished[0].finish_reason or "error"
        stream.error = unfinished[0].error
    else:
        stream.finish_reason = choices[0].stream.finish_reason
