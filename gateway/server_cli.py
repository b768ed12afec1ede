"""`tokenwire serve`: build the configs from flags (and TOKENWIRE_API_KEYS), run on uvloop.

SIGTERM/SIGINT start a graceful drain (see gateway.app.drain); a second signal skips the
wait. The listener starts before the model loads, so /health and /ready answer at once.
"""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal

from aiohttp import web

from gateway.config import ConfigError, GatewayConfig

log = logging.getLogger("tokenwire.serve")
D = GatewayConfig()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--host", default=D.host, help="address to bind (default %(default)s)")
    a("--port", type=int, default=D.port, help="port (default %(default)s)")
    a("--model", default="default", help='"default", a local HF directory or "dummy:NAME"')
    a("--device", default="auto", help="auto | cpu | cuda[:N]")
    a("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    e = parser.add_argument_group("engine limits")
    for flag in ("--max-num-seqs", "--max-num-batched-tokens", "--max-model-len",
                 "--num-kv-blocks", "--block-size"):
        e.add_argument(flag, type=int, default=None, help="engine default when omitted")
    e.add_argument("--no-prefix-caching", action="store_true",
                   help="recompute every prompt (to measure what the prefix cache saves)")
    e.add_argument("--num-threads", type=int, default=None,
                   help="CPU intra-op threads (default: torch's)")
    g = parser.add_argument_group("gateway limits")
    g.add_argument("--max-message-bytes", type=int, default=D.max_message_bytes)
    g.add_argument("--heartbeat", type=float, default=D.heartbeat_s, help="seconds")
    g.add_argument("--receive-timeout", type=float, default=D.receive_timeout_s,
                   help="seconds a socket may stay silent (default: no limit)")
    g.add_argument("--send-timeout", type=float, default=D.send_timeout_s, help="seconds")
    g.add_argument("--max-inflight", type=int, default=D.max_inflight_per_socket,
                   help="requests in flight per socket")
    g.add_argument("--max-tokens-cap", type=int, default=D.max_tokens_cap)
    g.add_argument("--default-max-tokens", type=int, default=D.default_max_tokens)
    g.add_argument("--max-engine-waiting", type=int, default=D.max_engine_waiting)
    g.add_argument("--drain-timeout", type=float, default=D.drain_timeout_s, help="seconds")
    s = parser.add_argument_group("auth and sessions")
    s.add_argument("--api-key", action="append", default=[], help="repeatable")
    s.add_argument("--api-key-file", help="one key per line; # starts a comment")
    s.add_argument("--allowed-origins", default="", help="comma-separated Origins")
    s.add_argument("--session-db", help="SQLite file for sessions (default: in memory)")
    parser.add_argument("--log-level", default="INFO")


def gateway_config(args: argparse.Namespace, environ: dict) -> GatewayConfig:
    return GatewayConfig(
        host=args.host, port=args.port, max_message_bytes=args.max_message_bytes,
        heartbeat_s=args.heartbeat, receive_timeout_s=args.receive_timeout,
        send_timeout_s=args.send_timeout, max_inflight_per_socket=args.max_inflight,
        max_tokens_cap=args.max_tokens_cap, default_max_tokens=args.default_max_tokens,
        max_engine_waiting=args.max_engine_waiting, drain_timeout_s=args.drain_timeout,
        api_keys=tuple(_api_keys(args, environ)),
        allowed_origins=tuple(o.strip() for o in args.allowed_origins.split(",") if o.strip()))


def _api_keys(args: argparse.Namespace, environ: dict) -> list[str]:
    keys = list(args.api_key)
    keys += [k for k in environ.get("TOKENWIRE_API_KEYS", "").split(",") if k.strip()]
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as f:
            keys += [line.strip() for line in f if line.strip() and not line.startswith("#")]
    return [k.strip() for k in keys]


def engine_config(args: argparse.Namespace):
    from engine.config import EngineConfig

    limits = {name: getattr(args, name) for name in (
        "max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_kv_blocks",
        "block_size", "num_threads") if getattr(args, name) is not None}
    return EngineConfig(model=args.model, device=args.device, dtype=args.dtype,
                        enable_prefix_caching=not args.no_prefix_caching, **limits)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = gateway_config(args, dict(os.environ))
        engine_cfg = engine_config(args)
    except (ConfigError, ValueError, OSError) as exc:
        log.error("bad configuration: %s", exc)
        return 2
    import uvloop

    return uvloop.run(serve(config, engine_cfg, args.session_db))


async def serve(config: GatewayConfig, engine_cfg, session_db: str | None) -> int:
    from engine.async_engine import AsyncEngine
    from gateway.app import build_app, drain
    from gateway.session_store import SessionStoreConfig, make_session_store

    store = make_session_store(SessionStoreConfig(path=session_db))
    app = build_app(config, engine_factory=lambda: AsyncEngine(engine_cfg), store=store)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, config.host, config.port).start()
    log.info("listening on http://%s:%d (model %s loading)", config.host, config.port,
             engine_cfg.model)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    stop.clear()
    log.info("draining (up to %.0fs; signal again to skip)", config.drain_timeout_s)
    drain_task = asyncio.create_task(drain(app))
    second_signal = asyncio.create_task(stop.wait())
    await asyncio.wait([drain_task, second_signal], return_when=asyncio.FIRST_COMPLETED)
    drain_task.cancel()
    second_signal.cancel()
    await runner.cleanup()
    return 0
