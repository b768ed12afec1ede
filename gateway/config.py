"""GatewayConfig: every gateway limit in one frozen dataclass, validated when built.

Only the CLI entry (gateway/server_cli.py) reads the environment; everything else gets
its settings from this object.
"""
from __future__ import annotations

import hashlib
import socket
from dataclasses import dataclass, field

from engine.errors import ConfigError


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Network and protocol limits of the gateway (admission limits: SchedulerConfig).

    api_keys: empty means no auth. allowed_origins: empty means any Origin is accepted
    (browsers' cross-site WebSockets are then only guarded by API keys).
    """

    host: str = "127.0.0.1"
    port: int = 8000
    max_message_bytes: int = 1 << 20  # largest client frame; larger closes with 1009
    heartbeat_s: float = 20.0  # WebSocket ping interval; a missing pong closes the socket
    receive_timeout_s: float | None = None  # None: idle sockets stay open (heartbeat guards)
    send_timeout_s: float = 10.0  # a frame not written within this closes the socket
    max_inflight_per_socket: int = 8  # requests running at once on one socket
    max_pending_frames: int = 1024  # control frames queued for a socket that is not reading
    max_tokens_cap: int = 4096  # largest max_tokens a request may ask for
    default_max_tokens: int = 256  # when a request names none
    max_choices: int = 16  # choices of one HTTP completion: prompts x n
    drain_timeout_s: float = 30.0  # in-flight turns get this long to finish on shutdown
    drain_grace_s: float = 1.0  # then cut streams end and sockets close within this
    reconnect_after_ms: int = 2000  # sent with `draining`
    max_conversation_items: int = 1024  # items of one /v1/realtime conversation
    api_keys: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    instance_id: str = ""  # `hello.instance`: which replica answered; "": hostname:port
    key_hashes: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise ConfigError("port", "must be in [0, 65535]")
        for name in ("max_message_bytes", "max_inflight_per_socket", "max_pending_frames",
                     "max_tokens_cap", "default_max_tokens", "reconnect_after_ms", "max_choices",
                     "max_conversation_items"):
            _positive(name, getattr(self, name))
        for name in ("heartbeat_s", "send_timeout_s", "drain_timeout_s", "drain_grace_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, "must be > 0")
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

    def limits(self, max_context: int) -> dict:
        """The `limits` object of the `hello` message."""
        return {"max_tokens": self.max_tokens_cap, "max_context": max_context,
                "max_message_bytes": self.max_message_bytes,
                "max_inflight": self.max_inflight_per_socket}


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def _positive(name: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(name, "must be a positive integer")
