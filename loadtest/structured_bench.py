"""Structured-output throughput, side by side in one run: the same requests at a fixed
concurrency, every one constrained by a JSON schema, then none.

The constrained round runs first and records each answer's length; the unconstrained round
then asks for exactly those lengths (ignore_eos) with the same prompts and seeds, so both
rounds do the same prefill and decode work and the ratio is the grammar's own cost (bitmask
fill, mask, matcher advance). Prefix caching is off so neither round reuses the other's
prompts. Grammars are compiled (and timed) before either round.

    python -m loadtest.structured_bench --concurrency 32 --num-requests 128
"""
from __future__ import annotations

import argparse
import json
import platform
import time

from engine import LLM, SamplingParams
from engine.llm import set_num_threads
from loadtest.json_schemas import SCHEMAS, max_tokens_for


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--device", default="auto")
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--num-requests", type=int, default=128)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--num-threads", type=int, default=None)
    args = p.parse_args(argv)
    set_num_threads(args.num_threads)
    llm = LLM(model=args.model, device=args.device, max_num_seqs=args.concurrency,
              enable_prefix_caching=False)
    prompts, constrained = _workload(llm, args)
    compile_s = _compile_all(llm)
    llm.generate(prompts[:2], constrained[:2])  # warm-up
    first, t_constrained = _timed(llm, prompts, constrained)
    lengths = [len(o.token_ids) for o in first]
    plain = [SamplingParams(max_tokens=n, temperature=args.temperature, seed=i, ignore_eos=True)
             for i, n in enumerate(lengths)]
    second, t_plain = _timed(llm, prompts, plain)
    valid = sum(_valid(o.text) for o in first)
    tokens = sum(lengths)
    rows = {"constrained": tokens / t_constrained,
            "unconstrained": sum(len(o.token_ids) for o in second) / t_plain}
    print(json.dumps({"device": _device_name(llm), "concurrency": args.concurrency,
                      "requests": len(prompts), "output_tokens": tokens,
                      "grammar_compile_s": round(compile_s, 3),
                      "answers_that_parse": f"{valid}/{len(first)}",
                      **{f"{k}_tok_s": round(v, 1) for k, v in rows.items()},
                      "ratio": round(rows["constrained"] / rows["unconstrained"], 3)}, indent=1))
    return 0


def _workload(llm: LLM, args) -> tuple[list[list[int]], list[SamplingParams]]:
    prompts, params = [], []
    for i in range(args.num_requests):
        name, schema = SCHEMAS[i % len(SCHEMAS)]
        messages = [{"role": "user", "content": f"Give one {name} as JSON: {json.dumps(schema)}"}]
        prompts.append(llm.core.encode_chat(messages))
        params.append(SamplingParams(
            max_tokens=max_tokens_for(schema), temperature=args.temperature, seed=i,
            response_format={"type": "json_schema", "json_schema": {"name": name,
                                                                    "schema": schema}}))
    return prompts, params


def _compile_all(llm: LLM) -> float:
    start = time.perf_counter()
    for _, schema in SCHEMAS:
        llm.core.grammars.compile({"type": "json_schema", "schema": schema})
    return time.perf_counter() - start


def _timed(llm: LLM, prompts, params):
    start = time.perf_counter()
    outs = llm.generate(prompts, params)
    return outs, time.perf_counter() - start


def _valid(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _device_name(llm: LLM) -> str:
    device = llm.engine_config.resolved_device()
    if device.type == "cuda":
        import torch
        return torch.cuda.get_device_name(device)
    with open("/proc/cpuinfo") as f:
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    return names[0] if names else platform.processor()


if __name__ == "__main__":
    raise SystemExit(main())
