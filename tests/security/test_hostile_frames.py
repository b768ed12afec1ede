"""The worst frame a client can build within the size limits stalls nobody.

For each endpoint a hostile client sends the most expensive request it can (many
messages or items, long histories fitted to a small context, a deep schema, long stop
lists, many prompts) while a /health poller and a stream beside it run. Every piece of
work that grows with the input runs off the event loop, linear or O(n log n) in it:
/health answers within 100 ms throughout, and the stream beside keeps its inter-token
latency p99 within twice its quiet value. The worst /health latency per endpoint (the
event loop's lag as a client sees it) is printed side by side with the quiet one.
"""
from __future__ import annotations

import asyncio
import json
import statistics
import time

import aiohttp
import pytest

HEALTH_BOUND_S = 0.1
BESIDE = {"type": "generate", "id": "beside", "prompt": "Count from 1 to 500:",
          "params": {"max_tokens": 300, "ignore_eos": True, "temperature": 0}}
TEXT = "lorem ipsum dolor sit amet " * 30  # ~800 characters, ~200 tokens


def _messages(n: int) -> list[dict]:
    return [{"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} {TEXT}"}
            for i in range(n)]


def _deep_schema(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth - 1):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    return schema


class Watch:
    """/health polled every 25 ms and a stream beside the hostile request, measured."""

    def __init__(self, http: aiohttp.ClientSession, base: str):
        self.http, self.base = http, base
        self.health_s: list[float] = []
        self.gaps_s: list[float] = []
        self._stop = asyncio.Event()

    async def _poll(self) -> None:
        while not self._stop.is_set():
            started = time.perf_counter()
            async with self.http.get(self.base + "/health") as r:
                assert r.status == 200
            self.health_s.append(time.perf_counter() - started)
            await asyncio.sleep(0.025)

    async def _beside(self, first: asyncio.Event) -> None:
        ws = await self.http.ws_connect(self.base.replace("http", "ws") + "/v1/ws")
        await ws.receive_json()  # hello
        await ws.send_json(BESIDE)
        last = None
        while True:
            frame = await ws.receive_json(timeout=120)
            now = time.perf_counter()
            if frame["type"] == "delta":
                if last is not None:
                    self.gaps_s += [(now - last) / frame["n"]] * frame["n"]
                last = now
                first.set()
            elif frame["type"] in ("done", "error"):
                break
        await ws.close()

    async def around(self, hostile) -> None:
        """Run `hostile()` once the stream beside has its first token."""
        first = asyncio.Event()
        poller = asyncio.create_task(self._poll())
        beside = asyncio.create_task(self._beside(first))
        await first.wait()
        await hostile()
        await beside
        self._stop.set()
        await poller

    @property
    def worst_health_ms(self) -> float:
        return 1000 * max(self.health_s)

    @property
    def itl_p99_ms(self) -> float:
        return 1000 * statistics.quantiles(self.gaps_s, n=100)[98]


async def _ws_frame(base: str, path: str, frame: dict, until: str, protocols=()) -> dict:
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(base.replace("http", "ws") + path, protocols=protocols,
                                   max_msg_size=0)
        await ws.receive_json()  # hello / session.created
        await ws.send_str(json.dumps(frame))
        while True:
            reply = await ws.receive_json(timeout=300)
            if reply["type"] in (until, "error"):
                await ws.close()
                return reply


async def _ws_generate(base: str) -> dict:
    frame = {"type": "generate", "id": "h", "messages": _messages(1000),
             "params": {"max_tokens": 4}}
    return await _ws_frame(base, "/v1/ws", frame, "done")


async def _ws_stop_lists(base: str, num_stops: int = 16, prompt: str = TEXT) -> dict:
    stops = [f"{i}{'z' * 250}" for i in range(num_stops)]
    frame = {"type": "generate", "id": "h", "prompt": prompt,
             "params": {"max_tokens": 64, "ignore_eos": True, "stop": stops}}
    return await _ws_frame(base, "/v1/ws", frame, "done")


async def _ws_no_stop_list(base: str) -> dict:
    """As long a prompt, from its first token on another (no prefix-cache hit either way)."""
    return await _ws_stop_lists(base, num_stops=0, prompt="ipsum " + TEXT[len("lorem "):])


async def _realtime_input(base: str, count: int = 1000) -> dict:
    """The last `count` of 1,000 messages as a response's input items."""
    items = [{"type": "message", "role": m["role"], "content": [
        {"type": "input_text" if m["role"] == "user" else "output_text", "text": m["content"]}]}
        for m in _messages(1000)[-count:]]
    frame = {"type": "response.create", "response": {"conversation": "none", "input": items,
                                                     "max_output_tokens": 4}}
    return await _ws_frame(base, "/v1/realtime", frame, "response.done", ("realtime",))


async def _realtime_input_that_fits(base: str) -> dict:
    """As long a prompt as the fitted one (9 messages of ~200 tokens in a 2,048 context),
    sent as it is: nothing to drop."""
    return await _realtime_input(base, count=9)


