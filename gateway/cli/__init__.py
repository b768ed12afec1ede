"""The `tokenwire` console script: serve, bench, loadtest.

Each subcommand lives in its own module, which provides `add_arguments(parser)` and
`run(args) -> int`; they are imported only when chosen so `--help` stays fast.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

SUBCOMMANDS = {
    "serve": ("gateway.server_cli", "start the WebSocket/HTTP server"),
    "bench": ("loadtest.offline_bench", "offline throughput, side by side with HF transformers"),
    "loadtest": ("loadtest.cli", "drive a running server over WebSocket or HTTP"),
}
# Subcommands whose torch threads share the cores with an event loop (and, under load,
# clients): OpenMP workers that spin at barriers steal those cores, passive ones yield
# them (on a busy 2-core box an engine step went from 2.0 s to 0.64 s). The offline bench
# keeps libgomp's default for Hugging Face's sake, measured in the same process: passive,
# its static generate ran 62-65 out tok/s against 91-92 spinning (tokenwire bench, Zen 3,
# 010845f), its hundreds of torch ops a step each waking a sleeping thread late.
PASSIVE_OPENMP = {"serve", "loadtest"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    chosen = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    if chosen in PASSIVE_OPENMP:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads
    parser = argparse.ArgumentParser(prog="tokenwire", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        sub_parser = sub.add_parser(name, help=help_text)
        if name == chosen:
            module = importlib.import_module(module_name)
            module.add_arguments(sub_parser)
            sub_parser.set_defaults(run=module.run)
    args = parser.parse_args(argv)
    return int(args.run(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
