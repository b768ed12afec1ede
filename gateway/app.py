"""The aiohttp application: routes, shared state, lifecycle and graceful drain.

    build_app(config, engine | engine_factory, store)
      cleanup_ctx: load + start the engine (in the background: /health and /ready answer
                   while the model loads) ... stop it and close the store
      on_shutdown: close every open socket (1012 after a drain, else 1001)
    drain(app): /ready -> 503, `draining` to every socket, in-flight work finishes up to
                drain_timeout_s, the rest is cancelled, sockets close with 1012; all done
                within drain_timeout_s + drain_grace_s
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

from aiohttp import WSCloseCode, web
from prometheus_client import CONTENT_TYPE_LATEST

from engine.async_engine import AsyncEngine
from gateway import openai_api
from gateway.gate import Gate
from gateway.config import GatewayConfig
from gateway.metrics import GpuSampler, Metrics
from gateway.realtime.route import realtime_handler
from gateway.session_store import MemorySessionStore, SessionStore
from gateway.sessions import SessionRegistry
from gateway.state import RUNTIME, Runtime
from gateway.ws import ws_handler
from scheduler.config import SchedulerConfig

log = logging.getLogger(__name__)
STATIC = Path(__file__).parent / "static"
CLOSE_SERVICE_RESTART = 1012


def build_app(config: GatewayConfig, *, engine: AsyncEngine | None = None,
              engine_factory: Callable[[], AsyncEngine] | None = None,
              store: SessionStore | None = None,
              gpu_sampler: GpuSampler | None = None,
              scheduler_config: SchedulerConfig | None = None,
              on_ready: Callable[[], None] | None = None) -> web.Application:
    """An app serving `engine` (already started, owned by the caller) or the engine that
    `engine_factory` builds (loaded in a thread, started and stopped by the app).
    `scheduler_config` sets admission and backpressure limits (None: defaults);
    `on_ready` runs once the engine is ready (the entry point's process-wide settings)."""
    if (engine is None) == (engine_factory is None):
        raise ValueError("give exactly one of engine or engine_factory")
    # `is None`, not `or`: an empty store has len() 0 and is falsy.
    store = store if store is not None else MemorySessionStore()
    rt = _runtime(config, store, gpu_sampler, scheduler_config)
    app = web.Application(client_max_size=config.max_message_bytes)
    app[RUNTIME] = rt
    app.cleanup_ctx.append(_lifecycle(engine, engine_factory, on_ready))
    app.on_shutdown.append(_close_sockets)
    app.router.add_get("/", index)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/ws", ws_handler)
    app.router.add_get("/v1/realtime", realtime_handler)
    app.router.add_get("/v1/models", openai_api.models)
    app.router.add_post("/v1/chat/completions", openai_api.chat_completions)
    app.router.add_post("/v1/completions", openai_api.completions)
    return app


def make_runner(app: web.Application, **kwargs) -> web.AppRunner:
    """The runner `tokenwire serve` (and the tests) use. handler_cancellation: a client
    that hangs up mid-completion cancels its handler, which aborts the engine request."""
    return web.AppRunner(app, handle_signals=False, handler_cancellation=True, **kwargs)


def _runtime(config: GatewayConfig, store: SessionStore, gpu_sampler,
             scheduler_config: SchedulerConfig | None) -> Runtime:
    rt: Runtime | None = None

    def stats():  # resolved at call time: rt exists by then
        return rt.engine_stats()

    # /metrics counts the admission queue as waiting and reads the gate's NVML sampler.
    metrics = Metrics(lambda: rt.gate.stats(), gpu_sampler or (lambda: rt.gate.gpu_sample()))
    gate = Gate(config, stats, metrics, scheduler_config)
    rt = Runtime(config, metrics, gate, SessionRegistry(store))
    # Read at scrape time: a session leaves the registry when its last save lands, which
    # can be after its last socket closed.
    metrics.sessions_active.set_function(lambda: len(rt.sessions))
    return rt


def _lifecycle(engine: AsyncEngine | None, factory: Callable[[], AsyncEngine] | None,
               on_ready: Callable[[], None] | None):
    async def ctx(app: web.Application):
        rt = app[RUNTIME]
        await rt.gate.start()
        loader = None
        if engine is not None:
            _set_ready(rt, engine, on_ready)
        else:
            loader = asyncio.create_task(_load(rt, factory, on_ready))
        watch = asyncio.create_task(_watch_engine(rt, loader))
        yield
        watch.cancel()
        if loader is not None:
            loader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loader
            if rt.engine is not None:
                await rt.engine.stop()
        await rt.gate.stop()
        await rt.sessions.store.close()

    return ctx


async def _load(rt: Runtime, factory: Callable[[], AsyncEngine],
                on_ready: Callable[[], None] | None) -> None:
    try:
        engine = await asyncio.to_thread(factory)
        await engine.start()
    except Exception as exc:  # noqa: BLE001 - reported by /health and /ready
        log.exception("model failed to load")
        rt.status, rt.reason = "failed", f"model failed to load: {exc}"
        return
    _set_ready(rt, engine, on_ready)
    log.info("model %s loaded; ready", engine.model_name)


async def _watch_engine(rt: Runtime, loader: asyncio.Task | None) -> None:
    """Once the engine's loop dies: /health and /ready answer 503 and `rt.engine_dead` is
    set, so the process can exit and be restarted."""
    if loader is not None:
        await loader
    if rt.engine is None:
        return  # the model did not load: /health and /ready say so
    cause = await rt.engine.wait_dead()
    rt.status, rt.reason = "failed", f"engine is dead: {cause}"
    rt.engine_dead.set()


def _set_ready(rt: Runtime, engine: AsyncEngine, on_ready: Callable[[], None] | None) -> None:
    rt.engine = engine
    if on_ready is not None:
        on_ready()
    if rt.status == "loading":
        rt.status, rt.reason = "ready", ""


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
    rt.status, rt.reason = "draining", "draining"
    notice = {"type": "draining", "reconnect_after_ms": rt.config.reconnect_after_ms}
    for conn in list(rt.connections):
        conn.notify(notice)
    while _busy(rt) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    grace = rt.config.drain_grace_s
    rt.gate.refuse_queued("draining", rt.config.reconnect_after_ms,
                          "the server is shutting down; reconnect later")
    await _cancel_streams(rt, grace / 2)
    await _close_sockets(app, max(0.0, deadline + grace - loop.time()))


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


async def _close_sockets(app: web.Application, timeout: float | None = None) -> None:
    rt = app[RUNTIME]
    code = CLOSE_SERVICE_RESTART if rt.status == "draining" else WSCloseCode.GOING_AWAY
    timeout = rt.config.drain_grace_s if timeout is None else timeout
    await asyncio.gather(*(conn.close(code, b"server shutting down", timeout)
                           for conn in list(rt.connections)), return_exceptions=True)


async def index(request: web.Request) -> web.FileResponse:
    return web.FileResponse(STATIC / "index.html")


async def health(request: web.Request) -> web.Response:
    """Process up and, once loaded, the engine loop alive."""
    rt = request.app[RUNTIME]
    engine_alive = rt.engine is not None and rt.engine.is_alive
    ok = rt.status == "loading" or engine_alive
    return web.json_response({"status": "ok" if ok else "unhealthy", "state": rt.status,
                              "engine_alive": engine_alive}, status=200 if ok else 503)


async def ready(request: web.Request) -> web.Response:
    """200 when the model is loaded, not draining and not overloaded; else 503 + reason."""
    rt = request.app[RUNTIME]
    reason = rt.reason if not rt.ready else ("overloaded" if rt.gate.overloaded() else "")
    if rt.status == "ready" and not rt.ready:
        reason = "engine loop stopped"
    if reason:
        return web.json_response({"ready": False, "reason": reason}, status=503,
                                 headers={"Retry-After": "1"})
    return web.json_response({"ready": True, "model": rt.engine.model_name})


async def metrics(request: web.Request) -> web.Response:
    rt = request.app[RUNTIME]
    return web.Response(body=rt.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})
