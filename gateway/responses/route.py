"""`GET /v1/responses`: WebSocket mode. Origin and key checks before the upgrade (a key
as `Authorization: Bearer`, as the SDK sends it), then one ResponsesProtocol on a
SocketCore."""
from __future__ import annotations

from aiohttp import web

from gateway.auth import authenticate, check_origin
from gateway.errors import bad_request
from gateway.responses.protocol import ResponsesProtocol
from gateway.runtime import RUNTIME
from gateway.sockets.upgrade import serve_socket, unavailable


async def responses_socket(request: web.Request) -> web.WebSocketResponse:
    rt = request.app[RUNTIME]
    if request.headers.get("Upgrade", "").lower() != "websocket":
        raise bad_request("GET /v1/responses is WebSocket mode (send an Upgrade); create "
                          "a response with POST /v1/responses", None)
    check_origin(request, rt.config)
    owner = authenticate(request, rt.config)
    if not rt.ready:
        raise unavailable(rt)
    return await serve_socket(request, rt, None, owner, "respws", ResponsesProtocol)
