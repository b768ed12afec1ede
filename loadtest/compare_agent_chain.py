"""One command, one server: an agent's tool chain on `/v1/responses` four ways, side by side.

    ws      WebSocket mode: one socket per chain, `response.create` with previous_response_id
    chain   HTTP (SSE) with previous_response_id: the server keeps the history
    resend  HTTP (SSE), store false, the whole history resent every turn
    ws-local  WebSocket mode with store false: the chain lives in the socket's memory only

Each chain is N turns (a user message, then the output of the tool the model was forced
to call, small), one chain at a time, greedy. Chains are interleaved (ws, chain, resend,
ws-local, then rotated) so load from other work on the box hits them alike. Each variant gets
its own random texts of the same lengths: the same text would find another variant's
chain in the prefix cache. The server keeps its prefix cache (as deployed): every variant
finds its earlier turns there. Reported: per-turn TTFT (first output event: a forced call
arrives whole, so it includes the call's decode) p50/p99, per-turn latency p50, and a
chain's end-to-end time (first send to last response), with the ratios to ws: of the
medians, and paired (each round's chain over that round's ws chain, the median of those).

    python -m loadtest.compare_agent_chain --device cpu --turns 20 --chains 5
"""
from __future__ import annotations

import argparse
import statistics
import sys

from loadtest.compare import _tokenizer_spec, add_common, log, serve_args
from loadtest.config import LoadTestConfig
from loadtest.machine import cpu_model, git_commit
from loadtest.metrics import describe
from loadtest.report import comparison_main
from loadtest.responses_client import MODES, ResponsesBackend
from loadtest.runner import Runner
from loadtest.server_process import ServerProcess
from loadtest.workload import build_workload, run_loop


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument("--turns", type=int, default=20, help="turns per chain")
    p.add_argument("--chains", type=int, default=5, help="chains per variant")
    p.add_argument("--first-turn-len", type=int, default=64, help="the user message, tokens")
    p.add_argument("--tool-output-len", type=int, default=16, help="each tool output, tokens")
    p.add_argument("--output-len", type=int, default=48, help="max_output_tokens a turn")


def one_chain(url: str, mode: str, args, tokenizer, seed: int, turns: int) -> list:
    """One chain of `turns` turns in `mode`; its records (RuntimeError on a failed turn)."""
    cfg = LoadTestConfig(url=url, endpoint="responses", dataset="sessions", num_sessions=1,
                         turns=turns, first_turn_len=args.first_turn_len,
                         random_input_len=args.tool_output_len,
                         random_output_len=args.output_len, seed=seed)
    backend = ResponsesBackend(url, mode, None, 0.0)
    outcome = run_loop(Runner(cfg, backend, show_progress=False).run(
        **build_workload(cfg, tokenizer)))
    failed = [r for r in outcome.records if not r.success]
    if failed or len(outcome.records) != turns:
        raise RuntimeError(f"{mode}: {failed[0].error_code if failed else 'cut short'} "
                           f"{failed[0].error_message if failed else ''}")
    return outcome.records


def compare(args: argparse.Namespace) -> dict:
    from loadtest.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(_tokenizer_spec(args.model))
    chains: dict[str, list[list]] = {mode: [] for mode in MODES}
    with ServerProcess(serve_args(args), ready_timeout_s=600) as server:
        url = server.base + "/v1"
        for index, mode in enumerate(MODES):  # first-use costs of each path, discarded
            one_chain(url, mode, args, tokenizer, 10_000 + index, 3)
        for chain in range(args.chains):
            shift = chain % len(MODES)
            order = MODES[shift:] + MODES[:shift]
            for mode in order:
                seed = args.seed + 100 * chain + MODES.index(mode)
                records = one_chain(url, mode, args, tokenizer, seed, args.turns)
                chains[mode].append(records)
                log(f"chain {chain} {mode}: {chain_seconds(records):.2f} s")
    rows = {mode: summary(runs) for mode, runs in chains.items()}
    for mode, row in rows.items():
        row["vs_ws_paired"] = paired(chains[mode], chains["ws"])
    best_http = min(rows["chain"]["e2e_s_median"], rows["resend"]["e2e_s_median"])
    return {"comparison": "agent-chain", "model": args.model, "device": args.device,
            "cpu": cpu_model(), "commit": git_commit(), "turns": args.turns,
            "chains": args.chains, "first_turn_len": args.first_turn_len,
            "tool_output_len": args.tool_output_len, "output_len": args.output_len,
            "variants": rows, "ws_vs_best_http_e2e": rows["ws"]["e2e_s_median"] / best_http,
            "ws_vs_best_http_paired": 1 / max(rows["chain"]["vs_ws_paired"],
                                              rows["resend"]["vs_ws_paired"])}


