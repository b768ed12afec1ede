"""Two one-command comparisons; each starts its own `tokenwire serve` on loopback.

  offline       WebSocket-delivered output throughput at a fixed concurrency against the
                offline engine (LLM.generate with max_num_seqs = concurrency, as `tokenwire
                bench` times it) on the same token-id prompts; prints both and the ratio.
  prefix-cache  multi-turn sessions whose first turn is a long history: turn-2+ TTFT with
                the server's prefix cache off and on; prints both and the ratio.

    python -m loadtest.compare offline --concurrency 16 --input-len 128 --output-len 64
    python -m loadtest.compare prefix-cache --history-len 2048 --turns 3
"""
from __future__ import annotations

import argparse
import gc
import sys
import time

from loadtest.config import LoadTestConfig
from loadtest.datasets import Prompt, token_prompts
from loadtest.metrics import summarize
from loadtest.report import print_report
from loadtest.server_process import ServerProcess
from loadtest.workload import build_workload, run_loop, run_workload


def add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default", help="default, a local HF dir, or dummy:NAME")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--num-threads", type=int, default=None, help="CPU threads (torch default)")
    p.add_argument("--num-kv-blocks", type=int, default=None, help="engine default when omitted")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `tokenwire serve` (repeatable, e.g. "
                        "--serve-arg=--max-num-batched-tokens=4096)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-json", help="also write the figures here")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="comparison", required=True)
    off = sub.add_parser("offline", help="online (WebSocket) vs offline engine throughput")
    add_common(off)
    off.add_argument("--concurrency", default="16",
                     help="comma list; each is one online run and one offline run")
    off.add_argument("--num-prompts", type=int, default=None,
                     help="per concurrency (default: 4 x concurrency)")
    off.add_argument("--input-len", type=int, default=128)
    off.add_argument("--output-len", type=int, default=64)
    off.add_argument("--msgpack", action="store_true", help="WebSocket frames as msgpack")
    off.add_argument("--repeat", type=int, default=1,
                     help="runs of each side; the best of each is reported (noisy boxes)")
    off.add_argument("--interleave", action="store_true",
                     help="alternate online and offline runs with both engines loaded, so "
                          "load from other work hits both sides alike (CPU: both KV pools "
                          "must fit in memory; leave off on GPU)")
    pc = sub.add_parser("prefix-cache", help="turn-2+ TTFT with the prefix cache off and on")
    add_common(pc)
    pc.add_argument("--history-len", type=int, default=2048,
                    help="tokens of each session's first turn (the history later turns carry)")
    pc.add_argument("--user-len", type=int, default=32, help="tokens of each later turn")
    pc.add_argument("--output-len", type=int, default=16)
    pc.add_argument("--num-sessions", type=int, default=2)
    pc.add_argument("--turns", type=int, default=3)
    pc.add_argument("--max-concurrency", type=int, default=1,
                    help="turns in flight at once (1: each TTFT is that turn's prefill alone)")


def serve_args(args: argparse.Namespace, *extra: str) -> list[str]:
    out = ["--model", args.model, "--device", args.device, "--dtype", args.dtype, *extra]
    if args.num_threads:
        out += ["--num-threads", str(args.num_threads)]
    if args.num_kv_blocks:
        out += ["--num-kv-blocks", str(args.num_kv_blocks)]
    return out + list(args.serve_arg)


def run_online(cfg: LoadTestConfig, workload: dict) -> tuple[dict, list]:
    """One loadtest run: its summary and its records."""
    outcome = run_loop(run_workload(cfg, workload))
    result = summarize(outcome.records, outcome.duration, outcome.t0)
    if result["failed"]:
        raise RuntimeError(f"online run had failures: {result['errors_by_code']}")
    return result, outcome.records


