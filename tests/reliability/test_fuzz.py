"""Hypothesis fuzz of the WebSocket protocol (and of HTTP bodies) against a live server.

CI sends 1,000 generated frames, FRAMES_PER_SOCKET per connection, JSON and msgpack
sockets; the full run sends 10,250 (TOKENWIRE_FUZZ_EXAMPLES=410, sockets: a few minutes).
A third of them are valid chat and generate requests that reach generation; the rest are
junk frames and frames valid but for one hostile number (see fuzz_frames.py). Every frame
must get exactly one terminal reply: `done`, or an `error` with a code docs/protocol.md
defines (never `internal`: that is a server fault), or the answer of a harmless message (a
session.update or reset may answer after the batch's closing ping, once its save is done).
Each valid request's terminal reply carries its id. The socket must stay open, the server
alive with no traceback in its log and every KV block free at the end. The explicit
examples are known crashers (deep nesting, huge numbers, ill-typed params), sent first on
every run so that one coming back fails at once.
"""
from __future__ import annotations

import asyncio
import collections
import json
import os

import aiohttp
import msgpack
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from .fuzz_frames import BINARY, TEXT, json_frames, msgpack_frames, valid_request
from .harness import ERROR_CODES, FRAME_TIMEOUT_S, connect, generate_once, settle

JUNK_PER_SOCKET, VALID_PER_SOCKET = 16, 9  # 9 of 25: over a third reach generation
FRAMES_PER_SOCKET = JUNK_PER_SOCKET + VALID_PER_SOCKET
# Hypothesis examples, one socket each. CI's 40 reach every frame kind and generation
# in seconds; set TOKENWIRE_FUZZ_EXAMPLES=410 (10,250 frames) for the full-length run.
SOCKETS = int(os.environ.get("TOKENWIRE_FUZZ_EXAMPLES", "40"))
TERMINAL = {"done", "error", "pong", "session.history", "session.updated"}
END = "fuzz-end-of-batch"


def _encode(binary: bool, msg: dict) -> tuple[str, str | bytes]:
    return (BINARY, msgpack.packb(msg)) if binary else (TEXT, json.dumps(msg))


@st.composite
def batches(draw):
    """(binary, frames): frames are (opcode, payload, id of a valid request or None)."""
    binary = draw(st.booleans())
    junk = draw(st.lists(msgpack_frames() if binary else json_frames(),
                         min_size=JUNK_PER_SOCKET, max_size=JUNK_PER_SOCKET))
    frames = [(*frame, None) for frame in junk]
    for i in range(VALID_PER_SOCKET):
        request_id = f"valid-{i}"
        frames.append((*_encode(binary, {**draw(valid_request()), "id": request_id}),
                       request_id))
    return binary, draw(st.permutations(frames))


async def _exchange(server, binary: bool, frames: list) -> list[dict]:
    """Send the frames and a closing ping on one socket; every reply but that pong, up to
    one terminal reply per frame (deltas included)."""
    async with aiohttp.ClientSession() as http:
        if binary:
            ws = await _connect_msgpack(http, server)
        else:
            ws, _ = await connect(http, server)
        for opcode, payload, _ in frames:
            await (ws.send_str(payload) if opcode == TEXT else ws.send_bytes(payload))
        ping = {"type": "ping", "t": END}
        await (ws.send_bytes(msgpack.packb(ping)) if binary else ws.send_json(ping))
        replies, ended, terminal = [], False, 0
        while not ended or terminal < len(frames):
            msg = await asyncio.wait_for(ws.receive(), FRAME_TIMEOUT_S)
            assert msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), \
                (msg, replies[-3:])  # a close here means a frame killed the socket
            reply = msgpack.unpackb(msg.data) if binary else json.loads(msg.data)
            if reply.get("type") == "pong" and reply.get("t") == END:
                ended = True
                continue
            replies.append(reply)
            terminal += reply.get("type") in TERMINAL
        await ws.close()
    return replies


async def _connect_msgpack(http, server):
    ws = await http.ws_connect(server.ws_url, protocols=("tokenwire.msgpack",))
    assert ws.protocol == "tokenwire.msgpack"
    hello = msgpack.unpackb((await asyncio.wait_for(ws.receive(), FRAME_TIMEOUT_S)).data)
    assert hello["type"] == "hello", hello
    return ws


