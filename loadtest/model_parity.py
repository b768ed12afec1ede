"""Print the model-family parity table: our engine against transformers on tiny random
models of each family (loadtest.tiny_models), greedy tokens and logits in fp32 on CPU.

    python -m loadtest.model_parity [--backends cpu torch] [--families llama3 qwen2 ...]
"""
from __future__ import annotations

import argparse
import logging
import tempfile
from pathlib import Path

from loadtest import tiny_models
from loadtest.machine import cpu_model


def describe(config) -> str:
    """What a family's config exercises, in a few words."""
    rope = config.rope_parameters
    rope = rope["rope_type"] if "rope_type" in rope else "default, local and global bases"
    parts = [config.model_type, f"rope {rope}",
             "tied" if config.tie_word_embeddings else "untied"]
    if config.model_type == "qwen2":
        parts.append("qkv bias")
    if config.model_type in ("qwen3", "gemma3_text"):
        parts.append("q/k norm")
    if getattr(config, "layer_types", None) and getattr(config, "sliding_window", None):
        windowed = config.layer_types.count("sliding_attention")
        parts.append(f"sliding window {config.sliding_window} on {windowed} of "
                     f"{len(config.layer_types)} layers")
    elif getattr(config, "sliding_window", None):
        parts.append(f"sliding window {config.sliding_window}")
    return ", ".join(parts)


def parity_rows(families: list[str], backends: list[str], root: Path) -> list[list[str]]:
    from transformers import AutoConfig

    tokenizer = tiny_models.default_tokenizer()
    prompts = [tokenizer.encode(p) for p in tiny_models.PROMPTS]
    rows = []
    for family in families:
        path = tiny_models.build_family(family, root, tokenizer)
        theirs = tiny_models.hf_runs(path, prompts)
        what = describe(AutoConfig.from_pretrained(path))
        for backend in backends:
            ours = tiny_models.engine_runs(path, prompts, attention_backend=backend)
            p = tiny_models.compare(ours, theirs)
            rows.append([family, what, backend, f"{p.tokens_matched}/{p.tokens_total}",
                         f"{p.max_logit_error:.1e}"])
    return rows


def table(rows: list[list[str]]) -> str:
    header = ["family", "what it covers", "attention backend", "greedy tokens matched",
              "max logit error"]
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=list(tiny_models.FAMILIES),
                        choices=list(tiny_models.FAMILIES))
    parser.add_argument("--backends", nargs="+", default=["cpu", "torch"],
                        choices=["cpu", "torch"])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    with tempfile.TemporaryDirectory() as root:
        rows = parity_rows(args.families, args.backends, Path(root))
    print(f"{len(tiny_models.PROMPTS)} prompts x {tiny_models.STEPS} greedy steps, fp32, "
          f"CPU ({cpu_model()}); logit error: max |ours - transformers| over every step")
    print(table(rows))


if __name__ == "__main__":
    main()
