"""The engine's per-token log-probabilities (engine.logprobs.TokenLogprob) in each wire shape.

    /v1/ws delta:         [{"token", "token_id", "logprob", "top": [{"token", "token_id",
                            "logprob"}]}]
    chat (OpenAI):        {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}],
                           "refusal": None}
    completions (legacy): {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
                           "text_offset"}

`text(token_id)` is one token's text as the tokenizer decodes it alone (as vLLM shows
it): a token holding part of a UTF-8 character shows U+FFFD, its `bytes` the character's
share.
"""
from __future__ import annotations

import math
from collections.abc import Callable

from engine.logprobs import TokenLogprob

TokenText = Callable[[int], str]


def finite(logprob: float) -> float:
    """JSON has no -inf: a token the model gives no chance gets OpenAI's floor value."""
    return logprob if math.isfinite(logprob) else -9999.0


def ws_entries(entries: list[TokenLogprob], text: TokenText) -> list[dict]:
    return [{"token": text(e.token_id), "token_id": e.token_id, "logprob": finite(e.logprob),
             "top": [{"token": text(t), "token_id": t, "logprob": finite(lp)}
                     for t, lp in e.top]} for e in entries]


def chat_logprobs(entries: list[TokenLogprob], text: TokenText) -> dict:
    def one(token_id: int, logprob: float) -> dict:
        token = text(token_id)
        return {"token": token, "logprob": finite(logprob), "bytes": list(token.encode())}

    return {"content": [{**one(e.token_id, e.logprob),
                         "top_logprobs": [one(t, lp) for t, lp in e.top]} for e in entries],
            "refusal": None}


def completion_logprobs(entries: list[TokenLogprob], text: TokenText, offset: int) -> dict:
    """`offset`: characters of the choice's text before these tokens."""
    tokens = [text(e.token_id) for e in entries]
    offsets = []
    for token in tokens:
        offsets.append(offset)
        offset += len(token)
    return {"tokens": tokens, "token_logprobs": [finite(e.logprob) for e in entries],
            "top_logprobs": [{text(t): finite(lp) for t, lp in e.top} for e in entries],
            "text_offset": offsets}
