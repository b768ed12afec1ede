"""`tokenwire loadtest`: drive a running server over WebSocket (protocol v1) or OpenAI HTTP.

    tokenwire loadtest --url ws://127.0.0.1:8000/v1/ws --num-prompts 200 --request-rate 8
    tokenwire loadtest --url ws://127.0.0.1:8000/v1/realtime --max-concurrency 16
    tokenwire loadtest --url http://127.0.0.1:8000/v1 --endpoint chat --dataset sessions
    tokenwire loadtest --url ws://127.0.0.1:8000/v1/responses --endpoint responses-ws --turns 20
"""
from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import threading

from loadtest import server_metrics
from loadtest.config import DATASETS, ENDPOINTS, LoadTestConfig
from loadtest.metrics import parse_goodput, summarize
from loadtest.report import format_summary, run_facts, write_json
from loadtest.runner import Runner
from loadtest.workload import build_workload, make_backend, run_loop


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = LoadTestConfig()
    p.add_argument("--url", default=d.url, help="ws://HOST:PORT/v1/ws, ws://HOST:PORT/v1/realtime "
                   "or http://HOST:PORT/v1")
    p.add_argument("--endpoint", choices=ENDPOINTS, default=d.endpoint,
                   help="raw prompt (completions), one user message (chat), or tool chains "
                        "on /v1/responses over HTTP with previous_response_id (responses) or "
                        "WebSocket mode (responses-ws)")
    p.add_argument("--msgpack", action="store_true", help="WebSocket frames as msgpack")
    p.add_argument("--model", action="append", default=[], metavar="NAME",
                   help="the model requests name (default: the server's first); repeat it "
                        "for a mix: requests (sessions) take the models in turn, and the "
                        "report adds figures per model")
    p.add_argument("--dataset", choices=DATASETS, default=None,
                   help="random (token prompts), copy (tasks that repeat the prompt: repeat, "
                        "rewrite, rename in code, quote a tool's output; sized by "
                        "--random-*-len), file, sessions; default: sessions (tool chains) "
                        "for responses endpoints, else random")
    p.add_argument("--prompts-file", help="one prompt per line, or JSONL with `prompt`")
    p.add_argument("--num-prompts", type=int, default=d.num_prompts)
    p.add_argument("--random-input-len", type=int, default=d.random_input_len)
    p.add_argument("--random-output-len", type=int, default=d.random_output_len)
    p.add_argument("--random-range-ratio", type=float, default=d.random_range_ratio)
    p.add_argument("--num-sessions", type=int, default=d.num_sessions)
    p.add_argument("--turns", type=int, default=d.turns,
                   help="turns per session (per tool chain with responses endpoints)")
    p.add_argument("--first-turn-len", type=int, default=None,
                   help="input tokens of each session's first turn, the history the later "
                        "turns carry (default: --random-input-len)")
    p.add_argument("--think-time", type=float, default=d.think_time,
                   help="seconds a session waits between turns")
    p.add_argument("--idle-gap", type=float, default=d.idle_gap,
                   help="sessions: seconds each session's socket stays closed between turns "
                        "(it then resumes by session id), as users who walk away and return")
    p.add_argument("--request-rate", type=float, default=d.request_rate,
                   help="requests (sessions) per second; inf sends all at once")
    p.add_argument("--burstiness", type=float, default=d.burstiness,
                   help="gamma shape of arrival gaps: 1 Poisson, <1 bursty, >1 regular")
    p.add_argument("--max-concurrency", type=int, default=None)
    p.add_argument("--duration", type=float, default=None, help="hard cap in seconds")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--allow-remote", action="store_true", help="allow a non-loopback host")
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--ignore-eos", action="store_true", help="always generate max_tokens")
    p.add_argument("--tokenizer", default=d.tokenizer, help="default, none, or a local dir")
    p.add_argument("--percentiles", default="99", help="comma-separated, e.g. 50,90,99")
    p.add_argument("--goodput", nargs="+", default=[], metavar="KEY:MS",
                   help="SLOs for goodput: ttft:MS tpot:MS e2el:MS")
    p.add_argument("--scrape-metrics", action="store_true",
                   help="also report the server's /metrics (tokenwire) over the run")
    p.add_argument("--result-json", help="write the summary and per-request data here")
    p.add_argument("--plot", help="write latency CDFs and throughput over time (PNG)")
    p.add_argument("--disable-tqdm", action="store_true")


def config_from_args(args: argparse.Namespace) -> LoadTestConfig:
    return LoadTestConfig(
        url=args.url, endpoint=args.endpoint, use_msgpack=args.msgpack, models=tuple(args.model),
        dataset=args.dataset or default_dataset(args.endpoint), prompts_file=args.prompts_file, num_prompts=args.num_prompts,
        random_input_len=args.random_input_len, random_output_len=args.random_output_len,
        random_range_ratio=args.random_range_ratio, num_sessions=args.num_sessions,
        turns=args.turns, first_turn_len=args.first_turn_len, think_time=args.think_time,
        idle_gap=args.idle_gap,
        request_rate=args.request_rate, burstiness=args.burstiness,
        max_concurrency=args.max_concurrency, duration=args.duration, seed=args.seed,
        allow_remote=args.allow_remote,
        temperature=args.temperature, ignore_eos=args.ignore_eos, tokenizer=args.tokenizer,
        percentiles=tuple(float(p) for p in args.percentiles.split(",") if p.strip()),
        goodput=parse_goodput(args.goodput))


def default_dataset(endpoint: str) -> str:
    """A responses endpoint drives tool chains (sessions); the others, single prompts."""
    return "sessions" if endpoint.startswith("responses") else LoadTestConfig().dataset


def run(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"tokenwire loadtest: {exc}", file=sys.stderr)
        return 2
    from loadtest.tokenizer import load_tokenizer

    workload = build_workload(cfg, load_tokenizer(cfg.tokenizer))
    runner = Runner(cfg, make_backend(cfg), show_progress=not args.disable_tqdm)
    try:
        outcome, server = run_loop(_measure(runner, workload, cfg, args.scrape_metrics))
    except Exception as exc:  # noqa: BLE001 - a CLI reports, it does not dump a trace
        print(f"tokenwire loadtest: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    result = summarize(outcome.records, outcome.duration, outcome.t0, cfg.percentiles,
                       cfg.goodput)
    result.update(run_facts(cfg, outcome.model))
    if server:
        result["server"] = server
    print(format_summary(result, cfg.percentiles))
    if args.result_json:
        write_json(args.result_json, result, outcome.records)
    if args.plot:
        from loadtest.plot import plot

        plot(args.plot, outcome.records, outcome.t0, f"{cfg.url} {cfg.dataset}")
    return 0 if result["completed"] else 1


async def _measure(runner: Runner, workload: dict, cfg: LoadTestConfig, scrape_metrics: bool):
    """Run the workload, bracketed by /metrics scrapes when asked. SIGINT or SIGTERM
    winds the run down (Runner.stop) and still reports (signals reach the main thread
    only; run from another, the CLI keeps Python's own handling)."""
    if threading.current_thread() is threading.main_thread():
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, runner.stop)
    if not scrape_metrics:
        return await runner.run(**workload), {}
    url = server_metrics.metrics_url(cfg.url)
    before = await server_metrics.scrape(url)
    outcome = await runner.run(**workload)
    return outcome, server_metrics.server_delta(before, await server_metrics.scrape(url))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tokenwire loadtest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
