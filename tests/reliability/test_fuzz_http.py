"""Hostile numbers in every numeric field of both OpenAI bodies, streamed and not, against
a live server: each answers 400 in OpenAI's error shape naming the field (or, for a value
that happens to be valid, a complete answer), never a 500, with no traceback logged and
every KV block free at the end."""
from __future__ import annotations

import asyncio
import collections
import json

import aiohttp

from .harness import settle

PATHS = {"/v1/chat/completions": '"messages":[{"role":"user","content":"Hi"}]',
         "/v1/completions": '"prompt":"Hi"'}
FIELDS = ("max_tokens", "max_completion_tokens", "n", "temperature", "top_p", "top_k", "min_p",
          "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "priority",
          "stop_token_ids")
LITERALS = ("1" + "0" * 400, "9" * 4300, "9" * 5000, "-" + "9" * 400, "1e309", "-1e309",
            "NaN", "Infinity", "-Infinity", "-1000", "-0.5", "0")
NOT_JSON = {"NaN", "Infinity", "-Infinity"}


def _body(path: str, field: str, literal: str, stream: bool) -> str:
    value = f"[{literal}]" if field == "stop_token_ids" else literal
    limit = "" if "max" in field else '"max_tokens":2,'
    return f'{{{PATHS[path]},{limit}"stream":{json.dumps(stream)},"{field}":{value}}}'


async def _post(http, url: str, path: str, field: str, literal: str, stream: bool) -> str:
    """What the server answered: an error code, or `answered` for a complete 200."""
    async with http.post(url + path, data=_body(path, field, literal, stream),
                         headers={"Content-Type": "application/json"}) as r:
        if r.status == 200:
            raw = (await r.read()).decode()
            assert raw.endswith("data: [DONE]\n\n") if stream else json.loads(raw)["usage"], raw
            assert '"error"' not in raw, raw
            return "answered"
        error = (await r.json())["error"]
        assert r.status == 400, (field, literal[:12], r.status, error)
        assert error["type"] == "invalid_request_error", (field, literal[:12], error)
        expected = None if literal in NOT_JSON else field
        param = error["param"] and error["param"].split("[")[0]  # stop_token_ids[0]
        assert param == expected, (field, literal[:12], error)
        return error["code"]


async def _run(server) -> collections.Counter:
    tally: collections.Counter = collections.Counter()
    async with aiohttp.ClientSession() as http:
        for path in PATHS:
            for field in FIELDS:
                for literal in LITERALS:
                    for stream in (False, True):
                        tally[await _post(http, server.http_url, path, field, literal,
                                          stream)] += 1
        want = {"tokenwire_kv_cache_usage_ratio": 0.0, "tokenwire_requests_running": 0.0}
        values = await settle(http, server, want)
        tally["blocks free"] = int(all(values.get(k) == v for k, v in want.items()))
    return tally


def test_hostile_numbers_in_http_bodies(shared_server, figures):
    log_before = shared_server.log().count("Traceback")
    tally = asyncio.run(_run(shared_server))
    blocks_free = tally.pop("blocks free")
    tracebacks = shared_server.log().count("Traceback") - log_before
    tried = len(PATHS) * len(FIELDS) * len(LITERALS) * 2
    figures("fuzz (hostile numbers in HTTP bodies)", tried=tried, survived=sum(tally.values()),
            lost=tried - sum(tally.values()),
            notes=f"both OpenAI endpoints, streamed and not; answers by code: "
                  f"{dict(sorted(tally.items()))}; tracebacks logged: {tracebacks}")
    assert sum(tally.values()) == tried
    assert tracebacks == 0, shared_server.log()[-3000:]
    assert blocks_free, "KV blocks still held after the HTTP fuzz"
