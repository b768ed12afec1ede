"""`tokenwire bench`: offline throughput of our engine beside Hugging Face transformers on
identical prompts, same weights, same box, in one run; prints both, the ratio, and the
fraction of the hardware ceiling, from the peak probed just before and after each of our
rounds."""
from __future__ import annotations

import argparse
import time

import torch

from engine import LLM, SamplingParams
from engine.llm import set_num_threads
from loadtest import hf_peers, peer_bench, prefill_bench
from loadtest.datasets import token_id_prompts
from loadtest.report import print_report
from loadtest.machine import cpu_model
from loadtest.roofline import (SUSTAIN_S, Workload, around, bandwidth_ceiling,
                               compute_ceiling, measure_hardware)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="default",
                   help="default, a local HF dir, dummy:NAME, a GGUF file or a model wheel "
                        "(--peer: a GGUF model)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto", help="auto: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--peers", default="auto",
                   help="comma list of static,cb or none; auto: static on CPU, both on CUDA")
    p.add_argument("--hf-batch-size", type=int, default=None,
                   help="static-batch size for HF generate (default: all prompts at once)")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--attention-backend", default="auto")
    p.add_argument("--no-cuda-graph", action="store_true")
    p.add_argument("--num-threads", type=int, default=None, help="CPU threads (torch default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeat", type=int, default=1,
                   help="rounds, each running every system in turn; each reports its best")
    p.add_argument("--result-json", default=None, help="also write the figures here")
    peer_bench.add_arguments(p)
    prefill_bench.add_arguments(p)


def run(args: argparse.Namespace) -> int:
    if args.peer:
        return peer_bench.run_peer(args)
    if args.repeat < 1:
        raise SystemExit("--repeat: must be at least 1")
    if args.num_threads:
        set_num_threads(args.num_threads)
    workload = Workload(args.num_prompts, args.input_len, args.output_len)
    timings: dict[str, list[dict]] = {}
    for round_ in range(args.repeat):
        # A fresh engine each round: an empty prefix cache, as in the first.
        llm = LLM(model=args.model, device=args.device, dtype=args.dtype,
                  **_engine_limits(args))
        if round_ == 0:
            device = llm.engine_config.resolved_device()
            dtype = llm.engine_config.resolved_dtype()
            prompts = token_id_prompts(len(llm.tokenizer), workload.num_prompts,
                                       workload.input_len, args.seed)
            # Warm-up prompts of their own: warming up on the timed prompts would leave
            # their blocks in our prefix cache (HF has none) and skip part of the prefill.
            warmup = token_id_prompts(len(llm.tokenizer), 2, args.input_len, args.seed + 1)
        timings.setdefault("tokenwire", []).append(
            _time_engine_against_ceiling(llm, prompts, warmup, workload, device, dtype))
        del llm  # free the KV pool before the peers load their own copy of the weights
        _empty_cache(device)
        for peer in _peers(args.peers, device):
            timings.setdefault(f"HF {peer}", []).append(
                _time_peer(peer, args, device, dtype, prompts, warmup))
    rows = {name: _best(runs) for name, runs in timings.items()}
    report = _report(args, device, dtype, rows, timings["tokenwire"])
    text = _format(report)
    if args.prefill_len:
        prefill_text, report["prefill"] = prefill_bench.run(args)
        text += "\n\n" + prefill_text
    print_report(text, report, args.result_json)
    return 0


def _engine_limits(args) -> dict:
    limits = {"attention_backend": args.attention_backend, "seed": args.seed,
              "use_cuda_graph": not args.no_cuda_graph}
    if args.max_num_seqs:
        limits["max_num_seqs"] = args.max_num_seqs
    if args.max_num_batched_tokens:
        limits["max_num_batched_tokens"] = args.max_num_batched_tokens
    return limits


def _time_engine_against_ceiling(llm: LLM, prompts, warmup, w: Workload, device,
                                 dtype) -> dict:
    """One timed engine round with the box's matmul rate probed just before and just after
    it: the 2-core box's speed drifts by a third over minutes (neighbours on the host), so
    a round is held against the rates of its own moment (loadtest.roofline.around)."""
    before = measure_hardware(device, dtype)
    row = _time_engine(llm, prompts, warmup, w.output_len)
    hw = around(before, measure_hardware(device, dtype))
    burst, sustained = (_ceiling(llm.model_config, w, h, device, dtype) for h in (hw, hw.sustained()))
    ours = row["output_tok_per_s"]
    row["hardware"] = {"matmul_gflops": round(hw.matmul_flops / 1e9, 1),
                       "sustained_matmul_gflops": round(hw.sustained_matmul_flops / 1e9, 1),
                       "copy_gb_per_s": round(hw.copy_bytes_per_s / 1e9, 1),
                       "burst_ceiling_out_tok_per_s": round(burst, 1),
                       "sustained_ceiling_out_tok_per_s": round(sustained, 1)}
    row["fractions"] = {"burst": round(ours / burst, 3), "sustained": round(ours / sustained, 3)}
    return row


