"""A response from its request to its stored end, whatever carries it (HTTP, SSE, socket).

    prepare():  refusals, input items, the previous response's history (the store, or
                a socket's own last response: see _previous()), the turn, its prompt
                fitted to the context, what the engine would refuse: all before admission
    generate(): the engine's outputs, folded into the response's Stream
    finish():   the status from how it ended, the reply joined to the history, the
                response stored (store: true) before its last event is sent
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass, field

from engine.errors import EngineError, InvalidRequestError
from gateway.errors import RequestError
from gateway.messages import fit_to_context
from gateway.prompt_cache import PromptCache, prompt_cache
from gateway.responses import stored
from gateway.responses.kv import keep_finished
from gateway.responses.request import CreateRequest, check, decode_items
from gateway.responses.shape import ResponseShape
from gateway.responses.tools import tool_plan
from gateway.responses.turn import Turn, build_turn
from gateway.runtime import Runtime
from gateway.stream import Stream
from scheduler.door import Admission

log = logging.getLogger(__name__)
# The engine's names for a field, as the Responses API spells them.
_PARAMS = {"prompt": "input", "messages": "input", "max_tokens": "max_output_tokens",
           "response_format": "text.format"}


@dataclass
class Prepared:
    """A response ready for admission."""

    shape: ResponseShape
    turn: Turn
    prompt: list[int]
    owner: str | None
    generate: bool = True  # False: prefill the chain's prompt, produce nothing
    version: int = 0  # the stored version the final save replaces (background: 1)
    cache: PromptCache = field(default_factory=PromptCache)  # prompt_cache_key / prompt_cache_retention
    output_ids: list[int] = field(default_factory=list)  # the tokens generated

    @property
    def store(self) -> bool:
        return self.shape.req.store is not False


async def prepare(rt: Runtime, req: CreateRequest, owner: str | None, *,
                  generate: bool = True, stream_id: str | None = None,
                  local: dict[str, stored.Stored] | None = None) -> Prepared:
    """Everything before admission; a RequestError names what is refused. `local` holds
    a socket's last response (finish() keeps it), as its chain goes on from it."""
    check(req)
    cache = prompt_cache(req.prompt_cache_key, req.prompt_cache_retention,
                         rt.config.max_prompt_cache_key_chars)
    items = decode_items(req.input)
    previous = None
    if req.previous_response_id is not None:
        found = await _previous(rt, req.previous_response_id, owner, local)
        if found is None:
            raise stored.not_found(req.previous_response_id, "previous_response_not_found",
                                   "previous_response_id")
        previous = found.history
    tools = tool_plan(rt, req)
    turn = build_turn(rt.config, req, items, previous)
    if tools is not None:
        turn.messages, turn.tools = tools.messages(turn.messages), tools.template_tools()
        if tools.choice != "auto" or turn.params.response_format is None:
            turn.params = dataclasses.replace(turn.params, response_format=tools.constraint())
    if not generate:  # one token: the prompt's KV is computed and left in the prefix cache
        turn.params = dataclasses.replace(turn.params, max_tokens=1)
    prompt = await _render(rt, turn, req.truncation != "disabled")
    _validate(rt, prompt, turn)
    shape = ResponseShape(req, rt.model.name, turn.params.max_tokens, stream_id, tools)
    shape.generate = generate
    return Prepared(shape, turn, prompt, owner, generate, cache=cache)


async def _previous(rt: Runtime, response_id: str, owner: str | None,
                    local: dict[str, stored.Stored] | None) -> stored.Stored | None:
    """The previous response: a socket's own last one from its memory (if stored, while
    the store still holds that version: see stored.kept_or_load), any other from the
    store (so chains survive reconnects, restarts and replicas)."""
    kept = (local or {}).get(response_id)
    if kept is None:
        found = await stored.load(rt, response_id, owner)
    elif kept.in_store:
        found = await stored.kept_or_load(rt, kept)
    else:
        found = kept  # store: false: the socket's copy is the only one
    if found is not None:
        rt.metrics.previous_responses.labels("socket" if found is kept else "store").inc()
    return found


async def _render(rt: Runtime, turn: Turn, fit: bool) -> list[int]:
    """The chat template's prompt; with truncation, the oldest turns dropped until the
    reply fits the context (as chat sessions do)."""
    model, room, tools = rt.model, turn.params.max_tokens, turn.tools

    def encode(messages: list[dict]) -> list[int]:
        return model.encode_chat(messages, tools)

    if not fit:
        return await rt.tokenize(lambda: encode(turn.messages))
    return await rt.tokenize(lambda: fit_to_context(encode, turn.messages, room,
                                                    model.max_model_len))


def _validate(rt: Runtime, prompt: list[int], turn: Turn) -> None:
    try:
        rt.model.validate(prompt, turn.params)
    except InvalidRequestError as exc:
        param = _PARAMS.get(exc.field, exc.field)
        raise RequestError(exc.code, f"{param}: {exc.problem}", param=param) from None
    except EngineError as exc:
        raise RequestError(exc.code, str(exc), param="input") from None


async def generate(admission: Admission, prepared: Prepared, stream: Stream):
    """The engine's outputs, each folded into `stream` first. An engine error before any
    output (a schema that does not compile) is a RequestError naming its field."""
    outputs = admission.generate(prepared.prompt, prepared.turn.params, stream.engine_id)
    first = True
    try:
        async with contextlib.aclosing(outputs) as outs:
            async for out in outs:
                first = False
                stream.absorb(out)
                prepared.output_ids.extend(out.new_token_ids)
                yield out
    except EngineError as exc:
        if not first or exc.code == "internal":
            raise
        param = "text.format" if getattr(exc, "field", None) == "response_format" else "input"
        raise RequestError(exc.code, str(exc), param=param) from None


async def finish(rt: Runtime, prepared: Prepared, stream: Stream,
                 local: dict[str, stored.Stored] | None = None) -> None:
    """Close the response: its status, and (store: true) its record in the store, so a
    chain can continue from it as soon as its last event is out. A response that could
    not be stored says so: a chain cannot continue from it."""
    shape = prepared.shape
    shape.finish(stream)
    if not prepared.generate:
        stream.completion_tokens = 0  # the prefill's token is never shown
    history = list(prepared.turn.history)
    obj = shape.final(stream)  # every call read
    if prepared.generate and stream.text and shape.status in ("completed", "incomplete"):
        history.append(_reply(shape, stream))
    response = stored.Stored.of(shape.id, prepared.owner, history, obj,
                                prepared.turn.input_items, prepared.turn.own_from)
    problem = await stored.save(rt, response, prepared.version) if prepared.store else None
    if shape.status in ("completed", "incomplete"):
        keep_finished(rt, prepared.prompt + prepared.output_ids, prepared.cache.retain_s,
                      prepared.store and problem is None)
    if problem is not None:
        log.warning("response %s not stored: %s", shape.id, problem)
        shape.status, shape.completed_at = "failed", None
        shape.error = {"code": "server_error",
                       "message": f"the response could not be stored: {problem}"}
    elif local is not None:  # a socket keeps its last response (one), for its chain
        local.clear()
        local[shape.id] = response


def _reply(shape: ResponseShape, stream: Stream) -> dict:
    """The reply as the chain's history keeps it: its text, and its calls as a chat
    message's tool_calls (so the next turn renders them and their outputs)."""
    if shape.parser is None:
        return {"role": "assistant", "content": stream.text}
    reply = {"role": "assistant", "content": shape.text}
    if shape.calls:
        reply["tool_calls"] = [call.openai() for call in shape.calls]
    return reply
