"""Benchmark metrics, pure math over RequestRecords; definitions follow `vllm bench serve`.

    send          first delta       delta ... delta         done
     |--- TTFT ------|--- ITL ---|--- ITL ---|  ...  |--------|
     |------------------------- E2EL -------------------------|
    TPOT = (E2EL - TTFT) / (output_tokens - 1)      (requests with more than one token)
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from loadtest.records import RequestRecord

SLO_KEYS = ("ttft", "tpot", "e2el")


def percentile(values: Sequence[float], p: float) -> float:
    """The p-th percentile with linear interpolation between ranks (numpy's default)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * p / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def describe(values_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float]:
    """Mean, median, population std and percentiles of `values_s`, reported in ms."""
    values = [v * 1000.0 for v in values_s]
    n = len(values)
    mean = sum(values) / n if n else 0.0
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / n) if n else 0.0
    stats = {"mean": mean, "median": percentile(values, 50), "std": std}
    for p in percentiles:
        stats[f"p{p:g}"] = percentile(values, p)
    return stats


def tpot(record: RequestRecord) -> float | None:
    """Time per output token after the first; None for requests of one token or fewer."""
    if record.output_tokens <= 1 or record.latency is None or record.ttft is None:
        return None
    return (record.latency - record.ttft) / (record.output_tokens - 1)


def is_good(record: RequestRecord, slos_ms: dict[str, float]) -> bool:
    """Whether a successful request meets every SLO (a one-token request has TPOT 0)."""
    measured = {"ttft": record.ttft, "tpot": tpot(record) or 0.0, "e2el": record.latency}
    return all(measured[key] * 1000.0 <= limit for key, limit in slos_ms.items())


def parse_goodput(items: Iterable[str]) -> dict[str, float]:
    """`["ttft:500", "tpot:50"]` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds)."""
    slos = {}
    for item in items:
        key, sep, value = item.partition(":")
        if not sep or key not in SLO_KEYS:
            raise ValueError(f"goodput: expected KEY:MS with KEY in {SLO_KEYS}, got {item!r}")
        slos[key] = float(value)
        if not slos[key] > 0:
            raise ValueError(f"goodput: {key} must be a positive number of ms")
    return slos


def output_token_series(records: Iterable[RequestRecord], t0: float,
                        bin_s: float = 1.0) -> list[int]:
    """Output tokens received in each `bin_s`-second bin since `t0` (client clock)."""
    bins: Counter[int] = Counter()
    for record in records:
        for t, n in zip(record.chunk_times, record.chunk_tokens):
            bins[int((t - t0) // bin_s)] += n
    if not bins:
        return []
    return [bins.get(i, 0) for i in range(max(bins) + 1)]


def peak_concurrency(records: Iterable[RequestRecord]) -> int:
    """Most requests in flight at once, from their send and end times."""
    events = []
    for r in records:
        if r.latency is not None:
            events += [(r.start, 1), (r.start + r.latency, -1)]
    running = peak = 0
    for _, step in sorted(events, key=lambda e: (e[0], e[1])):
        running += step
        peak = max(peak, running)
    return peak


def per_turn(records: Iterable[RequestRecord], percentiles: Sequence[float]) -> list[dict]:
    """TTFT and prefix-cache hits by turn number of multi-turn sessions."""
    by_turn: dict[int, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.turn is not None and r.success:
            by_turn[r.turn].append(r)
    rows = []
    for turn in sorted(by_turn):
        group = by_turn[turn]
        cached = [r.usage_cached_tokens for r in group if r.usage_cached_tokens is not None]
        rows.append({
            "turn": turn, "completed": len(group),
            "mean_prompt_tokens": sum(r.prompt_tokens for r in group) / len(group),
            "mean_cached_tokens": sum(cached) / len(cached) if cached else None,
            "ttft_ms": describe([r.ttft for r in group], percentiles),
        })
    return rows


def per_model(records: Sequence[RequestRecord], duration_s: float,
              percentiles: Sequence[float]) -> list[dict]:
    """Each model's share of a model mix: requests, throughput, TTFT and TPOT."""
    by_model: dict[str, list[RequestRecord]] = defaultdict(list)
    for r in records:
        if r.model is not None:
            by_model[r.model].append(r)
    rows = []
    for model in sorted(by_model):
        group = by_model[model]
        done = [r for r in group if r.success]
        rows.append({
            "model": model, "completed": len(done), "failed": len(group) - len(done),
            "output_throughput": sum(r.output_tokens for r in done) / duration_s,
            "ttft_ms": describe([r.ttft for r in done], percentiles),
            "tpot_ms": describe([t for t in map(tpot, done) if t is not None], percentiles),
        })
    return rows


def summarize(records: Sequence[RequestRecord], duration_s: float, t0: float,
              percentiles: Sequence[float] = (99,),
              slos_ms: dict[str, float] | None = None) -> dict:
    """Everything `vllm bench serve` reports, plus refusals and per-turn TTFT."""
    done = [r for r in records if r.success]
    failed = [r for r in records if not r.success]
    out_tokens = sum(r.output_tokens for r in done)
    in_tokens = sum(r.prompt_tokens for r in done)
    duration_s = max(duration_s, 1e-9)
    series = output_token_series(done, t0)
    result = {
        "duration": duration_s, "completed": len(done), "failed": len(failed),
        "errors_by_code": dict(Counter(r.error_code or "unknown" for r in failed)),
        "finish_reasons": dict(Counter(r.finish_reason for r in done)),
        "total_input_tokens": in_tokens, "total_output_tokens": out_tokens,
        "client_output_tokens": sum(r.client_tokens for r in done),
        "total_deltas": sum(r.num_deltas for r in done),
        "request_throughput": len(done) / duration_s,
        "output_throughput": out_tokens / duration_s,
        "total_token_throughput": (in_tokens + out_tokens) / duration_s,
        "max_output_tokens_per_s": max(series, default=0),
        "max_concurrent_requests": peak_concurrency(done),
        "output_tokens_per_s_series": series,
        "retried_requests": sum(1 for r in records if r.retries),
        "reconnects": sum(r.reconnects for r in records),
    }
    if slos_ms:
        good = sum(1 for r in done if is_good(r, slos_ms))
        result["request_goodput"] = good / duration_s
    tpots = [t for t in map(tpot, done) if t is not None]
    itls = [gap for r in done for gap in r.itl]
    for name, values in (("ttft", [r.ttft for r in done]), ("tpot", tpots),
                         ("itl", itls), ("e2el", [r.latency for r in done])):
        for stat, value in describe(values, percentiles).items():
            result[f"{stat}_{name}_ms"] = value
    turns = per_turn(done, percentiles)
    if turns:
        result["per_turn"] = turns
    models = per_model(records, duration_s, percentiles)
    if len(models) > 1:
        result["per_model"] = models
    return result