# -- online vs offline --------------------------------------------------------------------
def compare_offline(args: argparse.Namespace) -> dict:
    from loadtest.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(_tokenizer_spec(args.model))
    # Fresh prompts for every run (seed + 1000 x run + C), the same on both sides: a
    # repeated prompt would be served from the prefix cache.
    loads = {}
    for c in (int(c) for c in args.concurrency.split(",")):
        n = args.num_prompts or 4 * c
        warm = token_prompts(len(tokenizer), c, args.input_len, 4, args.seed + 999_000 + c)
        runs = [token_prompts(len(tokenizer), n, args.input_len, args.output_len,
                              args.seed + 1000 * r + c) for r in range(args.repeat)]
        loads[c] = (warm, runs)
    online = {c: [] for c in loads}
    offline = {c: [] for c in loads}
    # The engine and the admission controller both let every client request run at once,
    # as LLM.generate does: the comparison is about delivery, not admission.
    slots = str(max(loads))
    with ServerProcess(serve_args(args, "--max-num-seqs", slots,
                                  "--max-running-requests", slots)) as server:
        for c, (warm, runs) in loads.items():
            cfg = LoadTestConfig(url=server.ws_url, use_msgpack=args.msgpack,
                                 num_prompts=len(runs[0]), max_concurrency=c,
                                 ignore_eos=True, seed=args.seed)
            run_online(cfg, {"prompts": warm})
            engine = OfflineEngine(args, c, warm) if args.interleave else None
            for prompts in runs:
                online[c].append(run_online(cfg, {"prompts": prompts})[0])
                log(f"online  c={c}: {online[c][-1]['duration']:.2f} s")
                if engine:
                    offline[c].append(engine.run(prompts))
            if engine:
                engine.close()
    if not args.interleave:  # the server is gone: the engine may take its memory
        for c, (warm, runs) in loads.items():
            engine = OfflineEngine(args, c, warm)
            offline[c] = [engine.run(prompts) for prompts in runs]
            engine.close()
    rows = [offline_row(args, c, len(loads[c][1][0]), online[c], offline[c]) for c in loads]
    return {"comparison": "offline", "model": args.model, "device": args.device,
            "transport": "ws+msgpack" if args.msgpack else "ws", "repeat": args.repeat,
            "interleaved": args.interleave, "rows": rows}


def offline_row(args, concurrency: int, num_prompts: int, online: list[dict],
                offline: list[dict]) -> dict:
    """The best (fastest) run of each side: noise on a shared box only ever slows a run."""
    o = min(online, key=lambda r: r["duration"])
    e = min(offline, key=lambda r: r["seconds"])
    delivered = o["client_output_tokens"] / o["duration"]
    offline_rate = e["output_tokens"] / e["seconds"]
    return {"concurrency": concurrency, "num_prompts": num_prompts,
            "input_len": args.input_len, "output_len": args.output_len,
            "offline_output_tokens": e["output_tokens"],
            "online_output_tokens": o["client_output_tokens"],
            "offline_output_tok_per_s": offline_rate, "online_output_tok_per_s": delivered,
            "offline_seconds": [r["seconds"] for r in offline],
            "online_seconds": [r["duration"] for r in online],
            "online_mean_ttft_ms": o["mean_ttft_ms"], "online_mean_tpot_ms": o["mean_tpot_ms"],
            "ratio": delivered / offline_rate}


class OfflineEngine:
    """LLM with max_num_seqs = concurrency, warmed up like the server; `run()` generates
    every prompt at once (as `tokenwire bench` times it)."""

    def __init__(self, args: argparse.Namespace, concurrency: int, warm: list[Prompt]):
        from engine import LLM, SamplingParams

        limits = {"max_num_seqs": concurrency}
        if args.num_threads:
            limits["num_threads"] = args.num_threads
        if args.num_kv_blocks:
            limits["num_kv_blocks"] = args.num_kv_blocks
        self.concurrency = concurrency
        self.llm = LLM(model=args.model, device=args.device, dtype=args.dtype, **limits)
        self.llm.generate([list(p.token_ids) for p in warm],
                          SamplingParams(max_tokens=4, ignore_eos=True, temperature=0.0))

    def run(self, prompts: list[Prompt]) -> dict:
        from engine import SamplingParams

        params = [SamplingParams(max_tokens=p.output_len, ignore_eos=True, temperature=0.0)
                  for p in prompts]
        start = time.perf_counter()
        outs = self.llm.generate([list(p.token_ids) for p in prompts], params)
        seconds = time.perf_counter() - start
        log(f"offline c={self.concurrency}: {seconds:.2f} s")
        return {"output_tokens": sum(len(o.token_ids) for o in outs), "seconds": seconds}

    def close(self) -> None:
        import torch

        del self.llm
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def format_offline(report: dict) -> str:
    lines = [f"online ({report['transport']}) vs offline engine: {report['model']} "
             f"on {report['device']}",
             f"{'conc':>5} {'prompts':>7} {'in/out':>9} {'offline tok/s':>14} "
             f"{'online tok/s':>13} {'online/offline':>15} {'TTFT ms':>8} {'TPOT ms':>8}"]
    for r in report["rows"]:
        lines.append(f"{r['concurrency']:>5} {r['num_prompts']:>7} "
                     f"{r['input_len']:>4}/{r['output_len']:<4} "
                     f"{r['offline_output_tok_per_s']:>14.1f} "
                     f"{r['online_output_tok_per_s']:>13.1f} "
                     f"{r['ratio']:>15.3f} {r['online_mean_ttft_ms']:>8.1f} "
                     f"{r['online_mean_tpot_ms']:>8.2f}")
    return "\n".join(lines)


