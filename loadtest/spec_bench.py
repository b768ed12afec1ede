"""Speculative decoding at c=1: output tokens/s with `speculative="ngram"` beside without
it, on copy-heavy prompts (repeat, edit or reformat a given text) and on open chat, one
request at a time, the two engines alternating prompt by prompt on the same box; prints
the ratio, the acceptance rate and the mean accepted length (proposed tokens accepted per
verification), then each engine's median step time by the proposed tokens a step verified
(0: a plain decode step; steps with prefill rows left out).

    python -m loadtest.spec_bench [--max-tokens 128] [--num-speculative-tokens 4]
"""
from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import time
from collections import defaultdict

from engine import LLM, SamplingParams
from engine.llm import set_num_threads

PARAGRAPH = ("tokenwire is a realtime LLM streaming gateway: an aiohttp server holds "
             "long-lived WebSocket sessions, a coroutine scheduler admits work under "
             "backpressure, and a continuous-batching, paged-KV engine pushes each token to "
             "its socket as soon as it exists.")
CODE = ("def mean(values):\n    total = 0\n    for value in values:\n        total += value\n"
        "    return total / len(values)\n\n\ndef variance(values):\n    m = mean(values)\n"
        "    return sum((v - m) ** 2 for v in values) / len(values)\n")
ITEMS = "red apples, green pears, ripe plums, dark cherries, soft apricots, sweet figs"
COPY_HEAVY = [
    f"Repeat this text exactly: {PARAGRAPH}",
    f"Rewrite this paragraph, replacing 'tokenwire' with 'the gateway':\n{PARAGRAPH}",
    f"Add a docstring to each function and return the whole code:\n{CODE}",
    f"Rename the variable `values` to `xs` in this code and show the result:\n{CODE}",
    f"Write this list as a numbered list, one item per line: {ITEMS}",
    f"Quote the first two sentences of this text, then summarize it: {PARAGRAPH}",
    f"Copy this code exactly:\n{CODE}",
    f"Repeat after me, three times: {ITEMS}",
]
CHAT = [
    "Write a short poem about the sea.",
    "What are three good habits for staying healthy?",
    "Tell me a story about a dragon who learns to bake bread.",
    "Explain how a rainbow forms.",
    "Give me ideas for a weekend trip in the mountains.",
    "Why do cats purr?",
    "Describe your ideal city in a few sentences.",
    "What should I consider when adopting a dog?",
]


class StepTimes:
    """Wall time of each decode or verification step `llm` runs, in ms, by the proposed
    tokens it verified."""

    def __init__(self, llm: LLM):
        self.ms: dict[int, list[float]] = defaultdict(list)
        runner = llm.core.runner
        execute = runner.execute

        def timed(batch):
            start = time.perf_counter()
            out = execute(batch)
            drafts = [len(r.spec_token_ids) for r in batch.requests]
            if all(n == 1 + d for n, d in zip(batch.num_new_tokens, drafts)):
                self.ms[sum(drafts)].append(1e3 * (time.perf_counter() - start))
            return out

        runner.execute = timed

    def medians(self) -> str:
        return "  ".join(f"{k}: {statistics.median(v):.1f} ({len(v)})"
                         for k, v in sorted(self.ms.items()))


def run_one(llm: LLM, prompt: list[int], params: SamplingParams) -> tuple[int, float]:
    """One request alone: (output tokens, seconds from submit to its last token)."""
    start = time.perf_counter()
    out = llm.generate([prompt], params)[0]
    return len(out.token_ids), time.perf_counter() - start


def compare(off: LLM, on: LLM, prompts: list[str], params: SamplingParams) -> dict:
    ids = [off.core.encode_chat([{"role": "user", "content": p}]) for p in prompts]
    before = on.core.stats()
    totals = {"off": [0, 0.0], "on": [0, 0.0]}
    for prompt in ids:  # alternate, so both see the same load on a shared box
        for name, llm in (("off", off), ("on", on)):
            tokens, seconds = run_one(llm, prompt, params)
            totals[name][0] += tokens
            totals[name][1] += seconds
    after = on.core.stats()
    proposed = after.spec_proposed_tokens - before.spec_proposed_tokens
    accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
    drafts = after.spec_draft_steps - before.spec_draft_steps
    return {"off": totals["off"][0] / totals["off"][1], "on": totals["on"][0] / totals["on"][1],
            "acceptance": accepted / proposed if proposed else 0.0,
            "accepted_length": accepted / drafts if drafts else 0.0,
            "tokens": (totals["off"][0], totals["on"][0])}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--num-speculative-tokens", type=int, default=4)
    p.add_argument("--num-threads", type=int, default=None)
    args = p.parse_args(argv)
    set_num_threads(args.num_threads)
    off = LLM(model=args.model, device="cpu")
    on = LLM(model=args.model, device="cpu", speculative="ngram",
             num_speculative_tokens=args.num_speculative_tokens)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    compare(off, on, CHAT[:2], SamplingParams(max_tokens=16, temperature=0.0))  # warm up
    steps = {"off": StepTimes(off), "on": StepTimes(on)}
    print(f"CPU: {cpu_model()}; commit {commit()}; greedy, max_tokens {args.max_tokens}, "
          f"k <= {args.num_speculative_tokens}, c=1")
    print(f"{'dataset':<12}{'off tok/s':>10}{'on tok/s':>10}{'ratio':>8}"
          f"{'accept':>8}{'acc.len':>8}  tokens (off, on)")
    for name, prompts in (("copy-heavy", COPY_HEAVY), ("chat", CHAT)):
        r = compare(off, on, prompts, params)
        print(f"{name:<12}{r['off']:>10.1f}{r['on']:>10.1f}{r['on'] / r['off']:>7.2f}x"
              f"{r['acceptance']:>8.2f}{r['accepted_length']:>8.2f}  {r['tokens']}")
    print("median step ms by proposed tokens verified (steps):")
    for name, times in steps.items():
        print(f"  {name:<4}{times.medians()}")


def cpu_model() -> str:
    for line in open("/proc/cpuinfo", encoding="utf-8"):
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    main()
