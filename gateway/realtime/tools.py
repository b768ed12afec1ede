"""A Realtime session's or response's tools, checked and planned by gateway/tools.

Realtime declares functions flat, as the Responses API does:

    tools                [{"type": "function", "name", "description", "parameters"}, ...]
    tool_choice          "auto" | "none" | "required" | {"type": "function", "name": ...}
    parallel_tool_calls  false: at most one call per response (default true)

session.update sets the session's (kept with the session: they survive a reconnect);
a response.create's own replace them for that response. Tools of another type (mcp)
are refused as `unsupported`, naming the type.
"""
from __future__ import annotations

import msgspec

from gateway.errors import RequestError, field_message
from gateway.realtime.events import RealtimeError, ResponseConfig, SessionConfig
from gateway.runtime import Runtime
from gateway.tools.plan import FunctionDef, ToolPlan, for_model, nested_choice


def given(config: SessionConfig | ResponseConfig) -> dict:
    """The tool fields the event sets, as sent ({}: none)."""
    return {name: value for name in ("tools", "tool_choice", "parallel_tool_calls")
            if (value := getattr(config, name)) is not None}


def tool_plan(rt: Runtime, spec: dict, event_id: str | None, where: str) -> ToolPlan | None:
    """The plan for the tool fields `spec` holds (None: the model is shown no tools); a
    RealtimeError names the field at fault under `where` (session or response)."""
    functions = [_function(tool, i, event_id, where)
                 for i, tool in enumerate(spec.get("tools") or ())]
    try:
        return for_model(rt.config, rt.model, functions or None,
                         nested_choice(spec.get("tool_choice")),
                         spec.get("parallel_tool_calls"))
    except RequestError as exc:  # chat completions' names: tools[i].function.name
        param = f"{where}.{(exc.param or 'tools').replace('.function.', '.')}"
        raise RealtimeError(exc.code, f"{where}.{exc.message.replace('.function.', '.')}",
                            event_id, param) from None


def _function(tool: dict, i: int, event_id: str | None, where: str) -> FunctionDef:
    param = f"{where}.tools[{i}]"
    kind = tool.get("type", "function")
    if kind != "function":
        raise RealtimeError("unsupported", f"{param}.type: {str(kind)[:32]!r} tools are not "
                            "supported by this server (function tools only)", event_id,
                            f"{param}.type")
    try:
        return msgspec.convert({k: v for k, v in tool.items() if k != "type"}, FunctionDef)
    except msgspec.ValidationError as exc:
        message = f"{param}.{field_message(exc)}"
        raise RealtimeError("invalid_request", message, event_id,
                            message.split(":", 1)[0]) from None
