"""One command, two servers: `tokenwire serve` on a model's fp32 weights, then on the same
model with `--quantization` (int8 or int4, packed), each driven by the same client over
OpenAI HTTP at concurrency 1 (token-id prompts, ignore_eos); prints TPOT, output tok/s,
start-up time and each server's RSS after its run, side by side.

    python -m loadtest.quant_compare --model dummy:llama-3.2-1b --quantization int4
"""
from __future__ import annotations

import argparse
import sys
import time

from loadtest.peer_bench import drive, settled_rss_mib
from loadtest.report import print_report
from loadtest.server_process import ServerProcess
from loadtest.tokenizer import load_tokenizer


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="dummy:llama-3.2-1b")
    p.add_argument("--quantization", choices=("int8", "int4"), default="int4")
    p.add_argument("--input-len", type=int, default=32)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--num-threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-json", default=None)


def serve_and_drive(extra: list[str], args) -> dict:
    serve = ["--model", args.model, "--device", "cpu", "--num-threads", str(args.num_threads),
             *extra]
    started = time.monotonic()
    with ServerProcess(serve) as server:
        ready_s = time.monotonic() - started
        # Prompt ids from the default model's vocabulary, which the dummy shapes share.
        row = drive(f"{server.base}/v1", 1, 0, args, len(load_tokenizer("default")))
        return {"rows": {1: row}, "rss_mib": settled_rss_mib(server.proc.pid),
                "ready_s": ready_s}


def compare(args) -> dict:
    return {"model": args.model, "quantization": args.quantization,
            "threads": args.num_threads, "input_len": args.input_len,
            "output_len": args.output_len,
            "fp32": serve_and_drive([], args),
            args.quantization: serve_and_drive(["--quantization", args.quantization], args)}


def format_report(r: dict) -> str:
    fp32, quant, q = r["fp32"], r[r["quantization"]], r["quantization"]
    a, b = fp32["rows"][1], quant["rows"][1]
    return "\n".join([
        f"{r['model']} on CPU, {r['threads']} threads, {r['input_len']} in / "
        f"{r['output_len']} out, concurrency 1, OpenAI HTTP",
        f"| | fp32 | {q} | ratio |", "| --- | --- | --- | --- |",
        f"| TPOT | {a['mean_tpot_ms']:.0f} ms | {b['mean_tpot_ms']:.0f} ms | "
        f"{a['mean_tpot_ms'] / b['mean_tpot_ms']:.2f}x faster |",
        f"| output tok/s | {a['output_tok_per_s']:.2f} | {b['output_tok_per_s']:.2f} | "
        f"{b['output_tok_per_s'] / a['output_tok_per_s']:.2f}x |",
        f"| failed | {a['failed']} of {a['requests']} | {b['failed']} of {b['requests']} | |",
        f"| start-up to ready | {fp32['ready_s']:.0f} s | {quant['ready_s']:.0f} s | |",
        f"| server RSS after the run | {fp32['rss_mib']:.0f} MiB | {quant['rss_mib']:.0f} MiB "
        f"| {quant['rss_mib'] / fp32['rss_mib']:.2f}x |"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    report = compare(args)
    print_report(format_report(report), report, args.result_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
