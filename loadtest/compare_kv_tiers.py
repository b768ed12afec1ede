"""One command, two servers: turn-2+ TTFT of sessions that go idle between turns, with the
server's KV tiers on (the default with the SQLite store) beside `--kv-tiers off`.

Each session's first turn is a long history; between turns its socket closes for
`--idle-gap` seconds and it resumes by id (`tokenwire loadtest --idle-gap`). The sessions
take turns (one turn in flight at a time by default, so each TTFT is that turn's own
work) on a pool too small for all their histories (`--num-kv-blocks`), so while one
idles the others' turns push its blocks out of the pool: the tiers-off server re-prefills
them, the tiers-on one loads them back from host RAM or disk. Both servers stay up and
run the same seeded workload, the order alternating over `--repeat` runs; the mean of
each side's runs is reported.

    python -m loadtest.compare_kv_tiers --device cpu --num-sessions 4 --history-len 1024 \
        --turns 3 --idle-gap 2 --num-kv-blocks 128
"""
from __future__ import annotations

import argparse
import sys
import tempfile

from loadtest.compare import (_tokenizer_spec, add_common, format_turn_split, log,
                              run_online, serve_args, turn_split)
from loadtest.config import LoadTestConfig
from loadtest.report import comparison_main
from loadtest.server_process import ServerProcess
from loadtest.workload import build_workload

SIDES = {"off": ("--kv-tiers", "off"), "on": ()}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_common(p)
    p.set_defaults(num_kv_blocks=128)
    p.add_argument("--history-len", type=int, default=1024,
                   help="tokens of each session's first turn (the history later turns carry)")
    p.add_argument("--user-len", type=int, default=32, help="tokens of each later turn")
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--num-sessions", type=int, default=4,
                   help="sessions (their histories together should overflow the pool)")
    p.add_argument("--max-concurrency", type=int, default=1,
                   help="turns in flight at once (more: a turn's TTFT includes the others')")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--idle-gap", type=float, default=2.0,
                   help="seconds each session's socket stays closed between turns")
    p.add_argument("--kv-park-idle", type=float, default=1.0,
                   help="the servers' --kv-park-idle (seconds)")
    p.add_argument("--repeat", type=int, default=1, help="runs of each side, alternating")


def compare(args: argparse.Namespace) -> dict:
    from loadtest.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(_tokenizer_spec(args.model))
    runs: dict[str, list[dict]] = {side: [] for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="kv-tiers-") as state:
        servers = {side: ServerProcess(serve_args(
            args, "--state-dir", f"{state}/{side}", "--kv-park-idle", str(args.kv_park_idle),
            *flags)) for side, flags in SIDES.items()}
        with servers["off"], servers["on"]:
            for side, server in servers.items():  # first-use costs, off the figures
                warm = LoadTestConfig(url=server.ws_url, num_prompts=1, random_input_len=16,
                                      random_output_len=4, ignore_eos=True, seed=args.seed + 1)
                run_online(warm, build_workload(warm, tokenizer))
            for rep in range(args.repeat):
                for side in (("off", "on") if rep % 2 == 0 else ("on", "off")):
                    cfg = sessions_config(args, servers[side].ws_url, rep)
                    _, records = run_online(cfg, build_workload(cfg, tokenizer))
                    runs[side].append(turn_split(records))
                    log(f"tiers {side}: turn-2+ mean TTFT "
                        f"{runs[side][-1]['later_mean_ttft_ms']:.1f} ms")
    rows = {side: mean_rows(results) for side, results in runs.items()}
    return {"comparison": "kv-tiers", "model": args.model, "device": args.device,
            "history_len": args.history_len, "user_len": args.user_len,
            "output_len": args.output_len, "num_sessions": args.num_sessions,
            "turns": args.turns, "idle_gap": args.idle_gap,
            "num_kv_blocks": args.num_kv_blocks, "repeat": args.repeat,
            "tiers_off": rows["off"], "tiers_on": rows["on"],
            "ratio": rows["off"]["later_mean_ttft_ms"] / rows["on"]["later_mean_ttft_ms"]}


def sessions_config(args: argparse.Namespace, url: str, rep: int) -> LoadTestConfig:
    """The sessions workload of run `rep` (fresh histories each run, the same on both
    sides)."""
    return LoadTestConfig(
        url=url, dataset="sessions", num_sessions=args.num_sessions, turns=args.turns,
        first_turn_len=args.history_len, random_input_len=args.user_len,
        random_output_len=args.output_len, max_concurrency=args.max_concurrency,
        idle_gap=args.idle_gap, ignore_eos=True, seed=args.seed + 1000 * rep)


def mean_rows(results: list[dict]) -> dict:
    return {key: sum(r[key] for r in results) / len(results) for key in results[0]}


def format_report(report: dict) -> str:
    return format_turn_split(
        f"turn-2+ TTFT, {report['num_sessions']} sessions x {report['turns']} turns, "
        f"{report['history_len']}-token first turn, {report['idle_gap']:g} s idle gap "
        f"(socket closed, resumed by id), {report['num_kv_blocks']}-block pool: "
        f"{report['model']} on {report['device']}, mean of {report['repeat']} run(s)",
        "KV tiers", {side: report[f"tiers_{side}"] for side in SIDES}, report["ratio"])


def main(argv: list[str] | None = None) -> int:
    return comparison_main("python -m loadtest.compare_kv_tiers", __doc__, add_arguments,
                           compare, format_report, argv)


if __name__ == "__main__":
    sys.exit(main())
