"""The Responses API over HTTP: POST /v1/responses (whole or SSE), GET and DELETE
/v1/responses/{id}, GET /v1/responses/{id}/input_items. The WebSocket mode shares the
path (route.py answers GET with an Upgrade header there).

Errors are OpenAI's shape, as on chat completions: a RequestError's code picks the
status (400 for a bad field or an unknown previous_response_id, 404 for an unknown
response, 429/503 for admission and the store).
"""
from __future__ import annotations

import asyncio
import itertools
import math
import time

from aiohttp import web

from gateway.auth import OWNER
from gateway.errors import RequestError, bad_request, error_response, model_refusal
from gateway.openai.request import decode_body
# one fault boundary and one gate (origin, key, key slot, ready) for every OpenAI HTTP route
from gateway.openai.routes import contained, runtime_of
from gateway.responses import background, stored
from gateway.responses.answer import follow, sse, whole
from gateway.responses.kv import forget_deleted
from gateway.responses.request import CreateRequest
from gateway.responses.route import responses_socket
from gateway.responses.run import prepare
from gateway.runtime import Runtime
from gateway.stream import Stream

_ids = itertools.count()
_STATUS = {"not_found": web.HTTPNotFound, "rate_limited": web.HTTPTooManyRequests,
           "overloaded": web.HTTPServiceUnavailable, "draining": web.HTTPServiceUnavailable,
           "store_unavailable": web.HTTPServiceUnavailable}


def http_error(exc: RequestError) -> web.HTTPException:
    """A RequestError as OpenAI's HTTP error: 400 unless its code says otherwise."""
    cls = _STATUS.get(exc.code)
    if cls is None:
        return bad_request(exc.message, exc.param, code=exc.code)
    headers = None
    if exc.retry_after_ms is not None:
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after_ms / 1000)))}
    kind = "invalid_request_error" if cls is web.HTTPNotFound else exc.code
    return error_response(cls, exc.message, exc.code, headers=headers, err_type=kind,
                          param=exc.param)


@contained
async def create(request: web.Request) -> web.StreamResponse:
    rt = runtime_of(request)
    req = await decode_body(request, CreateRequest, rt.config.body_timeout_s)
    if req.background and req.store is False:
        raise bad_request("background: needs store: true (it is polled from the store)",
                          "background")
    try:  # the model this response runs on, loaded (a background run holds it again)
        rt.select_model(req.model if isinstance(req.model, str) else None)
        await rt.hold_model()
    except RequestError as exc:
        raise model_refusal(exc) from None
    try:
        prepared = await prepare(rt, req, request[OWNER])
    except RequestError as exc:
        raise http_error(exc) from None
    if req.background:
        return await _detached(request, rt, prepared)
    stream = Stream(prepared.shape.id, f"http-resp-{next(_ids)}", "http")
    try:
        admission = await rt.admit(stream, prepared.turn.params.priority,
                                   len(prepared.prompt), None, request[OWNER])
    except RequestError as exc:
        raise http_error(exc) from None
    return await _run(request, rt, admission, prepared, stream)


async def _run(request, rt: Runtime, admission, prepared, stream: Stream):
    stream.admitted = time.perf_counter()
    stream.task = asyncio.current_task()  # what a drain cancels
    rt.http_streams.add(stream)
    try:
        if prepared.shape.req.stream:
            return await sse(request, rt, admission, prepared, stream)
        return await whole(rt, admission, prepared, stream)
    except RequestError as exc:
        raise http_error(exc) from None
    except asyncio.CancelledError:
        if not stream.cancel_requested:
            raise  # the client hung up
        asyncio.current_task().uncancel()
        raise error_response(web.HTTPServiceUnavailable, "server draining", "draining",
                             headers={"Retry-After": "1"}) from None
    finally:
        admission.release(stream.completion_tokens, stream.finish_reason)
        rt.http_streams.discard(stream)


