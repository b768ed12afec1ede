"""Server events of the Realtime API (text subset), as the plain dicts the writer encodes.

Each builder returns one event with a fresh `event_id`; field names and shapes are the
GA ones the SDKs' pydantic/TypeScript types describe (tests parse every event with the
Python SDK's own models, strictly).
"""
from __future__ import annotations

import itertools

_event_ids = itertools.count()
_PART_TYPE = {"system": "input_text", "user": "input_text", "assistant": "output_text"}
_REFUSAL_KIND = {"overloaded": "server_error", "draining": "server_error",
                 "internal": "server_error", "engine_failed": "server_error"}


def event(kind: str, **fields) -> dict:
    return {"type": kind, "event_id": f"event_{next(_event_ids)}", **fields}


def item(item_id: str, role: str, text: str, status: str = "completed") -> dict:
    """A message item with its one text content part."""
    return {"id": item_id, "object": "realtime.item", "type": "message", "status": status,
            "role": role, "content": [{"type": _PART_TYPE[role], "text": text}]}


def function_call(item_id: str, call_id: str, name: str, arguments: str,
                  status: str = "completed") -> dict:
    return {"id": item_id, "object": "realtime.item", "type": "function_call",
            "status": status, "call_id": call_id, "name": name, "arguments": arguments}


def item_of(item_id: str, message: dict, status: str = "completed") -> dict:
    """The item a conversation message stands for (conversation.py): a tool call, a
    tool's output or a message."""
    if message.get("tool_calls"):
        call = message["tool_calls"][0]  # one call per item
        return function_call(item_id, call["id"], call["function"]["name"],
                             call["function"]["arguments"], status)
    if message["role"] == "tool":
        return {"id": item_id, "object": "realtime.item", "type": "function_call_output",
                "status": status, "call_id": message["tool_call_id"],
                "output": message["content"]}
    return item(item_id, message["role"], message["content"], status)


def session(session_id: str, model: str, system: str | None, params: dict,
            default_max_tokens: int, tools: dict) -> dict:
    """The `session` object of session.created / session.updated. `id` is the tokenwire
    session id: reconnect with `?session_id=` to resume the conversation (and its
    settings: instructions, params, tools)."""
    return {"type": "realtime", "object": "realtime.session", "id": session_id,
            "model": model, "output_modalities": ["text"],
            "instructions": system or "", "tools": tools.get("tools", []),
            "tool_choice": tools.get("tool_choice", "auto"),
            "max_output_tokens": params.get("max_tokens", default_max_tokens),
            **({"temperature": params["temperature"]} if "temperature" in params else {})}


def error(code: str, message: str, event_id: str | None, param: str | None = None,
          kind: str | None = None, retry_after_ms: int | None = None) -> dict:
    body = {"type": kind or _REFUSAL_KIND.get(code, "invalid_request_error"), "code": code,
            "message": message, "event_id": event_id, "param": param}
    if retry_after_ms is not None:
        body["retry_after_ms"] = retry_after_ms
    return event("error", error=body)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict:
    return {"total_tokens": prompt_tokens + completion_tokens, "input_tokens": prompt_tokens,
            "output_tokens": completion_tokens,
            "input_token_details": {"cached_tokens": cached_tokens, "text_tokens": prompt_tokens,
                                    "audio_tokens": 0, "image_tokens": 0},
            "output_token_details": {"text_tokens": completion_tokens, "audio_tokens": 0}}


def rate_limits(requests_limit: int, requests_remaining: int) -> dict:
    return event("rate_limits.updated", rate_limits=[
        {"name": "requests", "limit": requests_limit, "remaining": requests_remaining,
         "reset_seconds": 0.0}])
