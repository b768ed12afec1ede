"""The pages' side of scripts/refresh_figures.py: where the figure blocks are, how one is
rewritten, and the machine and checkout a figure is stamped with. The block format is in
refresh_figures.py's docstring."""
from __future__ import annotations

import os
import platform
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

OPEN = re.compile(r"<!-- figure: ([A-Za-z0-9_.-]+) -->")
CLOSE = "<!-- /figure -->"
FENCE = re.compile(r"(```|~~~)")


class BlockError(Exception):
    """A malformed block, or one naming a figure that is not in the registry."""


@dataclass(frozen=True)
class Block:
    """A figure block: its page (relative to the repo), its opening marker's line (1-based)."""
    page: Path
    line: int
    name: str


def pages(repo: Path) -> list[Path]:
    """README.md and docs/*.md: the pages readers see (drafts beside them are not scanned)."""
    readme = repo / "README.md"
    return ([readme] if readme.exists() else []) + sorted(repo.glob("docs/*.md"))


def parse_blocks(lines: list[str], page: Path) -> list[tuple[str, int, int]]:
    """(name, index of the opening marker, index of the closing marker) for each block."""
    blocks, fence, start = [], None, None
    for i, line in enumerate(lines):
        line = line.rstrip()
        if start is not None:  # inside a block only the closing marker counts
            if line == CLOSE:
                blocks.append((name, start, i))
                start = None
        elif fence is not None:  # markers in a code example are left alone
            fence = None if line.startswith(fence) else fence
        elif match := FENCE.match(line):
            fence = match[1]
        elif match := OPEN.fullmatch(line):
            name, start = match[1], i
        elif line == CLOSE:
            raise BlockError(f"{page}:{i + 1}: {CLOSE} without an opening marker")
    if start is not None:
        raise BlockError(f"{page}:{start + 1}: figure block {name!r} is never closed")
    return blocks


def find_blocks(repo: Path) -> list[Block]:
    found = []
    for path in pages(repo):
        page = path.relative_to(repo)
        lines = path.read_text().split("\n")
        found += [Block(page, start + 1, name) for name, start, _ in parse_blocks(lines, page)]
    return found


def rewrite_page(path: Path, name: str, body: str) -> bool:
    """Puts `body` inside every block `name` of the page, re-read now (others may be editing
    it); True when the page's text changed and was written."""
    text = path.read_text()
    lines = text.split("\n")
    for block, start, end in reversed(parse_blocks(lines, path)):
        if block == name:
            lines[start + 1:end] = body.split("\n")
    new = "\n".join(lines)
    if new == text:
        return False
    path.write_text(new)
    return True


@dataclass(frozen=True)
class Machine:
    """What a figure was measured on: the CPU, its widest vector instructions (one model
    name covers CPUs that differ: `AMD EPYC` is a Zen 3 with AVX2 or a Zen 4 with
    AVX-512), its core count and the checkout."""
    cpu: str
    cpu_source: str
    vectors: str
    cores: int
    commit: str


def cpu_model() -> tuple[str, str]:
    """(model, where it came from): lscpu's "Model name", else platform.processor()."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True,
                             env=dict(os.environ, LC_ALL="C")).stdout
    except OSError:
        out = ""
    for line in out.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "Model name" and value.strip():
            return value.strip(), "`lscpu` model name"
    return platform.processor() or "unknown CPU", "`platform.processor()`"


def cpu_vectors() -> str:
    """The widest vector instructions /proc/cpuinfo lists, as the kernels choose by them."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return "vector instructions unknown"
    flags = set(line.partition(":")[2].split())
    if "avx512f" not in flags:
        return "AVX2" if "avx2" in flags else "no AVX2"
    extras = [name for flag, name in (("avx512_vnni", "VNNI"), ("avx512_bf16", "BF16"),
                                      ("amx_tile", "AMX")) if flag in flags]
    return "AVX-512" + (" with " + ", ".join(extras) if extras else "")


def git(repo: Path, *args: str) -> str | None:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def checkout(repo: Path, own_pages: set[Path]) -> str:
    """Short commit, "+dirty" when tracked files other than `own_pages` have changed."""
    sha = git(repo, "rev-parse", "--short", "HEAD")
    if sha is None:
        return "unknown"
    status = git(repo, "status", "--porcelain") or ""
    changed = {Path(line[3:].split(" -> ")[-1].strip('"')) for line in status.splitlines()
               if not line.startswith("??")}
    return sha.strip() + ("+dirty" if changed - own_pages else "")


def describe_machine(repo: Path, blocks: list[Block]) -> Machine:
    cpu, source = cpu_model()
    return Machine(cpu, source, cpu_vectors(), os.cpu_count() or 1,
                   checkout(repo, {b.page for b in blocks}))
