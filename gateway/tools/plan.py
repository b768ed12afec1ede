"""A request's tools, checked, and what follows from them for one model: the messages
its chat template renders, the grammar that constrains calls, the parser that reads them.

    tool_choice  "none"      no plan: the model sees no tools and cannot call any
                 "auto"      the model may answer in text or call (calls constrained)
                 "required"  at least one call (one if parallel_tool_calls is false)
                 {"type": "function", "function": {"name": "f"}}   exactly a call of f
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import msgspec

from gateway.errors import RequestError
from gateway.params import ParamError, check_schema
from gateway.tools.fallback import render
from gateway.tools.formats import HERMES, ToolFormat, call_arguments, format_for_model
from gateway.tools.parser import CallParser

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class FunctionDef(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One function a model may call, as OpenAI declares it."""

    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None  # calls always follow the schema here: either value


@dataclass(frozen=True)
class ToolLimits:
    max_tools: int
    max_schema_bytes: int
    max_schema_depth: int


@dataclass(frozen=True)
class ToolPlan:
    functions: tuple[FunctionDef, ...]
    choice: str | dict  # "auto", "required" or a named function
    parallel: bool
    format: ToolFormat
    native: bool  # the chat template renders tools itself

    @property
    def names(self) -> frozenset[str]:
        return frozenset(f.name for f in self.functions)

    @property
    def forced(self) -> str | None:
        """The function every answer calls (a named tool_choice), else None."""
        return self.choice["function"]["name"] if isinstance(self.choice, dict) else None

    def parser(self) -> CallParser:
        return CallParser(self.format, self.names)

    def finish_reason(self, called: bool, finish: str | None) -> str | None:
        """OpenAI's: `tool_calls` when the model chose to call; a forced call is `stop`."""
        return "tool_calls" if called and finish == "stop" and not self.forced else finish

    def constraint(self) -> dict:
        """The `tool_calls` response_format the engine compiles (engine/response_format)."""
        return {"type": "tool_calls", "format": self.format.grammar,
                "tools": [{"type": "function", "function": {
                    "name": f.name, "parameters": f.parameters or {"type": "object"}}}
                    for f in self.functions],
                "tool_choice": self.choice, "parallel_tool_calls": self.parallel}

    def template_tools(self) -> list[dict] | None:
        """The `tools` a native template renders (None: the fallback renders them)."""
        if not self.native:
            return None
        return [{"type": "function", "function": msgspec.to_builtins(f)} for f in self.functions]

    def messages(self, messages: list[dict]) -> list[dict]:
        """The conversation for the chat template: past calls with dict arguments (as
        templates index them); without native support, the tools and calls as text."""
        if self.native:
            return [_with_dict_arguments(m) for m in messages]
        return render(self, messages)


def plan(functions: list[FunctionDef] | None, choice, parallel: bool | None, *,
         native: bool, fmt: ToolFormat = HERMES, limits: ToolLimits) -> ToolPlan | None:
    """The plan for a request's tools, None when the model is shown none. Raises
    RequestError naming the field at fault."""
    if choice is None:
        choice = "auto" if functions else "none"
    _check_choice(choice, functions)
    if not functions or choice == "none":
        return None
    _check_functions(functions, limits)
    return ToolPlan(tuple(functions), choice, parallel is not False, fmt, native)


def for_model(config, model, functions: list[FunctionDef] | None, choice,
              parallel: bool | None) -> ToolPlan | None:
    """`plan` for the served model: its template's syntax (or --tool-call-parser) and the
    gateway's limits (config: GatewayConfig; model: scheduler.models.ModelSlot)."""
    limits = ToolLimits(config.max_tools, config.max_schema_bytes, config.max_schema_depth)
    fmt = format_for_model(model, config.tool_call_parser)
    return plan(functions, choice, parallel, native=model.supports_tools, fmt=fmt,
                limits=limits)


def for_request(config, model, tools: list[tuple[str, FunctionDef]], choice,
                parallel: bool | None, format_field: str | None) -> ToolPlan | None:
    """`for_model` after the checks every API makes of a request's tools: `tools` as
    (type, function) pairs, each a function; `format_field` names the request's own
    response format (its API's spelling) when it sets one, which a required or named
    call cannot be combined with. Raises RequestError naming the field as chat
    completions spells it (tools[i].function.name); each API maps it to its own."""
    for i, (kind, _) in enumerate(tools):
        if kind != "function":
            raise _error(f"tools[{i}].type", "only function tools are supported, not "
                         f"{kind[:32]!r}")
    tool_plan = for_model(config, model, [f for _, f in tools], choice, parallel)
    if tool_plan is not None and tool_plan.choice != "auto" and format_field is not None:
        raise _error("tool_choice", "a required or named tool call cannot be combined "
                     f"with {format_field} (both constrain the whole answer)")
    return tool_plan


def _check_choice(choice, functions: list[FunctionDef] | None) -> None:
    if choice in ("none", "auto", "required"):
        if choice == "required" and not functions:
            raise _error("tool_choice", "\"required\" needs tools")
        return
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or \
            not isinstance(named, str):
        raise _error("tool_choice", "must be \"none\", \"auto\", \"required\" or "
                     "{\"type\": \"function\", \"function\": {\"name\": ...}}")
    if named not in {f.name for f in functions or ()}:
        raise _error("tool_choice", f"names {named[:64]!r}, which is not among the tools")


def _check_functions(functions: list[FunctionDef], limits: ToolLimits) -> None:
    if len(functions) > limits.max_tools:
        raise _error("tools", f"at most {limits.max_tools} tools (max_tools)")
    seen = set()
    for i, f in enumerate(functions):
        if not _NAME.fullmatch(f.name) or f.name in seen:
            raise _error(f"tools[{i}].function.name", "must be 1-64 letters, digits, _ or - "
                         "and unique among the tools")
        seen.add(f.name)
        try:
            check_schema(f.parameters or {}, limits.max_schema_bytes, limits.max_schema_depth)
        except ParamError as exc:
            raise _error(f"tools[{i}].function.parameters", exc.problem) from None


def nested_choice(choice):
    """A tool_choice in the flat spelling of the Responses and Realtime APIs
    ({"type": "function", "name": "f"}) as chat completions spell it, which `plan`
    takes; any other value as it is."""
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        return {"type": "function", "function": {"name": choice["name"]}}
    return choice


def _with_dict_arguments(message: dict) -> dict:
    calls = message.get("tool_calls")
    if not calls:
        return message
    return {**message, "tool_calls": [
        {**c, "function": {**c["function"], "arguments": call_arguments(c)}} for c in calls]}


def _error(param: str, problem: str) -> RequestError:
    return RequestError("invalid_request", f"{param}: {problem}", param=param)
