"""A Responses request's tools as gateway/tools plans them: the flat Responses spelling
({"type": "function", "name", "parameters"}; tool_choice {"type": "function", "name"})
read into chat completions' terms, and calls written back as `function_call` items."""
from __future__ import annotations

from gateway.errors import RequestError
from gateway.responses.request import CreateRequest, invalid
from gateway.runtime import Runtime
from gateway.tools.parser import ToolCall
from gateway.tools.plan import FunctionDef, ToolPlan, for_model


def tool_plan(rt: Runtime, req: CreateRequest) -> ToolPlan | None:
    """The plan for `req`'s tools (None: no tools shown); a 400 names the field."""
    functions = []
    for i, tool in enumerate(req.tools or ()):
        if tool.type != "function":
            raise invalid(f"tools[{i}].type: only function tools are supported, not "
                          f"{tool.type[:32]!r}", f"tools[{i}].type")
        functions.append(FunctionDef(tool.name, tool.description, tool.parameters,
                                     tool.strict))
    choice = req.tool_choice
    if isinstance(choice, dict) and choice.get("type") == "function" and "name" in choice:
        choice = {"type": "function", "function": {"name": choice["name"]}}
    try:
        plan = for_model(rt.config, rt.model, functions, choice, req.parallel_tool_calls)
    except RequestError as exc:
        raise invalid(exc.message.replace(".function.", "."),
                      (exc.param or "tools").replace(".function.", ".")) from None
    text_format = req.text.format if req.text is not None else None
    if plan is not None and plan.choice != "auto" and text_format is not None \
            and text_format.type != "text":
        raise invalid("tool_choice: a required or named tool call cannot be combined with "
                      "text.format (both constrain the whole answer)", "tool_choice")
    return plan


def call_item(call: ToolCall, item_id: str, status: str = "completed") -> dict:
    return {"id": item_id, "type": "function_call", "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}


def tools_body(req: CreateRequest) -> list[dict]:
    """The request's tools as the Response object echoes them."""
    return [{"type": "function", "name": t.name, "description": t.description,
             "parameters": t.parameters or {"type": "object"},
             "strict": t.strict is not False} for t in req.tools or ()]
