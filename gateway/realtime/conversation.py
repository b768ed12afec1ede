"""Conversation: the Realtime items of one connection over its session's history.

The session keeps plain chat messages ({"role", "content"}), shared with /v1/ws sockets
on the same session and saved in the session store; the conversation keeps one item id
per message beside them, and edits the history through the session's methods:

    session messages  [ {system..}, {user..}, {assistant..} ]
    ids               [ "item_a",   "item_b", "item_c"      ]

Ids are not stored: a resumed session (or messages a /v1/ws socket added meanwhile) gets
fresh ids for the messages it has not seen. A message item holds one text content part;
function items are kept as chat completions spells them, one message each, so sessions
stored before tools load as they were and templates render them as they expect:

    function_call         {"role": "assistant", "content": "",
                           "tool_calls": [{"id": call_id, "type": "function",
                                           "function": {"name", "arguments"}}]}
    function_call_output  {"role": "tool", "tool_call_id": call_id, "content": output}
"""
from __future__ import annotations

import secrets

from gateway.realtime.events import RealtimeError
from gateway.sessions.live import LiveSession

MAX_ITEM_ID_CHARS = 64


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


class Conversation:
    """Items of a session's history, addressable by id."""

    def __init__(self, session: LiveSession, max_items: int):
        self.session = session
        self.max_items = max_items
        self._ids: list[str] = []
        self._sync()

    def _sync(self) -> None:
        """Give ids to messages added by other sockets; forget those removed."""
        count = self.session.num_messages
        del self._ids[count:]
        self._ids.extend(new_id("item") for _ in range(count - len(self._ids)))

    def ids(self) -> list[str]:
        self._sync()
        return list(self._ids)

    def index(self, item_id: str, event_id: str | None) -> int:
        self._sync()
        try:
            return self._ids.index(item_id)
        except ValueError:
            raise RealtimeError("item_not_found", f"item_id: no item {item_id[:64]!r} in "
                                "the conversation", event_id, param="item_id") from None

    def item(self, index: int) -> tuple[str, dict]:
        """(item id, a copy of its message)."""
        return self._ids[index], self.session.message(index)

    def add(self, message: dict, item_id: str | None, previous_item_id: str | None,
            event_id: str | None) -> int:
        """Insert after previous_item_id (None: at the end, "root": first); its index.
        A tool output must answer a call in the conversation."""
        self._sync()
        call_id = message.get("tool_call_id")
        if call_id is not None and call_id not in self.call_ids():
            raise RealtimeError("invalid_request", f"item.call_id: no function_call with "
                                f"call_id {call_id[:64]!r} in the conversation", event_id,
                                param="item.call_id")
        if self.session.num_messages >= self.max_items:
            raise RealtimeError("too_large", f"the conversation holds {self.max_items} items, "
                                "its limit (max_conversation_items); delete some first",
                                event_id)
        item_id = item_id or new_id("item")
        if len(item_id) > MAX_ITEM_ID_CHARS:
            raise RealtimeError("invalid_value", f"item.id: at most {MAX_ITEM_ID_CHARS} "
                                "characters", event_id, param="item.id")
        if item_id in self._ids:
            raise RealtimeError("duplicate_id", f"item.id: {item_id[:64]!r} is already in "
                                "the conversation", event_id, param="item.id")
        if previous_item_id is None:
            at = self.session.num_messages
        elif previous_item_id == "root":
            at = 0
        else:
            at = self.index(previous_item_id, event_id) + 1
        self.session.insert(at, message)
        self._ids.insert(at, item_id)
        return at

    def delete(self, item_id: str, event_id: str | None) -> None:
        at = self.index(item_id, event_id)
        self.session.delete(at)
        del self._ids[at]

    def truncate(self, item_id: str, content_index: int, end: int,
                 event_id: str | None) -> None:
        """Cut an assistant item's text to its first `end` characters (what the client
        had shown when the user interrupted it)."""
        at = self.index(item_id, event_id)
        message = self.session.message(at)
        if message["role"] != "assistant" or message.get("tool_calls"):
            raise RealtimeError("invalid_value", "item_id: only assistant message items "
                                "can be truncated", event_id, param="item_id")
        if content_index != 0:
            raise RealtimeError("invalid_value", "content_index: items have one content "
                                "part here (0)", event_id, param="content_index")
        if not 0 <= end <= len(message["content"]):
            raise RealtimeError("invalid_value", f"audio_end_ms: the text has "
                                f"{len(message['content'])} characters", event_id,
                                param="audio_end_ms")
        self.session.truncate(at, end)

    def call_ids(self) -> set[str]:
        """The call_ids of the conversation's function_call items."""
        return {call["id"] for message in self.session.messages
                for call in message.get("tool_calls") or ()}

    def previous_id(self, index: int) -> str | None:
        return self._ids[index - 1] if index > 0 else None
