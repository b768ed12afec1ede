"""The small data objects the engine hands back: per-step deltas and final outputs."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.logprobs import TokenLogprob


@dataclass(frozen=True, slots=True)
class SampledToken:
    """The token a step sampled for one request, with its log-probabilities when asked."""

    token_id: int
    logprob: TokenLogprob | None = None


@dataclass
class RequestOutput:
    """What one request produced since its last output (a diff), plus running totals.

    finish_reason: None while running; then "stop", "length", "cancelled" or "error".
    """

    request_id: str
    delta_text: str
    new_token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    error: str | None = None
    logprobs: list[TokenLogprob] | None = None  # one per new token, when asked


@dataclass
class CompletionOutput:
    """The whole result of one prompt in offline `LLM.generate`."""

    text: str
    token_ids: list[int]
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int
    logprobs: list[TokenLogprob] | None = None  # one per token, when asked


@dataclass
class TierStats:
    """One KV tier below the pool (host RAM or disk): what it holds and what it served."""

    hits: int = 0  # prompt tokens loaded from this tier into the pool
    bytes: int = 0  # held now
    capacity: int = 0  # bytes it may hold
    stores: int = 0  # blocks written to it
    loads: int = 0  # blocks loaded from it
    store_seconds: float = 0.0  # spent copying blocks into it
    load_seconds: float = 0.0  # spent copying blocks back to the pool
    dropped: int = 0  # blocks let go to stay within capacity (disk: or a full write queue)
    corrupt: int = 0  # disk: files that failed their check (deleted, counted as misses)


@dataclass
class EngineStats:
    """A snapshot of the engine's load, read by the admission scheduler and /metrics."""

    num_running: int = 0
    num_waiting: int = 0
    num_free_blocks: int = 0
    num_total_blocks: int = 0
    prefix_cache_queries: int = 0  # tokens looked up
    prefix_cache_hits: int = 0  # tokens found
    prefill_tokens: int = 0  # prompt tokens computed (a cache hit or a fork computes none)
    fork_shared_tokens: int = 0  # prompt tokens `n > 1` samples shared with their first
    num_preemptions: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    steps: int = 0
    spec_proposed_tokens: int = 0  # speculative decoding: tokens proposed and verified
    spec_accepted_tokens: int = 0  # of those, accepted (each saved one forward pass)
    spec_draft_steps: int = 0  # request-steps that verified a proposal
    finish_reasons: dict[str, int] = field(default_factory=dict)
    kv_tiers: dict[str, TierStats] = field(default_factory=dict)  # "host", "disk" when on

    @property
    def kv_usage(self) -> float:
        if not self.num_total_blocks:
            return 0.0
        return 1.0 - self.num_free_blocks / self.num_total_blocks
