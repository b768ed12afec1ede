"""`--scrape-metrics`: the server's own view of the run, from /metrics before and after.

Only tokenwire's Prometheus names are read; a server without them yields nothing, so the
same flag is harmless against other OpenAI-compatible servers.
"""
from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

P = "tokenwire_"
HISTOGRAMS = {"ttft": "time_to_first_token_seconds", "itl": "inter_token_latency_seconds",
              "e2el": "e2e_request_latency_seconds", "queue": "request_queue_time_seconds"}
COUNTERS = ("prompt_tokens_total", "generation_tokens_total", "prefix_cache_queries_total",
            "prefix_cache_hits_total", "preemptions_total", "admission_rejections_total")


def metrics_url(url: str) -> str:
    """ws://h:p/v1/ws or http://h:p/v1 -> http://h:p/metrics."""
    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    return urlunsplit((scheme, parts.netloc, "/metrics", "", ""))


async def scrape(url: str) -> dict[str, float]:
    """Sample name -> value, label sets summed; {} when the server has no /metrics."""
    try:
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            if resp.status != 200:
                return {}
            text = await resp.text()
    except aiohttp.ClientError:
        return {}
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[sample.name] = samples.get(sample.name, 0.0) + sample.value
    return samples


def server_delta(before: dict[str, float], after: dict[str, float]) -> dict:
    """What the server counted during the run: histogram means (ms) and counter deltas."""
    def moved(name: str) -> float:
        return after.get(P + name, 0.0) - before.get(P + name, 0.0)

    if P + "generation_tokens_total" not in after:
        return {}
    result: dict = {}
    for key, name in HISTOGRAMS.items():
        count = moved(name + "_count")
        result[f"{key}_count"] = int(count)
        result[f"mean_{key}_ms"] = moved(name + "_sum") / count * 1000.0 if count else None
    for name in COUNTERS:
        result[name.removesuffix("_total")] = int(moved(name))
    queries = result["prefix_cache_queries"]
    result["prefix_cache_hit_rate"] = result["prefix_cache_hits"] / queries if queries else None
    return result
