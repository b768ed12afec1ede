"""How far the engine's logprobs lie from fp32 activations' on this CPU, per instruction
set of the quantized kernels: the default model's greedy and sampled runs, each returned
logprob (the chosen token's and the top ones') against Hugging Face's fp32 forward pass of
the same weights over the same tokens. The quantized matmuls round a step's activations to
int8 levels (docs/quantization.md), and beside two-level dots the prefill attention may
multiply in bf16 (kernels.cpu.prefill_attention_bf16; TOKENWIRE_CPU_PREFILL_ATTENTION
forces it): this prints what that costs, the figures behind tests/logprob_tolerance.py.

    python -m loadtest.logprob_error [--isa portable avx2 avx512] [--tokens 32] [--seeds 4]
                                     [--prompts 12 | --long-prompts]

--long-prompts takes three prompts of 700, 1,600 and 2,900 tokens cut from this checkout's
docs/ instead: only there do queries see key tiles far behind them, the ones the prefill
attention multiplies in bf16 where it does (short prompts stay fp32 throughout).

Each instruction set runs in a child process (TOKENWIRE_CPU_QUANT_ISA is read when the
kernels run), all at once: their model loads are mostly single-threaded. Those this CPU
lacks are skipped.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys

from loadtest.metrics import percentile

# Not the tests' prompts: a second sample of the same kinds of text, short and long.
PROMPTS = [
    "Hello",
    "The largest planet in the solar system is",
    "Write two lines about the sea at night.",
    "Name four colours of the rainbow:",
    "import json\n\ndef load(path):\n",
    "Translate to German: I would like a cup of coffee and a slice of cake, please.",
    "It was a cold morning in the mountains when the old shepherd noticed that one of his "
    "sheep was missing. He took his stick and",
    "Q: What is the square root of 81?\nA:",
    "Describe in simple terms why the sky looks blue during the day and red at sunset, "
    "mentioning how light scatters in the atmosphere and how the path length changes.",
    "def quicksort(items):",
    "Three reasons to learn a second language are",
    "The recipe needs flour, eggs and",
]
LONG_TOKENS = (700, 1600, 2900)
BATCH = 6  # prompts per generate call: a decode step's rows stay on the int8 path on AVX2
TOP = 5


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--isa", nargs="+", default=["portable", "avx2", "avx512"])
    p.add_argument("--tokens", type=int, default=32, help="output tokens per prompt and run")
    p.add_argument("--seeds", type=int, default=4, help="sampled runs beside the greedy one")
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help="the first N prompts")
    p.add_argument("--long-prompts", action="store_true",
                   help="three long prompts from docs/ instead (see above)")


def long_prompts(tokenizer) -> list[str]:
    """LONG_TOKENS-long cuts of this checkout's docs/ Markdown, 5,000 tokens apart, each
    asking for a one-sentence summary of itself."""
    docs = pathlib.Path(__file__).resolve().parent.parent / "docs"
    ids = tokenizer.encode("\n\n".join(p.read_text() for p in sorted(docs.glob("*.md"))))
    return [tokenizer.decode(ids[5000 * i:5000 * i + n])
            + "\n\nIn one sentence, the text above says" for i, n in enumerate(LONG_TOKENS)]


def errors(tokens: int, seeds: int, prompts: list[str] | None) -> list[float]:
    """|engine logprob - fp32 logprob| of every value the runs return, in this process
    (prompts None: long_prompts)."""
    import torch
    from transformers import AutoModelForCausalLM

    from engine import LLM, SamplingParams
    from engine.loader import default_model_dir

    llm = LLM(model="default", device="cpu")
    hf = AutoModelForCausalLM.from_pretrained(default_model_dir(), dtype=torch.float32).eval()
    prompts = prompts if prompts is not None else long_prompts(llm.tokenizer)
    runs = [SamplingParams(max_tokens=tokens, temperature=0.0, logprobs=TOP, ignore_eos=True)]
    runs += [SamplingParams(max_tokens=tokens, temperature=1.5, top_k=20, seed=seed,
                            logprobs=TOP, ignore_eos=True) for seed in range(seeds)]
    out = []
    for params in runs:
        for start in range(0, len(prompts), BATCH):
            batch = prompts[start:start + BATCH]
            for prompt, result in zip(batch, llm.generate(batch, params)):
                ref = fp32_logprobs(hf, llm.tokenizer.encode(prompt), result.token_ids)
                for row, entry in zip(ref, result.logprobs):
                    for token, logprob in [(entry.token_id, entry.logprob), *entry.top]:
                        out.append(abs(logprob - row[token].item()))
    return out


def fp32_logprobs(hf_model, prompt_ids: list[int], output_ids: list[int]):
    """log_softmax [T, V] (float64) of a Hugging Face model's logits at each position that
    produced one of output_ids: the fp32 distributions the engine's logprobs are held to."""
    import torch

    with torch.inference_mode():
        logits = hf_model(torch.tensor([prompt_ids + output_ids])).logits[0].double()
    return logits.log_softmax(-1)[len(prompt_ids) - 1:-1]


