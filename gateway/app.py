"""The aiohttp application: routes, shared state, each resource's lifecycle, the drain.

    build_app(config, scheduler, store)
      cleanup_ctx, one per resource, started in this order and stopped in reverse:
        store      closed last (the app owns the store it is given)
        scheduler  admission and NVML sampling; refuses what is still queued on stop
        model      loaded in the background (/health and /ready answer meanwhile), stopped;
                   the registry marks a model failed once its engine dies (for the
                   default: /health and /ready 503, the entry point exits for a restart)
        session_kv parks of closed sessions' KV (gateway/sessions/kv.py) land, then stop
      on_shutdown: close every open socket (1012 after a drain, else 1001)
    drain(app): /ready -> 503, `draining` to every socket, in-flight work finishes up to
                drain_timeout_s, the rest is cancelled, sockets close with 1012; all done
                within drain_timeout_s + drain_grace_s (clients reconnect elsewhere with
                ?session_id=)
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from aiohttp import WSCloseCode, web
from prometheus_client import CONTENT_TYPE_LATEST

from gateway import openai, responses
from gateway.auth import AccessLog, authenticate
from gateway.config import GatewayConfig
from gateway.metrics import Metrics
from gateway.realtime.client_secrets import create_client_secret
from gateway.realtime.route import realtime_handler
from gateway.runtime import RUNTIME, Runtime
from gateway.sessions.registry import SessionRegistry
from gateway.sessions.store import MemorySessionStore, SessionStore
from gateway.sockets.guard import ConnectionGuard, GuardedRunner
from gateway.ws.route import ws_handler
from scheduler.door import Scheduler
from scheduler.metrics import register_metrics, register_model_metrics

STATIC = Path(__file__).parent / "static"
CLOSE_SERVICE_RESTART = 1012


def build_app(config: GatewayConfig, scheduler: Scheduler,
              store: SessionStore | None = None) -> web.Application:
    """An app serving `scheduler`'s model; sessions in `store` (None: in memory)."""
    # `is None`, not `or`: an empty store has len() 0 and is falsy.
    store = store if store is not None else MemorySessionStore()
    metrics = Metrics(scheduler.stats, scheduler.gpu_sample)
    register_metrics(metrics.registry, scheduler.admission)
    register_model_metrics(metrics.registry, scheduler)
    rt = Runtime(config, metrics, scheduler, SessionRegistry(store))
    # Read at scrape time: a session leaves the registry when its last save lands, which
    # can be after its last socket closed.
    metrics.sessions_active.set_function(lambda: len(rt.sessions))
    app = web.Application(client_max_size=config.max_message_bytes,
                          middlewares=[openai.v1_errors])
    app[RUNTIME] = rt
    app.cleanup_ctx.extend([_store, _scheduler, _model, _session_kv])
    app.on_shutdown.append(close_sockets)
    _routes(app.router)
    responses.setup(app)
    return app


def _routes(router: web.UrlDispatcher) -> None:
    router.add_get("/", index)
    router.add_get("/health", health)
    router.add_get("/ready", ready)
    router.add_get("/metrics", metrics)
    router.add_get("/v1/ws", ws_handler)
    router.add_get("/v1/realtime", realtime_handler)
    router.add_post("/v1/realtime/client_secrets", create_client_secret)
    router.add_get("/v1/models", openai.models)
    router.add_get("/v1/models/{model:.+}", openai.model)  # ids may hold a slash
    router.add_post("/v1/models/{model:.+}/load", openai.load_model)
    router.add_post("/v1/models/{model:.+}/unload", openai.unload_model)
    router.add_post("/v1/chat/completions", openai.chat_completions)
    router.add_post("/v1/completions", openai.completions)


def make_runner(app: web.Application, **kwargs) -> web.AppRunner:
    """The runner `tokenwire serve` (and the tests) use: each connection passes the
    ConnectionGuard (caps, head deadline) first. handler_cancellation: a client that hangs
    up mid-completion cancels its handler, which aborts the engine request."""
    rt = app[RUNTIME]
    if rt.config.access_log:
        kwargs.update(access_log_class=AccessLog, access_log=logging.getLogger("tokenwire.access"))
    else:
        kwargs["access_log"] = None
    return GuardedRunner(app, ConnectionGuard(rt.config, rt.metrics), handle_signals=False,
                         handler_cancellation=True,
                         keepalive_timeout=rt.config.keepalive_timeout_s, **kwargs)


# -- one cleanup context per resource ------------------------------------------------------
async def _store(app: web.Application):
    yield
    await app[RUNTIME].sessions.store.close()


async def _scheduler(app: web.Application):
    scheduler = app[RUNTIME].scheduler
    await scheduler.start()
    yield
    await scheduler.stop()


