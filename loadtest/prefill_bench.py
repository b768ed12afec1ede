"""A long prompt's prefill, this checkout against another commit, side by side in one run:
`tokenwire bench --prefill-len 3000 --baseline-rev REV` (issue 38's second part: a
3,000-token prefill at least 2x the tokens/s it had). Rounds alternate between the two
trees, each a fresh process (loadtest/prefill_child.py) with its own kernel build directory,
so both meet the same moments of a noisy box."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from loadtest.machine import REPO, cpu_model, git_commit

CHILD = Path(__file__).resolve().parent / "prefill_child.py"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prefill-len", type=int, default=0,
                   help="also time one prompt of this many tokens (max_tokens 1); 0: skip")
    p.add_argument("--baseline-rev", default=None,
                   help="with --prefill-len: the commit to time beside this checkout")
    p.add_argument("--prefill-rounds", type=int, default=3,
                   help="alternating rounds per tree (the median is reported)")


def run(args: argparse.Namespace) -> tuple[str, dict]:
    trees = {"this checkout": REPO}
    if args.baseline_rev:
        trees[f"baseline {args.baseline_rev}"] = worktree(args.baseline_rev)
    seconds: dict[str, list[float]] = {name: [] for name in trees}
    for round_ in range(args.prefill_rounds):
        for name, tree in trees.items():
            seconds[name].append(_time_once(tree, args.model, args.prefill_len, seed=round_))
    rows = {name: {"seconds": statistics.median(s), "rounds_s": [round(x, 2) for x in s],
                   "tok_per_s": round(args.prefill_len / statistics.median(s), 1)}
            for name, s in seconds.items()}
    report = {"cpu": cpu_model(), "commit": git_commit(REPO), "model": args.model,
              "prompt_tokens": args.prefill_len,
              "threads": args.num_threads or "torch default", "rows": rows}
    return _format(report), report


def _time_once(tree: Path, model: str, prompt_len: int, seed: int) -> float:
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(_extensions_dir(tree)))
    out = subprocess.run([sys.executable, str(CHILD), str(tree), str(prompt_len), str(seed),
                          model],
                         cwd=tree, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"prefill in {tree} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def _extensions_dir(tree: Path) -> Path:
    """A kernel build directory per tree: two trees' sources in one directory rebuild each
    other's modules (same names, different paths) on every start."""
    base = Path(os.environ.get("TORCH_EXTENSIONS_DIR", Path.home() / ".cache" / "torch_extensions"))
    return base if tree == REPO else base.parent / f"{base.name}-{tree.name}"


def worktree(rev: str) -> Path:
    """A detached worktree of `rev` beside the system's temp files, made once and reused."""
    full = subprocess.run(["git", "rev-parse", "--verify", f"{rev}^{{commit}}"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout.strip()
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"tokenwire-baseline-{full[:10]}"
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), full], cwd=REPO,
                       capture_output=True, text=True, check=True)
    return path


def _format(r: dict) -> str:
    lines = [(f"prefill of one {r['prompt_tokens']}-token prompt (max_tokens 1), model {r['model']}, "
              f"{r['cpu']}, commit {r['commit']}, rounds alternating"),
             f"{'tree':<26}{'seconds':>9}{'tok/s':>9}{'vs baseline':>13}  rounds (s)"]
    rows = r["rows"]
    base = next((row for name, row in rows.items() if name.startswith("baseline")), None)
    for name, row in rows.items():
        ratio = f"{row['tok_per_s'] / base['tok_per_s']:.2f}x" if base else "-"
        lines.append(f"{name:<26}{row['seconds']:>9.2f}{row['tok_per_s']:>9.1f}{ratio:>13}  "
                     f"{' / '.join(str(s) for s in row['rounds_s'])}")
    return "\n".join(lines)