def first_difference(ours: list[int], theirs: list[int]) -> int | None:
    """The first index where two greedy runs part (a shorter run parts where it ends);
    None when they are the same."""
    same = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), None)
    if same is None and len(ours) != len(theirs):
        return min(len(ours), len(theirs))
    return same


def summary(isa: str, tokens: int, seeds: int, prompts: int, long: bool = False) -> dict:
    """This process's instruction set's figures (TOKENWIRE_CPU_QUANT_ISA already set)."""
    import kernels.cpu as cpu_kernels

    quant = cpu_kernels.load_quant()
    if quant is None:
        return {"isa": isa, "skipped": "no quantized kernels (no compiler?)"}
    chosen = cpu_kernels.quant_isa()
    if not quant.isa_supported(chosen):
        return {"isa": isa, "skipped": "not on this CPU"}
    bf16 = cpu_kernels.prefill_attention_bf16(cpu_kernels.load(), quantized_model=True)
    values = errors(tokens, seeds, None if long else PROMPTS[:prompts])
    return {"isa": isa, "levels": quant.activation_levels(chosen),
            "attention": "bf16" if bf16 else "fp32", "values": len(values),
            "p50": percentile(values, 50), "p99": percentile(values, 99), "max": max(values)}


def start_child(isa: str, args) -> subprocess.Popen:
    env = dict(os.environ, TOKENWIRE_CPU_QUANT_ISA=isa)
    cmd = [sys.executable, "-m", "loadtest.logprob_error", "--child", "--isa", isa,
           "--tokens", str(args.tokens), "--seeds", str(args.seeds),
           "--prompts", str(args.prompts)] + (["--long-prompts"] if args.long_prompts else [])
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)


def child_result(child: subprocess.Popen) -> dict:
    out, _ = child.communicate()
    if child.returncode:
        raise subprocess.CalledProcessError(child.returncode, child.args, out)
    return json.loads(out.strip().splitlines()[-1])


def format_report(rows: list[dict], args) -> str:
    prompt_set = (f"{len(LONG_TOKENS)} long prompts ({', '.join(map(str, LONG_TOKENS))} tokens "
                  "of docs/)" if args.long_prompts else f"{args.prompts} prompts")
    lines = [f"logprob error against Hugging Face's fp32 forward pass: default model on CPU, "
             f"{prompt_set} x {args.tokens} tokens, greedy and {args.seeds} sampled "
             f"runs, the chosen token's logprob and the top {TOP}",
             f"{'isa':<9} {'levels':>6} {'prefill attention':>17} {'values':>7} {'p50':>9} "
             f"{'p99':>9} {'max':>9}"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['isa']:<9} skipped: {r['skipped']}")
        else:
            lines.append(f"{r['isa']:<9} {r['levels']:>6} {r['attention']:>17} {r['values']:>7} "
                         f"{r['p50']:>9.1e} {r['p99']:>9.1e} {r['max']:>9.1e}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loadtest.logprob_error", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(summary(args.isa[0], args.tokens, args.seeds, args.prompts,
                                 args.long_prompts)))
        return
    children = [start_child(isa, args) for isa in args.isa]
    print(format_report([child_result(child) for child in children], args))


if __name__ == "__main__":
    main()
