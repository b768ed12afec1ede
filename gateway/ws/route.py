"""`GET /v1/ws`: origin and key checks before the upgrade, the subprotocol choice, then one
V1Protocol on a SocketCore."""
from __future__ import annotations

from aiohttp import web

from gateway.auth import BEARER_PREFIX, authenticate, check_origin
from gateway.runtime import RUNTIME
from gateway.sockets.upgrade import offered_subprotocols, serve_socket, unavailable
from gateway.ws import frames as f
from gateway.ws.protocol import V1Protocol

# "tokenwire.v1" lets a browser that offers bearer.KEY also offer a protocol we can echo
# without echoing its key.
JSON_SUBPROTOCOL = f.PROTOCOL


def choose_subprotocol(offered: list[str]) -> str | None:
    """msgpack if offered, else tokenwire.v1, else the bearer token itself (browsers fail
    a handshake that offered subprotocols and got none back)."""
    for name in (f.MSGPACK_SUBPROTOCOL, JSON_SUBPROTOCOL):
        if name in offered:
            return name
    bearer = [o for o in offered if o.startswith(BEARER_PREFIX)]
    return bearer[0] if bearer else None


async def ws_handler(request: web.Request) -> web.WebSocketResponse:
    rt = request.app[RUNTIME]
    check_origin(request, rt.config)
    offered = offered_subprotocols(request)
    owner = authenticate(request, rt.config, offered)
    if not rt.ready:
        raise unavailable(rt)
    chosen = choose_subprotocol(offered)
    codec = f.Codec(binary=chosen == f.MSGPACK_SUBPROTOCOL)
    return await serve_socket(
        request, rt, chosen, owner, "ws",
        lambda core, resumed: V1Protocol(core, resumed, codec))
