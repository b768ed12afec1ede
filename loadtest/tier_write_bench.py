"""The decode step's time with KV tier writes off, to host RAM, and to host RAM and disk,
side by side in one run: the default model on CPU, a pool just large enough for a steady
decode batch, so that every block the batch grows into evicts a hashed block an earlier
round left behind (which the tiers then write down). The three engines take turns round
by round (the order rotating), each round the same fresh prompts; p50/p99 of the decode
steps (every request past its prefill) and the p99 ratio against off.

    python -m loadtest.tier_write_bench [--rounds 6] [--batch 8] [--output-len 192]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch

from engine import LLM, SamplingParams
from engine.llm import set_num_threads
from loadtest.machine import cpu_model, git_commit

MODES = ("off", "host", "host+disk")


def build_engines(args: argparse.Namespace, disk_dir: str) -> dict[str, LLM]:
    """One engine per mode, each with a pool that holds one round's batch and little
    more; the host tier (where on) holds `--host-blocks` blocks, so the host+disk engine
    drops blocks to disk all along."""
    blocks_per_seq = -(-(args.input_len * 5 // 4 + args.output_len) // 16)
    pool = {"num_kv_blocks": args.batch * blocks_per_seq + 4, "max_num_seqs": args.batch}
    engines = {"off": LLM(model="default", device="cpu", **pool)}
    host_bytes = args.host_blocks * block_bytes(engines["off"])
    engines["host"] = LLM(model="default", device="cpu", kv_host_bytes=host_bytes, **pool)
    engines["host+disk"] = LLM(model="default", device="cpu", kv_host_bytes=host_bytes,
                               kv_disk_dir=disk_dir, **pool)
    return engines


def block_bytes(llm: LLM) -> int:
    """Bytes of one pool block's KV, every layer's k and v."""
    return sum(t[0].nbytes for pair in llm.core.runner.kv_caches for t in pair)


def prompts(args: argparse.Namespace, round_index: int, vocab: int) -> list[list[int]]:
    """`--batch` random prompts of `--input-len` +-25% tokens (so the sequences cross
    block boundaries on different steps, as a server's do), seeded by the round."""
    gen = torch.Generator().manual_seed(round_index)
    lengths = torch.randint(args.input_len * 3 // 4, args.input_len * 5 // 4 + 1,
                            (args.batch,), generator=gen).tolist()
    return [torch.randint(100, vocab - 100, (n,), generator=gen).tolist() for n in lengths]


def decode_round(llm: LLM, batch: list[list[int]], output_len: int, tag: str) -> list[float]:
    """Run the batch to its end; ms of each step in which every request was decoding."""
    core = llm.core
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    for i, prompt in enumerate(batch):
        core.add_request(f"{tag}-{i}", prompt, params)
    times = []
    while core.has_work():
        sched = core.step_scheduler
        decoding = not sched.waiting and all(r.num_output_tokens for r in sched.running)
        started = time.perf_counter()
        core.step()
        if decoding:
            times.append((time.perf_counter() - started) * 1e3)
    return times


def tier_counts(llm: LLM) -> dict[str, tuple[int, int]]:
    """(stores, dropped) of each tier so far."""
    return {name: (s.stores, s.dropped) for name, s in llm.core.stats().kv_tiers.items()}


def run(args: argparse.Namespace) -> dict[str, dict]:
    with tempfile.TemporaryDirectory(prefix="tier-bench-") as disk_dir:
        engines = build_engines(args, disk_dir)
        vocab = engines["off"].core.vocab_size
        for mode, llm in engines.items():  # warm up, and leave the pool full of hashed blocks
            decode_round(llm, prompts(args, 10_000, vocab), args.output_len, "warm")
        before = {mode: tier_counts(llm) for mode, llm in engines.items()}
        times = {mode: [] for mode in MODES}
        for r in range(args.rounds):
            batch = prompts(args, r, vocab)
            order = MODES[r % 3:] + MODES[:r % 3]  # rotate, so drift hits all alike
            for mode in order:
                times[mode] += decode_round(engines[mode], batch, args.output_len, f"r{r}")
        results = {}
        for mode, llm in engines.items():
            after = tier_counts(llm)
            results[mode] = {"steps": times[mode],
                             "tiers": {t: tuple(a - b for a, b in zip(after[t], before[mode][t]))
                                       for t in after}}
            if llm.core.kv_tiers is not None:
                llm.core.kv_tiers.close()
        return results


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def report(results: dict[str, dict], args: argparse.Namespace) -> str:
    off_p99 = percentile(results["off"]["steps"], 99)
    lines = [f"CPU: {cpu_model()}; commit {git_commit()}; {torch.get_num_threads()} threads; "
             f"batch {args.batch}, ~{args.input_len} in / {args.output_len} out, "
             f"{args.rounds} rounds, host tier {args.host_blocks} blocks",
             "| tiers | decode steps | p50 ms | p99 ms | mean ms | p99 / off | "
             "blocks stored (host, disk) | dropped (host, disk) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for mode in MODES:
        steps, tiers = results[mode]["steps"], results[mode]["tiers"]
        stored = ", ".join(str(tiers[t][0]) for t in tiers) or "-"
        dropped = ", ".join(str(tiers[t][1]) for t in tiers) or "-"
        lines.append(f"| {mode} | {len(steps)} | {statistics.median(steps):.2f} | "
                     f"{percentile(steps, 99):.2f} | {statistics.fmean(steps):.2f} | "
                     f"{percentile(steps, 99) / off_p99:.2f} | {stored} | {dropped} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=6, help="rounds of each engine, interleaved")
    p.add_argument("--batch", type=int, default=8, help="sequences decoding at once")
    p.add_argument("--input-len", type=int, default=64, help="mean prompt tokens (+-25%%)")
    p.add_argument("--output-len", type=int, default=192, help="tokens each sequence decodes")
    p.add_argument("--host-blocks", type=int, default=32,
                   help="host tier size in blocks (smaller than a round's evictions, so "
                        "the host+disk engine writes to disk throughout)")
    p.add_argument("--num-threads", type=int, default=None, help="torch CPU threads")
    args = p.parse_args(argv)
    set_num_threads(args.num_threads)
    print(report(run(args), args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
