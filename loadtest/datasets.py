"""Workloads: random token prompts (like vLLM's random dataset), a prompts file, sessions.

Everything is drawn from one seeded `random.Random`, so a seed names a workload exactly.
"""
from __future__ import annotations

import json
import math
import random
import string
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True)
class Prompt:
    """One request to send: its text, its length in tokens and how many tokens to ask for.

    token_ids, when set, is sent instead of the text by the completions transports (WS
    `generate` and HTTP /v1/completions), so the server sees exactly those tokens.
    """

    text: str
    prompt_len: int
    output_len: int
    token_ids: tuple[int, ...] | None = None
    model: str | None = None  # set in a model mix: the model this request names


def token_id_prompts(vocab: int, num: int, input_len: int, seed: int) -> list[list[int]]:
    """`tokenwire bench`'s prompts: seeded random token ids away from the special tokens at
    both ends of the vocab."""
    rng = random.Random(seed)
    return [[rng.randrange(100, vocab - 100) for _ in range(input_len)] for _ in range(num)]


def token_prompts(vocab: int, num: int, input_len: int, output_len: int,
                  seed: int) -> list[Prompt]:
    """The same token-id prompts as Prompts, for the comparisons that serve them."""
    ids = token_id_prompts(vocab, num, input_len, seed)
    return [Prompt("", input_len, output_len, tuple(p)) for p in ids]


def request_params(prompt: Prompt, temperature: float, ignore_eos: bool) -> dict:
    """The protocol's `params` for one request of the workload."""
    params = {"max_tokens": prompt.output_len, "temperature": temperature}
    if ignore_eos:
        params["ignore_eos"] = True
    if prompt.model is not None:
        params["model"] = prompt.model
    return params


def sample_len(mean: int, range_ratio: float, rng: random.Random) -> int:
    """A length drawn uniformly from [mean*(1-r), mean*(1+r)], at least 1."""
    low = max(1, math.floor(mean * (1 - range_ratio)))
    high = max(low, math.ceil(mean * (1 + range_ratio)))
    return rng.randint(low, high)


def random_text(num_tokens: int, rng: random.Random, tokenizer=None) -> tuple[str, int]:
    """Text of about `num_tokens` tokens and its exact length when a tokenizer is known.

    With a tokenizer: random non-special token ids, decoded, re-encoded and cut to length
    (decoding can merge ids, so the re-encode is what the server will see). Without one:
    random short lowercase words, counted as one token each (an estimate).
    """
    if tokenizer is None:
        words = ("".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 6)))
                 for _ in range(num_tokens))
        return " ".join(words), num_tokens
    special = set(tokenizer.all_special_ids)
    vocab = len(tokenizer)
    ids = []
    while len(ids) < num_tokens:
        token = rng.randrange(vocab)
        if token not in special:
            ids.append(token)
    text = tokenizer.decode(ids, clean_up_tokenization_spaces=False)
    ids = tokenizer.encode(text, add_special_tokens=False)[:num_tokens]
    return tokenizer.decode(ids, clean_up_tokenization_spaces=False), len(ids)


def random_prompts(num: int, input_len: int, output_len: int, range_ratio: float,
                   rng: random.Random, tokenizer=None) -> list[Prompt]:
    """`num` random prompts with lengths around input_len/output_len."""
    prompts = []
    for _ in range(num):
        text, length = random_text(sample_len(input_len, range_ratio, rng), rng, tokenizer)
        prompts.append(Prompt(text, length, sample_len(output_len, range_ratio, rng)))
    return prompts


def file_prompts(path: str | Path, num: int, output_len: int, tokenizer=None) -> list[Prompt]:
    """Prompts from a file: one per line, or JSONL objects with `prompt` (or `text`) and
    optional `output_len`/`max_tokens`. Cycles through the file to reach `num`."""
    entries = []
    for line_no, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        entries.append(_parse_line(line, line_no, output_len))
    if not entries:
        raise ValueError(f"{path}: no prompts in file")
    prompts = []
    for i in range(num):
        text, out_len = entries[i % len(entries)]
        length = len(tokenizer.encode(text, add_special_tokens=False)) if tokenizer \
            else len(text.split())
        prompts.append(Prompt(text, length, out_len))
    return prompts


def _parse_line(line: str, line_no: int, output_len: int) -> tuple[str, int]:
    if not line.lstrip().startswith("{"):
        return line, output_len
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"line {line_no}: invalid JSON ({exc.msg})") from None
    text = obj.get("prompt", obj.get("text"))
    if not isinstance(text, str):
        raise ValueError(f"line {line_no}: needs a string `prompt` or `text`")
    return text, int(obj.get("output_len", obj.get("max_tokens", output_len)))


def session_turns(num_sessions: int, turns: int, base: list[Prompt],
                  openers: list[Prompt] | None = None) -> list[list[Prompt]]:
    """Split `num_sessions * turns` prompts into sessions, each a list of user turns.

    `openers` (one per session) replace each first turn: e.g. a long document that every
    later turn carries as history, the case the prefix cache is for.
    """
    if len(base) < num_sessions * turns:
        raise ValueError("not enough prompts for the sessions")
    sessions = [base[s * turns:(s + 1) * turns] for s in range(num_sessions)]
    for session, opener in zip(sessions, openers or []):
        session[0] = opener
    return sessions
