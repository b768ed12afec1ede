"""The engine's per-token log-probabilities (engine.logprobs.TokenLogprob) in each wire shape.

    /v1/ws delta:       [{"token", "token_id", "logprob", "top": [{"token", "token_id", "logprob"}]}]
    chat (OpenAI):      {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}],
                         "refusal": None}
    completions (legacy): {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
                           "text_offset"}

A token's text is the tokenizer's decoding of that one token (as vLLM shows it): a token
holding part of a UTF-8 character shows U+FFFD, its `bytes` the character's share.
"""
from __future__ import annotations

import functools
import math

from engine.logprobs import TokenLogprob


class TokenStrings:
    """Token id -> its text, cached (bounded by the vocabulary)."""

    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._cache: dict[int, str] = {}

    def __call__(self, token_id: int) -> str:
        text = self._cache.get(token_id)
        if text is None:
            text = self._tokenizer.decode([token_id])
            self._cache[token_id] = text
        return text


@functools.lru_cache(maxsize=4)
def token_strings(tokenizer) -> TokenStrings:
    """The one TokenStrings of a tokenizer (an engine has one)."""
    return TokenStrings(tokenizer)


def _finite(logprob: float) -> float:
    """JSON has no -inf: a token the model gives no chance gets OpenAI's floor value."""
    return logprob if math.isfinite(logprob) else -9999.0


def ws_entries(entries: list[TokenLogprob], text: TokenStrings) -> list[dict]:
    return [{"token": text(e.token_id), "token_id": e.token_id, "logprob": _finite(e.logprob),
             "top": [{"token": text(t), "token_id": t, "logprob": _finite(lp)}
                     for t, lp in e.top]} for e in entries]


def chat_logprobs(entries: list[TokenLogprob], text: TokenStrings) -> dict:
    def one(token_id: int, logprob: float) -> dict:
        token = text(token_id)
        return {"token": token, "logprob": _finite(logprob), "bytes": list(token.encode())}

    return {"content": [{**one(e.token_id, e.logprob),
                         "top_logprobs": [one(t, lp) for t, lp in e.top]} for e in entries],
            "refusal": None}


def completion_logprobs(entries: list[TokenLogprob], text: TokenStrings,
                        offset: int) -> dict:
    """`offset`: characters of the choice's text before these tokens."""
    tokens = [text(e.token_id) for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": [_finite(e.logprob) for e in entries],
            "top_logprobs": [{text(t): _finite(lp) for t, lp in e.top} for e in entries],
            "text_offset": offsets}
