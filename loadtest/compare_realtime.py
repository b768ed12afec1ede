"""One command, one server: output throughput of the same workload over `/v1/realtime`
(OpenAI Realtime API, text) and over `/v1/ws` (protocol v1), side by side, and the ratio.

Both sides send each prompt as one user message through the chat template (a /v1/ws
`generate` with `messages`, a Realtime out-of-band response with that `input`), greedy,
at the same concurrency; runs alternate between the two so load from other work on the
box hits both alike, and the best run of each side is reported. The server runs without
its prefix cache: both sides send the same prompts, and a run must not find the previous
run's prefill done.

    python -m loadtest.compare_realtime --concurrency 16 --num-prompts 64 --repeat 3
"""
from __future__ import annotations

import argparse
import sys

from loadtest.compare import _tokenizer_spec, add_common, log, run_online, serve_args
from loadtest.config import LoadTestConfig
from loadtest.report import comparison_main
from loadtest.server_process import ServerProcess
from loadtest.workload import build_workload


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--num-prompts", type=int, default=None, help="default: 4 x concurrency")
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--repeat", type=int, default=2, help="runs of each side; best reported")


def compare(args: argparse.Namespace) -> dict:
    from loadtest.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(_tokenizer_spec(args.model))
    num_prompts = args.num_prompts or 4 * args.concurrency
    runs: dict[str, list[dict]] = {"ws": [], "realtime": []}
    with ServerProcess(serve_args(args, "--no-prefix-caching")) as server:
        urls = {"ws": server.ws_url, "realtime": server.ws_url.replace("/v1/ws", "/v1/realtime")}

        def config(side: str, n: int) -> LoadTestConfig:
            return LoadTestConfig(url=urls[side], endpoint="chat", num_prompts=n,
                                  random_input_len=args.input_len,
                                  random_output_len=args.output_len,
                                  max_concurrency=args.concurrency, seed=args.seed)

        for side in runs:  # warm both paths (first-use costs) on a few prompts
            warm = config(side, min(4, num_prompts))
            run_online(warm, build_workload(warm, tokenizer))
        for rep in range(args.repeat):
            for side in (("ws", "realtime") if rep % 2 == 0 else ("realtime", "ws")):
                cfg = config(side, num_prompts)
                result, _ = run_online(cfg, build_workload(cfg, tokenizer))
                runs[side].append(result)
                log(f"{side}: {result['output_throughput']:.1f} output tok/s "
                    f"({result['total_output_tokens']} tokens, {result['duration']:.1f} s)")
    best = {side: max(results, key=lambda r: r["output_throughput"])
            for side, results in runs.items()}
    return {"comparison": "realtime-vs-ws", "model": args.model, "device": args.device,
            "concurrency": args.concurrency, "num_prompts": num_prompts,
            "input_len": args.input_len, "output_len": args.output_len,
            "ws_output_tok_per_s": [r["output_throughput"] for r in runs["ws"]],
            "realtime_output_tok_per_s": [r["output_throughput"] for r in runs["realtime"]],
            "ws_output_tokens": best["ws"]["total_output_tokens"],
            "realtime_output_tokens": best["realtime"]["total_output_tokens"],
            "ratio": best["realtime"]["output_throughput"] / best["ws"]["output_throughput"]}


def format_report(report: dict) -> str:
    ws, rt = max(report["ws_output_tok_per_s"]), max(report["realtime_output_tok_per_s"])
    return "\n".join([
        f"model {report['model']} on {report['device']}, concurrency "
        f"{report['concurrency']}, {report['num_prompts']} prompts of {report['input_len']} "
        f"tokens, up to {report['output_len']} out (best of {len(report['ws_output_tok_per_s'])})",
        f"/v1/ws        {ws:10.1f} output tok/s  ({report['ws_output_tokens']} tokens)",
        f"/v1/realtime  {rt:10.1f} output tok/s  ({report['realtime_output_tokens']} tokens)",
        f"realtime/ws: {report['ratio']:.3f}"])


def main(argv: list[str] | None = None) -> int:
    return comparison_main("python -m loadtest.compare_realtime", __doc__, add_arguments, compare,
                           format_report, argv)


if __name__ == "__main__":
    sys.exit(main())
