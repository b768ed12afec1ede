"""The load-balancer benchmark's two sides on the cluster: the same load on replica r1
direct and through HAProxy with r2 and r3 out of rotation. The ratio is printed, not
asserted (the CI box is shared); both sides must serve every request."""
from __future__ import annotations

import argparse

import aiohttp
import pytest

from loadtest.lb_overhead import one_round
from tests.reliability.harness import scrape

pytestmark = pytest.mark.slow  # three replicas load the model: minutes on a 2-core box

GENERATED = "tokenwire_generation_tokens_total"


async def test_same_load_direct_and_through_haproxy(cluster):
    args = argparse.Namespace(num_prompts=16, max_concurrency=8, input_len=32, output_len=16)
    r1 = cluster.replicas[0]
    others = [name for name in cluster.lb.servers_up() if name != "r1"]
    for name in others:
        cluster.lb.command(f"set server replicas/{name} state maint")
    try:
        async with aiohttp.ClientSession() as http:
            before = (await scrape(http, r1))[GENERATED]
            direct = await one_round(r1.ws_url, args, seed=0)
            balanced = await one_round(cluster.lb.ws_url, args, seed=1)
            generated = (await scrape(http, r1))[GENERATED] - before
    finally:
        for name in others:
            cluster.lb.command(f"set server replicas/{name} state ready")
    cluster.lb.wait_up()
    assert generated == 2 * args.num_prompts * args.output_len  # both sides ran on r1
    for side in (direct, balanced):
        assert side["failed"] == 0 and side["completed"] == args.num_prompts, side
        assert side["total_output_tokens"] == args.num_prompts * args.output_len
    print(f"\noutput tok/s direct {direct['output_throughput']:.1f}, through HAProxy "
          f"{balanced['output_throughput']:.1f}, ratio "
          f"{balanced['output_throughput'] / direct['output_throughput']:.3f}")
