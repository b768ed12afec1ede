"""The chat messages a response is generated from.

    system:   response.instructions, else the session's instructions (if any)
    messages: response.input when given (its own context: message and function items,
              and `item_reference`s to conversation items), else the conversation's items
    tools:    with a plan, as it renders them (the template's own tool rendering, or the
              fallback's system message); without, past calls and outputs still render,
              as text in the model's call syntax (gateway/tools/fallback.py)

A response's text and its calls are items of their own (one message each); consecutive
ones are merged back into the one assistant turn a chat template expects.
"""
from __future__ import annotations

from gateway.realtime import events as ev
from gateway.realtime.conversation import Conversation
from gateway.tools.fallback import without_tools
from gateway.tools.formats import ToolFormat
from gateway.tools.plan import ToolPlan


def response_messages(conversation: Conversation, config: ev.ResponseConfig,
                      session_system: str | None, event_id: str | None) -> list[dict]:
    system = config.instructions if config.instructions is not None else session_system
    if config.input is None:
        messages = [dict(m) for m in conversation.session.messages]
    else:
        messages = _input_messages(conversation, config.input, event_id)
    head = [{"role": "system", "content": system}] if system else []
    return head + _merge_calls(messages)


def for_template(messages: list[dict], plan: ToolPlan | None,
                 fmt: ToolFormat) -> list[dict]:
    """The messages as the chat template takes them (fmt: the model's call syntax)."""
    return plan.messages(messages) if plan is not None else without_tools(fmt, messages)


def _input_messages(conversation: Conversation, items: list[ev.Item],
                    event_id: str | None) -> list[dict]:
    """response.input's items as messages; an output must answer a call among them or
    in the conversation."""
    messages, calls, read_conversation = [], set(), False
    for i, item in enumerate(items):
        where = f"response.input[{i}]"
        if item.type == "item_reference":
            if item.id is None:
                raise ev.RealtimeError("invalid_request", f"{where}.id: required for an "
                                       "item_reference", event_id, f"{where}.id")
            _, message = conversation.item(conversation.index(item.id, event_id))
        else:
            message = ev.item_message(item, event_id, where)
        calls.update(call["id"] for call in message.get("tool_calls") or ())
        call_id = message.get("tool_call_id")
        if call_id is not None and call_id not in calls and not read_conversation:
            calls |= conversation.call_ids()  # once, when an output first needs it
            read_conversation = True
        if call_id is not None and call_id not in calls:
            raise ev.RealtimeError("invalid_request", f"{where}.call_id: no function_call "
                                   f"with call_id {call_id[:64]!r} in the input or the "
                                   "conversation", event_id, f"{where}.call_id")
        messages.append(message)
    return messages


def _merge_calls(messages: list[dict]) -> list[dict]:
    """A call's message joins the assistant turn just before it (the response's text or
    its earlier calls): one turn with its content and all its calls."""
    out: list[dict] = []
    for m in messages:
        if m.get("tool_calls") and out and out[-1]["role"] == "assistant":
            last = out[-1]
            out[-1] = {**last, "tool_calls": [*(last.get("tool_calls") or ()),
                                              *m["tool_calls"]]}
        else:
            out.append(m)
    return out