# -- prefix cache off vs on ---------------------------------------------------------------
def compare_prefix_cache(args: argparse.Namespace) -> dict:
    from loadtest.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(_tokenizer_spec(args.model))
    rows = {}
    for label, extra in (("off", ("--no-prefix-caching",)), ("on", ())):
        with ServerProcess(serve_args(args, *extra)) as server:
            cfg = LoadTestConfig(
                url=server.ws_url, dataset="sessions", num_sessions=args.num_sessions,
                turns=args.turns, first_turn_len=args.history_len,
                random_input_len=args.user_len, random_output_len=args.output_len,
                max_concurrency=args.max_concurrency, ignore_eos=True, seed=args.seed)
            warm = LoadTestConfig(url=server.ws_url, num_prompts=1, random_input_len=16,
                                  random_output_len=4, ignore_eos=True, seed=args.seed + 1)
            run_online(warm, build_workload(warm, tokenizer))
            _, records = run_online(cfg, build_workload(cfg, tokenizer))
        rows[label] = turn_split(records)
        log(f"prefix cache {label}: turn-2+ mean TTFT {rows[label]['later_mean_ttft_ms']:.1f} ms")
    return {"comparison": "prefix-cache", "model": args.model, "device": args.device,
            "history_len": args.history_len, "user_len": args.user_len,
            "output_len": args.output_len, "num_sessions": args.num_sessions,
            "turns": args.turns, "cache_off": rows["off"], "cache_on": rows["on"],
            "ratio": rows["off"]["later_mean_ttft_ms"] / rows["on"]["later_mean_ttft_ms"]}


def turn_split(records) -> dict:
    """Mean TTFT of first turns and of later turns, with the later turns' prompt sizes."""
    first = [r for r in records if r.turn == 0]
    later = [r for r in records if r.turn]

    def mean(values):
        values = list(values)
        return sum(values) / len(values) if values else 0.0

    return {"first_mean_ttft_ms": mean(r.ttft * 1000 for r in first),
            "later_mean_ttft_ms": mean(r.ttft * 1000 for r in later),
            "later_count": len(later),
            "later_mean_prompt_tokens": mean(r.prompt_tokens for r in later),
            "later_mean_cached_tokens": mean(r.usage_cached_tokens or 0 for r in later)}


def format_prefix_cache(report: dict) -> str:
    return format_turn_split(
        f"turn-2+ TTFT, {report['num_sessions']} sessions x {report['turns']} turns, "
        f"{report['history_len']}-token first turn: {report['model']} on {report['device']}",
        "prefix cache", {label: report[f"cache_{label}"] for label in ("off", "on")},
        report["ratio"])


def format_turn_split(title: str, header: str, sides: dict[str, dict], ratio: float) -> str:
    """A turn_split figure per side (off, on) as a table under `title`, and their ratio."""
    width = max(len(header), 8)
    lines = [title, f"{header:>{width}} {'turn-1 TTFT ms':>15} {'turn-2+ TTFT ms':>16} "
             f"{'prompt tok':>11} {'cached tok':>11}"]
    for label, r in sides.items():
        lines.append(f"{label:>{width}} {r['first_mean_ttft_ms']:>15.1f} "
                     f"{r['later_mean_ttft_ms']:>16.1f} {r['later_mean_prompt_tokens']:>11.0f} "
                     f"{r['later_mean_cached_tokens']:>11.0f}")
    lines.append(f"turn-2+ TTFT off/on: {ratio:.1f}x")
    return "\n".join(lines)


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _tokenizer_spec(model: str) -> str:
    """The tokenizer the server will use: a local model's own, else the default's (dummy
    shapes share it)."""
    return "default" if model == "default" or model.startswith("dummy:") else model


def run(args: argparse.Namespace) -> int:
    try:
        if args.comparison == "offline":
            report = compare_offline(args)
            text = format_offline(report)
        else:
            report = compare_prefix_cache(args)
            text = format_prefix_cache(report)
    except (RuntimeError, ValueError) as exc:
        print(f"loadtest.compare: {exc}", file=sys.stderr)
        return 1
    print_report(text, report, args.result_json)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.compare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
