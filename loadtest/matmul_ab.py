"""The quantized matmul of this checkout against another commit's, in one process: both
trees' kernels/cpu/quant_* built as two modules, taking turns on the default model's four
projections (layer 0's qkv, o_proj, gate_up and down) at a prefill chunk's rows. Prints the
median time of each, their ratio and the largest difference between their outputs.

    python -m loadtest.matmul_ab --base 5726642 --rows 2048

Turns in one process, not runs apart: this box's speed drifts by 10-20% from one minute to
the next, more than most kernel changes are worth.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

import kernels.cpu as cpu_kernels
from engine.llm import LLM, set_num_threads
from loadtest.machine import REPO, cpu_model, git_commit
from loadtest.prefill_bench import worktree

PROJECTIONS = ("qkv", "o_proj", "gate_up", "down")


def build(tree: Path, name: str):
    """kernels/cpu's quantized-matmul module of `tree`, built as `name`."""
    cpu = tree / "kernels" / "cpu"
    sources = [str(cpu / os.path.basename(p)) for p in cpu_kernels.QUANT_SOURCES]
    return cpu_kernels.build_quant(name, sources)


def time_pair(modules: dict, x: torch.Tensor, args: tuple, turns: int) -> dict[str, float]:
    """Median seconds per call of each module's quant_linear, the modules taking turns, the
    order reversed every other turn (the second call of a pair ran up to 5% faster here)."""
    seconds: dict[str, list[float]] = {name: [] for name in modules}
    for turn in range(turns):
        order = list(modules.items())
        for name, module in order if turn % 2 else reversed(order):
            start = time.perf_counter()
            module.quant_linear(x, *args)
            seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(s) for name, s in seconds.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the commit to time beside this checkout")
    p.add_argument("--rows", type=int, default=2048, help="activation rows (a prefill chunk's)")
    p.add_argument("--turns", type=int, default=25)
    args = p.parse_args(argv)
    base = worktree(args.base)
    modules = {"this checkout": build(REPO, "tokenwire_cpu_quant_ab_this"),
               f"base {args.base}": build(base, f"tokenwire_cpu_quant_ab_{base.name[-10:]}")}
    set_num_threads(None)
    layer = LLM(model="default").core.runner.model.layers[0]
    isa = cpu_kernels.quant_isa()
    torch.manual_seed(0)
    print(f"quantized matmuls, {args.rows} rows, default model layer 0, {cpu_model()}, "
          f"commit {git_commit(REPO)} against {args.base}, {torch.get_num_threads()} threads")
    print(f"{'projection':<12}{'this (ms)':>11}{'base (ms)':>11}{'base / this':>13}"
          f"{'max diff':>11}")
    totals = {name: 0.0 for name in modules}
    for projection in PROJECTIONS:
        linear = getattr(layer, projection)
        w = linear.weight
        x = torch.randn(args.rows, w.in_features)
        call_args = (w.codes, w.scales, w.offsets, w.bits, w.sub, linear.bias, isa)
        outs = [m.quant_linear(x, *call_args) for m in modules.values()]  # also a warm-up
        diff = (outs[0] - outs[1]).abs().max().item()
        median = time_pair(modules, x, call_args, args.turns)
        this, base_s = median.values()
        for name in modules:
            totals[name] += median[name]
        print(f"{projection:<12}{this * 1e3:>11.2f}{base_s * 1e3:>11.2f}{base_s / this:>12.2f}x"
              f"{diff:>11.1e}")
    this, base_s = totals.values()
    print(f"{'all four':<12}{this * 1e3:>11.2f}{base_s * 1e3:>11.2f}{base_s / this:>12.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
