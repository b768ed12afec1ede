"""GatewayConfig: every gateway limit in one frozen dataclass, validated when built.

Each field is a `setting` (common/settings.py): its default, help and flag live here, and
`tokenwire serve` derives its flags from them. Only the CLI entry (gateway/cli/serve.py)
reads the environment; everything else gets its settings from this object.
"""
from __future__ import annotations

import hashlib
import ipaddress
import socket
from dataclasses import dataclass, field

from common.errors import ConfigError
from common.settings import comma_list, setting


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Network and protocol limits of the gateway (admission limits: SchedulerConfig).

    api_keys: empty means no auth, allowed only on a loopback address unless
    insecure_no_auth. allowed_origins: empty means the page's own origin and loopback ones
    (a page on any other site cannot drive the server from a visitor's browser); "*" any.
    """

    host: str = setting("127.0.0.1", "address to bind")
    port: int = setting(8000, "port")
    max_message_bytes: int = setting(1 << 20, "largest client frame; larger closes the "
                                     "socket with 1009")
    heartbeat_s: float = setting(20.0, "seconds between WebSocket pings; a missing pong "
                                 "closes the socket", flag="--heartbeat")
    receive_timeout_s: float | None = setting(None, "seconds a socket may stay silent "
                                              "(none: no limit, the heartbeat guards)",
                                              flag="--receive-timeout")
    send_timeout_s: float = setting(10.0, "seconds a frame may take to write before the "
                                    "socket is closed", flag="--send-timeout")
    max_pending_frames: int = setting(1024, "frames queued for a socket that does not "
                                      "read before it is closed")
    max_tokens_cap: int = setting(4096, "largest max_tokens a request may ask for")
    default_max_tokens: int = setting(256, "max_tokens of a request that names none")
    max_choices: int = setting(16, "choices one HTTP completion may ask for: prompts "
                               "times n")
    drain_timeout_s: float = setting(30.0, "seconds in-flight turns get to finish on "
                                     "SIGTERM", flag="--drain-timeout")
    drain_grace_s: float = setting(1.0, "seconds after the drain timeout for cut streams "
                                   "to end and sockets to close", flag="--drain-grace")
    reconnect_after_ms: int = setting(2000, "milliseconds sent with `draining`",
                                      flag="--reconnect-after")
    max_conversation_items: int = setting(1024, "items one /v1/realtime conversation may "
                                          "hold, and messages one request may send "
                                          "(response.input, generate, chat completions) "
                                          "or a /v1/responses chain keep (oldest first out)")
    background_log_s: float = setting(600.0, "seconds a finished background response's "
                                      "events stay resumable (?stream=true) on its replica",
                                      flag="--background-log-time")
    header_timeout_s: float = setting(10.0, "seconds a client may take to send a request's "
                                      "line and headers (slowloris)",
                                      flag="--header-timeout")
    body_timeout_s: float = setting(30.0, "seconds a client may take to send a request's "
                                    "body", flag="--body-timeout")
    keepalive_timeout_s: float = setting(75.0, "seconds an idle HTTP keep-alive connection "
                                         "stays open", flag="--keepalive-timeout")
    max_connections_total: int = setting(4096, "open TCP connections in all; beyond it a "
                                         "new one gets 503 too_many_connections",
                                         flag="--max-connections")
    max_connections_per_ip: int = setting(256, "open connections from one non-loopback "
                                          "address (a proxy on this host is not counted)")
    max_connections_per_key: int = setting(256, "open sockets and HTTP requests of one API "
                                           "key; beyond it 429 rate_limited")
    access_log: bool = setting(False, "one JSON line per HTTP request and WebSocket on the "
                               "tokenwire.access logger: method, path (no query), status, "
                               "bytes, duration, key id (never the key)")
    max_schema_bytes: int = setting(65536, "largest response_format JSON schema, as "
                                    "compact JSON (its grammar compiles in time with it)")
    max_schema_depth: int = setting(32, "deepest nesting of a response_format JSON schema")
    max_tools: int = setting(128, "functions one request may offer the model (each "
                             "function's parameters schema has the schema limits above)")
    tool_call_parser: str = setting("auto", "the tool-call syntax the model writes: hermes "
                                    "(<tool_call> JSON), llama3_json, or auto (from the "
                                    "chat template; hermes where it cannot render tools)",
                                    metavar="{auto,hermes,llama3_json}")
    max_chat_template_kwargs_bytes: int = setting(4096, "largest chat_template_kwargs of "
                                                  "a chat completion, as compact JSON")
    render_timeout_s: float = setting(10.0, "seconds a prompt may take to render and "
                                      "tokenize, off the event loop; beyond it the "
                                      "request answers too_large", flag="--render-timeout")
    max_prompt_cache_key_chars: int = setting(1024, "longest prompt_cache_key a chat "
                                              "completion or response may name")
    kv_park_idle_s: float = setting(15.0, "seconds a session may go without a turn before "
                                    "its KV blocks are written down to the engine's KV "
                                    "tiers (host RAM, disk), as they are when its last "
                                    "socket closes; 0: only then", flag="--kv-park-idle")
    api_keys: tuple[str, ...] = setting((), "an API key (repeatable; also "
                                        "--api-key-file and TOKENWIRE_API_KEYS)",
                                        flag="--api-key", repeat=True)
    allowed_origins: tuple[str, ...] = setting((), "comma-separated Origins a browser may "
                                               "connect from; * for any (default: the "
                                               "server's own and loopback)", parse=comma_list)
    insecure_no_auth: bool = setting(False, "serve a non-loopback address without API keys: "
                                     "anyone who reaches it may use it")
    metrics_port: int | None = setting(None, "also serve /metrics, without a key, on this "
                                       "port of the same host (bind it where only your "
                                       "monitoring reaches)")
    ssl_certfile: str | None = setting(None, "PEM certificate (chain) to serve HTTPS and "
                                       "wss:// on --port; its key too, unless "
                                       "--ssl-keyfile is given")
    ssl_keyfile: str | None = setting(None, "PEM private key of --ssl-certfile")
    ssl_ca_certs: str | None = setting(None, "PEM CA certificates: with it, a client must "
                                       "present a certificate they signed (mutual TLS)")
    client_secret_ttl_s: int = setting(600, "seconds an ephemeral client secret (POST "
                                       "/v1/realtime/client_secrets) lives when the "
                                       "request names none", flag="--client-secret-ttl")
    client_secret_max_ttl_s: int = setting(7200, "longest lifetime a client secret may "
                                           "ask for", flag="--client-secret-max-ttl")
    client_secret_key: str = setting("", "HMAC key that signs client secrets; replicas "
                                     "behind one balancer need the same (also "
                                     "TOKENWIRE_CLIENT_SECRET_KEY; default: random per "
                                     "process)", metavar="S")
    instance_id: str = setting("", "this replica's name in hello.instance (default: "
                               "hostname:port)")
    key_hashes: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self):
        for name in ("port", "metrics_port"):
            if getattr(self, name) is not None and not 0 <= getattr(self, name) <= 65535:
                raise ConfigError(name, "must be in [0, 65535]")
        if not self.api_keys and not self.insecure_no_auth and not is_loopback(self.host):
            raise ConfigError("api_keys", f"serving {self.host} (not a loopback address) "
                              "needs API keys (--api-key, --api-key-file or "
                              "TOKENWIRE_API_KEYS), or --insecure-no-auth to serve it open")
        for name in ("max_message_bytes", "max_pending_frames", "max_tokens_cap",
                     "default_max_tokens", "reconnect_after_ms", "max_choices",
                     "max_conversation_items", "max_schema_bytes", "max_schema_depth",
                     "max_tools", "max_chat_template_kwargs_bytes",
                     "max_prompt_cache_key_chars",
                     "max_connections_total", "max_connections_per_ip",
                     "max_connections_per_key", "client_secret_ttl_s",
                     "client_secret_max_ttl_s"):
            _positive(name, getattr(self, name))
        if self.client_secret_ttl_s > self.client_secret_max_ttl_s:
            raise ConfigError("client_secret_ttl_s", "must not exceed client_secret_max_ttl_s")
        if self.client_secret_key and len(self.client_secret_key) < 32:
            raise ConfigError("client_secret_key", "must be at least 32 characters (say, "
                              "openssl rand -hex 32)")
        for name in ("heartbeat_s", "send_timeout_s", "drain_timeout_s", "drain_grace_s",
                     "render_timeout_s", "header_timeout_s", "body_timeout_s",
                     "keepalive_timeout_s", "background_log_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, "must be > 0")
        if self.ssl_certfile is None and (self.ssl_keyfile or self.ssl_ca_certs):
            raise ConfigError("ssl_certfile", "--ssl-keyfile and --ssl-ca-certs need "
                              "--ssl-certfile")
        if self.tool_call_parser not in ("auto", "hermes", "llama3_json"):
            raise ConfigError("tool_call_parser", "must be auto, hermes or llama3_json")
        if not self.kv_park_idle_s >= 0:
            raise ConfigError("kv_park_idle_s", "must be >= 0 (0: park only on close)")
        if self.receive_timeout_s is not None and not self.receive_timeout_s > 0:
            raise ConfigError("receive_timeout_s", "must be > 0 or None")
        if self.default_max_tokens > self.max_tokens_cap:
            raise ConfigError("default_max_tokens", "must not exceed max_tokens_cap")
        if any(not key or any(c.isspace() for c in key) for key in self.api_keys):
            raise ConfigError("api_keys", "keys must be non-empty and contain no whitespace")
        if any(c.isspace() for c in self.instance_id) or len(self.instance_id) > 128:
            raise ConfigError("instance_id", "must be at most 128 characters, no whitespace")
        if not self.instance_id:
            object.__setattr__(self, "instance_id", f"{socket.gethostname()}:{self.port}")
        # Compare and store hashes only: a session's owner is the hash of its key.
        object.__setattr__(self, "key_hashes", frozenset(map(key_hash, self.api_keys)))

    @property
    def auth_enabled(self) -> bool:
        return bool(self.api_keys)

    @property
    def tls(self) -> bool:
        return self.ssl_certfile is not None


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only (an address, or "localhost")."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname: it may resolve to any interface


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(name, "must be a positive integer")
