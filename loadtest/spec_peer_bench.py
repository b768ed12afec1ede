"""Speculative decoding against llama.cpp (issue 38, must-show 4): c=1 TPOT on copy-heavy
chat prompts (the load tester's `--dataset copy`, or `--dataset random`: random token
text), each server with its n-gram speculation off and on, the
same GGUF (the default model's) and the same client (OpenAI chat completions, greedy).

    python -m loadtest.spec_peer_bench [--num-prompts 8] [--input-len 256]
        [--output-len 128] [--rounds 3] [--peer-spec-type ngram-mod]

Four servers stay up and take turns, one request at a time, the order rotating each round
(a shared VM's speed drifts within minutes: see peer_bench); each round draws fresh prompts
(seed, seed + 1, ...), the same for every server; each figure is the median of its rounds.
tokenwire's acceptance comes from its /metrics (`tokenwire_spec_decode_num_*`);
llama-server reports none over HTTP.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import statistics
import sys

from loadtest.config import LoadTestConfig
from loadtest.copy_dataset import copy_prompts
from loadtest.datasets import random_prompts
from loadtest.llama_server import LlamaServer, find_llama_server
from loadtest.machine import cpu_model, git_commit
from loadtest.peer_bench import peer_gguf
from loadtest.report import print_report
from loadtest.server_metrics import scrape
from loadtest.server_process import ServerProcess

PEER_SPEC_TYPES = ("ngram-mod", "ngram-simple", "ngram-map-k")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", choices=("copy", "random"), default="copy",
                   help="the load tester's copy-heavy prompts, or its random ones "
                        "(random token text: the default model often loops on it)")
    p.add_argument("--num-prompts", type=int, default=8)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--num-threads", type=int, default=2)
    p.add_argument("--num-speculative-tokens", type=int, default=None,
                   help="k on both sides (llama-server's draft length set to it); "
                        "default: tokenwire's")
    p.add_argument("--peer-spec-type", choices=PEER_SPEC_TYPES, default="ngram-mod",
                   help="llama-server's --spec-type for its speculating side")
    p.add_argument("--llama-server", default=None, metavar="PATH")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-json", default=None)
    return p.parse_args(argv)


def servers(args: argparse.Namespace, binary: str) -> dict:
    """The four sides, unstarted: name -> server (ServerProcess or LlamaServer)."""
    gguf = str(peer_gguf("default"))
    serve = ["--model", "default", "--device", "cpu", "--num-threads", str(args.num_threads)]
    slot_tokens = 2 * (args.input_len + args.output_len) + 256  # the chat template's too
    peer = LlamaServer(binary, gguf, 1, slot_tokens, args.num_threads)
    peer_spec = LlamaServer(binary, gguf, 1, slot_tokens, args.num_threads)
    peer_spec.cmd += ["--spec-type", args.peer_spec_type,
                      *peer_draft_flags(args.peer_spec_type, args.num_speculative_tokens)]
    return {"tokenwire": ServerProcess(serve),
            "tokenwire ngram": ServerProcess(serve + [
                "--speculative", "ngram",
                "--num-speculative-tokens", str(args.num_speculative_tokens)]),
            "llama.cpp": peer,
            f"llama.cpp {args.peer_spec_type}": peer_spec}


def peer_draft_flags(spec_type: str, k: int) -> list[str]:
    """llama-server's draft length set to ours (`k` tokens per verification): its defaults
    (48 to 64 tokens for ngram-mod) suit a GPU, where a long rejected draft costs little;
    on 2 CPU cores each verification of 64 tokens costs a 64-token prefill."""
    if spec_type == "ngram-mod":
        return ["--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", str(k)]
    return [f"--spec-{spec_type}-size-m", str(k)]


def drive(url: str, prompts: list) -> dict:
    """The prompts one at a time over chat completions: TPOT and output tok/s."""
    from loadtest.metrics import summarize
    from loadtest.workload import run_loop, run_workload
    cfg = LoadTestConfig(url=url, endpoint="chat", num_prompts=len(prompts),
                         max_concurrency=1, temperature=0.0)
    outcome = run_loop(run_workload(cfg, {"prompts": prompts}))
    s = summarize(outcome.records, outcome.duration, outcome.t0)
    return {"failed": s["failed"], "mean_tpot_ms": s["mean_tpot_ms"],
            "output_tok_per_s": s["output_throughput"],
            "output_tokens": s["total_output_tokens"]}


def spec_counters(base: str) -> dict[str, float]:
    metrics = asyncio.run(scrape(base + "/metrics"))
    return {k: metrics.get(f"tokenwire_spec_decode_num_{k}_total", 0.0)
            for k in ("drafts", "draft_tokens", "accepted_tokens")}


def run(args: argparse.Namespace) -> int:
    # both load torch's engine code: here, not when the module is imported
    from loadtest.spec_bench import config_default
    from loadtest.tokenizer import load_tokenizer
    if args.num_speculative_tokens is None:
        args.num_speculative_tokens = config_default("num_speculative_tokens")
    binary = find_llama_server(args.llama_server)
    if binary is None:
        print("no llama-server found; pass --llama-server or run "
              "scripts/build_llama_server.sh", file=sys.stderr)
        return 2
    make_prompts = copy_prompts if args.dataset == "copy" else random_prompts
    tokenizer = load_tokenizer("default")

    def prompts(seed: int) -> list:
        return make_prompts(args.num_prompts, args.input_len, args.output_len, 0.0,
                            random.Random(seed), tokenizer)

    sides = servers(args, binary)
    rounds: dict[str, list[dict]] = {name: [] for name in sides}
    with contextlib.ExitStack() as stack:
        urls = {name: stack.enter_context(s).base for name, s in sides.items()}
        warm_up = prompts(args.seed + args.rounds)[:1]  # a text no round has
        for url in urls.values():  # warm-up: first-step allocations, llama's graph build
            drive(url + "/v1", warm_up)
        before = spec_counters(urls["tokenwire ngram"])
        names = list(sides)
        for r in range(args.rounds):
            # Fresh texts each round: a repeated prompt would hit each server's prefix cache,
            # and its answer, already given, tokenwire's proposal history (2.2x where the
            # first round gave 1.64x).
            texts = prompts(args.seed + r)
            for name in names[r % len(names):] + names[:r % len(names)]:
                rounds[name].append(drive(urls[name] + "/v1", texts))
                print(f"  {name} round {r + 1}: {rounds[name][-1]}", file=sys.stderr)
        after = spec_counters(urls["tokenwire ngram"])
    spec = {k: after[k] - before[k] for k in after}
    report = {"cpu": cpu_model(), "commit": git_commit(), "threads": args.num_threads,
              "dataset": args.dataset, "prompts": args.num_prompts,
              "input_len": args.input_len, "output_len": args.output_len,
              "rounds": args.rounds, "llama_server": binary, "spec": spec,
              "sides": {name: median(runs) for name, runs in rounds.items()}}
    print_report(format_report(report, args.peer_spec_type), report, args.result_json)
    return 0


def median(runs: list[dict]) -> dict:
    return {"failed": sum(r["failed"] for r in runs),
            "mean_tpot_ms": statistics.median(r["mean_tpot_ms"] for r in runs),
            "output_tok_per_s": statistics.median(r["output_tok_per_s"] for r in runs),
            "tpot_by_round": [round(r["mean_tpot_ms"], 1) for r in runs]}


def format_report(r: dict, peer_spec: str) -> str:
    s = r["sides"]
    spec = r["spec"]
    title = (f"c=1 on {r['prompts']} {r['dataset']} chat prompts (~{r['input_len']} in, up "
             f"to {r['output_len']} out, greedy), {r['threads']} threads, {r['cpu']}; "
             f"medians of {r['rounds']} rotating rounds, commit {r['commit']}")
    lines = [title,
             "| server | TPOT | by round | output tok/s | failed |",
             "| --- | --- | --- | --- | --- |"]
    for name, row in s.items():
        lines.append(f"| {name} | {row['mean_tpot_ms']:.1f} ms | "
                     f"{' / '.join(map(str, row['tpot_by_round']))} | "
                     f"{row['output_tok_per_s']:.1f} | {row['failed']} |")
    ours, theirs = s["tokenwire ngram"], s[f"llama.cpp {peer_spec}"]
    lines.append(f"speculation on/off: tokenwire "
                 f"{s['tokenwire']['mean_tpot_ms'] / ours['mean_tpot_ms']:.2f}x TPOT, "
                 f"{ours['output_tok_per_s'] / s['tokenwire']['output_tok_per_s']:.2f}x "
                 f"output tok/s; llama.cpp "
                 f"{s['llama.cpp']['mean_tpot_ms'] / theirs['mean_tpot_ms']:.2f}x TPOT; "
                 f"tokenwire ngram vs llama.cpp {peer_spec}: "
                 f"{theirs['mean_tpot_ms'] / ours['mean_tpot_ms']:.2f}x faster")
    if spec["drafts"]:
        lines.append(f"tokenwire: acceptance {spec['accepted_tokens'] / spec['draft_tokens']:.2f}"
                     f", mean accepted per verification "
                     f"{spec['accepted_tokens'] / spec['drafts']:.2f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(run(parse_args()))
