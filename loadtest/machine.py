"""What a benchmark names beside its figures: the CPU (`lscpu`'s model name: one name can
cover CPUs whose figures differ, so figures always carry it) and the commit measured."""
from __future__ import annotations

import platform
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        out = ""
    names = [line.split(":", 1)[1].strip() for line in out.splitlines()
             if line.startswith("Model name:")]
    return names[0] if names else platform.processor() or "unknown CPU"


def git_commit(tree: Path = REPO) -> str:
    """The short commit of `tree`, "+dirty" when tracked files differ from it."""
    def git(*argv: str) -> str:
        return subprocess.run(["git", *argv], cwd=tree, capture_output=True, text=True,
                              check=False).stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return (git("rev-parse", "--short", "HEAD") or "unknown") + ("+dirty" if dirty else "")
