"""`response_format` as OpenAI spells it, checked and reduced to what the grammar needs.

    {"type": "text"}                                   -> None (unconstrained)
    {"type": "json_object"}                            -> {"type": "json_object"}
    {"type": "json_schema", "json_schema": {"name", "schema", "strict"?, "description"?}}
                                                       -> {"type": "json_schema", "schema": {...}}
    {"type": "tool_calls", "format", "tools", "tool_choice", "parallel_tool_calls"}
        (built by the gateway from `tools`)            -> itself: calls in the model's format

The reduced form is the grammar cache's key (as canonical JSON): two requests that differ
only in `name`, `description` or `strict` share one compiled grammar. Torch-free.
"""
from __future__ import annotations

import json

from engine.errors import InvalidRequestError

FIELD = "response_format"
_TYPES = ("text", "json_object", "json_schema")
# Tool-call syntaxes the grammar knows (xgrammar's built-in structural tags by model family):
# "qwen_3" is Hermes' <tool_call>{"name", "arguments"}</tool_call>; "llama" is Llama 3's
# {"name", "parameters"} JSON.
TOOL_CALL_FORMATS = ("qwen_3", "llama")


def reduce_response_format(value) -> dict | None:
    """The constraint a response_format asks for, None for plain text; else an
    InvalidRequestError naming `response_format`."""
    if value is None:
        return None
    if isinstance(value, dict) and value.get("type") == "tool_calls":
        return _tool_calls(value)
    if not isinstance(value, dict) or value.get("type") not in _TYPES:
        raise InvalidRequestError(FIELD, f"must be an object with type one of {list(_TYPES)}")
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if "json_schema" not in value and isinstance(value.get("schema"), dict):
        return value  # already reduced: SamplingParams copied by dataclasses.replace
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        raise InvalidRequestError(FIELD, "json_schema.schema: required, a JSON Schema object")
    if not isinstance(spec.get("name", ""), str) or not isinstance(spec.get("strict", False),
                                                                    (bool, type(None))):
        raise InvalidRequestError(FIELD, "json_schema: name must be a string, strict a boolean")
    return {"type": "json_schema", "schema": spec["schema"]}


def _tool_calls(value: dict) -> dict:
    """A tool-call constraint as the gateway builds it (its tools already checked there)."""
    if value.get("format") not in TOOL_CALL_FORMATS or not isinstance(value.get("tools"), list):
        raise InvalidRequestError(FIELD, f"tool_calls: format must be one of "
                                  f"{list(TOOL_CALL_FORMATS)} and tools a list")
    return value


def grammar_key(reduced: dict) -> str:
    """Canonical JSON of a reduced response_format: equal schemas, equal keys."""
    try:
        return json.dumps(reduced, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(FIELD, f"schema is not JSON: {exc}") from None
