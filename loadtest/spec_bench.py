"""Speculative decoding at c=1: output tokens/s with `speculative="ngram"` beside without
it, on the load tester's copy-heavy dataset (`tokenwire loadtest --dataset copy`: repeat,
rewrite, rename in a file, quote an agent's tool output; ~256 tokens in), on short edit
prompts (repeat, edit or reformat a short text) and on open chat, one request at a time,
the two engines alternating prompt by prompt on the same box; prints the ratio of output
tokens/s from submit to the last token and of tokens/s after the first (1 / TPOT), the
acceptance rate and the mean accepted length (proposed tokens accepted per
verification), then each engine's median step time by the proposed tokens a step verified
(0: a plain decode step; steps with prefill rows left out). Last, per dataset, the same
ratios modeled at its mean step times (loadtest.spec_bound): for the shipped proposer (a
check on the model against the measured ratios), for an oracle that knows the output
(the most any n-gram proposer could have accepted, proposing only when and as much as it
pays) and for a perfect draft (every step accepts k): what speculation can give on this
CPU at these step costs, whatever the proposer.

With `--batch-sizes`, each batch size c > 1 runs c copy-heavy prompts at a time instead
(one `generate` call of c prompts, batched continuously), the two engines alternating round
by round, and prints the same figures per c, then each engine's decode steps: their median
time, rows (tokens computed), ms per row and tokens sampled per step.

    python -m loadtest.spec_bench [--max-tokens 128] [--num-speculative-tokens 3]
                                  [--batch-sizes 1,8,32] [--rounds 3]
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import random
import statistics
import time
from collections import defaultdict

from engine import LLM, EngineConfig, SamplingParams
from engine.core import proposer_for
from engine.llm import set_num_threads
from loadtest.copy_dataset import copy_prompts
from loadtest.machine import cpu_model, git_commit
from loadtest.spec_bound import fewest_ms, oracle_positions, proposer_ms, step_costs

PARAGRAPH = ("tokenwire is a realtime LLM streaming gateway: an aiohttp server holds "
             "long-lived WebSocket sessions, a coroutine scheduler admits work under "
             "backpressure, and a continuous-batching, paged-KV engine pushes each token to "
             "its socket as soon as it exists.")
CODE = ("def mean(values):\n    total = 0\n    for value in values:\n        total += value\n"
        "    return total / len(values)\n\n\ndef variance(values):\n    m = mean(values)\n"
        "    return sum((v - m) ** 2 for v in values) / len(values)\n")
ITEMS = "red apples, green pears, ripe plums, dark cherries, soft apricots, sweet figs"
SHORT_EDITS = [
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

WARM_UP = "Name a colour."

REQUEST_IDS = itertools.count()
BATCH_SEEDS = itertools.count(1)


class StepTimes:
    """Wall time of each decode or verification step `llm` runs, in ms, by the proposed
    tokens it verified, and the rows (tokens computed) and tokens sampled of each. A step
    is the engine's whole step (scheduling and proposing, the forward, sampling, booking
    and the outputs' detokenizing), all of which a step saved by speculation saves."""

    def __init__(self, llm: LLM):
        self.ms: dict[int, list[float]] = defaultdict(list)
        self.rows: list[tuple[int, int, float]] = []  # (rows, sampled, ms) of each such step
        core = llm.core
        execute, step = core.runner.execute, core.step
        executed: list[tuple[int, int, int]] = []  # (drafts, rows, sampled) of decode steps

        def noted(batch):
            out = execute(batch)
            drafts = [len(r.spec_token_ids) for r in batch.requests]
            if all(n == 1 + d for n, d in zip(batch.num_new_tokens, drafts)):
                executed.append((sum(drafts), batch.total_tokens, sum(map(len, out))))
            return out

        def timed():
            executed.clear()
            start = time.perf_counter()
            outputs = step()
            if executed:
                ms = 1e3 * (time.perf_counter() - start)
                drafts, rows, sampled = executed[0]
                self.ms[drafts].append(ms)
                self.rows.append((rows, sampled, ms))
            return outputs

        core.runner.execute = noted
        core.step = timed

    def mark(self) -> dict[int, int]:
        """Where the times stand now, for `since`."""
        return {k: len(v) for k, v in self.ms.items()}

    def since(self, mark: dict[int, int]) -> dict[int, list[float]]:
        """The times of the steps run after `mark`, by proposed tokens verified."""
        return {k: v[mark.get(k, 0):] for k, v in self.ms.items() if len(v) > mark.get(k, 0)}

    def clear(self) -> None:
        self.ms.clear()
        self.rows.clear()

    def medians(self) -> str:
        return "  ".join(f"{k}: {statistics.median(v):.1f} ({len(v)})"
                         for k, v in sorted(self.ms.items()))

    def row_summary(self) -> str:
        """Over the decode steps timed: median ms, rows and ms per row; tokens sampled per
        step and per second of those steps."""
        if not self.rows:
            return "no decode steps"
        rows, sampled, ms = zip(*self.rows)
        per_row = [t / n for n, _, t in self.rows]
        return (f"{len(ms)} steps, median {statistics.median(ms):.1f} ms, "
                f"{statistics.median(rows):.0f} rows, {statistics.median(per_row):.2f} ms/row, "
                f"{sum(sampled) / len(ms):.2f} tokens/step, "
                f"{1e3 * sum(sampled) / sum(ms):.1f} tokens/s in steps")


