"""Wire `params` -> SamplingParams: the one path every WebSocket frame and HTTP body takes.

    params map ──msgspec.convert(WireParams)──> typed fields ──SamplingParams──> ranges
                 (types: a 400-digit integer in          (NaN, infinity, out of range)
                  a float field is refused here)

Both steps name the field; either failure is an `invalid_request` ProtocolError.
"""
from __future__ import annotations

from typing import Literal

import msgspec

from engine.errors import InvalidRequestError
from engine.sampling_params import SamplingParams
from gateway.config import GatewayConfig
from gateway.protocol import ProtocolError, field_message


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


class WireParams(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The sampling fields a client may send (WS `params`, the top level of an OpenAI body).
    None means absent: the engine's default (or a lower layer's value) applies."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    seed: int | None = None
    ignore_eos: bool | None = None
    priority: int | None = None
    logprobs: int | None = None  # top alternatives per token (0..max_logprobs); None: off
    response_format: ResponseFormat | None = None


PARAM_FIELDS = WireParams.__struct_fields__


def build_params(config: GatewayConfig, *layers: dict | None,
                 request_id: str | None = None) -> SamplingParams:
    """Merge params maps (later layers win) into validated SamplingParams.

    Errors are `invalid_request` naming the field as `params.NAME`.
    """
    merged: dict = {}
    for layer in layers:
        merged.update(layer or {})
    try:
        wire = msgspec.convert(merged, WireParams)
        given = {k: msgspec.to_builtins(v)  # response_format: a plain dict for the engine
                 for k, v in msgspec.structs.asdict(wire).items() if v is not None}
        params = SamplingParams(**{"max_tokens": config.default_max_tokens, **given})
    except msgspec.ValidationError as exc:
        raise _refused(field_message(exc), request_id) from None
    except InvalidRequestError as exc:
        raise _refused(str(exc), request_id) from None
    if params.max_tokens > config.max_tokens_cap:
        raise ProtocolError("invalid_request", f"params.max_tokens: must be at most "
                            f"{config.max_tokens_cap}", request_id)
    return params


def _refused(message: str, request_id: str | None) -> ProtocolError:
    return ProtocolError("invalid_request", f"params.{message}", request_id)
