"""fit_to_context drops exactly what dropping one message (or turn) at a time would, with
log2(n) renders instead of n: a long history costs O(n log n), not O(n^2)."""
from __future__ import annotations

import math
import random

import pytest

from engine.errors import PromptTooLongError
from gateway.messages import fit_to_context


class Template:
    """A chat template stand-in: each message costs its length plus 3 tokens; counts
    renders."""

    def __init__(self):
        self.renders = 0

    def __call__(self, messages: list[dict]) -> list[int]:
        self.renders += 1
        return [0] * sum(len(m["content"]) + 3 for m in messages)


def drop_one_at_a_time(encode, messages, room, max_len, step) -> list[int]:
    """The reference: drop the oldest non-system message(s) until it fits or one is left."""
    messages = list(messages)
    first = 1 if messages and messages[0]["role"] == "system" else 0
    prompt = encode(messages)
    while len(prompt) + room > max_len and len(messages) - first > 1:
        del messages[first:first + step]
        prompt = encode(messages)
    return prompt


def conversation(rng: random.Random, n: int, system: bool) -> list[dict]:
    head = [{"role": "system", "content": "s" * rng.randrange(0, 5)}] if system else []
    return head + [{"role": "user", "content": "x" * rng.randrange(0, 9)} for _ in range(n)]


@pytest.mark.parametrize("step", [1, 2])
def test_drops_what_dropping_one_at_a_time_drops(step):
    rng = random.Random(step)
    for _ in range(2000):
        messages = conversation(rng, rng.randrange(0, 12), rng.random() < 0.5)
        room, max_len = rng.randrange(0, 10), rng.randrange(1, 60)
        ours = fit_to_context(Template(), messages, room, max_len, step)
        assert ours == drop_one_at_a_time(Template(), messages, room, max_len, step)


@pytest.mark.parametrize("step", [1, 2])
def test_a_render_refused_by_its_length_counts_as_not_fitting(step):
    """The engine refuses a text longer in characters than the context can hold before
    encoding it (PromptTooLongError): such renders are ones that do not fit, and where
    the fewest messages kept are refused, so is the conversation."""
    rng = random.Random(10 + step)
    for _ in range(2000):
        messages = conversation(rng, rng.randrange(1, 12), rng.random() < 0.5)
        room, max_len = rng.randrange(0, 10), rng.randrange(1, 60)
        refused_from = rng.randrange(max_len, 2 * max_len)  # never a prompt that fits
        template = Refusing(refused_from)
        expected = drop_one_at_a_time(Template(), messages, room, max_len, step)
        if len(expected) >= refused_from:
            with pytest.raises(PromptTooLongError):
                fit_to_context(template, messages, room, max_len, step)
        else:
            assert fit_to_context(template, messages, room, max_len, step) == expected


class Refusing(Template):
    """Refuses a render of `refused_from` tokens or more, as the engine does by length."""

    def __init__(self, refused_from: int):
        super().__init__()
        self.refused_from = refused_from

    def __call__(self, messages: list[dict]) -> list[int]:
        prompt = super().__call__(messages)
        if len(prompt) >= self.refused_from:
            raise PromptTooLongError("too long by its characters")
        return prompt


def test_a_long_history_takes_log_renders():
    rng = random.Random(0)
    messages = conversation(rng, 2000, system=True)
    template = Template()
    prompt = fit_to_context(template, messages, 10, 400, step=1)
    assert len(prompt) + 10 <= 400
    assert template.renders <= math.ceil(math.log2(2000)) + 2
