"""API keys and Origin checks, done before any WebSocket upgrade or completion.

Keys are compared by their SHA-256 (the stored set holds hashes only), which also makes
the comparison's timing independent of the key. The hash is the owner of sessions. On
the socket endpoints an ephemeral client secret (gateway/tokens.py) acts as its key.
"""
from __future__ import annotations

import json
import logging
import time
from urllib.parse import urlsplit

from aiohttp import hdrs, web
from aiohttp.abc import AbstractAccessLogger

from gateway.config import GatewayConfig, is_loopback, key_hash
from gateway.errors import error_response
from gateway.tokens import ClientSecrets, TokenRefused, is_token

log = logging.getLogger(__name__)
# The caller's key hash once authenticated (None without auth): its owner id, for the
# handlers and the access log.
OWNER = web.RequestKey("owner", str)

# A browser cannot set headers on a WebSocket: it offers its key as a subprotocol, ours
# or OpenAI Realtime's.
BEARER_PREFIX = "bearer."
KEY_PROTOCOL_PREFIXES = (BEARER_PREFIX, "openai-insecure-api-key.")


def without_keys(request: web.Request) -> web.Request:
    """The request with no key among its offered subprotocols, for the upgrade: the key
    was read already, and aiohttp logs offered subprotocols when none is chosen."""
    header = request.headers.get(hdrs.SEC_WEBSOCKET_PROTOCOL)
    if header is None:
        return request
    offered = [p.strip() for p in header.split(",") if p.strip()]
    kept = [p for p in offered if not p.startswith(KEY_PROTOCOL_PREFIXES)]
    if len(kept) == len(offered):
        return request
    headers = request.headers.copy()
    del headers[hdrs.SEC_WEBSOCKET_PROTOCOL]
    if kept:
        headers[hdrs.SEC_WEBSOCKET_PROTOCOL] = ", ".join(kept)
    return request.clone(headers=headers)


class AccessLog(AbstractAccessLogger):
    """One JSON line per HTTP request or WebSocket (when it closes). The path is logged
    without its query (a session id there is a capability), the key as its hash's first
    12 hex characters."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        owner = request.get(OWNER)
        self.logger.info(json.dumps({
            "remote": request.remote, "method": request.method, "path": request.path,
            "status": response.status, "bytes": response.body_length,
            "ms": round(time * 1000, 1), "key": owner[:12] if owner else None}))


def check_origin(request: web.Request, config: GatewayConfig) -> None:
    """403 for a browser request from an origin that may not use the server: one not in
    allowed_origins, or by default one that is neither the server's own (its Host) nor a
    loopback page. Without an Origin header (not a browser) nothing is checked: keys guard
    those."""
    origin = request.headers.get(hdrs.ORIGIN)
    if origin is None or _allowed(origin, request.host, config.allowed_origins):
        return
    log.info("refused %s %s: Origin %.200r is not allowed", request.method, request.path,
             origin)
    raise error_response(web.HTTPForbidden, "origin not allowed", "forbidden")


def _allowed(origin: str, host: str, allowed: tuple[str, ...]) -> bool:
    if allowed:
        return "*" in allowed or origin in allowed
    parts = urlsplit(origin)  # "null" (a file or sandboxed page) has no host: refused
    return parts.netloc == host or (parts.hostname is not None and is_loopback(parts.hostname))


def authenticate(request: web.Request, config: GatewayConfig,
                 offered_protocols: list[str] = (),
                 tokens: ClientSecrets | None = None) -> str | None:
    """The owner (hash of the caller's key), None without auth, or 401 before any upgrade.
    With `tokens` (the socket endpoints only) an ephemeral client secret stands for the
    key that minted it. The owner is also kept on the request (OWNER). A refusal is
    logged with its reason, never with the key or token tried."""
    request[OWNER] = None
    if not config.auth_enabled:
        return None
    keys = [request.headers.get(hdrs.AUTHORIZATION, "").removeprefix("Bearer ").strip()]
    keys += [p[len(BEARER_PREFIX):] for p in offered_protocols if p.startswith(BEARER_PREFIX)]
    reason = "an API key that is not accepted" if any(keys) else "no API key"
    for key in keys:
        if key and key_hash(key) in config.key_hashes:
            request[OWNER] = key_hash(key)
            return request[OWNER]
        if tokens is not None and is_token(key):
            try:
                request[OWNER] = tokens.owner(key, time.time())
                return request[OWNER]
            except TokenRefused as exc:
                reason = str(exc)
    log.info("refused %s %s: %s", request.method, request.path, reason)
    raise error_response(web.HTTPUnauthorized, "missing or invalid API key", "unauthorized",
                         headers={"WWW-Authenticate": "Bearer"})
