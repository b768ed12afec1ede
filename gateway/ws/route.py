"""`GET /v1/ws`: origin and key checks before the upgrade, the subprotocol choice, then one
V1Protocol on a SocketCore."""
from __future__ import annotations

from aiohttp import web

from gateway.auth import authenticate, check_origin
from gateway.runtime import RUNTIME
from gateway.sockets.upgrade import offered_subprotocols, serve_socket, unavailable
from gateway.ws import frames as f
from gateway.ws.protocol import V1Protocol

# A browser that sends its key as the subprotocol bearer.KEY also offers "tokenwire.v1",
# which is echoed: a key is never echoed (the 101 would carry it into logs and proxies),
# and browsers fail a handshake that offered subprotocols and got none back.
JSON_SUBPROTOCOL = f.PROTOCOL


def choose_subprotocol(offered: list[str]) -> str | None:
    """msgpack if offered, else tokenwire.v1, else none."""
    for name in (f.MSGPACK_SUBPROTOCOL, JSON_SUBPROTOCOL):
        if name in offered:
            return name
    return None


async def ws_handler(request: web.Request) -> web.WebSocketResponse:
    rt = request.app[RUNTIME]
    check_origin(request, rt.config)
    offered = offered_subprotocols(request)
    owner = authenticate(request, rt.config, offered, rt.tokens)
    if not rt.ready:
        raise unavailable(rt)
    chosen = choose_subprotocol(offered)
    codec = f.Codec(binary=chosen == f.MSGPACK_SUBPROTOCOL)
    return await serve_socket(
        request, rt, chosen, owner, "ws",
        lambda core, resumed: V1Protocol(core, resumed, codec))