def _check(replies: list[dict], frames: list, tally: collections.Counter,
           valid: collections.Counter) -> None:
    """tally: terminal replies by kind or code; valid: how valid requests ended."""
    terminal = [r for r in replies if r.get("type") != "delta"]
    assert len(terminal) == len(frames), (len(terminal), len(frames), replies[-3:])
    for reply in terminal:
        kind = reply.get("type")
        assert kind in TERMINAL, reply
        if kind == "error":
            assert reply.get("code") in ERROR_CODES - {"internal"}, reply
        tally[reply["code"] if kind == "error" else kind] += 1
    for *_, request_id in frames:
        if request_id is None:
            continue
        ends = [i for i, r in enumerate(replies) if r.get("id") == request_id
                and r.get("type") in ("done", "error")]
        assert len(ends) == 1, (request_id, [replies[i] for i in ends])
        deltas = [i for i, r in enumerate(replies) if r.get("id") == request_id
                  and r.get("type") == "delta"]
        assert all(i < ends[0] for i in deltas), request_id  # nothing after the end
        end = replies[ends[0]]
        if end["type"] == "done":
            valid["done with tokens" if end["usage"]["completion_tokens"] else "done"] += 1
        else:
            valid[end["code"]] += 1


# A 400-digit integer in a float param, alone in an otherwise valid request.
HUGE_TEMPERATURE = ('{"type":"generate","id":"h","prompt":"x","params":{"max_tokens":2,'
                    '"temperature":1' + "0" * 400 + "}}")


def test_fuzzed_frames_get_defined_errors(shared_server, figures):
    tally: collections.Counter = collections.Counter()
    valid: collections.Counter = collections.Counter()
    sent = [0, 0, 0]  # frames, valid requests, sockets
    log_before = shared_server.log().count("Traceback")

    # No shrinking: against a live server it takes minutes; the assertion messages
    # already name the frame and its reply.
    @settings(max_examples=SOCKETS, deadline=None, derandomize=True, database=None,
              phases=(Phase.explicit, Phase.generate), report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck))
    @given(batches())
    @example((False, [(TEXT, HUGE_TEMPERATURE, None)]))
    @example((False, [(TEXT, "[" * 10000 + "]" * 10000, None),
                      (TEXT, '{"type":"session.update","params":{"stop":5}}', None),
                      (TEXT, '{"type":"chat","id":"c","content":"x","params":{"stop":true}}',
                       None),
                      (TEXT, '{"type":"generate","id":"g","prompt":"x",'
                             '"params":{"stop_token_ids":1.5}}', None)]))
    @example((True, [(BINARY, b"\x91" * 20000 + b"\xc0", None)]))
    def batch(case):
        binary, frames = case
        sent[0] += len(frames)
        sent[1] += sum(request_id is not None for *_, request_id in frames)
        sent[2] += 1
        _check(asyncio.run(_exchange(shared_server, binary, frames)), frames, tally, valid)

    try:
        batch()
    finally:
        alive = shared_server.proc.poll() is None
        tracebacks = shared_server.log().count("Traceback") - log_before
        generated = valid["done with tokens"]
        answered = sum(tally.values())
        figures("fuzz (hypothesis frames)", tried=sent[0], survived=answered,
                lost=sent[0] - answered,
                notes=f"{sent[2]} sockets (JSON and msgpack); {sent[1]} valid requests "
                      f"ended: {dict(sorted(valid.items()))}; terminal replies by kind: "
                      f"{dict(sorted(tally.items()))}; server alive: {alive}; "
                      f"tracebacks logged: {tracebacks}")
    assert sent[0] >= SOCKETS * FRAMES_PER_SOCKET and sent[1] * 3 >= sent[0]
    assert generated >= sent[0] // 4, (generated, sent)  # most valid requests generate
    assert alive and tracebacks == 0, shared_server.log()[-3000:]
    assert asyncio.run(_blocks_free(shared_server)), "KV blocks still held after the fuzz"
    end = asyncio.run(generate_once(shared_server, 4))
    assert end["type"] == "done" and end["usage"]["completion_tokens"] == 4, end


async def _blocks_free(server) -> bool:
    want = {"tokenwire_kv_cache_usage_ratio": 0.0, "tokenwire_requests_running": 0.0,
            "tokenwire_requests_waiting": 0.0}
    async with aiohttp.ClientSession() as http:
        values = await settle(http, server, want)
    return all(values.get(k) == v for k, v in want.items())
