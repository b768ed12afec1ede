"""The tool-call syntaxes tokenwire reads and writes, one per model family.

    hermes       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
                 (Qwen 2.5/3, Hermes, and tokenwire's rendering for templates without tools)
    llama3_json  {"name": "f", "parameters": {...}}
                 (Llama 3.x's JSON tool calling)

Each names the structural tag xgrammar builds for it (engine/response_format.py), so the
grammar and the parser agree on every byte of a call.
"""
from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class ToolFormat:
    name: str
    grammar: str  # xgrammar's built-in structural tag of the syntax
    start: str  # where a call begins in the model's text
    end: str  # where it ends after its JSON object ("" : the object's end)
    arguments_key: str

    def call_text(self, name: str, arguments: dict) -> str:
        """A call as the model writes it (the fallback renders past calls so)."""
        body = json.dumps({"name": name, self.arguments_key: arguments}, ensure_ascii=False)
        if self.end:
            return f"{self.start}\n{body}\n{self.end}"
        return body


HERMES = ToolFormat("hermes", "qwen_3", "<tool_call>", "</tool_call>", "arguments")
LLAMA3_JSON = ToolFormat("llama3_json", "llama", '{"name"', "", "parameters")
FORMATS = {f.name: f for f in (HERMES, LLAMA3_JSON)}


def format_for_template(template: str | None, override: str = "auto") -> ToolFormat:
    """The syntax a chat template teaches its model (`override` unless "auto"): Hermes
    when the template names <tool_call> or cannot render tools at all (the fallback
    writes Hermes), Llama 3 JSON when it renders tools with Llama's ipython turns."""
    if override != "auto":
        return FORMATS[override]
    template = template or ""
    if "<tool_call>" not in template and ("<|python_tag|>" in template
                                          or "ipython" in template):
        return LLAMA3_JSON
    return HERMES


def format_for_model(model, override: str = "auto") -> ToolFormat:
    """The served model's syntax (model: scheduler.models.ModelSlot; override: the
    --tool-call-parser)."""
    return format_for_template(model.chat_template if model.supports_tools else None,
                               override)


def call_arguments(call: dict) -> dict:
    """A past call's arguments as an object (clients send OpenAI's JSON text)."""
    arguments = call["function"].get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            arguments = {"_raw": arguments}  # a broken past call is kept, not refused
    return arguments if isinstance(arguments, dict) else {"_value": arguments}