def run_one(llm: LLM, prompt: list[int],
            params: SamplingParams) -> tuple[list[int], float, float]:
    """One request alone: (output token ids, seconds from submit to its last token, seconds
    from its first token to its last)."""
    start = time.perf_counter()
    llm.core.add_request(f"spec-bench-{next(REQUEST_IDS)}", prompt, params)
    tokens, first = [], None
    while llm.core.has_work():
        for out in llm.core.step():
            tokens += out.new_token_ids
            if first is None and tokens:
                first = time.perf_counter()
    end = time.perf_counter()
    return tokens, end - start, end - first


def compare(off: LLM, on: LLM, prompts: list[str], params: SamplingParams) -> dict:
    """Both engines, one prompt at a time: the figures of `summarize`, tokens/s after the
    first token, and for the bound the prompts, the outputs without speculation and the
    seconds the speculating engine took to its first tokens (its prefills)."""
    ids = [off.core.encode_chat([{"role": "user", "content": p}]) for p in prompts]
    before = on.core.stats()
    totals = {"off": [0, 0.0], "on": [0, 0.0]}
    decode = {"off": [0, 0.0], "on": [0, 0.0]}  # tokens after the first, and their seconds
    outputs, prefill_seconds = [], 0.0
    for prompt in ids:  # alternate, so both see the same load on a shared box
        for name, llm in (("off", off), ("on", on)):
            tokens, seconds, after_first = run_one(llm, prompt, params)
            totals[name][0] += len(tokens)
            totals[name][1] += seconds
            decode[name][0] += len(tokens) - 1
            decode[name][1] += after_first
            if name == "off":
                outputs.append(tokens)
            else:
                prefill_seconds += seconds - after_first
    return {**summarize(totals, before, on.core.stats()),
            "decode": {name: n / t for name, (n, t) in decode.items()},
            "prompts": ids, "outputs": outputs, "prefill_seconds": prefill_seconds}


def summarize(totals: dict, before, after) -> dict:
    """Each engine's tok/s from its (tokens, seconds), and the speculating engine's
    acceptance between two of its stats."""
    proposed = after.spec_proposed_tokens - before.spec_proposed_tokens
    accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
    drafts = after.spec_draft_steps - before.spec_draft_steps
    return {"off": totals["off"][0] / totals["off"][1], "on": totals["on"][0] / totals["on"][1],
            "acceptance": accepted / proposed if proposed else 0.0,
            "accepted_length": accepted / drafts if drafts else 0.0,
            "tokens": (totals["off"][0], totals["on"][0])}


def copy_heavy(llm: LLM, num: int, max_tokens: int, seed: int = 0) -> list[str]:
    """`num` prompts of the load tester's copy-heavy dataset (~256 tokens in)."""
    prompts = copy_prompts(num, 256, max_tokens, 0.0, random.Random(seed),
                           llm.core.tokenizer)
    return [p.text for p in prompts]


def batch_prompts(llm: LLM, c: int, max_tokens: int, seed: int) -> list[list[int]]:
    """c prompts of the copy-heavy dataset, each its own task and text."""
    return [llm.core.encode_chat([{"role": "user", "content": t}])
            for t in copy_heavy(llm, c, max_tokens, seed)]