def chain_seconds(records: list) -> float:
    last = records[-1]
    return last.start + last.latency - records[0].start


def paired(runs: list[list], ws_runs: list[list]) -> float:
    """The median over rounds of a chain's end-to-end time over the same round's ws chain:
    the four chains of a round run within a minute, so load that drifts over the run
    (other work on a shared box) cancels out of each ratio."""
    return statistics.median(chain_seconds(a) / chain_seconds(b)
                             for a, b in zip(runs, ws_runs, strict=True))


def summary(runs: list[list]) -> dict:
    turns = [r for records in runs for r in records]
    ttft = describe([r.ttft for r in turns], (50, 99))
    latency = describe([r.latency for r in turns], (50, 99))
    e2e = [chain_seconds(records) for records in runs]
    last = [records[-1] for records in runs]
    return {"ttft_ms_p50": ttft["p50"], "ttft_ms_p99": ttft["p99"],
            "turn_ms_p50": latency["p50"], "turn_ms_p99": latency["p99"],
            "e2e_s": e2e, "e2e_s_median": statistics.median(e2e),
            "last_turn_prompt_tokens": statistics.mean(r.prompt_tokens for r in last),
            "last_turn_cached_tokens": statistics.mean(r.usage_cached_tokens or 0
                                                       for r in last),
            "output_tokens_per_turn": statistics.mean(r.output_tokens for r in turns)}


def format_report(report: dict) -> str:
    rows = report["variants"]
    lines = [(f"model {report['model']} on {report['cpu']} (device {report['device']}), "
              f"commit {report['commit']}"),
             (f"{report['chains']} chains x {report['turns']} turns per variant: a "
              f"{report['first_turn_len']}-token user message, then "
              f"{report['tool_output_len']}-token tool outputs; forced calls, up to "
              f"{report['output_len']} tokens a turn"),
             (f"{'variant':<8} {'TTFT p50':>9} {'TTFT p99':>9} {'turn p50':>9} "
              f"{'chain e2e':>10} {'vs ws':>6} {'paired':>6} {'last prompt':>12} "
              f"{'cached':>7}")]
    ws = rows["ws"]["e2e_s_median"]
    for mode, row in rows.items():
        lines.append(f"{mode:<8} {row['ttft_ms_p50']:>7.1f}ms {row['ttft_ms_p99']:>7.1f}ms "
                     f"{row['turn_ms_p50']:>7.1f}ms {row['e2e_s_median']:>9.2f}s "
                     f"{row['e2e_s_median'] / ws:>6.3f} {row['vs_ws_paired']:>6.3f} "
                     f"{row['last_turn_prompt_tokens']:>12.0f} "
                     f"{row['last_turn_cached_tokens']:>7.0f}")
    lines.append(f"ws / best HTTP chain e2e: {report['ws_vs_best_http_e2e']:.3f} (medians), "
                 f"{report['ws_vs_best_http_paired']:.3f} (paired by round)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return comparison_main("python -m loadtest.compare_agent_chain", __doc__, add_arguments, compare,
                           format_report, argv)


if __name__ == "__main__":
    sys.exit(main())
