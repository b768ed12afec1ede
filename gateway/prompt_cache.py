"""OpenAI's `prompt_cache_key` and `prompt_cache_retention` (chat completions, Responses)
on the engine's KV tiers:

    prompt_cache_retention "24h" -> at the request's end its prompt and output blocks are
                                    parked (host RAM, through to disk) and kept: the disk
                                    tier's age sweep leaves them 24 h, and its byte bound
                                    drops other blocks first (engine/kv_disk_tier.py)
    prompt_cache_key (a string)  -> parked and kept the same way, aged as any block
    neither, or "in_memory"      -> as any request: the pool, and the tiers as eviction
                                    writes blocks down

The key says "this prefix comes back": a balancer may also route by it (docs/deploy.md),
so requests that share it meet the same replica's pool.
"""
from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import RequestError

RETENTIONS_S = {"in_memory": None, "24h": 24 * 3600.0}


@dataclass(frozen=True, slots=True)
class PromptCache:
    """What a request asks of the cache: `retain_s` None leaves its blocks as any
    request's; a number parks them at its end, kept on disk that long at least."""

    key: str | None = None
    retain_s: float | None = None


def prompt_cache(key: str | None, retention: str | None, max_key_chars: int) -> PromptCache:
    """The request's two fields, checked; a RequestError naming the one at fault."""
    if retention is not None and retention not in RETENTIONS_S:
        raise RequestError("invalid_request", "prompt_cache_retention: must be one of "
                           f"{', '.join(map(repr, RETENTIONS_S))}",
                           param="prompt_cache_retention")
    if key is not None and len(key) > max_key_chars:
        raise RequestError("invalid_request", f"prompt_cache_key: at most {max_key_chars} "
                           "characters (max_prompt_cache_key_chars)", param="prompt_cache_key")
    retain_s = RETENTIONS_S[retention] if retention is not None else None
    if retain_s is None and key:
        retain_s = 0.0  # kept, with no age beyond any block's
    return PromptCache(key or None, retain_s)
