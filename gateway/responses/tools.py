"""A Responses request's tools as gateway/tools plans them: the flat Responses spelling
({"type": "function", "name", "parameters"}; tool_choice {"type": "function", "name"})
read into chat completions' terms, and calls written back as `function_call` items."""
from __future__ import annotations

from gateway.errors import RequestError
from gateway.responses.request import CreateRequest, invalid
from gateway.runtime import Runtime
from gateway.tools.parser import ToolCall
from gateway.tools.plan import FunctionDef, ToolPlan, for_request, nested_choice


def tool_plan(rt: Runtime, req: CreateRequest) -> ToolPlan | None:
    """The plan for `req`'s tools (None: no tools shown); a 400 names the field."""
    tools = [(t.type, FunctionDef(t.name, t.description, t.parameters, t.strict))
             for t in req.tools or ()]
    choice = nested_choice(req.tool_choice)
    text_format = req.text.format if req.text is not None else None
    fmt = "text.format" if text_format is not None and text_format.type != "text" else None
    try:
        return for_request(rt.config, rt.model, tools, choice, req.parallel_tool_calls, fmt)
    except RequestError as exc:  # chat completions' field names, flattened
        raise invalid(exc.message.replace(".function.", "."),
                      (exc.param or "tools").replace(".function.", ".")) from None


def call_item(call: ToolCall, item_id: str, status: str = "completed") -> dict:
    return {"id": item_id, "type": "function_call", "call_id": call.id, "name": call.name,
            "arguments": call.arguments, "status": status}


def tools_body(req: CreateRequest) -> list[dict]:
    """The request's tools as the Response object echoes them."""
    return [{"type": "function", "name": t.name, "description": t.description,
             "parameters": t.parameters or {"type": "object"},
             "strict": t.strict is not False} for t in req.tools or ()]
