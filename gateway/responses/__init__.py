"""OpenAI's Responses API: /v1/responses over HTTP, SSE and WebSocket mode (docs/responses.md).

    request.py   the create body's schema, its refusals, input items decoded one by one
    turn.py      a request as a chat turn: messages (history + input) and SamplingParams
    shape.py     the Response object and its stream events
    stored.py    stored responses, in the session store
    run.py       prepare (all checks, before admission), generate, finish (store)
    answer.py    one JSON Response, or Server-Sent Events
    background.py  background: true runs, their event logs, cancel
    routes.py    the HTTP handlers
"""
from gateway.responses.routes import (
    add_routes,
    create,
    delete,
    input_items,
    retrieve,
    setup,
)

__all__ = ["add_routes", "create", "delete", "input_items", "retrieve", "setup"]