async def _http(base: str, path: str, body: dict) -> dict:
    async with aiohttp.ClientSession() as http:
        async with http.post(base + path, json=body) as r:
            return {"status": r.status, **(await r.json())}


async def _http_chat(base: str) -> dict:
    return await _http(base, "/v1/chat/completions", {"messages": _messages(1000),
                                                      "max_tokens": 4})


async def _http_prompts(base: str) -> dict:
    return await _http(base, "/v1/completions", {"prompt": [TEXT * 60] * 16, "max_tokens": 1})


def _schema_request(schema: dict) -> dict:
    return {"messages": [{"role": "user", "content": "Fill it in."}], "max_tokens": 4,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "hostile", "schema": schema}}}


async def _http_no_schema(base: str) -> dict:
    """The schema requests' benign twin: the same chat request, its output unconstrained."""
    request = _schema_request({})
    del request["response_format"]
    return await _http(base, "/v1/chat/completions", request)


async def _http_deep_schema(base: str) -> dict:
    # 15 objects, each its schema and its `properties`: 30 levels, under the default 32.
    return await _http(base, "/v1/chat/completions", _schema_request(_deep_schema(15)))


async def _http_wide_schema(base: str) -> dict:
    properties = {f"p{i}": {"type": "integer"} for i in range(1800)}  # ~61 KB
    schema = {"type": "object", "properties": properties, "required": list(properties)}
    return await _http(base, "/v1/chat/completions", _schema_request(schema))


HOSTILE = {
    "/v1/ws generate, 1,000 messages (~850 KB)": _ws_generate,
    "/v1/ws generate, 16 stop strings of 251 characters": _ws_stop_lists,
    "/v1/realtime response.create, 1,000 input items fitted to the context": _realtime_input,
    "/v1/chat/completions, 1,000 messages (~850 KB)": _http_chat,
    "/v1/completions, 16 prompts of ~48 KB": _http_prompts,
    "/v1/chat/completions, a JSON schema 15 objects deep": _http_deep_schema,
    "/v1/chat/completions, a JSON schema of 1,800 required properties": _http_wide_schema,
}


# A hostile request that also generates shares the batch with the stream beside, as any
# request of its size would: its ITL is compared with that of its benign twin (the same
# request without what makes it hostile), not with a stream running alone. The fitted
# items' prompt fills the context, and its prefill chunks slow the steps of the stream
# beside as any prompt that long does: on a 2-core AMD EPYC the stream's ITL p99 was
# 2.2-2.4x its quiet value beside the fitted items and as much beside 9 items that fit.
# The schema requests' own prefill and tokens share steps too (a full CI run on that box
# saw 2.1x beside the deep schema): their twin asks the same without a schema.
BENIGN_TWIN = {"/v1/ws generate, 16 stop strings of 251 characters": _ws_no_stop_list,
               "/v1/realtime response.create, 1,000 input items fitted to the context":
                   _realtime_input_that_fits,
               "/v1/chat/completions, a JSON schema 15 objects deep": _http_no_schema,
               "/v1/chat/completions, a JSON schema of 1,800 required properties":
                   _http_no_schema}


@pytest.fixture(scope="module")
def server(serve):
    return serve()


@pytest.fixture(scope="module")
def quiet(server) -> Watch:
    async def measure() -> Watch:
        async with aiohttp.ClientSession() as http:
            watch = Watch(http, server.base)
            await watch.around(lambda: asyncio.sleep(1.0))
            return watch
    return asyncio.run(measure())


@pytest.mark.parametrize("name", list(HOSTILE))
async def test_the_worst_frame_of_each_endpoint_stalls_nobody(server, quiet, name):
    replies = []

    async def hostile() -> None:
        replies.append(await HOSTILE[name](server.base))

    async with aiohttp.ClientSession() as http:
        baseline = quiet
        if name in BENIGN_TWIN:
            baseline = Watch(http, server.base)
            await baseline.around(lambda: BENIGN_TWIN[name](server.base))
        watch = Watch(http, server.base)
        await watch.around(hostile)
    print(f"\n{name}: worst /health {watch.worst_health_ms:.1f} ms (quiet "
          f"{quiet.worst_health_ms:.1f}), beside ITL p99 {watch.itl_p99_ms:.1f} ms (quiet "
          f"{quiet.itl_p99_ms:.1f}, benign twin {baseline.itl_p99_ms:.1f}); reply "
          f"{str(replies[0])[:120]}")
    assert replies  # answered (a reply or an error with its code), never left hanging
    assert replies[0].get("status", 200) < 500 and replies[0].get("code") != "internal"
    assert watch.worst_health_ms < 1000 * HEALTH_BOUND_S
    # A coarse bound: it catches steps stalled by the hostile work (beside its twin the
    # ratio is ~1, 0.7-1.1 seen), not a few ms per token (32 ms of stop-string work per
    # token showed as 1.3-1.9: the stream beside gets several tokens a frame, which
    # spreads a slow step's gap over them).
    assert watch.itl_p99_ms <= 2 * baseline.itl_p99_ms
