"""Hypothesis fuzz of the WebSocket protocol against a live server process.

Over 10,000 generated frames (see fuzz_frames.py), FRAMES_PER_SOCKET per connection,
JSON and msgpack sockets. Each frame must get exactly one reply: an `error` with a code
DESIGN.md defines, or the answer of a harmless valid message (a session.update or reset
may answer after the batch's closing ping, once its save is done). The socket must stay
open, the server process alive with no traceback in its log, and a well-formed request
must work after. The explicit examples are frames that once killed a socket.
"""
from __future__ import annotations

import asyncio
import collections
import json

import aiohttp
import msgpack
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from .fuzz_frames import BINARY, TEXT, json_frames, msgpack_frames
from .harness import ERROR_CODES, FRAME_TIMEOUT_S, connect, generate_once

FRAMES_PER_SOCKET = 25
SOCKETS = 410  # 10,250 frames
HARMLESS_REPLIES = {"pong", "session.history", "session.updated"}
END = "fuzz-end-of-batch"


async def _exchange(server, binary: bool, frames: list[tuple[str, str | bytes]]) -> list[dict]:
    """Send the frames and a closing ping on one socket; the replies before its pong."""
    async with aiohttp.ClientSession() as http:
        if binary:
            ws = await _connect_msgpack(http, server)
        else:
            ws, _ = await connect(http, server)
        for opcode, payload in frames:
            await (ws.send_str(payload) if opcode == TEXT else ws.send_bytes(payload))
        ping = {"type": "ping", "t": END}
        await (ws.send_bytes(msgpack.packb(ping)) if binary else ws.send_json(ping))
        replies, ended = [], False
        # session.update/reset answer once the store has saved: possibly after the pong.
        while not ended or len(replies) < len(frames):
            msg = await asyncio.wait_for(ws.receive(), FRAME_TIMEOUT_S)
            assert msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), \
                (msg, replies[-3:])  # a close here means a frame killed the socket
            reply = msgpack.unpackb(msg.data) if binary else json.loads(msg.data)
            if reply.get("type") == "pong" and reply.get("t") == END:
                ended = True
            else:
                replies.append(reply)
        await ws.close()
    return replies


async def _connect_msgpack(http, server):
    ws = await http.ws_connect(server.ws_url, protocols=("tokenwire.msgpack",))
    assert ws.protocol == "tokenwire.msgpack"
    hello = msgpack.unpackb((await asyncio.wait_for(ws.receive(), FRAME_TIMEOUT_S)).data)
    assert hello["type"] == "hello", hello
    return ws


def _check(replies: list[dict], frames: list, tally: collections.Counter) -> None:
    assert len(replies) == len(frames), (len(replies), len(frames), replies[-3:])
    for reply, frame in zip(replies, frames):
        kind = reply.get("type")
        if kind == "error":
            assert reply.get("code") in ERROR_CODES, (reply, frame)
            tally[reply["code"]] += 1
        else:
            assert kind in HARMLESS_REPLIES, (reply, frame)
            tally[kind] += 1


def test_fuzzed_frames_get_defined_errors(shared_server, figures):
    tally: collections.Counter = collections.Counter()
    sent = [0, 0]  # frames, sockets
    log_before = shared_server.log().count("Traceback")

    # No shrinking: against a live server it takes minutes; the assertion messages
    # already name the frame and its reply.
    @settings(max_examples=SOCKETS, deadline=None, derandomize=True, database=None,
              phases=(Phase.explicit, Phase.generate), report_multiple_bugs=False,
              suppress_health_check=list(HealthCheck))
    @given(st.booleans().flatmap(lambda binary: st.tuples(st.just(binary), st.lists(
        msgpack_frames() if binary else json_frames(), min_size=FRAMES_PER_SOCKET,
        max_size=FRAMES_PER_SOCKET))))
    @example((False, [(TEXT, "[" * 10000 + "]" * 10000),
                      (TEXT, '{"type":"session.update","params":{"stop":5}}'),
                      (TEXT, '{"type":"chat","id":"c","content":"x","params":{"stop":true}}'),
                      (TEXT, '{"type":"generate","id":"g","prompt":"x",'
                             '"params":{"stop_token_ids":1.5}}')]))
    @example((True, [(BINARY, b"\x91" * 20000 + b"\xc0")]))
    def batch(case):
        binary, frames = case
        sent[0] += len(frames)
        sent[1] += 1
        _check(asyncio.run(_exchange(shared_server, binary, frames)), frames, tally)

    try:
        batch()
    finally:
        alive = shared_server.proc.poll() is None
        tracebacks = shared_server.log().count("Traceback") - log_before
        figures("fuzz (hypothesis frames)", tried=sent[0], survived=sum(tally.values()),
                lost=sent[0] - sum(tally.values()),
                notes=f"{sent[1]} sockets (JSON and msgpack); replies by code: "
                      f"{dict(sorted(tally.items()))}; server alive: {alive}; "
                      f"tracebacks logged: {tracebacks}")
    assert sent[0] >= 10_000
    assert alive and tracebacks == 0, shared_server.log()[-3000:]
    end = asyncio.run(generate_once(shared_server, 4))
    assert end["type"] == "done" and end["usage"]["completion_tokens"] == 4, end
