"""Time the sampler on CPU: one step's `Sampler.sample` for 1, 8 and 32 rows of a 49k
vocabulary (SmolLM2's), greedy, `temperature: 1` and `top_p: 0.9`, and beside it the two
sources of a row's Exp(1) noise the sampler could use (numpy's PCG64, which it does use on
CPU, and torch's `exponential_`), and 32 rows' noise drawn on one thread against split over
torch's threads as the sampler draws it. With --model-logits: top-p's candidate widths
(TOP_P_CANDIDATES against trying 1024 first) on 32 rows of the default model's own
logits, over a story it writes and over a docs page it reads, at temperature 0.7 and 1.

    python -m loadtest.sampler_bench [--vocab 49152] [--repeats 200] [--model-logits]
"""
from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from engine.request import Request
from engine.sampler import TOP_P_CANDIDATES, Sampler, exponential_rows, top_p_filter
from engine.sampling_params import SamplingParams

CASES = {"greedy": SamplingParams(temperature=0.0),
         "temperature 1": SamplingParams(temperature=1.0),
         "top_p 0.9": SamplingParams(temperature=0.7, top_p=0.9)}


def median_ms(fn, repeats: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def sample_ms(rows: int, params: SamplingParams, vocab: int, repeats: int) -> float:
    sampler = Sampler()
    requests = [Request(f"r{i}", [1], params) for i in range(rows)]
    logits = torch.randn(rows, vocab, generator=torch.Generator().manual_seed(0)) * 3
    return median_ms(lambda: sampler.sample(logits.clone(), requests), repeats)


def model_logits() -> dict[str, torch.Tensor]:
    """The default model's logits at every position of a story it writes (seeded) and of
    docs/engine.md's start."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.loader import default_model_dir
    path = default_model_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    torch.manual_seed(0)
    ask = [{"role": "user", "content": "Write a short story about a robot who learns to paint."}]
    prompt = tokenizer.apply_chat_template(ask, add_generation_prompt=True, return_dict=True,
                                           return_tensors="pt")["input_ids"]
    story = model.generate(prompt, max_new_tokens=200, do_sample=True, temperature=0.7,
                           top_p=0.9)
    docs = Path(__file__).resolve().parent.parent / "docs" / "engine.md"
    page = tokenizer(docs.read_text()[:6000], return_tensors="pt").input_ids[:, :1024]
    with torch.no_grad():
        return {name: model(ids).logits[0] for name, ids in (("story", story), ("docs", page))}


def top_p_widths(repeats: int) -> None:
    for name, logits in model_logits().items():
        picked = torch.randperm(logits.shape[0], generator=torch.Generator().manual_seed(0))
        rows = logits[picked[:32]]
        for temperature in (0.7, 1.0):
            probs = torch.softmax(rows / temperature, dim=-1)
            top_p = torch.full((32, 1), 0.9)
            wide = median_ms(lambda: top_p_filter(probs, top_p, (1024,)), repeats)
            narrow = median_ms(lambda: top_p_filter(probs, top_p, TOP_P_CANDIDATES), repeats)
            print(f"top_p 0.9, 32 rows of the default model's logits ({name}, temperature "
                  f"{temperature}): 1024 first {wide:.2f}, {TOP_P_CANDIDATES} {narrow:.2f} "
                  f"({wide / narrow:.2f}x)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--model-logits", action="store_true",
                        help="also time top-p's candidate widths on the default model's logits")
    args = parser.parse_args(argv)
    print(f"torch threads {torch.get_num_threads()}, vocab {args.vocab}; median ms per call")
    for rows in (1, 8, 32):
        cells = [f"{name} {sample_ms(rows, p, args.vocab, args.repeats):.3f}"
                 for name, p in CASES.items()]
        print(f"Sampler.sample, {rows:2d} rows: " + ", ".join(cells))
    numpy_gen = np.random.Generator(np.random.PCG64(0))
    torch_gen = torch.Generator().manual_seed(0)
    row = torch.empty(args.vocab)
    numpy_ms = median_ms(lambda: numpy_gen.standard_exponential(out=row.numpy(),
                                                                dtype=np.float32), args.repeats)
    torch_ms = median_ms(lambda: row.exponential_(generator=torch_gen), args.repeats)
    print(f"one row's Exp(1) noise: numpy PCG64 {numpy_ms:.3f}, torch exponential_ "
          f"{torch_ms:.3f} ({torch_ms / numpy_ms:.1f}x numpy's)")
    noise = torch.empty(32, args.vocab)
    rows = [(noise[i], np.random.Generator(np.random.PCG64(i))) for i in range(32)]
    one_ms = median_ms(lambda: exponential_rows(rows), args.repeats)
    sampler = Sampler()
    split_ms = median_ms(lambda: sampler.draw_noise(rows), args.repeats)
    print(f"32 rows' Exp(1) noise: one thread {one_ms:.3f}, split over "
          f"{torch.get_num_threads()} threads {split_ms:.3f} ({one_ms / split_ms:.2f}x)")
    if args.model_logits:
        top_p_widths(args.repeats)


if __name__ == "__main__":
    main()