def run_batch(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> tuple[int, float]:
    """All prompts submitted at once: (output tokens, seconds until the last finished)."""
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    return sum(len(o.token_ids) for o in outs), time.perf_counter() - start


def compare_batched(off: LLM, on: LLM, c: int, rounds: int, params: SamplingParams) -> dict:
    """Both engines run c prompts at once, the same ones in a round, for `rounds` rounds,
    alternating which goes first; the figures of `compare` plus each round's ratio. Each
    round of each c has its own prompts (seeds 1, 2, ... in turn; the c=1 table's are
    seed 0): a prompt repeated would find its answer in the speculating engine's proposal
    history."""
    before = on.core.stats()
    totals = {"off": [0, 0.0], "on": [0, 0.0]}
    ratios = []
    for r in range(rounds):
        prompts = batch_prompts(off, c, params.max_tokens, seed=next(BATCH_SEEDS))
        order = (("off", off), ("on", on)) if r % 2 == 0 else (("on", on), ("off", off))
        rate = {}
        for name, llm in order:
            tokens, seconds = run_batch(llm, prompts, params)
            totals[name][0] += tokens
            totals[name][1] += seconds
            rate[name] = tokens / seconds
        ratios.append(rate["on"] / rate["off"])
    return {**summarize(totals, before, on.core.stats()), "ratios": ratios}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--copy-prompts", type=int, default=8,
                   help="prompts drawn from the copy-heavy dataset (seed 0, ~256 tokens in)")
    p.add_argument("--num-speculative-tokens", type=int,
                   default=config_default("num_speculative_tokens"))
    p.add_argument("--num-threads", type=int, default=None)
    p.add_argument("--batch-sizes", type=batch_sizes, default=[1],
                   help="comma-separated; 1: the c=1 comparison, c > 1: c copy-heavy "
                        "prompts at once")
    p.add_argument("--rounds", type=int, default=3, help="rounds per batch size c > 1")
    p.add_argument("--speculative-max-rows", type=max_rows,
                   default=config_default("speculative_max_rows"),
                   help="the speculating engine's speculative_max_rows (none: no limit)")
    args = p.parse_args(argv)
    set_num_threads(args.num_threads)
    off = LLM(model=args.model, device="cpu")
    on = LLM(model=args.model, device="cpu", speculative="ngram",
             num_speculative_tokens=args.num_speculative_tokens,
             speculative_max_rows=args.speculative_max_rows)
    params = SamplingParams(max_tokens=args.max_tokens, temperature=0.0)
    # A warm-up prompt no dataset has: a dataset's prompt would find the warm-up's answer
    # in the speculating engine's proposal history.
    warm_up = compare(off, on, [WARM_UP], SamplingParams(max_tokens=16, temperature=0.0))
    steps = {"off": StepTimes(off), "on": StepTimes(on)}
    if 1 in args.batch_sizes:
        print_single(off, on, params, steps, args, warm_up["outputs"])
    batched = [c for c in args.batch_sizes if c > 1]
    if batched:
        print_batched(off, on, params, steps, batched, args)


def print_single(off: LLM, on: LLM, params: SamplingParams, steps: dict, args,
                 history: list[list[int]]) -> None:
    """The c=1 table, the step times, then the bounds at those step times; `history`: the
    outputs the speculating engine finished before (its proposer's history)."""
    print(f"CPU: {cpu_model()}; commit {git_commit()}; greedy, max_tokens {args.max_tokens}, "
          f"k <= {args.num_speculative_tokens}, c=1")
    print("tok/s: output tokens per second from submit to the last token; decode: after the "
          "first token (1 / TPOT), the prefill left out")
    print(f"{'dataset':<12}{'off tok/s':>10}{'on tok/s':>10}{'ratio':>8}{'decode off':>11}"
          f"{'on':>7}{'ratio':>8}{'accept':>8}{'acc.len':>8}  tokens (off, on)")
    copy = copy_heavy(off, args.copy_prompts, args.max_tokens)
    results = {}
    for name, prompts in (("copy-heavy", copy), ("short edit", SHORT_EDITS),
                          ("chat", CHAT)):
        marks = {engine: times.mark() for engine, times in steps.items()}
        r = compare(off, on, prompts, params)
        r["step_ms"] = {engine: times.since(marks[engine]) for engine, times in steps.items()}
        d = r["decode"]
        print(f"{name:<12}{r['off']:>10.1f}{r['on']:>10.1f}{r['on'] / r['off']:>7.2f}x"
              f"{d['off']:>11.1f}{d['on']:>7.1f}{d['on'] / d['off']:>7.2f}x"
              f"{r['acceptance']:>8.2f}{r['accepted_length']:>8.2f}  {r['tokens']}")
        results[name] = r
    print("median step ms (the engine's whole step) by proposed tokens verified (steps):")
    for name, times in steps.items():
        print(f"  {name:<4}{times.medians()}")
    print_bounds(on.core.config, results, args.num_speculative_tokens, history)


