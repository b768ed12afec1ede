"""`GET /v1/ws`: checks before the upgrade, subprotocol choice, then one Connection
(`serve_socket` is shared with `GET /v1/realtime`)."""
from __future__ import annotations

from aiohttp import hdrs, web

from gateway import protocol as p
from gateway.auth import authenticate, check_origin, error_response
from gateway.connection import Connection
from gateway.session_store import SessionStoreUnavailableError
from gateway.state import RUNTIME, Runtime

SESSION_HEADER = "X-Tokenwire-Session"
JSON_SUBPROTOCOL = p.PROTOCOL  # "tokenwire.v1": lets a browser that offers bearer.KEY
# also offer a protocol we can echo without echoing its key.


def choose_subprotocol(offered: list[str]) -> str | None:
    """msgpack if offered, else tokenwire.v1, else the bearer token itself (browsers fail
    a handshake that offered subprotocols and got none back)."""
    for name in (p.MSGPACK_SUBPROTOCOL, JSON_SUBPROTOCOL):
        if name in offered:
            return name
    bearer = [o for o in offered if o.startswith(p.BEARER_PREFIX)]
    return bearer[0] if bearer else None


def offered_subprotocols(request: web.Request) -> list[str]:
    header = request.headers.get(hdrs.SEC_WEBSOCKET_PROTOCOL, "")
    return [part.strip() for part in header.split(",") if part.strip()]


async def ws_handler(request: web.Request) -> web.WebSocketResponse:
    rt = request.app[RUNTIME]
    check_origin(request, rt.config)
    offered = offered_subprotocols(request)
    owner = authenticate(request, rt.config, offered)
    if not rt.ready:
        raise unavailable(rt)
    chosen = choose_subprotocol(offered)
    codec = p.Codec(binary=chosen == p.MSGPACK_SUBPROTOCOL)
    return await serve_socket(request, rt, chosen, owner,
                              lambda ws, live, resumed: Connection(rt, ws, codec, live, resumed))


async def serve_socket(request: web.Request, rt: Runtime, chosen: str | None,
                       owner: str | None, make_connection) -> web.WebSocketResponse:
    """Upgrade with the gateway's socket limits, attach the session (`?session_id=`),
    serve the connection `make_connection(ws, session, resumed)` builds until it closes."""
    config = rt.config
    ws = web.WebSocketResponse(heartbeat=config.heartbeat_s,
                               receive_timeout=config.receive_timeout_s,
                               # aiohttp refuses a frame of exactly max_msg_size bytes;
                               # ours is the largest allowed, so the bound is one more.
                               max_msg_size=config.max_message_bytes + 1,
                               protocols=(chosen,) if chosen else ())
    try:
        live, resumed = await rt.sessions.attach(request.query.get("session_id"), owner)
    except SessionStoreUnavailableError as exc:  # the session to resume cannot be read
        retry_s = str(max(1, -(-exc.retry_after_ms // 1000)))
        raise error_response(web.HTTPServiceUnavailable, str(exc), exc.code,
                             headers={"Retry-After": retry_s}) from None
    # The 101 names the session, so a load balancer can learn which replica holds it
    # (deploy/haproxy: a stick table) before the client reconnects with ?session_id=.
    ws.headers[SESSION_HEADER] = live.id
    conn = None
    try:
        await ws.prepare(request)
        conn = make_connection(ws, live, resumed)
        rt.connections.add(conn)
        rt.metrics.ws_active.inc()
        await conn.serve()
    finally:
        if conn is not None:
            rt.connections.discard(conn)
            rt.metrics.ws_active.dec()
        rt.sessions.detach(live)
    return ws


def unavailable(rt: Runtime) -> web.HTTPException:
    retry_s = max(1, rt.config.reconnect_after_ms // 1000)
    code = "draining" if rt.status == "draining" else "overloaded"
    return error_response(web.HTTPServiceUnavailable, f"not ready: {rt.reason}", code,
                          headers={"Retry-After": str(retry_s)})
