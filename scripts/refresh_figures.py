"""Re-run the documentation's CPU figures and rewrite their blocks, so that a page never
quotes an old commit's numbers as if they were today's.

A figure block in README.md or docs/*.md:

    <!-- figure: NAME -->
    ...anything: replaced wholesale...
    <!-- /figure -->

Both markers stand alone on their line, at column 0 and outside any ``` or ~~~ fence (so
a page can show the format in a code example without it being rewritten). NAME is
an entry of FIGURES below. Each block's inside becomes exactly:

    Measured with `COMMAND` on a 2-core `CPU MODEL` (`lscpu` model name; VECTORS), YYYY-MM-DD, commit SHORTSHA:

    ```text
    OUTPUT
    ```

VECTORS is the CPU's widest vector instructions (AVX2, AVX-512 with VNNI, ...): one model
name can cover CPUs whose figures differ. COMMAND is the command as a reader would type
it; a figure measured against a server the script started shows that server as
ws://127.0.0.1:8000/v1/ws or http://127.0.0.1:8000/v1
(in the output too) and says `(against `tokenwire serve ARGS` started by the script)` right
after the command. The commit gets "+dirty" when git shows tracked changes outside the
pages that hold figure blocks. OUTPUT is the command's stdout, cut by the figure's `keep`
rule, trailing whitespace stripped; its stderr (progress) goes to the terminal.

    python scripts/refresh_figures.py [--only NAME ...] [--list] [--dry-run]

Run it with the venv's python: commands run under bash in the repo root with that
python's bin first on PATH and no OMP_WAIT_POLICY. Each figure runs once however
many blocks use it; a figure whose `needs` is missing is skipped and its blocks left as
they are; a page is written only when its text changed. Exit status: 0 when every figure
ran (or was skipped), 1 when a command failed (its blocks left as they are), 2 for a block
naming a figure not in FIGURES or a malformed block.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

# A sibling file: Python puts scripts/ on sys.path when it runs this one.
from figure_blocks import (OPEN, Block, BlockError, Machine, describe_machine, find_blocks,
                           rewrite_page)

REPO = Path(__file__).resolve().parent.parent
SHOWN_PORT = 8000  # the port a reader's own `tokenwire serve` would listen on


@dataclass(frozen=True)
class FromLine:
    """Keep the output from the first line matching `pattern` (re.search) to the end."""
    pattern: str

    def apply(self, lines: list[str]) -> list[str]:
        for i, line in enumerate(lines):
            if re.search(self.pattern, line):
                return lines[i:]
        raise FigureFailed(f"no output line matches {self.pattern!r}")


@dataclass(frozen=True)
class LastLines:
    """Keep the last `count` lines of the output."""
    count: int

    def apply(self, lines: list[str]) -> list[str]:
        if len(lines) < self.count:
            raise FigureFailed(f"{len(lines)} output lines, fewer than the {self.count} kept")
        return lines[-self.count:]


@dataclass(frozen=True)
class Figure:
    """One documented figure: the command that measures it and how its output is cut.

    `serve`: `tokenwire serve` arguments; the script starts that server on a free loopback
    port and puts its URL where the command says {ws} or {http}. `needs`: a binary (on
    PATH; llama-server as loadtest.llama_server finds it) or an importable module.
    """
    name: str
    command: str
    serve: tuple[str, ...] | None = None
    keep: FromLine | LastLines | None = None
    needs: str | None = None
    timeout_s: float = 3600.0

    def __post_init__(self):
        if not OPEN.fullmatch(f"<!-- figure: {self.name} -->"):
            raise ValueError(f"Figure.name {self.name!r}: letters, digits, '_', '.', '-'")
        uses_server = "{ws}" in self.command or "{http}" in self.command
        if uses_server != (self.serve is not None):
            raise ValueError(f"Figure.serve of {self.name}: set exactly when the command "
                             "names {ws} or {http}")


FIGURES = (
    Figure("loadtest-ws", "tokenwire loadtest --url {ws} --num-prompts 32 --random-input-len 128 "
           "--random-output-len 64 --ignore-eos --max-concurrency 8 --percentiles 50,99 "
           "--scrape-metrics", serve=("--device", "cpu"),
           keep=FromLine(r"=+ Serving Benchmark Result =+")),
    Figure("loadtest-sessions", "tokenwire loadtest --url {ws} --msgpack --dataset sessions "
           "--num-sessions 4 --turns 3 --first-turn-len 512 --random-input-len 32 "
           "--random-output-len 16", serve=("--device", "cpu"),
           keep=FromLine(r"TTFT by session turn")),
    Figure("peer-llama-cpp", "tokenwire bench --peer llama.cpp --input-len 128 --output-len 64",
           keep=FromLine(r"^tokenwire vs llama\.cpp"), needs="llama-server"),
    Figure("quant-compare",
           "python -m loadtest.quant_compare --model dummy:llama-3.2-1b --quantization int4"),
    # --device cpu: left out, `auto` would pick CUDA where there is one.
    Figure("realtime-vs-ws", "python -m loadtest.compare_realtime --device cpu --concurrency 16 "
           "--num-prompts 64 --input-len 128 --output-len 64 --repeat 3", keep=LastLines(4)),
    Figure("agent-chain", "python -m loadtest.compare_agent_chain --device cpu --turns 20 "
           "--chains 5"),
    Figure("online-vs-offline", "python -m loadtest.compare offline --device cpu "
           "--concurrency 16 --num-prompts 32 --input-len 128 --output-len 64 --repeat 2 "
           "--interleave"),
    Figure("prefix-cache", "python -m loadtest.compare prefix-cache --device cpu "
           "--history-len 2048 --turns 3 --num-sessions 2"),
    Figure("offline-bench", "tokenwire bench --device cpu --num-prompts 32 --input-len 128 "
           "--output-len 64 --repeat 2 --prefill-len 3000 --baseline-rev 5726642",
           keep=FromLine(r"^model .* on cpu")),
    Figure("lb-overhead", "python -m loadtest.lb_overhead --num-prompts 16 --max-concurrency 8 "
           "--input-len 32 --output-len 32 --rounds 2 --serve-arg=--device=cpu",
           needs="haproxy"),
)


class FigureFailed(Exception):
    """A figure's command failed, timed out or printed something its keep rule rejects."""


