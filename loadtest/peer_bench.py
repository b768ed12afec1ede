"""`tokenwire bench --peer llama.cpp`: `tokenwire serve` and llama.cpp's `llama-server` on
the same GGUF (the default model's), driven by the same client (`tokenwire loadtest` over
OpenAI HTTP completions, token-id prompts, ignore_eos) at each concurrency, one server at
a time on the same cores; prints TPOT, output tok/s, failures and each server's RSS after
its runs, side by side with ratios."""
from __future__ import annotations

import argparse
import json
import sys
import time

from loadtest.config import LoadTestConfig
from loadtest.llama_server import LlamaServer, find_llama_server
from loadtest.server_process import ServerProcess

PEERS = ("llama.cpp",)
RSS_SETTLE_S = 3.0


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--peer", choices=PEERS, default=None,
                   help="serve-vs-serve comparison against this peer server instead of the "
                        "offline bench (uses --input-len, --output-len, --num-threads)")
    p.add_argument("--llama-server", default=None, metavar="PATH",
                   help="llama-server binary (default: $LLAMA_SERVER, PATH, or the one "
                        "scripts/build_llama_server.sh cached)")
    p.add_argument("--peer-concurrency", default="1,8,32", help="comma list")


def run_peer(args: argparse.Namespace) -> int:
    binary = find_llama_server(args.llama_server)
    if binary is None:
        print("tokenwire bench --peer llama.cpp: no llama-server found; pass --llama-server "
              "or run scripts/build_llama_server.sh", file=sys.stderr)
        return 2
    from engine.llm import set_num_threads
    from engine.loader import default_gguf_path
    import torch

    if args.num_threads:
        set_num_threads(args.num_threads)
    threads = torch.get_num_threads()
    levels = [int(c) for c in args.peer_concurrency.split(",")]
    slot_tokens = args.input_len + args.output_len + 64
    serve = ["--model", "default", "--device", "cpu", "--num-threads", str(threads)]
    with ServerProcess(serve) as server:
        ours = drive(f"{server.base}/v1", server.proc.pid, levels, args)
    with LlamaServer(binary, str(default_gguf_path()), max(levels), slot_tokens,
                     threads) as peer:
        theirs = drive(f"{peer.base}/v1", peer.proc.pid, levels, args)
    report = {"peer": args.peer, "llama_server": binary, "threads": threads,
              "input_len": args.input_len, "output_len": args.output_len,
              "tokenwire": ours, args.peer: theirs}
    print(format_report(report))
    if args.result_json:
        with open(args.result_json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


def drive(url: str, pid: int, levels: list[int], args) -> dict:
    """Each concurrency in turn (max(8, 2c) fresh prompts after a warm-up of c), then the
    server's RSS."""
    import psutil
    from loadtest.compare import run_loop, token_prompts
    from loadtest.cli import make_backend
    from loadtest.metrics import summarize
    from loadtest.runner import Runner
    from loadtest.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("default")
    rows = {}
    for c in levels:
        n = max(8, 2 * c)
        cfg = LoadTestConfig(url=url, num_prompts=n, max_concurrency=c, ignore_eos=True,
                             seed=args.seed)
        for prompts, keep in ((token_prompts(tokenizer, c, args.input_len, 4,
                                             args.seed + 999_000 + c), False),
                              (token_prompts(tokenizer, n, args.input_len, args.output_len,
                                             args.seed + c), True)):
            outcome = run_loop(Runner(cfg, make_backend(cfg), show_progress=False)
                               .run(prompts=prompts))
            if keep:
                s = summarize(outcome.records, outcome.duration, outcome.t0)
                rows[c] = {"requests": n, "failed": s["failed"],
                           "mean_tpot_ms": s["mean_tpot_ms"],
                           "output_tok_per_s": s["output_throughput"]}
                print(f"  c={c}: {rows[c]}", file=sys.stderr)
    # Read after a few idle seconds: the server's memory once the burst is over (tokenwire
    # hands freed step buffers back after 1 s idle; llama-server keeps what it has).
    time.sleep(RSS_SETTLE_S)
    return {"rows": rows, "rss_mib": psutil.Process(pid).memory_info().rss / 2**20}


def format_report(r: dict) -> str:
    peer, ours, theirs = r["peer"], r["tokenwire"], r[r["peer"]]
    lines = [f"tokenwire vs {peer} ({r['llama_server']}), {r['threads']} threads, "
             f"{r['input_len']} in / {r['output_len']} out, ignore_eos, OpenAI HTTP",
             f"| | {peer} | tokenwire | ratio |", "| --- | --- | --- | --- |"]
    for c, t in ours["rows"].items():
        p = theirs["rows"][c]
        lines.append(f"| c={c}: TPOT | {p['mean_tpot_ms']:.1f} ms | {t['mean_tpot_ms']:.1f} ms "
                     f"| {p['mean_tpot_ms'] / t['mean_tpot_ms']:.2f}x faster |")
        lines.append(f"| c={c}: output tok/s | {p['output_tok_per_s']:.0f} | "
                     f"{t['output_tok_per_s']:.0f} | "
                     f"{t['output_tok_per_s'] / p['output_tok_per_s']:.2f}x |")
        lines.append(f"| c={c}: failed | {p['failed']} of {p['requests']} | "
                     f"{t['failed']} of {t['requests']} | |")
    lines.append(f"| server RSS after the runs | {theirs['rss_mib']:.0f} MiB | "
                 f"{ours['rss_mib']:.0f} MiB | {ours['rss_mib'] / theirs['rss_mib']:.2f}x |")
    return "\n".join(lines)
