"""The server process of `tokenwire serve`: listen, serve, drain on a signal, exit.

SIGTERM/SIGINT start a graceful drain (gateway/app.py); a second signal skips the wait.
The listener starts before the model loads, so /health and /ready answer at once. When
the engine dies (max_consecutive_failed_steps failed steps in a row) the process exits
with status 1 so that its supervisor restarts it.
"""
from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import ssl

from aiohttp import web

from gateway.app import build_app, build_metrics_app, drain, make_runner
from gateway.cli.models import ModelSpec
from gateway.cli.tls import TLSSite
from gateway.config import GatewayConfig, is_loopback
from gateway.sessions.factory import make_session_store
from gateway.sessions.store import SessionStoreConfig
from scheduler import heap
from scheduler.config import SchedulerConfig
from scheduler.door import Scheduler
from scheduler.models import ModelSlot

log = logging.getLogger("tokenwire.serve")


def exit_now(code: int) -> None:
    """Flush the logs and end the process without the interpreter's teardown.

    Everything that must outlive the process (sessions, sockets) is closed or given up by
    now; the teardown of the model and the frozen startup heap would add about half a
    second to a drain that has promised to end within its bound."""
    logging.shutdown()
    os._exit(code)


# Seconds of the drain's grace kept for the process's exit (see serve).
EXIT_RESERVE_S = 0.25


def freeze_startup_heap() -> None:
    """Put everything alive once the model is up (weights' wrappers, tokenizer, imported
    modules: ~380k objects on the default model) beyond the garbage collector's reach.

    A full collection walks every tracked object with the GIL held, so it stalls the event
    loop and the engine together: ~190 ms per collection with this heap (docs/benchmarks.md).
    Frozen, a full collection walks only what serving allocated since. Garbage is
    collected first so that none of it is kept for good. The collector is the process's,
    so the entry point decides this: it runs once the model is ready."""
    heap.freeze()


async def serve(config: GatewayConfig, specs: list[ModelSpec], sched_cfg: SchedulerConfig,
                store_cfg: SessionStoreConfig, tls: ssl.SSLContext | None = None,
                memory_budget: int | None = None) -> int:
    """Serve `specs` (the first is the default model) until SIGTERM/SIGINT (then drain) or
    the default engine's death (then status 1); HTTPS and wss:// on config.port with `tls`.
    The startup heap is frozen once the default model is ready."""
    model, *others = [ModelSlot(config=s.engine, name=s.name, keep_alive_s=s.keep_alive_s,
                                preload=s.preload,
                                on_ready=freeze_startup_heap if i == 0 else None)
                      for i, s in enumerate(specs)]
    log.info("sessions in %s", re.sub(r"//[^@/]*@", "//", store_cfg.url))  # no password
    scheduler = Scheduler(sched_cfg, model, others=tuple(others), memory_budget=memory_budget)
    # The app owns the store from here: its cleanup closes it.
    app = build_app(config, scheduler, make_session_store(store_cfg))
    runners = await _listen(app, config, tls)
    log.info("listening on %s://%s:%d (model %s loading)", "https" if tls else "http",
             config.host, config.port, specs[0].engine.model)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if await _engine_died(stop, model.dead):
        log.critical("exiting with status 1 for a restart: %s", model.reason)
        for runner in runners:
            await runner.cleanup()
        return 1
    stop.clear()
    return await _drain_and_stop(app, runners, config, stop)


async def _listen(app: web.Application, config: GatewayConfig,
                  tls: ssl.SSLContext | None) -> list[web.AppRunner]:
    """The app on host:port (over TLS with `tls`), and /metrics alone on --metrics-port
    when given, in plain HTTP, as Prometheus scrapes it on the monitoring network."""
    if config.insecure_no_auth and not config.api_keys and not is_loopback(config.host):
        log.warning("serving %s without API keys (--insecure-no-auth): anyone who reaches "
                    "it may use it", config.host)
    runners = [make_runner(app)]
    sites = [(runners[0], config.port, tls)]
    if config.metrics_port is not None:
        runners.append(web.AppRunner(build_metrics_app(app), handle_signals=False,
                                     access_log=None))
        sites.append((runners[1], config.metrics_port, None))
    for runner, port, context in sites:
        await runner.setup()
        site = web.TCPSite(runner, config.host, port) if context is None else \
            TLSSite(runner, config.host, port, context, config.header_timeout_s)
        await site.start()
    return runners


async def _drain_and_stop(app: web.Application, runners: list[web.AppRunner],
                          config: GatewayConfig, stop: asyncio.Event) -> int:
    """Drain (a second signal skips the wait), then stop within the drain's bound."""
    loop = asyncio.get_running_loop()
    log.info("draining (up to %.0fs; signal again to skip)", config.drain_timeout_s)
    started = loop.time()
    drain_task = asyncio.create_task(drain(app))
    second_signal = asyncio.create_task(stop.wait())
    await asyncio.wait([drain_task, second_signal], return_when=asyncio.FIRST_COMPLETED)
    drain_task.cancel()
    second_signal.cancel()
    log.info("drained in %.2fs; stopping", loop.time() - started)
    # The engine stops after the step it is in; on a slow CPU that step can outlast the
    # drain's bound, and nothing is lost by not waiting for it (the process exits next).
    # Part of the grace is kept for the exit itself (unmapping a model's memory).
    bound = (started + config.drain_timeout_s + config.drain_grace_s
             - min(EXIT_RESERVE_S, config.drain_grace_s / 2))
    cleanup = asyncio.create_task(_cleanup(runners))
    done, _ = await asyncio.wait([cleanup], timeout=max(0.1, bound - loop.time()))
    log.info("stopped %.2fs after the signal", loop.time() - started)
    if not done:
        # Not even the event loop's own teardown: it would cancel every handler still
        # running and wait for them, well past the bound with many streams open.
        log.warning("shutdown reached the drain's bound; exiting without waiting for it")
        exit_now(0)
    return 0


async def _cleanup(runners: list[web.AppRunner]) -> None:
    for runner in runners:
        await runner.cleanup()


async def _engine_died(stop: asyncio.Event, engine_dead: asyncio.Event) -> bool:
    """Wait for a stop signal or the engine's death; True if the engine died first."""
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(engine_dead.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in waits:
        task.cancel()
    return engine_dead.is_set() and not stop.is_set()
