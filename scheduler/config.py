"""SchedulerConfig: every admission and backpressure limit in one frozen dataclass."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from common.errors import ConfigError
from common.settings import setting


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Admission limits. None switches a limit off.

    Overload signals use hysteresis: the server enters overload when any signal reaches
    its `*_enter` threshold and leaves only when every signal is back under its `*_leave`
    threshold, so a load hovering at one threshold does not flap between admit and refuse.
    """

    # Engine slots: requests handed to the engine at once; the rest wait in our queue.
    max_running_requests: int = 32
    # The bounded waiting queue in front of the engine.
    max_waiting_requests: int = 128
    max_waiting_prompt_tokens: int = 65536
    # Share of the queue only chat turns may use (bulk `generate` stops short of it).
    chat_reserved_fraction: float = 0.25
    # Overload signals (ratios in [0, 1]; bytes for memory).
    kv_usage_enter: float = 0.95
    kv_usage_leave: float = 0.85
    # NVML utilization reads 100% whenever any kernel ran in its sample window, so it is
    # a weak overload signal on a busy server: off unless asked for.
    gpu_util_enter: float | None = None
    gpu_util_leave: float | None = None
    gpu_memory_enter: float | None = 0.98  # used / total
    gpu_memory_leave: float | None = 0.95
    max_rss_bytes: int | None = None  # process resident memory (psutil)
    rss_leave_ratio: float = 0.9  # leave overload under max_rss_bytes * this
    # Fairness limits (rate_limited).
    max_inflight_per_socket: int = setting(8, "requests in flight on one socket (hello "
                                           "announces it)", flag="--max-inflight")
    max_inflight_per_key: int | None = 64
    key_tokens_per_minute: int | None = None  # token bucket per API key; prompt+output
    key_burst_tokens: int | None = None  # bucket size; None: one minute's worth
    # `priority` request param: higher runs first, within these bounds.
    priority_min: int = -100
    priority_max: int = 100
    # What a client may ask for: 0 is a request's priority when it names none, so by
    # default a client may lower its own requests but not put them ahead of others'.
    max_client_priority: int = setting(0, "highest `priority` a request may ask for "
                                       "(invalid_request naming it beyond); the default, "
                                       "0, is what a request naming none gets")
    key_max_priority: tuple[str, ...] = setting((), "KEY_ID=N: the highest `priority` of "
                                                "one API key, by its id (the first 12 hex "
                                                "characters of the key's SHA-256, as the "
                                                "access log shows it); repeatable",
                                                repeat=True, metavar="KEY_ID=N")
    # key id -> its cap, from key_max_priority
    key_priority_caps: dict = field(init=False, repr=False, compare=False)
    # Signals.
    nvml_interval_s: float = 1.0
    drain_window_s: float = 10.0  # time constant of the drain-rate EWMA
    # Completions per second assumed until the drain rate is measured (a replica that
    # just started). None: until then nothing queues; requests beyond the free engine
    # slots are refused at once instead of waiting out their queue budget.
    initial_drain_rps: float | None = None
    # Time-to-first-token promise. A request may spend queue_budget_fraction of it queued
    # (the rest is for its prefill): one whose estimated wait exceeds that is refused up
    # front, and a queued one still waiting when its budget runs out is refused then.
    ttft_bound_s: float = 5.0
    queue_budget_fraction: float = 0.5
    retry_after_min_ms: int = 100
    retry_after_max_ms: int = 30000
    # Several models: their engines' forward steps take turns on the device, fairly
    # (engine/device_gate.py); "off" lets them step at once, as the OS schedules them.
    # Off by default: on a 2-core CPU the turns bought even device time but no speed, and
    # a long prefill step of one model then stalls the other's decode (docs/benchmarks.md).
    model_gate: str = setting("off", "on: the models' engines take fair turns at the "
                              "device, one forward step at a time; off: they step at once",
                              metavar="on|off")
    model_gate_reserve_s: float = setting(
        0.005, "seconds the device waits for the engine whose turn is next while it books "
        "its last step's outputs; past it the next waiting engine runs")

    def __post_init__(self):
        for name in ("max_running_requests", "max_waiting_requests",
                     "max_waiting_prompt_tokens", "max_inflight_per_socket"):
            _positive_int(name, getattr(self, name))
        for name in ("max_inflight_per_key", "key_tokens_per_minute", "key_burst_tokens",
                     "max_rss_bytes"):
            if getattr(self, name) is not None:
                _positive_int(name, getattr(self, name))
        _ratio("chat_reserved_fraction", self.chat_reserved_fraction, upper_open=True)
        _ratio("rss_leave_ratio", self.rss_leave_ratio)
        _ratio("queue_budget_fraction", self.queue_budget_fraction)
        _pair("kv_usage", self.kv_usage_enter, self.kv_usage_leave)
        _pair("gpu_util", self.gpu_util_enter, self.gpu_util_leave)
        _pair("gpu_memory", self.gpu_memory_enter, self.gpu_memory_leave)
        if self.priority_min > self.priority_max:
            raise ConfigError("priority_min", "must not exceed priority_max")
        object.__setattr__(self, "key_priority_caps", self._key_caps())
        caps = {"max_client_priority": [self.max_client_priority],
                "key_max_priority": list(self.key_priority_caps.values())}
        for name, values in caps.items():
            if any(not self.priority_min <= cap <= self.priority_max for cap in values):
                raise ConfigError(name, "must lie in [priority_min, priority_max]")
        if self.initial_drain_rps is not None and not self.initial_drain_rps > 0:
            raise ConfigError("initial_drain_rps", "must be positive or None")
        for name in ("nvml_interval_s", "drain_window_s", "ttft_bound_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(name, "must be positive")
        if self.model_gate not in ("on", "off"):
            raise ConfigError("model_gate", "must be on or off")
        if not self.model_gate_reserve_s >= 0:
            raise ConfigError("model_gate_reserve_s", "must be at least 0")
        if not 0 < self.retry_after_min_ms <= self.retry_after_max_ms:
            raise ConfigError("retry_after_min_ms",
                              "must be positive and at most retry_after_max_ms")

    def priority_cap(self, api_key: str | None) -> int:
        """The highest priority the owner of `api_key` (its SHA-256 hex, None without
        auth) may ask for."""
        if api_key is None:
            return self.max_client_priority
        return self.key_priority_caps.get(api_key[:12], self.max_client_priority)

    def _key_caps(self) -> dict[str, int]:
        caps = {}
        for item in self.key_max_priority:
            match = re.fullmatch(r"([0-9a-f]{12})=(-?\d+)", item.strip().lower())
            if match is None:
                raise ConfigError("key_max_priority", f"{item!r} is not KEY_ID=N (KEY_ID: "
                                  "the first 12 hex characters of the key's SHA-256)")
            caps[match.group(1)] = int(match.group(2))
        return caps

    @property
    def generate_waiting_limit(self) -> int:
        """Queue places bulk `generate` may fill; the rest is reserved for chat."""
        return max(1, int(self.max_waiting_requests * (1.0 - self.chat_reserved_fraction)))

    @property
    def generate_waiting_tokens_limit(self) -> int:
        return max(1, int(self.max_waiting_prompt_tokens * (1.0 - self.chat_reserved_fraction)))

    @property
    def key_bucket_size(self) -> int | None:
        if self.key_tokens_per_minute is None:
            return None
        return self.key_burst_tokens or self.key_tokens_per_minute


def _positive_int(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(name, "must be a positive integer")


def _ratio(name: str, value: float, upper_open: bool = False) -> None:
    ok = 0.0 <= value < 1.0 if upper_open else 0.0 < value <= 1.0
    if not ok:
        interval = "[0, 1)" if upper_open else "(0, 1]"
        raise ConfigError(name, f"must be a ratio in {interval}")


def _pair(name: str, enter: float | None, leave: float | None) -> None:
    """Hysteresis thresholds: both or neither, ratios, leave strictly below enter."""
    if (enter is None) != (leave is None):
        raise ConfigError(f"{name}_leave", "set both enter and leave, or neither")
    if enter is None:
        return
    if not 0.0 < leave < enter <= 1.0:
        raise ConfigError(f"{name}_leave", "need 0 < leave < enter <= 1")
