"""The aiohttp application: routes, shared state, lifecycle and graceful drain.

    build_app(config, engine | engine_factory, store)
      cleanup_ctx: load + start the engine (in the background: /health and /ready answer
                   while the model loads) ... stop it and close the store
      on_shutdown: close every open socket (1012 after a drain, else 1001)
    drain(app): /ready -> 503, `draining` to every socket, in-flight work finishes up to
                drain_timeout_s, the rest is cancelled, sockets close with 1012
"""
from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import Callable
from pathlib import Path

from aiohttp import WSCloseCode, web
from prometheus_client import CONTENT_TYPE_LATEST

from engine.async_engine import AsyncEngine
from gateway import openai_api
from gateway.admission import Gate
from gateway.config import GatewayConfig
from gateway.metrics import GpuSampler, Metrics
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
              scheduler_config: SchedulerConfig | None = None) -> web.Application:
    """An app serving `engine` (already started, owned by the caller) or the engine that
    `engine_factory` builds (loaded in a thread, started and stopped by the app).
    `scheduler_config` sets admission and backpressure limits (None: defaults)."""
    if (engine is None) == (engine_factory is None):
        raise ValueError("give exactly one of engine or engine_factory")
    rt = _runtime(config, store or MemorySessionStore(), gpu_sampler, scheduler_config)
    app = web.Application(client_max_size=config.max_message_bytes)
    app[RUNTIME] = rt
    app.cleanup_ctx.append(_lifecycle(engine, engine_factory))
    app.on_shutdown.append(_close_sockets)
    app.router.add_get("/", index)
    app.router.add_get("/health", health)
    app.router.add_get("/ready", ready)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/ws", ws_handler)
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


def _lifecycle(engine: AsyncEngine | None, factory: Callable[[], AsyncEngine] | None):
    async def ctx(app: web.Application):
        rt = app[RUNTIME]
        await rt.gate.start()
        loader = None
        if engine is not None:
            _set_ready(rt, engine)
        else:
            loader = asyncio.create_task(_load(rt, factory))
        yield
        if loader is not None:
            loader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loader
            if rt.engine is not None:
                await rt.engine.stop()
        await rt.gate.stop()
        await rt.sessions.store.close()

    return ctx


async def _load(rt: Runtime, factory: Callable[[], AsyncEngine]) -> None:
    try:
        engine = await asyncio.to_thread(factory)
        await engine.start()
    except Exception as exc:  # noqa: BLE001 - reported by /health and /ready
        log.exception("model failed to load")
        rt.status, rt.reason = "failed", f"model failed to load: {exc}"
        return
    _set_ready(rt, engine)
    log.info("model %s loaded; ready", engine.model_name)


def _set_ready(rt: Runtime, engine: AsyncEngine) -> None:
    rt.engine = engine
    _freeze_startup_heap()
    if rt.status == "loading":
        rt.status, rt.reason = "ready", ""


def _freeze_startup_heap() -> None:
    """Put everything alive once the model is up (weights' wrappers, tokenizer, imported
    modules: ~380k objects on the default model) beyond the garbage collector's reach.

    A full collection walks every tracked object with the GIL held, so it stalls the event
    loop and the engine together: ~190 ms per collection with this heap (BENCHMARKS.md).
    Frozen, a full collection walks only what serving allocated since. Garbage is
    collected first so that none of it is kept for good."""
    gc.collect()
    gc.freeze()


async def drain(app: web.Application) -> None:
    """Stop taking work, let in-flight requests finish (up to drain_timeout_s), cancel the
    rest and close every socket with 1012. The listener is stopped by the caller after."""
    rt = app[RUNTIME]
    rt.status, rt.reason = "draining", "draining"
    notice = {"type": "draining", "reconnect_after_ms": rt.config.reconnect_after_ms}
    for conn in list(rt.connections):
        conn.outbox.put(notice)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + rt.config.drain_timeout_s
    while _busy(rt) and loop.time() < deadline:
        await asyncio.sleep(0.05)
    tasks = []
    for conn in list(rt.connections):
        for stream in list(conn.streams.values()):
            stream.cancel_requested, stream.error = True, "server draining"
            stream.task.cancel()
            tasks.append(stream.task)
    await asyncio.gather(*tasks, return_exceptions=True)
    await _close_sockets(app)


def _busy(rt: Runtime) -> bool:
    return bool(rt.http_streams) or any(conn.streams for conn in rt.connections)


async def _close_sockets(app: web.Application) -> None:
    rt = app[RUNTIME]
    code = CLOSE_SERVICE_RESTART if rt.status == "draining" else WSCloseCode.GOING_AWAY
    await asyncio.gather(*(conn.close(code, b"server shutting down")
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
