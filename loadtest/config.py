"""LoadTestConfig: every knob of a load test in one frozen dataclass, validated when built."""
from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field
from urllib.parse import urlsplit

DATASETS = ("random", "copy", "file", "sessions")
ENDPOINTS = ("completions", "chat", "responses", "responses-ws")


@dataclass(frozen=True, slots=True)
class LoadTestConfig:
    """What to drive, with which workload and arrival process, and what to report.

    url: ws://HOST:PORT/v1/ws (protocol v1), ws://HOST:PORT/v1/realtime (OpenAI Realtime,
    text; always the chat template), ws://HOST:PORT/v1/responses (endpoint responses-ws)
    or http://HOST:PORT/v1 (OpenAI-compatible).
    Non-loopback hosts are refused unless allow_remote: a load test is not for others' servers.
    """

    url: str = "ws://127.0.0.1:8000/v1/ws"
    endpoint: str = "completions"
    use_msgpack: bool = False
    models: tuple[str, ...] = ()  # one: every request names it; more: requests spread
    #                               over them in turn (a session keeps its model)
    dataset: str = "random"
    prompts_file: str | None = None
    num_prompts: int = 100
    random_input_len: int = 128
    random_output_len: int = 64
    random_range_ratio: float = 0.0
    num_sessions: int = 8
    turns: int = 4
    first_turn_len: int | None = None  # None: like every other turn (random_input_len)
    think_time: float = 0.0
    idle_gap: float = 0.0  # sessions: seconds with the socket closed between turns
    request_rate: float = math.inf
    burstiness: float = 1.0
    max_concurrency: int | None = None
    duration: float | None = None
    seed: int = 0
    allow_remote: bool = False
    temperature: float = 0.0
    ignore_eos: bool = False
    tokenizer: str = "default"
    percentiles: tuple[float, ...] = (99.0,)
    goodput: dict[str, float] = field(default_factory=dict)
    connect_timeout: float = 30.0

    def __post_init__(self):
        scheme = urlsplit(self.url).scheme
        if scheme not in ("ws", "wss", "http", "https"):
            raise ValueError(f"url: scheme must be ws(s) or http(s), got {self.url!r}")
        if not self.allow_remote and not is_loopback(urlsplit(self.url).hostname or ""):
            raise ValueError(f"url: {self.url} is not a loopback host; pass --allow-remote "
                             "to load-test a server on another machine")
        _check(self.endpoint in ENDPOINTS, "endpoint", f"one of {ENDPOINTS}")
        _check(self.dataset in DATASETS, "dataset", f"one of {DATASETS}")
        _check(self.dataset != "file" or bool(self.prompts_file), "prompts_file",
               "required with --dataset file")
        for name in ("num_prompts", "random_input_len", "random_output_len",
                     "num_sessions", "turns"):
            _check(getattr(self, name) > 0, name, "a positive integer")
        _check(self.first_turn_len is None or self.first_turn_len > 0, "first_turn_len",
               "a positive integer")
        _check(0.0 <= self.random_range_ratio < 1.0, "random_range_ratio", "in [0, 1)")
        _check(self.think_time >= 0, "think_time", ">= 0")
        _check(self.idle_gap >= 0, "idle_gap", ">= 0")
        _check(not self.idle_gap or (self.dataset == "sessions" and not self.is_realtime
                                     and not self.is_responses), "idle_gap",
               "used only with --dataset sessions on /v1/ws or the chat endpoint")
        _check(self.request_rate > 0, "request_rate", "positive or inf")
        _check(self.burstiness > 0, "burstiness", "positive")
        _check(self.max_concurrency is None or self.max_concurrency > 0, "max_concurrency",
               "a positive integer")
        _check(self.duration is None or self.duration > 0, "duration", "positive seconds")
        _check(self.temperature >= 0, "temperature", ">= 0")
        _check(not (self.is_realtime and (self.ignore_eos or self.use_msgpack)), "url",
               "without --ignore-eos and --msgpack for /v1/realtime (the Realtime API has "
               "neither)")
        _check(not self.is_responses or (self.is_websocket == (self.endpoint == "responses-ws")),
               "url", "ws(s)://HOST:PORT/v1/responses with --endpoint responses-ws, "
               "http(s)://HOST:PORT/v1 with --endpoint responses")
        _check(not (self.is_responses and (self.ignore_eos or self.use_msgpack)), "endpoint",
               "without --ignore-eos and --msgpack for responses (the Responses API has "
               "neither)")
        _check(all(0 < p <= 100 for p in self.percentiles), "percentiles", "in (0, 100]")
        _check(all(isinstance(m, str) and m for m in self.models), "models", "model names")
        _check(not self.is_mix or not (self.is_realtime or self.is_responses), "models",
               "a single model on /v1/realtime and responses endpoints (a mix of models is "
               "driven over /v1/ws and the completions and chat endpoints)")

    @property
    def model(self) -> str | None:
        """The model HTTP requests name when there is no mix (None: the server's first)."""
        return self.models[0] if self.models else None

    @property
    def is_mix(self) -> bool:
        return len(self.models) > 1

    @property
    def is_websocket(self) -> bool:
        return self.url.startswith("ws")

    @property
    def is_responses(self) -> bool:
        """Tool chains on /v1/responses (loadtest/responses_client.py)."""
        return self.endpoint.startswith("responses")

    @property
    def is_realtime(self) -> bool:
        return self.is_websocket and urlsplit(self.url).path.rstrip("/").endswith("/realtime")

    @property
    def num_requests(self) -> int:
        if self.dataset == "sessions":
            return self.num_sessions * self.turns
        return self.num_prompts


def is_loopback(host: str) -> bool:
    """localhost or a loopback address; other names are not resolved (they could move)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check(ok: bool, name: str, expected: str) -> None:
    if not ok:
        raise ValueError(f"{name}: must be {expected}")
