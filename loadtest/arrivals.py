"""Request arrival process: all at once, Poisson, or gamma-bursty (as in `vllm bench serve`).

Inter-arrival gaps are Gamma(shape=burstiness, scale=1/(rate*burstiness)): the mean gap is
always 1/rate; burstiness 1 is a Poisson process, below 1 burstier, above 1 more regular
(the coefficient of variation of the gaps is 1/sqrt(burstiness)).
"""
from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator, Iterator


def intervals(rate: float, burstiness: float, rng: random.Random) -> Iterator[float]:
    """Endless seconds to wait before each next request; 0 forever when rate is inf."""
    if not burstiness > 0:
        raise ValueError("burstiness must be positive")
    if math.isinf(rate):
        while True:
            yield 0.0
    if not rate > 0:
        raise ValueError("request rate must be positive or inf")
    scale = 1.0 / (rate * burstiness)
    while True:
        yield rng.gammavariate(burstiness, scale)


async def paced(items: list, rate: float, burstiness: float,
                rng: random.Random) -> AsyncIterator:
    """Yield `items` one by one, sleeping the arrival gap after each (the first goes at once)."""
    gaps = intervals(rate, burstiness, rng)
    for item in items:
        yield item
        gap = next(gaps)
        if gap > 0:
            await asyncio.sleep(gap)
