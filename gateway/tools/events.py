"""The events that stream one function call item, shared by the Responses API and Realtime.

Both protocols announce a call the same way: the item in progress with empty arguments,
the arguments (sent whole: the parser releases a call only once it is complete), then
the item done. They differ only in the envelope (`event`) and the ids each event carries.
"""
from __future__ import annotations

from typing import Callable

Event = Callable[..., dict]


def function_call_events(event: Event, item: dict, where: dict, ids: dict) -> list[dict]:
    """`event(kind, **fields)` builds one event; `where` goes into every event (its output
    index), `ids` into the argument events (the item id, and the call id on Realtime)."""
    arguments = item["arguments"]
    return [
        event("response.output_item.added", **where,
              item={**item, "arguments": "", "status": "in_progress"}),
        event("response.function_call_arguments.delta", **where, **ids, delta=arguments),
        event("response.function_call_arguments.done", **where, **ids,
              name=item["name"], arguments=arguments),
        event("response.output_item.done", **where, item=item)]


def plain_event(kind: str, **fields) -> dict:
    """An event with no envelope beyond its type (the Responses API's)."""
    return {"type": kind, **fields}