def shown_command(figure: Figure) -> str:
    return (figure.command.replace("{ws}", f"ws://127.0.0.1:{SHOWN_PORT}/v1/ws")
            .replace("{http}", f"http://127.0.0.1:{SHOWN_PORT}/v1"))


def against(figure: Figure) -> str:
    if figure.serve is None:
        return ""
    return f" (against `tokenwire serve {shlex.join(figure.serve)}` started by the script)"


def render(figure: Figure, machine: Machine, output: str) -> str:
    """A block's new inside."""
    return (f"Measured with `{shown_command(figure)}`{against(figure)} on a {machine.cores}-core "
            f"`{machine.cpu}` ({machine.cpu_source}; {machine.vectors}), "
            f"{datetime.date.today().isoformat()}, "
            f"commit {machine.commit}:\n\n```text\n{output}\n```")


def command_env() -> dict[str, str]:
    """The caller's environment, the venv first on PATH, and no OMP_WAIT_POLICY: a figure
    is what its command gives as typed (tokenwire's commands set their own OpenMP policy;
    a PASSIVE one inherited by llama-server tripled its TPOT)."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_command(command: str, repo: Path, timeout_s: float) -> str:
    """The command's stdout; its stderr goes straight to the terminal."""
    # A session of its own, so that a timeout or Ctrl-C stops the whole tree it started.
    proc = subprocess.Popen(["bash", "-c", command], cwd=repo, env=command_env(),
                            stdout=subprocess.PIPE, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise FigureFailed(f"timed out after {timeout_s:.0f} s") from None
    finally:
        stop_group(proc)
    if proc.returncode != 0:
        raise FigureFailed(f"exit status {proc.returncode}")
    return out.decode(errors="replace")


def stop_group(proc: subprocess.Popen) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def measure(figure: Figure, repo: Path) -> str:
    """The figure's output as it goes in a block."""
    if figure.serve is None:
        output = run_command(figure.command, repo, figure.timeout_s)
    else:
        from loadtest.server_process import ServerProcess

        try:
            with ServerProcess(list(figure.serve)) as server:
                command = (figure.command.replace("{ws}", server.ws_url)
                           .replace("{http}", f"{server.base}/v1"))
                output = run_command(command, repo, figure.timeout_s)
        except RuntimeError as exc:  # the server never became ready
            raise FigureFailed(str(exc)) from None
        output = output.replace(f"127.0.0.1:{server.port}", f"127.0.0.1:{SHOWN_PORT}")
    if not output.strip():
        raise FigureFailed("nothing on stdout")
    lines = [line.rstrip() for line in output.rstrip().split("\n")]
    return "\n".join(figure.keep.apply(lines) if figure.keep else lines).strip("\n")


def missing(need: str | None) -> bool:
    if need is None:
        return False
    if need == "llama-server":
        from loadtest.llama_server import find_llama_server

        return find_llama_server(None) is None
    return (shutil.which(need, path=command_env()["PATH"]) is None
            and importlib.util.find_spec(need) is None)


def refresh(figure: Figure, blocks: list[Block], repo: Path, machine: Machine) -> bool:
    """Runs one figure and rewrites its blocks; False when its command failed."""
    if missing(figure.needs):
        print(f"{figure.name}: skipped, needs {figure.needs} (blocks left as they are)",
              flush=True)
        return True
    print(f"{figure.name}: running {shown_command(figure)}", flush=True)
    started = time.monotonic()
    try:
        body = render(figure, machine, measure(figure, repo))
    except FigureFailed as exc:
        print(f"{figure.name}: FAILED after {time.monotonic() - started:.1f} s: {exc} "
              "(blocks left as they are)", file=sys.stderr)
        return False
    own = sorted({b.page for b in blocks if b.name == figure.name})
    try:
        written = [page for page in own if rewrite_page(repo / page, figure.name, body)]
    except BlockError as exc:  # someone broke the page while the figure ran
        print(f"{figure.name}: not written: {exc}", file=sys.stderr)
        return False
    print(f"{figure.name}: {time.monotonic() - started:.1f} s; "
          f"wrote {', '.join(map(str, written)) or 'nothing (unchanged)'}", flush=True)
    return True


def uses(figure: Figure, blocks: list[Block]) -> str:
    return ", ".join(f"{b.page}:{b.line}" for b in blocks if b.name == figure.name)


def describe(figure: Figure, blocks: list[Block]) -> str:
    lines = [figure.name, f"  blocks:  {uses(figure, blocks) or '(none)'}",
             f"  command: {shown_command(figure)}"]
    if figure.serve is not None:
        lines.append(f"  serve:   tokenwire serve {shlex.join(figure.serve)}")
    if figure.needs is not None:
        found = "missing" if missing(figure.needs) else "found"
        lines.append(f"  needs:   {figure.needs} ({found})")
    return "\n".join(lines)


def plan(figure: Figure, blocks: list[Block]) -> str:
    if missing(figure.needs):
        return f"{figure.name}: would skip it, {figure.needs} is missing"
    return (f"{figure.name}: would run `{shown_command(figure)}`{against(figure)}, then rewrite "
            f"{uses(figure, blocks)}")


def check(blocks: list[Block], registry: dict[str, Figure], only: list[str]) -> None:
    for block in blocks:
        if block.name not in registry:
            raise BlockError(f"{block.page}:{block.line}: figure {block.name!r} is not in "
                             "scripts/refresh_figures.py's FIGURES")
    for name in only:
        if name not in registry:
            raise BlockError(f"--only {name}: not in FIGURES ({', '.join(registry)})")
    for name in registry:
        if not any(b.name == name for b in blocks):
            print(f"warning: figure {name!r} is in FIGURES but no block uses it",
                  file=sys.stderr)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python scripts/refresh_figures.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", default=[], metavar="NAME",
                   help="refresh just these figures")
    p.add_argument("--list", action="store_true",
                   help="print each figure, the blocks that use it and its command")
    p.add_argument("--dry-run", action="store_true",
                   help="print what would run and which blocks it would rewrite; run nothing")
    return p.parse_args(argv)


def main(argv: list[str] | None = None, figures=FIGURES, repo: Path = REPO) -> int:
    args = parse_args(argv)
    registry = {f.name: f for f in figures}
    try:
        blocks = find_blocks(repo)
        check(blocks, registry, args.only)
    except BlockError as exc:
        print(f"refresh_figures: {exc}", file=sys.stderr)
        return 2
    if args.list:
        print("\n".join(describe(f, blocks) for f in registry.values()))
        return 0
    used = {b.name for b in blocks}
    chosen = [registry[n] for n in args.only or registry if n in used]
    if args.dry_run:
        print("\n".join(plan(f, blocks) for f in chosen) or "nothing to refresh")
        return 0
    machine = describe_machine(repo, blocks)
    ok = [refresh(f, blocks, repo, machine) for f in chosen]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
