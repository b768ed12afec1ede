"""What /v1 answers where no route matches: OpenAI's JSON error shape, so the SDKs show a
message instead of failing to parse aiohttp's plain-text 404 or 405.

    unknown path under /v1          -> 404 {"error": {..., "code": "not_found"}}
    known path, method it lacks     -> 405 {"error": {..., "code": "method_not_allowed"}}
                                       with Allow naming the methods it takes
"""
from __future__ import annotations

import json

from aiohttp import web
from aiohttp.web_urldispatcher import MatchInfoError


@web.middleware
async def v1_errors(request: web.Request, handler) -> web.StreamResponse:
    """aiohttp's routing failures under /v1 in OpenAI's shape; every other answer as is."""
    match = request.match_info
    if not isinstance(match, MatchInfoError) or not _under_v1(request.path):
        return await handler(request)
    failure = match.http_exception
    if isinstance(failure, web.HTTPMethodNotAllowed):
        allowed = sorted(failure.allowed_methods)
        raise web.HTTPMethodNotAllowed(
            request.method, allowed, content_type="application/json",
            text=_body(f"{request.method} is not allowed on {request.path[:200]}; use "
                       f"{', '.join(allowed)}", "method_not_allowed"))
    if isinstance(failure, web.HTTPNotFound):
        raise web.HTTPNotFound(content_type="application/json", text=_body(
            f"no such endpoint: {request.method} {request.path[:200]}", "not_found"))
    return await handler(request)


def _under_v1(path: str) -> bool:
    return path == "/v1" or path.startswith("/v1/")


def _body(message: str, code: str) -> str:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": None, "code": code}})
