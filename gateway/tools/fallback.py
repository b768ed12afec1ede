"""Tools for a chat template that cannot render them (the default model's cannot): the
functions and the call syntax in a system message, past calls and their results as text,
in the syntax the parser reads and the grammar writes (Hermes' unless overridden).

The wording is tokenwire's own; what matters to the parser is only the syntax, which
the grammar enforces whenever a call is made.
"""
from __future__ import annotations

import json
from typing import TYPE_CHECKING

from gateway.tools.formats import ToolFormat, call_arguments

if TYPE_CHECKING:
    from gateway.tools.plan import ToolPlan

_INTRO = ("You can call functions to help answer. Their signatures, one JSON object "
          "per line:\n<tools>\n{tools}\n</tools>\n\nTo call one, answer with only the "
          "call, in this form:\n{example}\nA function's result comes back in "
          "<tool_response></tool_response> tags.")


def render(plan: ToolPlan, messages: list[dict]) -> list[dict]:
    """`messages` with the tool instructions in the system message and every tool turn
    as text the template renders like any other."""
    signatures = "\n".join(json.dumps({"name": f.name, "description": f.description or "",
                                       "parameters": f.parameters or {"type": "object"}},
                                      ensure_ascii=False) for f in plan.functions)
    example = plan.format.call_text("<function-name>", {"<argument>": "<value>"})
    intro = _INTRO.format(tools=signatures, example=example)
    out = render_turns(plan.format, messages)
    if out and out[0]["role"] == "system":
        out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{intro}"}
    else:
        out.insert(0, {"role": "system", "content": intro})
    return out


def without_tools(fmt: ToolFormat, messages: list[dict]) -> list[dict]:
    """`messages` for a prompt that shows no tools: past calls and results (a Realtime
    conversation's, which /v1/ws shares) as text in `fmt`, so any template renders them;
    a history without any, as it is."""
    if any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
        return render_turns(fmt, messages)
    return messages


def render_turns(fmt: ToolFormat, messages: list[dict]) -> list[dict]:
    """`messages` with every tool turn as text: past calls in `fmt`'s syntax, results as
    user turns. Also for a conversation that holds calls when no tools are shown now."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            calls = [fmt.call_text(c["function"]["name"], call_arguments(c))
                     for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(
                [m["content"]] * bool(m.get("content")) + calls)})
        elif m["role"] == "tool":
            out.append({"role": "user", "content":
                        f"<tool_response>\n{m['content']}\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out
