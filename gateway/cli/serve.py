"""`tokenwire serve`: build the configs from flags (and TOKENWIRE_API_KEYS), run on uvloop.

Gateway limits have hand-named flags; every EngineConfig and SchedulerConfig field gets a
flag generated from the dataclass (gateway.flags), so no limit lacks one.

SIGTERM/SIGINT start a graceful drain (see gateway.app.drain); a second signal skips the
wait. The listener starts before the model loads, so /health and /ready answer at once.
When the engine dies (max_consecutive_failed_steps failed steps in a row) the process
exits with status 1 so that its supervisor restarts it.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import re
import signal
from pathlib import Path

from aiohttp import web

from engine.errors import ConfigError
from gateway.config import GatewayConfig
from gateway.flags import add_config_flags, config_values
from gateway.session_store import SessionStoreConfig
from scheduler.config import SchedulerConfig

log = logging.getLogger("tokenwire.serve")
D = GatewayConfig()
S = SessionStoreConfig()


# Fields set by their own flags (model, device, dtype), or owned by the gateway (the
# per-socket limit `hello` announces: --max-inflight).
_ENGINE_SKIP = frozenset({"model", "device", "dtype"})
_SCHEDULER_SKIP = frozenset({"max_inflight_per_socket"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--host", default=D.host, help="address to bind (default %(default)s)")
    a("--port", type=int, default=D.port, help="port (default %(default)s)")
    a("--model", default="default", help='"default", a local HF directory or "dummy:NAME"')
    a("--device", default="auto", help="auto | cpu | cuda[:N]")
    a("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    a("--num-threads", type=int, default=None,
      help="torch's CPU intra-op threads for the whole process (default: torch's)")
    g = parser.add_argument_group("gateway limits")
    g.add_argument("--max-message-bytes", type=int, default=D.max_message_bytes,
                   help="largest client frame; larger closes the socket with 1009")
    g.add_argument("--heartbeat", type=float, default=D.heartbeat_s,
                   help="seconds between WebSocket pings (default %(default)s)")
    g.add_argument("--receive-timeout", type=float, default=D.receive_timeout_s,
                   help="seconds a socket may stay silent (default: no limit)")
    g.add_argument("--send-timeout", type=float, default=D.send_timeout_s,
                   help="seconds a frame may take to write before the socket is closed")
    g.add_argument("--max-inflight", type=int, default=D.max_inflight_per_socket,
                   help="requests in flight per socket (default %(default)s)")
    g.add_argument("--max-pending-frames", type=int, default=D.max_pending_frames,
                   help="frames queued for a socket that does not read before it is closed")
    g.add_argument("--max-tokens-cap", type=int, default=D.max_tokens_cap,
                   help="largest max_tokens a request may ask for")
    g.add_argument("--default-max-tokens", type=int, default=D.default_max_tokens,
                   help="max_tokens of a request that names none")
    g.add_argument("--max-choices", type=int, default=D.max_choices,
                   help="choices one HTTP completion may ask for: prompts times n "
                        "(default %(default)s)")
    g.add_argument("--drain-timeout", type=float, default=D.drain_timeout_s,
                   help="seconds in-flight turns get to finish on SIGTERM")
    g.add_argument("--drain-grace", type=float, default=D.drain_grace_s,
                   help="seconds after the drain timeout for cut streams to end and "
                        "sockets to close (default %(default)s)")
    g.add_argument("--reconnect-after", type=int, default=D.reconnect_after_ms,
                   help="milliseconds sent with `draining` (default %(default)s)")
    g.add_argument("--max-conversation-items", type=int, default=D.max_conversation_items,
                   help="items one /v1/realtime conversation may hold (default %(default)s)")
    s = parser.add_argument_group("auth and sessions")
    s.add_argument("--api-key", action="append", default=[], help="repeatable")
    s.add_argument("--api-key-file", help="one key per line; # starts a comment")
    s.add_argument("--allowed-origins", default="", help="comma-separated Origins")
    s.add_argument("--instance-id", default=D.instance_id,
                   help="this replica's name in hello.instance (default: hostname:port)")
    s.add_argument("--session-store", metavar="URL",
                   help="memory:, sqlite:///PATH or redis://HOST:PORT/DB (default: "
                        "sqlite:///STATE_DIR/sessions.db)")
    s.add_argument("--state-dir", help="directory of the default SQLite store (default: "
                   "$XDG_STATE_HOME/tokenwire, else ~/.local/state/tokenwire)")
    s.add_argument("--session-store-timeout", type=float, default=S.timeout_s,
                   help="seconds one Redis call may take; beyond it chat turns answer "
                        "store_unavailable (default %(default)s)")
    s.add_argument("--session-store-retry-after", type=int, default=S.retry_after_ms,
                   help="retry_after_ms sent with store_unavailable (default %(default)s)")
    s.add_argument("--session-store-connections", type=int, default=S.max_connections,
                   help="Redis connections per process (default %(default)s)")
    s.add_argument("--session-ttl", type=float, default=S.ttl_s,
                   help="seconds a session lives after its last save (default %(default)s)")
    s.add_argument("--max-sessions", type=int, default=S.max_sessions,
                   help="sessions kept; beyond it the least recently saved go")
    s.add_argument("--max-session-bytes", type=int, default=S.max_bytes_per_session,
                   help="largest serialized session; a turn beyond it answers too_large")
    add_config_flags(parser.add_argument_group("engine limits"), _engine_config_cls(),
                     _ENGINE_SKIP)
    add_config_flags(parser.add_argument_group("admission and backpressure"), SchedulerConfig,
                     _SCHEDULER_SKIP)
    parser.add_argument("--log-level", default="INFO")


def gateway_config(args: argparse.Namespace, environ: dict) -> GatewayConfig:
    return GatewayConfig(
        host=args.host, port=args.port, max_message_bytes=args.max_message_bytes,
        heartbeat_s=args.heartbeat, receive_timeout_s=args.receive_timeout,
        send_timeout_s=args.send_timeout, max_inflight_per_socket=args.max_inflight,
        max_pending_frames=args.max_pending_frames, max_tokens_cap=args.max_tokens_cap,
        default_max_tokens=args.default_max_tokens, max_choices=args.max_choices,
        drain_timeout_s=args.drain_timeout,
        drain_grace_s=args.drain_grace,
        reconnect_after_ms=args.reconnect_after,
        max_conversation_items=args.max_conversation_items,
        api_keys=tuple(_api_keys(args, environ)),
        allowed_origins=tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip()),
        instance_id=args.instance_id)


def session_store_config(args: argparse.Namespace, environ: dict) -> SessionStoreConfig:
    url = args.session_store or f"sqlite://{state_dir(args, environ) / 'sessions.db'}"
    return SessionStoreConfig(url=url, ttl_s=args.session_ttl, max_sessions=args.max_sessions,
                              max_bytes_per_session=args.max_session_bytes,
                              timeout_s=args.session_store_timeout,
                              retry_after_ms=args.session_store_retry_after,
                              max_connections=args.session_store_connections)


def state_dir(args: argparse.Namespace, environ: dict) -> Path:
    """--state-dir, else $XDG_STATE_HOME/tokenwire (XDG: only an absolute path counts),
    else ~/.local/state/tokenwire; always absolute."""
    if args.state_dir:
        return Path(args.state_dir).expanduser().absolute()
    xdg = environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "tokenwire"


def _api_keys(args: argparse.Namespace, environ: dict) -> list[str]:
    keys = list(args.api_key)
    keys += [k for k in environ.get("TOKENWIRE_API_KEYS", "").split(",") if k.strip()]
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as f:
            keys += [line.strip() for line in f if line.strip() and not line.startswith("#")]
    return [k.strip() for k in keys]


def _engine_config_cls():
    from engine.config import EngineConfig  # imports torch: only when serving or --help

    return EngineConfig


def engine_config(args: argparse.Namespace):
    cls = _engine_config_cls()
    return cls(model=args.model, device=args.device, dtype=args.dtype,
               **config_values(args, cls, _ENGINE_SKIP))


def scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    return SchedulerConfig(**config_values(args, SchedulerConfig, _SCHEDULER_SKIP))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = gateway_config(args, dict(os.environ))
        engine_cfg = engine_config(args)
        sched_cfg = scheduler_config(args)
        store_cfg = session_store_config(args, dict(os.environ))
        from engine.llm import set_num_threads  # loads torch: only once the flags are good

        set_num_threads(args.num_threads)
    except (ConfigError, ValueError, OSError) as exc:
        log.error("bad configuration: %s", exc)
        return 2
    import uvloop

    exit_now(uvloop.run(serve(config, engine_cfg, sched_cfg, store_cfg)))


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
    so the entry point decides this: build_app calls it once the model is ready."""
    gc.collect()
    gc.freeze()


