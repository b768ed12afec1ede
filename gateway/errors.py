"""Errors as data: what went wrong with a request, shaped by each protocol its own way.

    RequestError(code, message, request_id, param, retry_after_ms)
        /v1/ws:       {"type": "error", "code", "message", "id", "retry_after_ms"}
        /v1/realtime: {"type": "error", "error": {"type", "code", "message", "event_id",
                       "param", "retry_after_ms"}}
        HTTP:         {"error": {"message", "type", "param", "code"}} (error_response)
"""
from __future__ import annotations

import json
import re

import msgspec
from aiohttp import web


class RequestError(Exception):
    """A request that cannot be served. `request_id` is the client's id for it (a v1 `id`,
    a Realtime `event_id`), `param` the field at fault as the client named it."""

    def __init__(self, code: str, message: str, request_id: str | None = None, *,
                 param: str | None = None, retry_after_ms: int | None = None):
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id
        self.param = param
        self.retry_after_ms = retry_after_ms


def field_error(exc: msgspec.ValidationError) -> tuple[str, str]:
    """(field path, problem) of a msgspec error. msgspec says where only in its message
    ("Expected `str`, got `int` - at `$.content`"), so this is the one place that reads
    it; everything after carries the field as data."""
    text = str(exc)
    field = re.fullmatch(r"Object (missing required|contains unknown) field `(\w+)`"
                         r"(?: - at `\$\.(.+)`)?", text)
    if field:
        problem, name, parent = field.groups()
        path = f"{parent}.{name}" if parent else name
        return path, "required field missing" if problem[0] == "m" else "unknown field"
    if " - at `$." in text:
        message, path = text.rsplit(" - at `$.", 1)
        return path.rstrip("`"), message
    return "", text


def field_message(exc: msgspec.ValidationError) -> str:
    """A msgspec error as "field: problem", leading with the field."""
    path, problem = field_error(exc)
    return f"{path}: {problem}" if path else problem


def error_response(cls: type[web.HTTPException], message: str, code: str,
                   headers: dict | None = None, err_type: str | None = None,
                   param: str | None = None) -> web.HTTPException:
    """An HTTP error with OpenAI's JSON body: {"error": {message, type, param, code}}."""
    body = json.dumps({"error": {"message": message, "type": err_type or code,
                                 "param": param, "code": code}})
    return cls(text=body, content_type="application/json", headers=headers)


def bad_request(message: str, param: str | None,
                code: str = "invalid_request") -> web.HTTPException:
    """A 400 naming the field the way OpenAI does."""
    return error_response(web.HTTPBadRequest, message, code,
                          err_type="invalid_request_error", param=param)


def model_refusal(exc: RequestError) -> web.HTTPException:
    """A request's model that is unknown (404 model_not_found), cannot load (503
    model_unavailable, the loader's error) or has too many waiting for its load (503
    overloaded), as an HTTP error."""
    if exc.code == "model_not_found":
        return error_response(web.HTTPNotFound, exc.message, exc.code,
                              err_type="invalid_request_error", param="model")
    retry_s = -(-(exc.retry_after_ms or 5000) // 1000)
    return error_response(web.HTTPServiceUnavailable, exc.message, exc.code,
                          err_type="server_error", headers={"Retry-After": str(retry_s)})