def _ceiling(model_config, w: Workload, hw, device, dtype) -> float:
    if device.type == "cpu":
        return compute_ceiling(model_config, w, hw)
    return bandwidth_ceiling(model_config, w, hw, torch.tensor([], dtype=dtype).element_size())


def _time_engine(llm: LLM, prompts, warmup, output_len: int) -> dict:
    params = SamplingParams(max_tokens=output_len, ignore_eos=True, temperature=0.0)
    llm.generate(warmup, SamplingParams(max_tokens=4, ignore_eos=True))
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    seconds = time.perf_counter() - start
    row = _row(sum(len(o.token_ids) for o in outs), seconds)
    row["cached_prompt_tokens"] = sum(o.num_cached_tokens for o in outs)
    return row


def _time_peer(peer: str, args, device, dtype, prompts, warmup) -> dict:
    model = hf_peers.load_hf_model(args.model, device, dtype)
    if peer == "static":
        batch = args.hf_batch_size or len(prompts)
        hf_peers.run_static(model, warmup, 4, 2)
        tokens, seconds = hf_peers.run_static(model, prompts, args.output_len, batch)
    else:
        tokens, seconds = hf_peers.run_continuous_batching(model, prompts, args.output_len)
    del model
    _empty_cache(device)
    return _row(tokens, seconds)


def _best(runs: list[dict]) -> dict:
    """The fastest round (what the system can do when the box lets it), with every round's
    seconds when there were several."""
    best = dict(min(runs, key=lambda r: r["seconds"]))
    if len(runs) > 1:
        best["rounds_s"] = [r["seconds"] for r in runs]
    return best


def _row(tokens: int, seconds: float) -> dict:
    return {"output_tokens": tokens, "seconds": round(seconds, 3),
            "output_tok_per_s": round(tokens / seconds, 1)}


def _peers(choice: str, device: torch.device) -> list[str]:
    if choice == "auto":
        return ["static"] if device.type == "cpu" else list(hf_peers.PEERS)
    if choice == "none":
        return []
    peers = [p.strip() for p in choice.split(",")]
    unknown = set(peers) - set(hf_peers.PEERS)
    if unknown:
        raise SystemExit(f"--peers: unknown {sorted(unknown)}; choose from {hf_peers.PEERS}")
    return peers


def _empty_cache(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _report(args, device, dtype, rows, engine_rounds: list[dict]) -> dict:
    ours = rows["tokenwire"]
    # The headline fractions are the best round's, against the rates probed around it.
    hardware, fractions = ours.pop("hardware"), ours.pop("fractions")
    for row in rows.values():
        row["ours_vs_this"] = round(ours["output_tok_per_s"] / row["output_tok_per_s"], 2)
    return {
        "model": args.model, "device": _device_name(device), "dtype": str(dtype).removeprefix("torch."),
        "workload": f"{args.num_prompts} x {args.input_len} in x {args.output_len} out, ignore_eos",
        **hardware,
        "fraction_of_burst_ceiling": fractions["burst"],
        "fraction_of_sustained_ceiling": fractions["sustained"],
        "fractions_by_round": [r["fractions"] for r in engine_rounds],
        "results": rows,
    }


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({torch.get_num_threads()} threads, {cpu_model()})"


def _format(r: dict) -> str:
    lines = [f"model {r['model']} on {r['device']}, {r['dtype']}; {r['workload']}",
             f"{'system':<14}{'out tok':>9}{'seconds':>10}{'out tok/s':>11}{'ours / this':>13}"]
    for name, row in r["results"].items():
        lines.append(f"{name:<14}{row['output_tokens']:>9}{row['seconds']:>10.2f}"
                     f"{row['output_tok_per_s']:>11.1f}{row['ours_vs_this']:>12.2f}x")
    for name, row in r["results"].items():
        if "rounds_s" in row:
            lines.append(f"{name} rounds (s): " + ", ".join(f"{x:.2f}" for x in row["rounds_s"]))
    lines.append(f"hardware: matmul {r['matmul_gflops']} GFLOP/s best single, "
                 f"{r['sustained_matmul_gflops']} sustained ({SUSTAIN_S:.0f} s back to back, "
                 f"before and after); copy {r['copy_gb_per_s']} GB/s")
    lines.append(f"ceiling: {r['burst_ceiling_out_tok_per_s']} out tok/s at the best single "
                 f"matmul, {r['sustained_ceiling_out_tok_per_s']} at the sustained rate; "
                 f"tokenwire at {100 * r['fraction_of_burst_ceiling']:.0f}% and "
                 f"{100 * r['fraction_of_sustained_ceiling']:.0f}% of them")
    if len(r["fractions_by_round"]) > 1:
        lines.append("tokenwire rounds, each against the rates probed around it (best single / "
                     "sustained): " + ", ".join(f"{100 * f['burst']:.0f}%/{100 * f['sustained']:.0f}%"
                                                for f in r["fractions_by_round"]))
    return "\n".join(lines)
