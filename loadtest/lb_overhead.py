"""Load-balancer overhead: the same offered load on one replica, direct and through
deploy/haproxy/haproxy.cfg, in alternating rounds of one run, side by side.

    python -m loadtest.lb_overhead --num-prompts 64 --max-concurrency 16 --rounds 2

Rounds alternate (direct, HAProxy, direct, ...) so that drift on a shared machine hits
both sides alike, and every run draws its own prompts, so that no side finds the other's
in the prefix cache; the ratio is of the mean output throughputs (target: >= 0.95).
"""
from __future__ import annotations

import argparse
import asyncio
import sys

from loadtest.config import LoadTestConfig
from loadtest.haproxy_process import HaproxyProcess
from loadtest.metrics import summarize
from loadtest.server_process import ServerProcess
from loadtest.workload import build_workload, run_workload


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtest.lb_overhead", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="default")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--max-concurrency", type=int, default=16)
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--rounds", type=int, default=2, help="rounds on each side")
    p.add_argument("--serve-arg", action="append", default=[],
                   help="extra `tokenwire serve` flag (repeatable, e.g. --serve-arg=--device=cpu)")
    return p.parse_args(argv)


async def one_round(url: str, args: argparse.Namespace, seed: int) -> dict:
    """One workload of random prompts drawn from `seed`; its summary."""
    cfg = LoadTestConfig(url=url, num_prompts=args.num_prompts,
                         random_input_len=args.input_len, random_output_len=args.output_len,
                         max_concurrency=args.max_concurrency, ignore_eos=True,
                         tokenizer="none", seed=seed)
    outcome = await run_workload(cfg, build_workload(cfg, None))
    return summarize(outcome.records, outcome.duration, outcome.t0)


async def compare(direct: str, balanced: str, args: argparse.Namespace) -> dict:
    sides = {"direct": [], "haproxy": []}
    for i in range(args.rounds):
        for j, (name, url) in enumerate((("direct", direct), ("haproxy", balanced))):
            result = await one_round(url, args, seed=2 * i + j)
            sides[name].append(result)
            print(f"round {i + 1} {name:>8}: {result['output_throughput']:8.1f} tok/s "
                  f"({result['completed']} done, {result['failed']} failed)", flush=True)
    return {name: sum(r["output_throughput"] for r in rs) / len(rs) for name, rs in sides.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    serve = ["--model", args.model, *args.serve_arg]
    with ServerProcess(serve) as replica, \
            HaproxyProcess([f"127.0.0.1:{replica.port}"]) as lb:
        mean = asyncio.run(compare(replica.ws_url, lb.ws_url, args))
    ratio = mean["haproxy"] / mean["direct"] if mean["direct"] else 0.0
    print(f"output throughput  direct {mean['direct']:.1f} tok/s   through HAProxy "
          f"{mean['haproxy']:.1f} tok/s   ratio {ratio:.3f} (target >= 0.95)")
    return 0 if ratio else 1


if __name__ == "__main__":
    sys.exit(main())
