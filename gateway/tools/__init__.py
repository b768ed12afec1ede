"""Tool calls: what the model is shown, how its calls are constrained, how they are read.

    tools + tool_choice + parallel_tool_calls --plan()--> ToolPlan
        .messages(history)   the conversation as the chat template takes it: the template's
                             own tool rendering, or (a template that cannot render tools)
                             a system message listing them in the call syntax the parser reads
        .constraint          a `tool_calls` response_format: xgrammar's structural tag for
                             the syntax, so every call's arguments parse against its schema
        .parser()            a streaming CallParser: model text -> content + ToolCalls

One syntax per model (formats.py): Hermes' <tool_call> JSON (Qwen, Hermes, and the fallback
for templates without tools) or Llama 3's JSON, chosen from the chat template or by
--tool-call-parser. Chat completions, Realtime and Responses share this package.
"""
from gateway.tools.formats import FORMATS, ToolFormat, format_for_template
from gateway.tools.parser import CallParser, ToolCall
from gateway.tools.plan import ToolPlan, plan

__all__ = ["FORMATS", "CallParser", "ToolCall", "ToolFormat", "ToolPlan",
           "format_for_template", "plan"]