async def _model(app: web.Application):
    """Load the default model in the background (/health and /ready answer meanwhile; an
    engine the caller started is ready before the listener opens), then the other models
    configured to preload; the rest load on first use."""
    models = app[RUNTIME].scheduler.models
    loading = asyncio.create_task(models.preload(models.default))
    if models.default.given:
        await loading
    others = asyncio.create_task(_preload_others(models, loading))
    yield
    for task in (others, loading):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await models.stop()


async def _session_kv(app: web.Application):
    """Stopped before the models: the parks of the sockets a shutdown closed land first."""
    yield
    await app[RUNTIME].session_kv.stop()


async def _preload_others(models, default_loading: asyncio.Task) -> None:
    await asyncio.wait([default_loading])
    for slot in models.slots[1:]:
        if slot.preload:
            await models.preload(slot)


# -- graceful drain ------------------------------------------------------------------------
async def drain(app: web.Application) -> None:
    """Stop taking work, let in-flight requests finish (up to drain_timeout_s), then end
    the rest and close every socket with 1012, all within drain_grace_s more. The listener
    is stopped by the caller after.

        0 ........ drain_timeout_s ........ + grace/2 ............ + grace
        `draining`, wait for streams  |  refuse the queue,     |  close sockets;
                                      |  cancel WS/SSE streams |  drop the unanswered
    """
    rt = app[RUNTIME]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + rt.config.drain_timeout_s
    rt.draining = True
    for conn in list(rt.connections):
        conn.notify_draining(rt.config.reconnect_after_ms)
    while _busy(rt) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    grace = rt.config.drain_grace_s
    rt.scheduler.refuse_queued("draining", rt.config.reconnect_after_ms,
                               "the server is shutting down; reconnect later")
    await _cancel_streams(rt, grace / 2)
    await close_sockets(app, max(0.0, deadline + grace - loop.time()))


def _busy(rt: Runtime) -> bool:
    return bool(rt.http_streams) or any(conn.streams for conn in rt.connections)


async def _cancel_streams(rt: Runtime, timeout: float) -> None:
    """Cancel every WS and HTTP stream; each ends with its terminal event (a `done`
    cancelled, an SSE error event and [DONE]) unless it takes longer than `timeout`."""
    streams = [s for conn in rt.connections for s in conn.streams.values()]
    streams += rt.http_streams
    for stream in streams:
        stream.cancel_requested, stream.error = True, "server draining"
        stream.task.cancel()
    if streams:
        await asyncio.wait([s.task for s in streams], timeout=timeout)


async def close_sockets(app: web.Application, timeout: float | None = None) -> None:
    """Close every open socket: 1012 after a drain, else 1001 (going away)."""
    rt = app[RUNTIME]
    code = CLOSE_SERVICE_RESTART if rt.draining else WSCloseCode.GOING_AWAY
    timeout = rt.config.drain_grace_s if timeout is None else timeout
    await asyncio.gather(*(conn.close(code, b"server shutting down", timeout)
                           for conn in list(rt.connections)), return_exceptions=True)


# -- handlers -----------------------------------------------------------------------------
async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


async def health(request: web.Request) -> web.Response:
    """Process up and, once loaded, the engine loop alive."""
    rt = request.app[RUNTIME]
    alive = rt.default_model.alive
    ok = rt.status in ("loading", "unloaded") or alive  # unloaded: loads on next use
    return web.json_response({"status": "ok" if ok else "unhealthy", "state": rt.status,
                              "engine_alive": alive}, status=200 if ok else 503)


async def ready(request: web.Request) -> web.Response:
    """200 when the model is loaded, not draining, not overloaded and the session store
    answers; else 503 + reason."""
    rt = request.app[RUNTIME]
    reason = rt.reason if not rt.ready else ("overloaded" if rt.scheduler.overloaded() else "")
    if rt.status == "ready" and not rt.ready:
        reason = "engine loop stopped"
    if not reason and rt.sessions.blocks_readiness:
        reason = "session store unavailable"
    if reason:
        return web.json_response({"ready": False, "reason": reason}, status=503,
                                 headers={"Retry-After": "1"})
    return web.json_response({"ready": True, "model": rt.default_model.name})


async def metrics(request: web.Request) -> web.Response:
    """Prometheus text; with API keys on, only for a key (or on --metrics-port)."""
    rt = request.app[RUNTIME]
    authenticate(request, rt.config)
    return _metrics_text(rt)


def build_metrics_app(app: web.Application) -> web.Application:
    """/metrics alone, without a key, for --metrics-port: the same registry as `app`'s."""
    metrics_app = web.Application()
    metrics_app[RUNTIME] = app[RUNTIME]
    metrics_app.router.add_get("/metrics", _open_metrics)
    return metrics_app


async def _open_metrics(request: web.Request) -> web.Response:
    return _metrics_text(request.app[RUNTIME])


def _metrics_text(rt: Runtime) -> web.Response:
    return web.Response(body=rt.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})
