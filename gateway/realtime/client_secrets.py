"""`POST /v1/realtime/client_secrets`: an ephemeral token for a browser, as OpenAI's GA API.

    request  (with a real API key; body optional)
        {"expires_after": {"anchor": "created_at", "seconds": N},
         "session": {"type": "realtime", "model": M}}
    answer
        {"value": "ek_...", "expires_at": UNIX, "session": {"type": "realtime", ...}}

The token (gateway/tokens.py) opens /v1/ws and /v1/realtime as the key that minted it
(its quotas, its sessions) until it expires; every other endpoint, this one included,
refuses it. The session's other settings (instructions, ...) are not carried by the token:
they are refused here, naming the field, and belong in `session.update` once connected.
"""
from __future__ import annotations

import asyncio
import math
import time

import msgspec
from aiohttp import web

from gateway.auth import authenticate, check_origin
from gateway.errors import bad_request, error_response, field_error
from gateway.runtime import RUNTIME, Runtime


class ExpiresAfter(msgspec.Struct, forbid_unknown_fields=True):
    anchor: str = "created_at"
    seconds: int | None = None


class SessionSpec(msgspec.Struct, forbid_unknown_fields=True):
    type: str = "realtime"
    model: str | None = None


class ClientSecretRequest(msgspec.Struct, forbid_unknown_fields=True):
    expires_after: ExpiresAfter | None = None
    session: SessionSpec | None = None


async def create_client_secret(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    check_origin(request, rt.config)
    owner = authenticate(request, rt.config)  # a real key: a token cannot mint another
    req = await _decode(request, rt.config.body_timeout_s)
    ttl = _lifetime(req.expires_after, rt)
    session = _session(req.session or SessionSpec(), rt)
    expires_at = math.ceil(time.time() + ttl)
    return web.json_response({"value": rt.tokens.mint(owner, expires_at),
                              "expires_at": expires_at, "session": session},
                             headers={"Cache-Control": "no-store"})


async def _decode(request: web.Request, timeout: float) -> ClientSecretRequest:
    try:
        async with asyncio.timeout(timeout):
            body = await request.read()
    except asyncio.TimeoutError:
        raise error_response(web.HTTPRequestTimeout, f"the body did not arrive within "
                             f"{timeout:g} s", "timeout") from None
    if not body.strip():
        return ClientSecretRequest()
    try:
        return msgspec.json.decode(body, type=ClientSecretRequest)
    except msgspec.ValidationError as exc:
        path, problem = field_error(exc)
        if problem == "unknown field" and path.startswith("session."):
            problem = ("not carried by a client secret here; send it in session.update "
                       "once connected")
        raise bad_request(f"{path}: {problem}" if path else problem, path or None) from None
    except msgspec.DecodeError as exc:
        raise bad_request(f"body is not valid JSON: {exc}", None, code="invalid_json") \
            from None


def _lifetime(expires: ExpiresAfter | None, rt: Runtime) -> int:
    """Seconds the token lives: the request's, within client_secret_max_ttl_s."""
    limit = rt.config.client_secret_max_ttl_s
    if expires is None or expires.seconds is None:
        return rt.config.client_secret_ttl_s
    if expires.anchor != "created_at":
        raise bad_request('expires_after.anchor: must be "created_at"', "expires_after.anchor")
    if not 1 <= expires.seconds <= limit:
        raise bad_request(f"expires_after.seconds: must be in [1, {limit}] "
                          "(client_secret_max_ttl_s)", "expires_after.seconds")
    return expires.seconds


def _session(spec: SessionSpec, rt: Runtime) -> dict:
    if spec.type != "realtime":
        raise bad_request('session.type: only "realtime" sessions are served',
                          "session.type")
    names = rt.scheduler.models.names()
    if spec.model is not None and spec.model not in names:
        raise bad_request(f"session.model: {spec.model!r} is not served here (the models "
                          f"are {', '.join(map(repr, names))})", "session.model",
                          code="model_not_found")
    return {"type": "realtime", "object": "realtime.session",
            "model": spec.model or rt.default_model.name, "output_modalities": ["text"]}
