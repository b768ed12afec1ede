"""A Responses request as a chat turn: the messages the chat template renders and the
SamplingParams, built in this one place for HTTP, SSE and WebSocket mode alike.

    previous response's history ─┐
    input items ──to messages────┼──> history (bounded by max_conversation_items)
    instructions (this request's only: never carried over a chain)
                                 └──> messages = [system: instructions] + history

Input items become chat completions' messages: a message item its role and text, a
`function_call` a `tool_calls` entry of an assistant message (the one just before, whose
turn it belongs to, or a new one), a `function_call_output` a `tool` message. The
request's `tools` are planned by gateway/responses/tools.py (gateway/tools renders them,
and past calls, for the template).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass

import msgspec

from engine.sampling_params import SamplingParams
from gateway import params as wire
from gateway.config import GatewayConfig
from gateway.responses.request import (
    CreateRequest,
    FunctionCallItem,
    FunctionCallOutputItem,
    Item,
    MessageItem,
    Part,
    invalid,
)

# Params' names as the Responses API spells them.
_FIELD_NAMES = {"max_tokens": "max_output_tokens", "response_format": "text.format"}
_TEXT_PARTS = {"user": "input_text", "system": "input_text", "developer": "input_text",
               "assistant": "output_text"}


@dataclass
class Turn:
    """What one response runs on: `messages` for the template, `history` to store (the
    chain so far with this input; the reply joins it when done), this request's own
    input items (with ids, for GET .../input_items), and the sampling params."""

    messages: list[dict]
    history: list[dict]
    input_items: list[dict]
    params: SamplingParams
    tools: list[dict] | None = None  # the tools a template that can renders itself
    own_from: int = 0  # where this request's own messages begin in `history`


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def build_turn(config: GatewayConfig, req: CreateRequest, items: list[Item],
               previous: list[dict] | None) -> Turn:
    """The turn for `req` whose input is `items`, after the `previous` history (None:
    a chain's first response). Raises a 400 naming the field at fault."""
    own = to_messages(items)
    history = list(previous or []) + own
    _check_outputs(items, history)
    if not history:
        raise invalid("input: must not be empty", "input")
    history = history[-config.max_conversation_items:]  # a chain's oldest turns go first
    while len(history) > 1 and history[0]["role"] == "tool":  # its call went: it goes too
        history.pop(0)
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    return Turn(system + history, history, [item_body(item) for item in items],
                sampling(config, req), own_from=max(0, len(history) - len(own)))


def _check_outputs(items: list[Item], history: list[dict]) -> None:
    """Every function_call_output answers a function_call of the chain (the previous
    response's history or this input): one that answers none is a client's mistake
    (a wrong or stale call_id), refused by name rather than shown to the model."""
    calls = {call.get("id") for message in history for call in message.get("tool_calls", ())}
    for i, item in enumerate(items):
        if isinstance(item, FunctionCallOutputItem) and item.call_id not in calls:
            raise invalid(f"input[{i}].call_id: no function_call with call_id "
                          f"{item.call_id[:64]!r} in this input or the previous "
                          "response's chain", f"input[{i}].call_id")


def sampling(config: GatewayConfig, req: CreateRequest) -> SamplingParams:
    params = wire.Params()
    if req.max_output_tokens is not None:
        params.max_tokens = req.max_output_tokens
    if req.temperature is not None:
        params.temperature = req.temperature
    if req.top_p is not None:
        params.top_p = req.top_p
    text_format = req.text.format if req.text is not None else None
    if text_format is not None:
        params.response_format = _response_format(text_format)
    try:
        return wire.resolve(config, params)
    except wire.ParamError as exc:
        name = _FIELD_NAMES.get(exc.field, exc.field)
        raise invalid(f"{name}: {exc.problem}", name) from None


def _response_format(fmt) -> wire.ResponseFormat:
    """`text.format` as chat completions' response_format (the grammar path)."""
    if fmt.type != "json_schema":
        return wire.ResponseFormat(type=fmt.type)
    if not fmt.name:
        raise invalid("text.format.name: required for json_schema", "text.format.name")
    return wire.ResponseFormat(type="json_schema", json_schema=wire.JsonSchemaFormat(
        name=fmt.name, schema=fmt.schema, description=fmt.description, strict=fmt.strict))


def to_messages(items: list[Item]) -> list[dict]:
    """Input items as chat messages (see the module docstring)."""
    messages: list[dict] = []
    for i, item in enumerate(items):
        if isinstance(item, MessageItem):
            role = "system" if item.role == "developer" else item.role
            messages.append({"role": role, "content": _text(item.content, i)})
        elif isinstance(item, FunctionCallItem):
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": item.arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":  # one turn's text and calls
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item.call_id,
                             "content": _text(item.output, i, "output")})
    return messages


def _text(content: str | list[Part], index: int, field: str = "content") -> str:
    if isinstance(content, str):
        return content
    for j, part in enumerate(content):
        if part.type not in ("input_text", "output_text", "text"):
            param = f"input[{index}].{field}[{j}].type"
            raise invalid(f"{param}: only text parts are supported, not "
                              f"{part.type[:32]!r}", param)
    return "".join(part.text for part in content)


def item_body(item: Item) -> dict:
    """An input item as the API returns it (input_items): with an id and a status."""
    if isinstance(item, MessageItem):
        text = _text(item.content, 0)
        return {"id": item.id or new_id("msg"), "type": "message", "role": item.role,
                "status": "completed",
                "content": [_part(item.role, text)]}
    body = {k: v for k, v in msgspec.to_builtins(item).items() if v is not None}
    prefix = "fc" if isinstance(item, FunctionCallItem) else "fco"
    if isinstance(item, FunctionCallOutputItem) and not isinstance(item.output, str):
        body["output"] = _text(item.output, 0, "output")
    return {**body, "id": item.id or new_id(prefix), "status": "completed"}


def _part(role: str, text: str) -> dict:
    kind = _TEXT_PARTS[role]
    return {"type": kind, "text": text, **({"annotations": []} if kind == "output_text"
                                            else {})}
