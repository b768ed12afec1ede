"""`GET /v1/realtime`: OpenAI's auth conventions, then one RealtimeProtocol on a SocketCore.

Auth as OpenAI's: `Authorization: Bearer KEY`, or for browsers (which cannot set
headers on a WebSocket) the subprotocols `realtime` and `openai-insecure-api-key.KEY`;
`realtime` is echoed, never the key. `?model=` picks the model (serve_socket binds it);
`?session_id=` resumes a session's conversation.
"""
from __future__ import annotations

from aiohttp import web

from gateway.auth import BEARER_PREFIX, authenticate, check_origin
from gateway.realtime.protocol import RealtimeProtocol
from gateway.runtime import RUNTIME
from gateway.sockets.upgrade import offered_subprotocols, serve_socket, unavailable

SUBPROTOCOL = "realtime"
KEY_PREFIX = "openai-insecure-api-key."


async def realtime_handler(request: web.Request) -> web.WebSocketResponse:
    rt = request.app[RUNTIME]
    check_origin(request, rt.config)
    offered = offered_subprotocols(request)
    keys = [BEARER_PREFIX + o[len(KEY_PREFIX):] for o in offered if o.startswith(KEY_PREFIX)]
    owner = authenticate(request, rt.config, keys, rt.tokens)
    if not rt.ready:
        raise unavailable(rt)
    chosen = SUBPROTOCOL if SUBPROTOCOL in offered else None
    return await serve_socket(request, rt, chosen, owner, "rtws", RealtimeProtocol)
