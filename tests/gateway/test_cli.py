"""`tokenwire serve` flags: every limit of the three configs is a flag (tests/docs checks
that docs/ documents each one)."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from common.errors import ConfigError
from engine.config import EngineConfig
from gateway.cli import serve
from gateway.config import GatewayConfig
from gateway.sessions.store import SessionStoreConfig
from scheduler.config import SchedulerConfig


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return parser


def parse(*argv: str) -> argparse.Namespace:
    return _parser().parse_args(argv)


def test_no_flags_gives_the_dataclass_defaults():
    args = parse()
    assert serve.scheduler_config(args) == SchedulerConfig()
    assert serve.engine_config(args) == EngineConfig()
    assert serve.gateway_config(args, {}) == GatewayConfig()
    home_db = Path.home() / ".local" / "state" / "tokenwire" / "sessions.db"
    assert serve.session_store_config(args, {}) == SessionStoreConfig(f"sqlite://{home_db}")


def test_every_gateway_field_has_a_flag():
    args = parse("--host", "0.0.0.0", "--port", "9", "--max-message-bytes", "7",
                 "--heartbeat", "3", "--receive-timeout", "4", "--send-timeout", "5",
                 "--max-pending-frames", "8", "--max-tokens-cap", "99",
                 "--default-max-tokens", "9", "--drain-timeout", "10", "--drain-grace", "2",
                 "--reconnect-after", "11", "--max-choices", "12",
                 "--instance-id", "replica-a", "--max-conversation-items", "13",
                 "--api-key", "a", "--allowed-origins", "http://x, http://y",
                 "--insecure-no-auth", "--metrics-port", "9100", "--header-timeout", "3",
                 "--body-timeout", "4", "--keepalive-timeout", "5", "--max-connections", "6",
                 "--max-connections-per-ip", "7", "--max-connections-per-key", "8",
                 "--max-schema-bytes", "999", "--max-schema-depth", "9",
                 "--render-timeout", "2", "--access-log", "--ssl-certfile", "c.pem",
                 "--ssl-keyfile", "k.pem", "--ssl-ca-certs", "ca.pem",
                 "--client-secret-ttl", "60", "--client-secret-max-ttl", "120",
                 "--client-secret-key", "k" * 32, "--max-tools", "5",
                 "--tool-call-parser", "hermes", "--background-log-time", "7",
                 "--max-chat-template-kwargs-bytes", "99", "--kv-park-idle", "3",
                 "--max-prompt-cache-key-chars", "64")
    config = serve.gateway_config(args, {"TOKENWIRE_API_KEYS": "b,c"})
    defaults = GatewayConfig()
    unchanged = [f.name for f in dataclasses.fields(GatewayConfig)
                 if f.init and getattr(config, f.name) == getattr(defaults, f.name)]
    assert unchanged == []
    assert config.api_keys == ("a", "b", "c")
    assert config.allowed_origins == ("http://x", "http://y")


def test_the_client_secret_key_comes_from_the_environment_unless_given():
    env = {"TOKENWIRE_CLIENT_SECRET_KEY": "e" * 40}
    assert serve.gateway_config(parse(), env).client_secret_key == "e" * 40
    given = parse("--client-secret-key", "f" * 32)
    assert serve.gateway_config(given, env).client_secret_key == "f" * 32


def test_each_setting_has_one_owner_and_one_flag():
    """--max-inflight is the scheduler's (it enforces it; hello announces it): no other
    config declares the per-socket limit, and every flag is declared once."""
    assert serve.scheduler_config(parse("--max-inflight", "6")).max_inflight_per_socket == 6
    names = [f.name for cls in (GatewayConfig, SchedulerConfig, SessionStoreConfig,
                                EngineConfig) for f in dataclasses.fields(cls) if f.init]
    assert len(names) == len(set(names))
    flags = [o for action in _parser()._actions for o in action.option_strings]
    assert len(flags) == len(set(flags))


def test_session_store_flags():
    args = parse("--session-store", "redis://127.0.0.1:6390/2", "--session-ttl", "60",
                 "--max-sessions", "5", "--max-session-bytes", "4096",
                 "--session-store-timeout", "0.25", "--session-store-retry-after", "300",
                 "--session-store-connections", "7")
    assert serve.session_store_config(args, {}) == SessionStoreConfig(
        "redis://127.0.0.1:6390/2", 60.0, 5, 4096, 0.25, 300, 7)


@pytest.mark.parametrize("argv, environ, path", [
    ((), {"XDG_STATE_HOME": "/xdg"}, "/xdg/tokenwire/sessions.db"),
    ((), {"XDG_STATE_HOME": "relative"}, f"{Path.home()}/.local/state/tokenwire/sessions.db"),
    (("--state-dir", "/srv/tw"), {"XDG_STATE_HOME": "/xdg"}, "/srv/tw/sessions.db"),
    (("--session-store", "sqlite:///data/s.db"), {}, "/data/s.db"),
])
def test_default_store_is_sqlite_in_the_state_dir(argv, environ, path):
    config = serve.session_store_config(parse(*argv), environ)
    assert config.url.startswith("sqlite://") and config.sqlite_path == path


@pytest.mark.parametrize("url", ["sqlite://", "redis://", "postgres://x", "", "/tmp/s.db"])
def test_session_store_url_is_checked(url):
    with pytest.raises(ConfigError) as info:
        SessionStoreConfig(url)
    assert info.value.field == "url"


def test_instance_id_defaults_to_host_and_port():
    import socket

    assert GatewayConfig(port=8123).instance_id == f"{socket.gethostname()}:8123"
    with pytest.raises(ConfigError):
        GatewayConfig(instance_id="a b")


def test_engine_and_scheduler_flags_typed_and_none_switches_off():
    args = parse("--num-threads", "1", "--no-prefix-caching", "--max-running-requests", "3",
                 "--kv-usage-enter", "0.5", "--kv-usage-leave", "0.4",
                 "--max-inflight-per-key", "none")
    engine = serve.engine_config(args)
    assert args.num_threads == 1 and engine.enable_prefix_caching is False
    sched = serve.scheduler_config(args)
    assert (sched.max_running_requests, sched.kv_usage_enter, sched.max_inflight_per_key) == (
        3, 0.5, None)
    with pytest.raises(SystemExit):
        parse("--max-running-requests", "lots")


def test_bad_values_exit_2_naming_the_field(caplog):
    args = parse("--kv-usage-enter", "0.5", "--kv-usage-leave", "0.9")
    assert serve.run(args) == 2
    assert "kv_usage_leave" in caplog.text


@pytest.mark.parametrize("build, field", [
    (lambda: GatewayConfig(port=-1), "port"),
    (lambda: SchedulerConfig(ttft_bound_s=0), "ttft_bound_s"),
    (lambda: SessionStoreConfig(ttl_s=0), "ttl_s"),
    (lambda: EngineConfig(block_size=0), "block_size"),
])
def test_every_layer_refuses_bad_config_with_one_error_naming_the_field(build, field):
    with pytest.raises(ConfigError) as info:
        build()
    assert info.value.field == field


def test_num_threads_is_set_by_the_entry_point_only():
    """Threads are the whole process's: `tokenwire serve` sets them, the engine never."""
    import torch

    from engine.llm import set_num_threads

    before = torch.get_num_threads()
    try:
        set_num_threads(None)
        assert torch.get_num_threads() == before
        set_num_threads(1)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
    with pytest.raises(ConfigError):
        set_num_threads(0)
    assert "num_threads" not in {f.name for f in dataclasses.fields(EngineConfig)}


