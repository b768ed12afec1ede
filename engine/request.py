"""Request: one sequence's state as the step scheduler and block manager see it."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """A prompt and what it has produced so far.

    The single scheduling rule: `num_computed_tokens` (tokens whose KV is in the cache)
    catches up with `num_tokens` (prompt + output); once it has, the next token is sampled.

        all_token_ids: [p0 p1 ... p(n-1) | o0 o1 ...]
                        ^-- computed --^ ^-- new this step --^
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float = field(default_factory=time.monotonic)
    all_token_ids: list[int] = field(init=False)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache (first schedule)
    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[bytes] = field(default_factory=list)  # chained, one per full block
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None
    num_preemptions: int = 0
    # xgrammar's matcher of a structured-output request: it has accepted exactly the
    # output tokens (never re-fed when a preempted request is recomputed)
    grammar: Any = None
    # tokens proposed for this step (speculative decoding): computed after the last real
    # token and verified by the step; never part of all_token_ids until accepted
    spec_token_ids: list[int] = field(default_factory=list)

    def __post_init__(self):
        self.all_token_ids = list(self.prompt_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.all_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.all_token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return self.num_tokens - self.num_prompt_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
