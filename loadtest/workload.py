"""What a load run sends and how: the seeded workload, the backend for a URL, and the
event loop the client runs on. Shared by `tokenwire loadtest` (loadtest/cli.py) and the
one-command comparisons (compare, compare_realtime, lb_overhead, peer_bench)."""
from __future__ import annotations

import dataclasses
import random

from loadtest import datasets
from loadtest.backends import HttpBackend, WsBackend
from loadtest.config import LoadTestConfig
from loadtest.copy_dataset import copy_prompts
from loadtest.realtime_client import RealtimeBackend
from loadtest.responses_client import ResponsesBackend
from loadtest.runner import Runner, RunResult


def build_workload(cfg: LoadTestConfig, tokenizer) -> dict:
    """{"prompts": [...]} or {"sessions": [[...], ...]}, drawn from the seed."""
    rng = random.Random(cfg.seed)
    n = cfg.num_requests
    if cfg.dataset != "random" and cfg.prompts_file:
        prompts = datasets.file_prompts(cfg.prompts_file, n, cfg.random_output_len, tokenizer)
    elif cfg.dataset == "copy":
        prompts = copy_prompts(n, cfg.random_input_len, cfg.random_output_len,
                               cfg.random_range_ratio, rng, tokenizer)
    else:
        prompts = datasets.random_prompts(n, cfg.random_input_len, cfg.random_output_len,
                                          cfg.random_range_ratio, rng, tokenizer)
    if cfg.dataset == "sessions":
        openers = None
        if cfg.first_turn_len:
            openers = datasets.random_prompts(cfg.num_sessions, cfg.first_turn_len,
                                              cfg.random_output_len, cfg.random_range_ratio,
                                              rng, tokenizer)
        sessions = datasets.session_turns(cfg.num_sessions, cfg.turns, prompts, openers)
        if cfg.is_mix:  # a session keeps its model for all its turns
            sessions = [_on(turns, cfg.models[i % len(cfg.models)])
                        for i, turns in enumerate(sessions)]
        return {"sessions": sessions}
    if cfg.is_mix:
        prompts = [_on([p], cfg.models[i % len(cfg.models)])[0] for i, p in enumerate(prompts)]
    return {"prompts": prompts}


def _on(prompts: list, model: str) -> list:
    """The prompts naming `model`. Their lengths were counted with the load tester's
    tokenizer: another model's tokenizer counts the same text differently (the report's
    token counts are the servers' own)."""
    return [dataclasses.replace(p, model=model) for p in prompts]


def make_backend(cfg: LoadTestConfig):
    if cfg.is_responses:
        mode = "ws" if cfg.is_websocket else "chain"
        return ResponsesBackend(cfg.url, mode, cfg.model, cfg.temperature,
                                cfg.connect_timeout)
    if cfg.is_realtime:
        return RealtimeBackend(cfg.url, cfg.temperature, cfg.connect_timeout)
    if cfg.is_websocket:
        return WsBackend(cfg.url, cfg.endpoint, cfg.use_msgpack, cfg.temperature,
                         cfg.ignore_eos, cfg.connect_timeout)
    return HttpBackend(cfg.url, cfg.endpoint, cfg.model, cfg.temperature, cfg.ignore_eos,
                       cfg.max_concurrency or 0)


async def run_workload(cfg: LoadTestConfig, workload: dict) -> RunResult:
    """One run of `workload` against cfg.url, without a progress bar (a comparison's run)."""
    return await Runner(cfg, make_backend(cfg), show_progress=False).run(**workload)


def run_loop(coro):
    """Run the client on uvloop: its per-frame cost is what keeps a single client process
    from becoming the bottleneck at hundreds of streams."""
    import uvloop

    return uvloop.run(coro)
