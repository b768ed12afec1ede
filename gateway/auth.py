"""API keys and Origin checks, done before any WebSocket upgrade or completion.

Keys are compared by their SHA-256 (the stored set holds hashes only), which also makes
the comparison's timing independent of the key. The hash is the owner of sessions.
"""
from __future__ import annotations

from aiohttp import hdrs, web

from gateway.config import GatewayConfig, key_hash
from gateway.errors import error_response

# A browser cannot set headers on a WebSocket: it offers its key as a subprotocol.
BEARER_PREFIX = "bearer."


def check_origin(request: web.Request, config: GatewayConfig) -> None:
    """403 when allowed_origins is set and the request's Origin is not in it."""
    origin = request.headers.get(hdrs.ORIGIN)
    if config.allowed_origins and origin is not None and origin not in config.allowed_origins:
        raise error_response(web.HTTPForbidden, "origin not allowed", "forbidden")


def authenticate(request: web.Request, config: GatewayConfig,
                 offered_protocols: list[str] = ()) -> str | None:
    """The owner (hash of the caller's key), None without auth, or 401 before any upgrade."""
    if not config.auth_enabled:
        return None
    keys = [request.headers.get(hdrs.AUTHORIZATION, "").removeprefix("Bearer ").strip()]
    keys += [p[len(BEARER_PREFIX):] for p in offered_protocols if p.startswith(BEARER_PREFIX)]
    for key in keys:
        if key and key_hash(key) in config.key_hashes:
            return key_hash(key)
    raise error_response(web.HTTPUnauthorized, "missing or invalid API key", "unauthorized",
                         headers={"WWW-Authenticate": "Bearer"})
