"""The WebSocket upgrade every socket endpoint shares: limits, session, serve, detach.

    route (per protocol): origin, auth, subprotocol choice -> serve_socket(...)
    serve_socket: the session (?session_id=) attached, 101 with its id, the protocol's
                  SocketCore served until the socket closes, the session detached
"""
from __future__ import annotations

from collections.abc import Callable

from aiohttp import WSCloseCode, hdrs, web

from gateway.auth import without_keys
from gateway.errors import RequestError, error_response
from gateway.runtime import Runtime
from gateway.sessions.live import LiveSession
from gateway.sessions.store import SessionStoreUnavailableError
from gateway.sockets.core import SocketCore, WireProtocol

SESSION_HEADER = "X-Tokenwire-Session"

# (the socket's core, holding its session; whether the session was resumed) -> the protocol
ProtocolFactory = Callable[[SocketCore, bool], WireProtocol]


def offered_subprotocols(request: web.Request) -> list[str]:
    header = request.headers.get(hdrs.SEC_WEBSOCKET_PROTOCOL, "")
    return [part.strip() for part in header.split(",") if part.strip()]


def unavailable(rt: Runtime) -> web.HTTPException:
    """503 before the upgrade: the model is loading or failed, or the server draining."""
    retry_s = max(1, rt.config.reconnect_after_ms // 1000)
    code = "draining" if rt.status == "draining" else "overloaded"
    return error_response(web.HTTPServiceUnavailable, f"not ready: {rt.reason}", code,
                          headers={"Retry-After": str(retry_s)})


async def serve_socket(request: web.Request, rt: Runtime, chosen: str | None,
                       owner: str | None, tag_prefix: str,
                       make_protocol: ProtocolFactory) -> web.WebSocketResponse:
    """Upgrade with the gateway's socket limits, attach the session (`?session_id=`) and
    serve the protocol `make_protocol` builds until the socket closes. The socket counts
    against its key's max_connections_per_key for its lifetime (429 beyond it)."""
    try:
        rt.take_key_slot(owner)
    except RequestError as exc:
        raise error_response(web.HTTPTooManyRequests, exc.message, exc.code,
                             headers={"Retry-After": "1"}) from None
    try:
        return await _serve(request, rt, chosen, owner, tag_prefix, make_protocol)
    finally:
        rt.give_key_slot(owner)


async def _choose_model(rt: Runtime, name: str | None,
                        live: LiveSession) -> RequestError | None:
    """Bind the socket to `?model=`, else its session's model, else the default, and wait
    for it to load (after the upgrade: a load can outlast a client's handshake timeout;
    the hello that names its limits comes after). The session remembers the model where
    several are served. The refusal (model_not_found, model_unavailable) the socket
    answers with instead."""
    try:
        slot = rt.select_model(name or live.record.model)
        async with rt.using_model():
            pass
    except RequestError as exc:
        return exc
    if len(rt.scheduler.models.slots) > 1:
        live.record.model = slot.name
    return None


async def _refuse(ws: web.WebSocketResponse, protocol: WireProtocol,
                  refusal: RequestError) -> None:
    """The protocol's error event in place of its hello, then a close (1008)."""
    frame = protocol.encode(protocol.error_frame(refusal))
    await (ws.send_bytes(frame) if isinstance(frame, bytes) else ws.send_str(frame))
    await ws.close(code=WSCloseCode.POLICY_VIOLATION, message=refusal.code.encode())


async def _serve(request: web.Request, rt: Runtime, chosen: str | None, owner: str | None,
                 tag_prefix: str, make_protocol: ProtocolFactory) -> web.WebSocketResponse:
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
    core = None
    try:
        await ws.prepare(without_keys(request))
        refusal = await _choose_model(rt, request.query.get("model"), live)
        core = SocketCore(rt, ws, live, tag_prefix)
        protocol = make_protocol(core, resumed)
        if refusal is not None:
            await _refuse(ws, protocol, refusal)
            return ws
        if resumed:
            rt.session_kv.resumed(live)
        rt.connections.add(core)
        rt.metrics.ws_active.inc()
        await core.serve(protocol)
    finally:
        if core is not None and core in rt.connections:
            rt.connections.discard(core)
            rt.metrics.ws_active.dec()
        rt.sessions.detach(live)
        if live.refs == 0:
            rt.session_kv.closed(live)
    return ws
