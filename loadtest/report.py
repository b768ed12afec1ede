"""The summary table (laid out like `vllm bench serve`), the run facts it shows, and the
result JSON."""
from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from loadtest.config import LoadTestConfig

WIDTH = 50
SECTIONS = (("ttft", "TTFT", "Time to First Token"),
            ("tpot", "TPOT", "Time per Output Token (excl. 1st token)"),
            ("itl", "ITL", "Inter-token Latency"),
            ("e2el", "E2EL", "End-to-end Latency"))


def _row(label: str, value) -> str:
    if isinstance(value, float):
        value = f"{value:.2f}"
    return f"{label:<40} {value}"


def _title(text: str, fill: str = "-") -> str:
    return f" {text} ".center(WIDTH, fill) if text else fill * WIDTH


def format_summary(result: dict, percentiles) -> str:
    """The human-readable report of `metrics.summarize()` output plus run facts."""
    lines = [_title("Serving Benchmark Result", "="),
             _row("Target:", f"{result['url']} ({result['transport']}, {result['endpoint']})"),
             _row("Successful requests:", result["completed"]),
             _row("Failed requests:", result["failed"])]
    if result["errors_by_code"]:
        codes = ", ".join(f"{k}={v}" for k, v in sorted(result["errors_by_code"].items()))
        lines.append(_row("Failures by code:", codes))
    if result.get("dataset") == "sessions" or result.get("reconnects"):
        lines += [_row("Reconnects (draining, lost socket):", result["reconnects"]),
                  _row("Retried requests (then as reported):", result["retried_requests"])]
    lines += [
        _row("Maximum request concurrency:", result["max_concurrency"] or "unlimited"),
        _row("Request rate (req/s):", result["request_rate"]),
        _row("Benchmark duration (s):", result["duration"]),
        _row("Total input tokens:", result["total_input_tokens"]),
        _row("Total generated tokens:", result["total_output_tokens"]),
        _row("Generated tokens (client count):", result["client_output_tokens"]),
        _row("Deltas received:", result["total_deltas"]),
        _row("Request throughput (req/s):", result["request_throughput"]),
    ]
    if "request_goodput" in result:
        lines.append(_row("Request goodput (req/s):", result["request_goodput"]))
    lines += [
        _row("Output token throughput (tok/s):", result["output_throughput"]),
        _row("Peak output token throughput (tok/s):", float(result["max_output_tokens_per_s"])),
        _row("Peak concurrent requests:", result["max_concurrent_requests"]),
        _row("Total token throughput (tok/s):", result["total_token_throughput"]),
    ]
    for key, short, title in SECTIONS:
        lines.append(_title(title))
        lines.append(_row(f"Mean {short} (ms):", result[f"mean_{key}_ms"]))
        lines.append(_row(f"Median {short} (ms):", result[f"median_{key}_ms"]))
        lines.append(_row(f"Std {short} (ms):", result[f"std_{key}_ms"]))
        for p in percentiles:
            lines.append(_row(f"P{p:g} {short} (ms):", result[f"p{p:g}_{key}_ms"]))
    lines += _turn_lines(result.get("per_turn", []))
    lines += _model_lines(result.get("per_model", []))
    lines += _server_lines(result.get("server"))
    lines.append(_title("", "="))
    return "\n".join(lines)


def _turn_lines(turns: list[dict]) -> list[str]:
    if not turns:
        return []
    lines = [_title("TTFT by session turn"),
             f"{'turn':>4} {'n':>4} {'prompt':>8} {'cached':>8} {'mean ms':>9} {'median ms':>10}"]
    for row in turns:
        cached = row["mean_cached_tokens"]
        cached = "-" if cached is None else f"{cached:.0f}"
        lines.append(f"{row['turn']:>4} {row['completed']:>4} {row['mean_prompt_tokens']:>8.0f} "
                     f"{cached:>8} {row['ttft_ms']['mean']:>9.2f} {row['ttft_ms']['median']:>10.2f}")
    return lines