def print_bounds(config: EngineConfig, results: dict, k: int, history: list[list[int]]) -> None:
    """Per dataset, modeled at its mean step times (a plain step: the engine without
    speculation's; a verification of j tokens: the speculating engine's) and the
    speculating engine's measured prefills: the shipped proposer, the n-gram oracle's
    bound and a perfect draft's."""
    print("modeled (loadtest.spec_bound) at each dataset's mean step ms by proposed tokens "
          "verified and the measured prefills: submit-to-last / decode ratios")
    print(f"{'dataset':<12}{'shipped proposer':>18}{'n-gram oracle':>18}{'perfect draft':>18}"
          f"  step ms (0..{k})")
    for name, r in results.items():
        prompts, outputs = r["prompts"], r["outputs"]
        costs = step_costs({**r["step_ms"]["on"], 0: r["step_ms"]["off"][0]}, k)
        tokens_after_first = sum(len(o) - 1 for o in outputs)
        plain_ms = tokens_after_first * costs[0]
        shipped = proposer_ms(lambda: proposer_for(config), prompts, outputs, k, costs,
                              history)
        oracle = perfect = 0.0
        for prompt, output in zip(prompts, outputs, strict=True):
            accepted = oracle_positions(prompt, output, k, config.speculative_ngram_min,
                                        history)
            oracle += fewest_ms(accepted, costs)
            perfect += fewest_ms([k] * len(accepted), costs)
            history = [*history, output]
        prefill_ms = 1e3 * r["prefill_seconds"]
        cells = [f"{(prefill_ms + plain_ms) / (prefill_ms + ms):.2f}x / {plain_ms / ms:.2f}x"
                 for ms in (shipped, oracle, perfect)]
        print(f"{name:<12}" + "".join(f"{c:>18}" for c in cells)
              + "  " + " / ".join(f"{c:.1f}" for c in costs))


def print_batched(off: LLM, on: LLM, params: SamplingParams, steps: dict, sizes: list[int],
                  args) -> None:
    print(f"CPU: {cpu_model()}; commit {git_commit()}; greedy, max_tokens {args.max_tokens}, "
          f"k <= {args.num_speculative_tokens}, speculative_max_rows "
          f"{args.speculative_max_rows}, copy-heavy, {args.rounds} rounds per c")
    for c in sizes:
        for times in steps.values():
            times.clear()
        r = compare_batched(off, on, c, args.rounds, params)
        rounds = " ".join(f"{x:.2f}" for x in r["ratios"])
        print(f"c={c:<4}off {r['off']:.1f} tok/s, on {r['on']:.1f} tok/s, "
              f"{r['on'] / r['off']:.2f}x (rounds {rounds}; median "
              f"{statistics.median(r['ratios']):.2f}x); accept {r['acceptance']:.2f}, "
              f"acc.len {r['accepted_length']:.2f}; tokens (off, on) {r['tokens']}")
        for name, times in steps.items():
            print(f"  {name:<4}{times.row_summary()}")


def config_default(name: str):
    return next(f.default for f in dataclasses.fields(EngineConfig) if f.name == name)


def max_rows(text: str) -> int | None:
    return None if text == "none" else int(text)


def batch_sizes(text: str) -> list[int]:
    sizes = [int(part) for part in text.split(",")]
    if any(c < 1 for c in sizes):
        raise argparse.ArgumentTypeError("batch sizes must be at least 1")
    return sizes


if __name__ == "__main__":
    main()
