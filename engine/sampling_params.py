"""SamplingParams: the per-request generation settings, validated when built."""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from engine.errors import InvalidRequestError
from engine.response_format import reduce_response_format

MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256


@dataclass
class SamplingParams:
    """Settings of one request, the same fields as the WebSocket `params` object.

    temperature 0 means greedy. `seed` makes sampling reproducible per request.
    `stop` strings end the request and never appear in its text. `response_format` is
    OpenAI's (text, json_object, json_schema), kept in its reduced form (None for text).
    """

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1: no limit
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None
    ignore_eos: bool = False
    priority: int = 0
    # None: no log-probabilities; k: each token's, with its k most likely alternatives
    logprobs: int | None = None
    response_format: dict | None = None
    # False: special tokens (an end-of-turn marker, ...) appear in the text (vLLM's field)
    skip_special_tokens: bool = True

    def __post_init__(self):
        self.stop = _as_list(self.stop, "stop", "must be a string or a list of strings",
                             scalar=str)
        self.stop_token_ids = _as_list(self.stop_token_ids, "stop_token_ids",
                                       "must be a list of integers")
        if self.top_k == -1:
            self.top_k = 0
        _check_types(self)
        _check_ranges(self)
        self.response_format = reduce_response_format(self.response_format)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    @classmethod
    def from_dict(cls, params: dict | None, **defaults) -> "SamplingParams":
        """Build from a wire `params` map; unknown keys are an error naming the key."""
        merged = dict(defaults)
        names = {f.name for f in fields(cls)}
        for key, value in (params or {}).items():
            if key not in names:
                raise InvalidRequestError(f"params.{key}", "unknown parameter")
            merged[key] = value
        return cls(**merged)


_INT_FIELDS = ("max_tokens", "top_k", "priority")
_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty",
                 "presence_penalty", "frequency_penalty")


def _as_list(value, name: str, message: str, scalar: type | None = None) -> list:
    """None -> [], a lone `scalar` -> [value], a list or tuple -> a copy; else an error
    naming the field (a dict or a set must not slip through as its keys)."""
    if value is None:
        return []
    if scalar is not None and isinstance(value, scalar):
        return [value]
    if not isinstance(value, (list, tuple)):
        raise InvalidRequestError(name, message)
    return list(value)


def _check_types(p: SamplingParams) -> None:
    for name in _INT_FIELDS:
        value = getattr(p, name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequestError(name, "must be an integer")
    for name in _FLOAT_FIELDS:
        setattr(p, name, _finite_float(getattr(p, name), name))
    if p.seed is not None and (isinstance(p.seed, bool) or not isinstance(p.seed, int)):
        raise InvalidRequestError("seed", "must be an integer or null")
    if p.logprobs is not None and (isinstance(p.logprobs, bool)
                                   or not isinstance(p.logprobs, int)):
        raise InvalidRequestError("logprobs", "must be an integer or null")
    for name in ("ignore_eos", "skip_special_tokens"):
        if not isinstance(getattr(p, name), bool):
            raise InvalidRequestError(name, "must be a boolean")
    if not all(isinstance(s, str) for s in p.stop):
        raise InvalidRequestError("stop", "must be a string or a list of strings")
    if not all(isinstance(t, int) and not isinstance(t, bool) for t in p.stop_token_ids):
        raise InvalidRequestError("stop_token_ids", "must be a list of integers")


def _finite_float(value, name: str) -> float:
    """value as a finite float; an int too large for a float (OverflowError) and NaN or
    infinity (which every range comparison would treat inconsistently) are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidRequestError(name, "must be a number")
    try:
        number = float(value)
    except OverflowError:
        raise InvalidRequestError(name, "must be a finite number") from None
    if not math.isfinite(number):
        raise InvalidRequestError(name, "must be a finite number")
    return number


def _check_ranges(p: SamplingParams) -> None:
    _require(1 <= p.max_tokens <= 1_000_000, "max_tokens", "must be in [1, 1000000]")
    _require(0.0 <= p.temperature <= 100.0, "temperature", "must be in [0, 100]")
    _require(0.0 < p.top_p <= 1.0, "top_p", "must be in (0, 1]")
    _require(0 <= p.top_k <= 1_000_000, "top_k", "must be -1, 0 or a positive integer")
    _require(0.0 <= p.min_p <= 1.0, "min_p", "must be in [0, 1]")
    _require(0.0 < p.repetition_penalty <= 10.0, "repetition_penalty", "must be in (0, 10]")
    _require(-2.0 <= p.presence_penalty <= 2.0, "presence_penalty", "must be in [-2, 2]")
    _require(-2.0 <= p.frequency_penalty <= 2.0, "frequency_penalty", "must be in [-2, 2]")
    _require(p.seed is None or 0 <= p.seed < 2**63, "seed", "must be in [0, 2^63)")
    _require(-100 <= p.priority <= 100, "priority", "must be in [-100, 100]")
    _require(p.logprobs is None or p.logprobs >= 0, "logprobs", "must be non-negative")
    _require(len(p.stop) <= MAX_STOP_STRINGS, "stop", f"at most {MAX_STOP_STRINGS} strings")
    _require(all(0 < len(s) <= MAX_STOP_STRING_CHARS for s in p.stop), "stop",
             f"each stop string must have 1..{MAX_STOP_STRING_CHARS} characters")
    _require(all(t >= 0 for t in p.stop_token_ids), "stop_token_ids", "must be non-negative")


def _require(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise InvalidRequestError(name, message)
