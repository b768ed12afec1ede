"""Sampling params on the wire: one typed struct for every protocol, checked once.

    frame / body ──msgspec──> Params ──merge(session, request)──> Params ──> SamplingParams
                  (types, at the edge,   (later layers' fields win)        (ranges: the
                   naming the field)                                        engine's check)

A /v1/ws frame's `params`, the top level of an OpenAI body and Realtime's few sampling
fields all become Params; the engine's SamplingParams is the one range check. A refusal
is a ParamError carrying the field and the problem as data: each protocol names the field
its own way (`params.top_p`, `top_p`, `max_output_tokens`).
"""
from __future__ import annotations

from typing import Literal

import msgspec

from engine.errors import InvalidRequestError
from engine.sampling_params import SamplingParams
from gateway.config import GatewayConfig
from gateway.errors import field_error


class JsonSchemaFormat(msgspec.Struct, forbid_unknown_fields=True):
    """OpenAI's `response_format.json_schema`; `strict` is accepted either way: the
    grammar always enforces the schema."""

    name: str
    schema: dict | None = None
    description: str | None = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


UNSET = msgspec.UNSET
Unset = msgspec.UnsetType


class Params(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The sampling fields a client may send (WS `params`, the top level of an OpenAI body).
    UNSET: not sent, a lower layer's value applies; None (sent as null): the engine's
    default applies, whatever a lower layer says."""

    max_tokens: int | None | Unset = UNSET
    temperature: float | None | Unset = UNSET
    top_p: float | None | Unset = UNSET
    top_k: int | None | Unset = UNSET
    min_p: float | None | Unset = UNSET
    repetition_penalty: float | None | Unset = UNSET
    presence_penalty: float | None | Unset = UNSET
    frequency_penalty: float | None | Unset = UNSET
    stop: str | list[str] | None | Unset = UNSET
    stop_token_ids: list[int] | None | Unset = UNSET
    seed: int | None | Unset = UNSET
    ignore_eos: bool | None | Unset = UNSET
    priority: int | None | Unset = UNSET
    logprobs: int | None | Unset = UNSET  # top alternatives per token; None: off
    response_format: ResponseFormat | None | Unset = UNSET


PARAM_FIELDS = Params.__struct_fields__


class ParamError(ValueError):
    """A refused sampling param: `field` as Params names it, `problem` what is wrong."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def params_from_map(params: dict | None) -> Params:
    """A stored params map (a session's defaults) as Params; raises ParamError."""
    try:
        return msgspec.convert(params or {}, Params)
    except msgspec.ValidationError as exc:
        raise ParamError(*field_error(exc)) from None


def merge(*layers: Params | None) -> Params:
    """One Params from several; a field a later layer sent (null included) wins."""
    sent: dict = {}
    for layer in layers:
        if layer is not None:
            sent.update({name: value for name in PARAM_FIELDS
                         if (value := getattr(layer, name)) is not UNSET})
    return Params(**sent)


def given(value) -> bool:
    """Whether a Params field holds a value (neither unsent nor null)."""
    return value is not None and value is not UNSET


def sampling_params(params: Params, *, default_max_tokens: int,
                    max_tokens_cap: int) -> SamplingParams:
    """The engine's SamplingParams (its ranges checked there, once); raises ParamError."""
    values = {name: value for name in PARAM_FIELDS if given(value := getattr(params, name))}
    if "response_format" in values:  # the engine reads a plain map
        values["response_format"] = msgspec.to_builtins(params.response_format)
    try:
        result = SamplingParams(**{"max_tokens": default_max_tokens, **values})
    except InvalidRequestError as exc:
        raise ParamError(exc.field, exc.problem) from None
    if result.max_tokens > max_tokens_cap:
        raise ParamError("max_tokens", f"must be at most {max_tokens_cap}")
    return result


def resolve(config: GatewayConfig, *layers: Params | dict | None) -> SamplingParams:
    """The layers (a map is a session's stored defaults) merged, later ones winning, as
    SamplingParams within the gateway's limits; raises ParamError."""
    merged = merge(*(params_from_map(layer) if isinstance(layer, dict) else layer
                     for layer in layers))
    if given(merged.response_format) and given(merged.response_format.json_schema):
        check_schema(merged.response_format.json_schema.schema, config.max_schema_bytes,
                     config.max_schema_depth)
    return sampling_params(merged, default_max_tokens=config.default_max_tokens,
                           max_tokens_cap=config.max_tokens_cap)


def check_schema(schema: dict | None, max_bytes: int, max_depth: int) -> None:
    """A JSON schema small and shallow enough for its grammar to compile in time: its
    compiled size grows with the schema's, and each level nests the grammar's rules."""
    size = len(msgspec.json.encode(schema))
    if size > max_bytes:
        raise ParamError("response_format", f"the JSON schema is {size} bytes, over the "
                         f"limit of {max_bytes} (max_schema_bytes)")
    level, depth = [schema], 0
    while level:  # one level of nesting at a time: linear in the schema's size
        depth += 1
        if depth > max_depth:
            raise ParamError("response_format", f"the JSON schema nests deeper than "
                             f"{max_depth} levels (max_schema_depth)")
        level = [child for node in level for child in _children(node)]


def _children(node) -> list:
    if isinstance(node, dict):
        return [v for v in node.values() if isinstance(v, (dict, list))]
    if isinstance(node, list):
        return [v for v in node if isinstance(v, (dict, list))]
    return []