async def _detached(request: web.Request, rt: Runtime, prepared) -> web.StreamResponse:
    """Store the response as in_progress, start its run, answer without waiting for it."""
    shape = prepared.shape
    problem = await stored.save(rt, stored.Stored.of(
        shape.id, prepared.owner, prepared.turn.history, shape.body(),
        prepared.turn.input_items))
    if problem is not None:
        raise error_response(web.HTTPServiceUnavailable, problem, "store_unavailable",
                             err_type="server_error", headers={"Retry-After": "1"})
    run = background.start(request.app, rt, prepared)
    if shape.req.stream:
        return await follow(request, rt, run.log, -1)
    return web.json_response(shape.body())


async def _stored(request: web.Request, rt: Runtime) -> stored.Stored:
    response_id = request.match_info["response_id"]
    try:
        found = await stored.load(rt, response_id, request[OWNER])
    except RequestError as exc:
        raise http_error(exc) from None
    if found is None:
        raise http_error(stored.not_found(response_id))
    return found


@contained
async def retrieve(request: web.Request) -> web.StreamResponse:
    """The stored Response; `?stream=true&starting_after=N` resumes a background run's
    events after sequence number N (on the replica running it, while its log is kept)."""
    rt = runtime_of(request)
    found = await _stored(request, rt)
    if request.query.get("stream") not in ("true", "1"):
        return web.json_response(found.object)
    run = request.app[background.RUNS].get(found.record.session_id)
    if run is None:
        raise bad_request("stream: only a background response's events can be resumed, "
                          "on the server running it, while its log is kept", "stream")
    try:
        after = int(request.query.get("starting_after", "-1"))
    except ValueError:
        raise bad_request("starting_after: must be an integer", "starting_after") from None
    return await follow(request, rt, run.log, after)


@contained
async def cancel(request: web.Request) -> web.Response:
    """Stop a background response (its engine request aborted, its KV freed); answers
    the Response as stored once the run has ended."""
    rt = runtime_of(request)
    found = await _stored(request, rt)
    response_id = found.record.session_id
    if not found.object.get("background"):
        raise bad_request("response_id: only a background response can be cancelled",
                          "response_id")
    run = request.app[background.RUNS].get(response_id)
    if run is not None:
        await background.cancel(run)
        found = await _stored(request, rt)
    return web.json_response(found.object)


@contained
async def delete(request: web.Request) -> web.Response:
    rt = runtime_of(request)
    found = await _stored(request, rt)
    try:
        await stored.delete(rt, found.record.session_id)
    except RequestError as exc:
        raise http_error(exc) from None
    forget_deleted(rt, found)
    return web.json_response({"id": found.record.session_id, "object": "response",
                              "deleted": True})


@contained
async def input_items(request: web.Request) -> web.Response:
    found = await _stored(request, runtime_of(request))
    items = list(found.input_items)
    order = request.query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise bad_request("order: must be \"asc\" or \"desc\"", "order")
    if order == "desc":
        items.reverse()
    after = request.query.get("after")
    if after is not None:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    limit = _limit(request.query.get("limit", "20"))
    page = items[:limit]
    return web.json_response({"object": "list", "data": page,
                              "first_id": page[0]["id"] if page else None,
                              "last_id": page[-1]["id"] if page else None,
                              "has_more": len(items) > limit})


def _limit(raw: str) -> int:
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise bad_request("limit: must be an integer in [1, 100]", "limit")
    return limit


def add_routes(router: web.UrlDispatcher) -> None:
    """The Responses API's routes (app.py registers them with this one call)."""
    router.add_post("/v1/responses", create)
    router.add_get("/v1/responses", responses_socket)
    router.add_get("/v1/responses/{response_id}", retrieve)
    router.add_delete("/v1/responses/{response_id}", delete)
    router.add_get("/v1/responses/{response_id}/input_items", input_items)
    router.add_post("/v1/responses/{response_id}/cancel", cancel)


def setup(app: web.Application) -> None:
    """The routes and this process's registry of background runs."""
    app[background.RUNS] = {}
    add_routes(app.router)
