"""Every wire format replays a recorded session to the same frames.

Each test drives one scripted session (the happy paths and the client errors of its
protocol) against the shared server and compares the normalized log with the recording
in tests/gateway/replay/ (see wire_replay.py for what normalization masks). A change in
any field, its order, an error's code or message, or the sequence of frames fails it.

To record anew after a deliberate wire change: TOKENWIRE_RECORD_REPLAY=1 and run this
file; review the diff of the JSON files like code.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import aiohttp
import pytest

from wire_replay import (GREEDY, Normalizer, SocketRecorder, http_entry, merge_deltas, of_type,
                         terminal)

REPLAY_DIR = Path(__file__).parent / "replay"
FRANCE = "What is the capital of France? Answer in one sentence."


def terse(tag: str) -> str:
    """A system prompt of this test alone: its first KV block is shared with no other
    test, so `cached_tokens` counts only what this script itself cached."""
    return f"Replay {tag}: you are terse."


def check(name: str, log: list, session_ids: set[str]) -> None:
    normalized = Normalizer(session_ids)([list(e) for e in merge_deltas(log)])
    path = REPLAY_DIR / f"{name}.json"
    if os.environ.get("TOKENWIRE_RECORD_REPLAY"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(normalized, indent=1, ensure_ascii=False) + "\n")
    recorded = json.loads(path.read_text())
    for i, (got, want) in enumerate(zip(normalized, recorded)):
        # As text, so that the order of a frame's fields counts too.
        assert json.dumps(got) == json.dumps(want), f"entry {i} differs from {path.name}"
    assert len(normalized) == len(recorded)


async def _v1_script(rec: SocketRecorder, tag: str) -> None:
    """Protocol v1: every client message type, chat turns, generate, and client errors."""
    await rec.send({"type": "ping", "t": 7})
    await rec.recv()
    await rec.send({"type": "session.update", "system": terse(tag),
                    "params": {"temperature": 0, "max_tokens": 3}})
    await rec.until(of_type("session.updated", "error"))
    for i, content in enumerate([FRANCE, "And of Italy?"]):
        await rec.send({"type": "chat", "id": f"t{i}", "content": content,
                        "params": {"ignore_eos": True}})
        await rec.until(terminal(f"t{i}"))
    await rec.send({"type": "session.history"})
    await rec.until(of_type("session.history"))
    await rec.send({"type": "generate", "id": "g1", "prompt": "The capital of France is",
                    "params": {**GREEDY, "logprobs": 2}})
    await rec.until(terminal("g1"))
    await rec.send({"type": "generate", "id": "g2", "params": GREEDY, "messages": [
        {"role": "developer", "content": terse(tag + " generate")},
        {"role": "user", "content": [{"type": "text", "text": "Replay: name a colour."}]}]})
    await rec.until(terminal("g2"))
    await rec.send({"type": "generate", "id": "g3", "prompt": [504, 3575, 282, 4649, 314],
                    "params": GREEDY})
    await rec.until(terminal("g3"))
    for bad in _V1_ERRORS:
        await rec.send(bad)
        await rec.until(of_type("error"))
    await rec.send({"type": "session.reset"})
    await rec.until(of_type("session.updated", "error"))


_V1_ERRORS = [
    "{not json", "[1, 2]", {"id": "x"}, {"type": "bogus", "id": "b1"},
    {"type": "chat", "id": "e1"}, {"type": "chat", "id": "e2", "content": 5},
    {"type": "chat", "id": "e3", "content": "hi", "extra": 1},
    {"type": "chat", "id": "e4", "content": "hi", "params": {"temperature": "hot"}},
    {"type": "chat", "id": "e5", "content": "hi", "params": {"top_p": 2}},
    {"type": "chat", "id": "e6", "content": "hi", "params": {"nope": 1}},
    {"type": "chat", "id": "e7", "content": "hi", "params": {"max_tokens": 10**6}},
    {"type": "chat", "id": "e8", "content": "hi", "params": {"stop": [1]}},
    {"type": "chat", "id": "e9", "content": "hi",
     "params": {"response_format": {"type": "xml"}}},
    {"type": "generate", "id": "e10", "prompt": "a", "messages": []},
    {"type": "generate", "id": "e11", "prompt": ""},
    {"type": "generate", "id": "e12", "messages": [{"role": "robot", "content": "x"}]},
    {"type": "generate", "id": "e13", "messages": [
        {"role": "user", "content": [{"type": "image_url"}]}]},
    {"type": "generate", "id": "e14", "prompt": [10**9], "params": GREEDY},
    {"type": "generate", "id": "e15", "prompt": "a", "params": {"logprobs": 99}},
    {"type": "generate", "id": "x" * 200, "prompt": "a"},
    {"type": "cancel", "id": "nothing"},
    {"type": "session.update", "params": {"temperature": -1}},
]


async def test_protocol_v1_json_replays(base_url):
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(base_url + "/v1/ws")
        rec = SocketRecorder(ws)
        hello = await rec.recv()
        await _v1_script(rec, "v1 json")
        await ws.close()
    check("v1_json", rec.log, {hello["session_id"]})


async def test_protocol_v1_msgpack_replays(base_url):
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(base_url + "/v1/ws", protocols=("tokenwire.msgpack",))
        rec = SocketRecorder(ws, binary=True)
        hello = await rec.recv()
        await rec.send({"type": "session.update", "system": terse("v1 msgpack")})
        await rec.until(of_type("session.updated"))
        await rec.send({"type": "chat", "id": "m1", "content": FRANCE, "params": GREEDY})
        await rec.until(terminal("m1"))
        await rec.send({"type": "generate", "id": "m2", "prompt": "The capital of France is",
                        "params": {**GREEDY, "logprobs": 1}})
        await rec.until(terminal("m2"))
        await rec.send('{"type": "ping"}')  # a text frame on a msgpack socket
        await rec.until(of_type("error"))
        await rec.send({"type": "ping", "t": b"\x00"})
        await rec.recv()
        await ws.close()
    check("v1_msgpack", rec.log, {hello["session_id"]})


def _user_item(text: str, **fields) -> dict:
    return {"type": "message", "role": "user", "content": [{"type": "input_text",
                                                             "text": text}], **fields}


async def test_realtime_replays(base_url):
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(base_url + "/v1/realtime?model=default",
                                   protocols=("realtime",))
        rec = SocketRecorder(ws)
        created = await rec.recv()
        await _realtime_script(rec)
        await ws.close()
    check("realtime", rec.log, {created["session"]["id"]})


async def _realtime_script(rec: SocketRecorder) -> None:
    done = of_type("response.done")
    await rec.send({"type": "session.update", "event_id": "c1", "session": {
        "type": "realtime", "instructions": terse("realtime"), "max_output_tokens": 3,
        "temperature": 0}})
    await rec.until(of_type("session.updated"))
    await rec.send({"type": "conversation.item.create", "event_id": "c2",
                    "item": _user_item(FRANCE, id="item_user1")})
    await rec.until(of_type("conversation.item.done"))
    await rec.send({"type": "response.create", "event_id": "c3"})
    last = await rec.until(done)
    reply_id = last["response"]["output"][0]["id"]
    await rec.send({"type": "conversation.item.retrieve", "event_id": "c4",
                    "item_id": reply_id})
    await rec.until(of_type("conversation.item.retrieved"))
    await rec.send({"type": "conversation.item.truncate", "event_id": "c5",
                    "item_id": reply_id, "content_index": 0, "audio_end_ms": 3})
    await rec.until(of_type("conversation.item.truncated"))
    await rec.send({"type": "response.create", "event_id": "c6", "response": {
        "conversation": "none", "metadata": {"topic": "colours"},
        "instructions": terse("realtime out-of-band"),
        "input": [{"type": "item_reference", "id": "item_user1"},
                  _user_item("Replay: name a colour.")]}})
    await rec.until(done)
    await rec.send({"type": "conversation.item.delete", "event_id": "c7",
                    "item_id": reply_id})
    await rec.until(of_type("conversation.item.deleted"))
    for bad in _REALTIME_ERRORS:
        await rec.send(bad)
        await rec.until(of_type("error"))


_REALTIME_ERRORS = [
    "not json", {"type": "bogus.event", "event_id": "e1"},
    {"type": "response.create", "event_id": "e2", "response": {"max_output_tokens": "x"}},
    {"type": "response.create", "event_id": "e3", "response": {"max_output_tokens": 10**6}},
    {"type": "response.create", "event_id": "e4", "response": {"temperature": 900}},
    {"type": "response.create", "event_id": "e5", "response": {"conversation": "other"}},
    {"type": "session.update", "event_id": "e6", "session": {"type": "realtime", "audio": {}}},
    {"type": "session.update", "event_id": "e7", "session": {
        "type": "realtime", "output_modalities": ["audio"]}},
    {"type": "conversation.item.create", "event_id": "e8", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_audio"}]}},
    {"type": "conversation.item.create", "event_id": "e9", "item": {"type": "message"}},
    {"type": "conversation.item.create", "event_id": "e10",
     "item": _user_item("x", id="item_user1")},
    {"type": "conversation.item.delete", "event_id": "e11", "item_id": "nope"},
    {"type": "conversation.item.retrieve", "event_id": "e12", "item_id": "nope"},
    {"type": "conversation.item.truncate", "event_id": "e13", "item_id": "item_user1",
     "content_index": 0, "audio_end_ms": 1},
    {"type": "response.cancel", "event_id": "e14"},
    {"type": "response.cancel", "event_id": "e15", "response_id": "resp_x"},
    {"type": "input_audio_buffer.commit", "event_id": "e16"},
    {"type": "response.create", "event_id": "e17", "response": {
        "input": [{"type": "item_reference"}]}},
]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "sse"])
async def test_openai_http_replays(base_url, stream):
    log = []
    async with aiohttp.ClientSession() as http:
        for method, path, body in _http_script(stream):
            log.append(await http_entry(http, method, base_url, path, body))
    check(f"http_{'sse' if stream else 'whole'}", log, set())


def _http_script(stream: bool) -> list[tuple]:
    chat = {"model": "default", "temperature": 0, "max_tokens": 3, "stream": stream,
            "messages": [{"role": "system", "content": terse(f"http {stream}")},
                         {"role": "user", "content": FRANCE}]}
    completion = {"model": "default", "temperature": 0, "max_tokens": 3, "stream": stream,
                  "prompt": "The capital of France is"}
    usage = {"stream_options": {"include_usage": True}} if stream else {}
    return [
        ("GET", "/v1/models", None),
        ("GET", "/health", None),
        ("GET", "/ready", None),
        ("POST", "/v1/chat/completions", {**chat, **usage}),
        ("POST", "/v1/chat/completions", {**chat, "logprobs": True, "top_logprobs": 2,
                                          "max_completion_tokens": 2, "seed": 3, "user": "u"}),
        ("POST", "/v1/completions", {**completion, **usage, "logprobs": 2, "echo": True}),
        ("POST", "/v1/completions", {**completion, "n": 2,
                                     "prompt": ["The capital of France is", [504, 3575]]}),
        ("POST", "/v1/chat/completions", "{broken"),
        ("POST", "/v1/chat/completions", {**chat, "nope": 1}),
        ("POST", "/v1/chat/completions", {**chat, "temperature": 500}),
        ("POST", "/v1/chat/completions", {**chat, "top_logprobs": 2}),
        ("POST", "/v1/chat/completions", {**chat, "max_completion_tokens": 10**6}),
        ("POST", "/v1/chat/completions", {**chat, "logit_bias": {"42": 5}}),
        ("POST", "/v1/chat/completions", {**chat, "messages": []}),
        ("POST", "/v1/chat/completions", {**chat, "tools": [{"type": "function", "function": {
            "name": "f", "parameters": {"type": "object"}}}]}),
        ("POST", "/v1/completions", {**completion, "prompt": [[10**9]]}),
        ("POST", "/v1/completions", {**completion, "prompt": []}),
        ("POST", "/v1/completions", {**completion, "n": 99}),
        ("POST", "/v1/completions", {**completion, "suffix": "x"}),
        ("POST", "/v1/completions", {**completion, "response_format": {"type": "xml"}}),
    ]
