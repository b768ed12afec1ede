"""A long session's turns against real servers, for the KV tier must-shows
(test_session_kv.py on one machine, tests/cluster/test_kv_failover.py across replicas):
its text, greedy turns, the tier metrics to wait on and the figures to print.
"""
from __future__ import annotations

import asyncio
import re

from tests.sizes import FULL_SIZE

from .harness import until_end

BLOCK = 16
# CI runs a ~1,000-token session, which proves the same restores in a third of the
# prefills; TOKENWIRE_FULL_SIZE=1 runs the ~3,050-token one behind the TTFT figures quoted
# in docs/sessions.md. A pool holds the long session and little else.
if FULL_SIZE:
    POOL_BLOCKS, LONG_SENTENCES, MIN_CACHED = 200, 90, 2900
else:
    POOL_BLOCKS, LONG_SENTENCES, MIN_CACHED = 80, 30, 950
SENTENCE = ("Entry {}: the keeper of the light at {} wrote down the wind, the ships that "
            "passed and the birds that rested on the rail.")
# A 3,000-token prefill takes tens of seconds on a busy 2-core box.
TURN_TIMEOUT_S = 300.0


async def chat(ws, request_id: str, content: str) -> tuple[str, dict]:
    await ws.send_json({"type": "chat", "id": request_id, "content": content,
                        "params": {"max_tokens": 8, "temperature": 0}})
    return await until_end(ws, request_id, TURN_TIMEOUT_S)


def text(place: str, sentences: int) -> str:
    return " ".join(SENTENCE.format(i, place) for i in range(sentences))


async def tier_metric(http, server, name: str, tier: str) -> float:
    async with http.get(server.http_url + "/metrics") as resp:
        body = await resp.text()
    found = re.search(rf'^tokenwire_{name}{{tier="{tier}"}} (\S+)$', body, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


async def wait_for_metric(http, server, name: str, tier: str, at_least: float) -> None:
    for _ in range(300):
        if await tier_metric(http, server, name, tier) >= at_least:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{name}{{tier={tier}}} never reached {at_least}")


def figures(end: dict) -> dict:
    assert end["type"] == "done", end
    return {"cached": end["usage"]["cached_tokens"], "prompt": end["usage"]["prompt_tokens"],
            "ttft_ms": end["timing"]["ttft_ms"]}
