"""The chat messages a response is generated from.

    system:   response.instructions, else the session's instructions (if any)
    messages: response.input when given (its own context: message items, and
              `item_reference`s to conversation items), else the conversation's items
"""
from __future__ import annotations

from gateway.realtime import events as ev
from gateway.realtime.conversation import Conversation


def response_messages(conversation: Conversation, config: ev.ResponseConfig,
                      session_system: str | None, event_id: str | None) -> list[dict]:
    system = config.instructions if config.instructions is not None else session_system
    if config.input is None:
        messages = [dict(m) for m in conversation.session.messages]
    else:
        messages = [_input_message(conversation, item, i, event_id)
                    for i, item in enumerate(config.input)]
    head = [{"role": "system", "content": system}] if system else []
    return head + messages


def _input_message(conversation: Conversation, item: ev.Item, i: int,
                   event_id: str | None) -> dict:
    if item.type == "item_reference":
        if item.id is None:
            raise ev.RealtimeError("invalid_request", f"response.input[{i}].id: required for "
                                   "an item_reference", event_id, f"response.input[{i}].id")
        _, message = conversation.item(conversation.index(item.id, event_id))
        return dict(message)
    role, text = ev.item_text(item, event_id, f"response.input[{i}]")
    return {"role": role, "content": text}