async def serve(config: GatewayConfig, engine_cfg, sched_cfg: SchedulerConfig,
                store_cfg: SessionStoreConfig) -> int:
    from engine.async_engine import AsyncEngine
    from gateway.app import build_app, drain, make_runner
    from gateway.session_store import make_session_store
    from gateway.state import RUNTIME

    store = make_session_store(store_cfg)
    log.info("sessions in %s", re.sub(r"//[^@/]*@", "//", store_cfg.url))  # no password
    app = build_app(config, engine_factory=lambda: AsyncEngine(engine_cfg), store=store,
                    scheduler_config=sched_cfg, on_ready=freeze_startup_heap)
    runner = make_runner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, config.host, config.port).start()
    log.info("listening on http://%s:%d (model %s loading)", config.host, config.port,
             engine_cfg.model)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    rt = app[RUNTIME]
    if await _engine_died(stop, rt.engine_dead):
        log.critical("exiting with status 1 for a restart: %s", rt.reason)
        await runner.cleanup()
        return 1
    stop.clear()
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
    cleanup = asyncio.create_task(runner.cleanup())
    done, _ = await asyncio.wait([cleanup], timeout=max(0.1, bound - loop.time()))
    log.info("stopped %.2fs after the signal", loop.time() - started)
    if not done:
        # Not even the event loop's own teardown: it would cancel every handler still
        # running and wait for them (0.6 s past the bound on a 2-core AVX2 box, 64 streams).
        log.warning("shutdown reached the drain's bound; exiting without waiting for it")
        exit_now(0)
    return 0


async def _engine_died(stop: asyncio.Event, engine_dead: asyncio.Event) -> bool:
    """Wait for a stop signal or the engine's death; True if the engine died first."""
    waits = [asyncio.create_task(stop.wait()), asyncio.create_task(engine_dead.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in waits:
        task.cancel()
    return engine_dead.is_set() and not stop.is_set()
