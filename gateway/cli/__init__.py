"""The `tokenwire` console script: serve, bench, loadtest.

Each subcommand lives in its own module, which provides `add_arguments(parser)` and
`run(args) -> int`; a subcommand's module is imported only when it is chosen, so
`--help` stays fast and `serve` never loads the load tester.
"""
from __future__ import annotations

import argparse
import os
import sys
from types import ModuleType


def _serve() -> ModuleType:
    from gateway.cli import serve

    return serve


def _bench() -> ModuleType:
    from loadtest import offline_bench

    return offline_bench


def _loadtest() -> ModuleType:
    from loadtest import cli

    return cli


SUBCOMMANDS = {
    "serve": (_serve, "start the WebSocket/HTTP server"),
    "bench": (_bench, "offline throughput, side by side with HF transformers"),
    "loadtest": (_loadtest, "drive a running server over WebSocket or HTTP"),
}
# Subcommands whose torch threads share the cores with an event loop (and, under load,
# clients): OpenMP workers that spin at barriers steal those cores, passive ones yield
# them (docs/engine.md has the figures). The offline bench keeps libgomp's default for
# Hugging Face's sake, measured in the same process: its hundreds of torch ops a step
# each wake a sleeping thread late, and passive it runs far slower.
PASSIVE_OPENMP = {"serve", "loadtest"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    if chosen in PASSIVE_OPENMP:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads
    parser = argparse.ArgumentParser(prog="tokenwire", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (load, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text)
        if name == chosen:
            module = load()
            module.add_arguments(sub_parser)
            sub_parser.set_defaults(run=module.run)
    args = parser.parse_args(argv)
    return int(args.run(args) or 0)
