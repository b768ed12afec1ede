"""The copy-heavy dataset (`--dataset copy`): tasks whose answer repeats much of the prompt,
the workloads speculative decoding from the prompt's own n-grams is for (issue 38):
repeat or rewrite a given text, rename an identifier in a given file, and an agent's
transcript whose tool output the answer quotes back.

The texts are drawn from small word lists with the workload's seeded `random.Random`, so
a seed names the prompts exactly (as for the random dataset), and they read as plain
English or Python, which a model can copy (random token ids it cannot).
"""
from __future__ import annotations

import random

from loadtest.datasets import Prompt, sample_len

NOUNS = ("keeper", "ship", "harbour", "lamp", "storm", "gull", "rope", "tide", "signal",
         "island", "engine", "ledger", "cargo", "anchor", "window", "captain")
PLACES = ("the north pier", "Gull Rock", "the old mill", "the east channel", "Port Ellen",
          "the lighthouse", "the market", "the dry dock")
VERBS = ("checked", "repaired", "counted", "painted", "logged", "moved", "lit", "watched")
ADVERBS = ("before dawn", "at noon", "twice", "in the rain", "without help", "slowly",
           "by lamplight", "once more")
NAMES = ("total", "values", "count", "result", "items", "offset", "limit", "buffer")
SERVICES = ("disk", "queue", "cache", "worker", "socket", "index")
STATES = ("ok", "slow", "retrying", "full", "idle", "degraded")


def sentence(rng: random.Random) -> str:
    return (f"The {rng.choice(NOUNS)} at {rng.choice(PLACES)} {rng.choice(VERBS)} the "
            f"{rng.choice(NOUNS)} {rng.choice(ADVERBS)}.")


def code_function(rng: random.Random, index: int) -> str:
    a, b = rng.sample(NAMES, 2)
    return (f"def step_{index}({a}, {b}):\n    if {b} > {rng.randint(2, 99)}:\n"
            f"        {a} = {a} + {b}\n    return {a} * {rng.randint(2, 9)}\n")


def log_line(rng: random.Random, index: int) -> str:
    return (f"{index:04d} {rng.choice(SERVICES)}={rng.choice(STATES)} "
            f"latency_ms={rng.randint(1, 900)}")


def _repeat(body: str, rng: random.Random) -> str:
    return f"Repeat this text exactly, word for word:\n\n{body}"


def _rewrite(body: str, rng: random.Random) -> str:
    old, new = rng.sample(NOUNS, 2)
    return f"Rewrite this text, replacing every '{old}' with '{new}':\n\n{body}"


def _rename(body: str, rng: random.Random) -> str:
    old, new = rng.sample(NAMES, 2)
    return f"Rename `{old}` to `{new}` in this file and return the whole file:\n\n{body}"


def _agent(body: str, rng: random.Random) -> str:
    service = rng.choice(SERVICES)
    return ("You are an operations agent. You called the tool `read_log`.\n"
            f"<tool_output>\n{body}\n</tool_output>\n"
            f"Quote every line of the tool output that mentions `{service}`, exactly, then "
            "say which service is slowest.")


# (task, the unit its body is made of)
TASKS = ((_repeat, "prose"), (_rewrite, "prose"), (_rename, "code"), (_agent, "log"))
UNITS = {"prose": lambda rng, i: sentence(rng), "code": code_function, "log": log_line}
JOINERS = {"prose": " ", "code": "\n", "log": "\n"}


def copy_prompt(input_len: int, output_len: int, rng: random.Random,
                tokenizer=None) -> Prompt:
    """One copy-heavy task whose prompt is about `input_len` tokens (counted with the
    tokenizer when given, else in words): units are added until their counts and the
    task's own words reach it, then the whole prompt is counted once."""
    task, unit = TASKS[rng.randrange(len(TASKS))]
    task_seed = rng.random()  # the task's own draws (which words to swap), apart from units
    overhead = _count(task("", random.Random(task_seed)), tokenizer)
    units: list[str] = []
    length = overhead
    while length < input_len:
        units.append(UNITS[unit](rng, len(units)))
        length += _count(units[-1], tokenizer)
    text = task(JOINERS[unit].join(units), random.Random(task_seed))
    return Prompt(text, _count(text, tokenizer), output_len)


def _count(text: str, tokenizer) -> int:
    if tokenizer is None:
        return len(text.split())
    return len(tokenizer.encode(text, add_special_tokens=False))


def copy_prompts(num: int, input_len: int, output_len: int, range_ratio: float,
                 rng: random.Random, tokenizer=None) -> list[Prompt]:
    """`num` copy-heavy tasks with lengths around input_len/output_len, each of a kind
    drawn from the seed."""
    return [copy_prompt(sample_len(input_len, range_ratio, rng),
                        sample_len(output_len, range_ratio, rng), rng, tokenizer)
            for _ in range(num)]