def test_kv_tiers_are_on_with_the_persistent_store_and_off_on_request(tmp_path):
    environ = {}
    on = serve.kv_tier_values(parse("--state-dir", str(tmp_path)), environ)
    assert on["kv_disk_dir"] == str(tmp_path / "kv")
    assert 0 < on["kv_host_bytes"] <= serve.KV_HOST_CAP
    assert on["kv_disk_max_age_s"] == 7 * 24 * 3600  # block files live as long as sessions
    # Flags given win over what auto sizes; memory: sessions leave the tiers as flagged.
    given = parse("--state-dir", str(tmp_path), "--kv-host-bytes", "1024", "--session-ttl",
                  "60")
    assert serve.kv_tier_values(given, environ) == {"kv_disk_dir": str(tmp_path / "kv"),
                                                   "kv_disk_max_age_s": 60}
    given = parse("--state-dir", str(tmp_path), "--kv-disk-max-age-s", "30")
    assert serve.models(given, environ)[0][0].engine.kv_disk_max_age_s == 30
    assert serve.kv_tier_values(parse("--session-store", "memory:"), environ) == {}
    for argv in (("--kv-tiers", "off"), ("--kv-tiers", "off", "--kv-host-bytes", "9")):
        assert serve.kv_tier_values(parse(*argv), environ) == {"kv_host_bytes": 0,
                                                               "kv_disk_dir": None}
    specs, _ = serve.models(parse("--state-dir", str(tmp_path)), environ)
    assert specs[0].engine.kv_disk_dir == str(tmp_path / "kv")
    with pytest.raises(SystemExit):
        parse("--kv-tiers", "maybe")