def _model_lines(models: list[dict]) -> list[str]:
    if not models:
        return []
    lines = [_title("By model"),
             f"{'model':<24} {'ok':>5} {'failed':>6} {'out tok/s':>10} {'TTFT ms':>9} "
             f"{'TPOT ms':>8}"]
    for row in models:
        ttft, tpot_ms = row["ttft_ms"]["mean"], row["tpot_ms"]["mean"]
        lines.append(f"{row['model'][:24]:<24} {row['completed']:>5} {row['failed']:>6} "
                     f"{row['output_throughput']:>10.1f} {_ms(ttft):>9} {_ms(tpot_ms):>8}")
    return lines


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _server_lines(server: dict | None) -> list[str]:
    """The server's own /metrics over the run, to set beside the client's numbers."""
    if not server:
        return []
    lines = [_title("Server /metrics over the run")]
    for key, short in (("ttft", "TTFT"), ("itl", "ITL"), ("e2el", "E2EL"), ("queue", "queue")):
        mean = server[f"mean_{key}_ms"]
        lines.append(_row(f"Server mean {short} (ms, n={server[key + '_count']}):",
                          "-" if mean is None else mean))
    lines += [_row("Server generation tokens:", server["generation_tokens"]),
              _row("Server prompt tokens:", server["prompt_tokens"]),
              _row("Server prefix cache hits / queries:",
                   f"{server['prefix_cache_hits']} / {server['prefix_cache_queries']}"),
              _row("Server preemptions:", server["preemptions"]),
              _row("Server admission rejections:", server["admission_rejections"])]
    return lines


def run_facts(cfg: LoadTestConfig, model: str | None) -> dict:
    """What the summary says about the run itself: target, transport and workload shape."""
    rate = "inf" if math.isinf(cfg.request_rate) else cfg.request_rate
    # Sessions always speak chat (WS `chat` turns, or /chat/completions over HTTP), and so
    # does the Realtime API; responses endpoints run tool chains either way.
    endpoint = cfg.endpoint if cfg.is_responses else \
        "chat" if cfg.dataset == "sessions" or cfg.is_realtime else cfg.endpoint
    return {"url": cfg.url, "endpoint": endpoint, "model": model,
            "transport": "realtime" if cfg.is_realtime else "ws+msgpack" if cfg.use_msgpack
            else ("ws" if cfg.is_websocket else "http"),
            "dataset": cfg.dataset, "num_requests": cfg.num_requests, "request_rate": rate,
            "burstiness": cfg.burstiness, "max_concurrency": cfg.max_concurrency,
            "seed": cfg.seed, "percentiles": list(cfg.percentiles), "goodput_slos": cfg.goodput}


def print_report(text: str, report: dict, path: str | None) -> None:
    """A one-command comparison's output: its table printed, its report written as JSON
    to `path` when one is given."""
    print(text)
    if path:
        Path(path).write_text(json.dumps(report, indent=1))


def comparison_main(prog: str, doc: str, add_arguments: Callable, compare: Callable,
                    format_report: Callable, argv: list[str] | None) -> int:
    """A one-command comparison's entry point: parse its flags, run it, print its table
    (and write its JSON report); a RuntimeError or ValueError is one line on stderr, exit 1."""
    parser = argparse.ArgumentParser(prog=prog, description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        report = compare(args)
    except (RuntimeError, ValueError) as exc:
        print(f"{prog.removeprefix('python -m ')}: {exc}", file=sys.stderr)
        return 1
    print_report(format_report(report), report, args.result_json)
    return 0


def write_json(path: str | Path, result: dict, records) -> None:
    """The summary plus per-request lists (as vLLM's result JSON has them)."""
    done = [r for r in records if r.success]
    payload = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        **result,
        "input_lens": [r.prompt_tokens for r in done],
        "output_lens": [r.output_tokens for r in done],
        "ttfts": [r.ttft for r in done],
        "itls": [r.itl for r in done],
        "e2els": [r.latency for r in done],
        "server_ttfts_ms": [r.server_ttft_ms for r in done],
        "errors": [r.error_code for r in records if not r.success],
    }
    Path(path).write_text(json.dumps(payload, indent=1))
