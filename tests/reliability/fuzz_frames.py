"""Hypothesis strategies for WebSocket frames: (opcode, payload) pairs.

Junk frames (`json_frames`, `msgpack_frames`) are built so that they cannot start a
generation (a chat or generate always carries an invalid `max_tokens`). Hostile numbers
(`hostile_*`) sit alone in an otherwise valid frame, in every numeric field of every frame
type, so nothing else refuses the frame first; one may happen to be valid (a negative
penalty) and then generates a few tokens. `valid_requests` reach generation.
Sizes stay under the shared server's 65,536-byte frame limit (1009 is tested apart).
"""
from __future__ import annotations

import json
import math

import msgpack
from hypothesis import strategies as st

TEXT, BINARY = "text", "binary"
TYPES = ["chat", "generate", "cancel", "session.update", "session.history", "session.reset",
         "ping"]
FIELDS = ["id", "content", "prompt", "messages", "params", "system", "t", "role", "type"]
PARAMS = ["max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
          "presence_penalty", "frequency_penalty", "stop", "seed", "ignore_eos", "priority"]
BAD_MAX_TOKENS = [0, -1, 2**63 - 1, -(2**63), "many", 2.5, [1], {}, 1e308]  # msgpack-sized
NUMERIC_PARAMS = ["max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
                  "presence_penalty", "frequency_penalty", "seed", "priority", "stop_token_ids"]
# As JSON text: integers of 20 to 5,000 digits (a parser keeps up to 4,300 as a Python
# int, which no float holds beyond 309), beyond a double (1e308 * 10), the literals JSON
# lacks (the frame is then not JSON), negative. As msgpack: its extremes and the floats
# JSON lacks.
HOSTILE_JSON = st.one_of(
    st.integers(20, 5000).map(lambda digits: "1" + "0" * (digits - 1)),
    st.integers(20, 5000).map(lambda digits: "-" + "9" * digits),
    st.sampled_from(["1e309", "-1e309", "NaN", "Infinity", "-Infinity", "-1000", "-0.5"]))
HOSTILE_MSGPACK = [2**64 - 1, -(2**63), math.nan, math.inf, -math.inf, -1000, -0.5, 1e308]
HOLE = "@hostile-number@"  # where the number goes in a frame

huge_ints = st.integers(min_value=-(10**40), max_value=10**40)
scalars = (st.none() | st.booleans() | st.integers() | huge_ints
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=40))
json_values = st.recursive(
    scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids,
                                                                        max_size=4),
    max_leaves=12)
# msgpack can carry what JSON cannot (bytes, ext types) but no int beyond 64 bits.
mp_ints = st.integers(-(2**63), 2**64 - 1)
mp_scalars = (st.none() | st.booleans() | mp_ints
              | st.floats() | st.text(max_size=40) | st.binary(max_size=40)
              | st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=8)))
mp_values = st.recursive(
    mp_scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8),
                                                                          kids, max_size=4),
    max_leaves=12)


@st.composite
def messages(draw, values=json_values, numbers=huge_ints) -> dict:
    """Protocol-shaped maps: a real or junk type, known and unknown fields, wrong types,
    params with huge or odd values."""
    msg = {"type": draw(st.sampled_from(TYPES) | values)}
    for name in draw(st.lists(st.sampled_from(FIELDS) | st.text(max_size=6), max_size=4)):
        msg[name] = draw(values)
    if draw(st.booleans()):
        msg["params"] = {name: draw(values | numbers)
                         for name in draw(st.lists(st.sampled_from(PARAMS), max_size=4))}
    if msg["type"] in ("chat", "generate"):  # never a real generation: a bad max_tokens
        params = msg["params"] if isinstance(msg.get("params"), dict) else {}
        msg["params"] = {**params, "max_tokens": draw(st.sampled_from(BAD_MAX_TOKENS))}
    return msg


@st.composite
def huge_number_text(draw) -> str:
    digits = draw(st.integers(7, 5000))  # 9999999 is already over any max_tokens cap
    number = draw(st.sampled_from(["9" * digits, "-" + "9" * digits, f"1e{digits}",
                                   f"-1e-{digits}", "0." + "0" * digits + "1"]))
    where = draw(st.sampled_from(['{"type":"ping","t":%s}',
                                  '{"type":"generate","id":"n","prompt":"x","params":'
                                  '{"max_tokens":%s}}', '{"type":"cancel","id":%s}', "%s"]))
    return where % number


@st.composite
def deep_text(draw) -> str:
    depth = draw(st.integers(10, 10000))  # the map shape takes 6 bytes a level
    shape = draw(st.sampled_from(["list", "map", "inside"]))
    if shape == "list":
        return "[" * depth + "]" * depth
    if shape == "map":
        return '{"a":' * depth + "1" + "}" * depth
    return '{"type":"ping","t":' + "[" * depth + "]" * depth + "}"


@st.composite
def invalid_utf8(draw) -> bytes:
    """JSON-looking bytes with bytes that are not UTF-8 (lone continuation, overlong,
    surrogate, truncated sequences) spliced in."""
    bad = draw(st.sampled_from([b"\xff", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\x80",
                                b"\xf8\x88\x80\x80\x80"]))
    body = json.dumps(draw(messages())).encode()
    at = draw(st.integers(0, len(body)))
    return body[:at] + bad + body[at:]


@st.composite
def deep_msgpack(draw) -> bytes:
    depth = draw(st.integers(10, 20000))  # at most 3 bytes a level
    return draw(st.sampled_from([b"\x91" * depth + b"\xc0",
                                 b"\x81\xa1a" * depth + b"\xc0",
                                 b"\x82\xa4type\xa4ping\xa1t" + b"\x91" * depth + b"\xc0"]))


@st.composite
def bad_utf8_msgpack(draw) -> bytes:
    junk = draw(st.binary(min_size=1, max_size=20)) + b"\xff"
    field = draw(st.sampled_from([b"\xa4type", b"\xa2id", b"\xa7content"]))
    return b"\x82\xa4type\xa4chat" + field + bytes([0xA0 | len(junk)]) + junk


@st.composite
def hostile_message(draw) -> dict:
    """A valid frame of each type with HOLE in one of its numeric places."""
    kind = draw(st.sampled_from(["chat", "generate", "session.update", "ping", "cancel"]))
    if kind == "ping":
        return {"type": "ping", "t": HOLE}
    if kind == "cancel":
        return {"type": "cancel", "id": HOLE}
    name = draw(st.sampled_from(NUMERIC_PARAMS))
    params = {name: [HOLE] if name == "stop_token_ids" else HOLE}
    if kind == "session.update":
        return {"type": kind, "params": params}
    params = {"max_tokens": 2, **params}  # should the number be valid, a short generation
    where = draw(st.sampled_from(["params", "params", "params", "id"]
                                 + (["prompt"] if kind == "generate" else [])))
    msg = {"type": kind, "id": "hostile", "params": {"max_tokens": 2}}
    msg["content" if kind == "chat" else "prompt"] = "x"
    if where == "params":
        msg["params"] = params
    else:
        msg[where] = HOLE if where == "id" else [1, HOLE, 2]
    return msg


def hostile_json():
    return st.tuples(hostile_message(), HOSTILE_JSON).map(
        lambda m: (TEXT, json.dumps(m[0]).replace(f'"{HOLE}"', m[1])))


def hostile_msgpack():
    def fill(value, number):
        if value == HOLE:
            return number
        if isinstance(value, dict):
            return {k: fill(v, number) for k, v in value.items()}
        return [fill(v, number) for v in value] if isinstance(value, list) else value

    return st.tuples(hostile_message(), st.sampled_from(HOSTILE_MSGPACK)).map(
        lambda m: (BINARY, msgpack.packb(fill(*m))))


@st.composite
def valid_request(draw) -> dict:
    """A chat or generate that reaches generation (a few tokens); the test gives its id."""
    params = {"max_tokens": draw(st.integers(1, 3))}
    optional = {"temperature": st.floats(0, 2), "top_p": st.floats(0.05, 1),
                "top_k": st.integers(-1, 50), "min_p": st.floats(0, 0.5),
                "repetition_penalty": st.floats(0.5, 2), "presence_penalty": st.floats(-2, 2),
                "frequency_penalty": st.floats(-2, 2), "seed": st.integers(0, 2**63 - 1),
                # above 0 a client may not go (--max-client-priority): invalid_request
                "priority": st.integers(-100, 0), "ignore_eos": st.booleans(),
                "stop": st.text(min_size=1, max_size=4)}
    for name in draw(st.lists(st.sampled_from(sorted(optional)), max_size=4, unique=True)):
        params[name] = draw(optional[name])
    # One chat turn runs at a time per session (the rest answer `busy`): fewer chats, and
    # last, as Hypothesis leans towards the first choice.
    shape = draw(st.sampled_from(["text", "text", "messages", "token_ids", "token_ids", "chat"]))
    if shape == "chat":
        return {"type": "chat", "content": draw(st.text(min_size=1, max_size=20)),
                "params": params}
    prompt = {"text": {"prompt": draw(st.text(min_size=1, max_size=20))},
              "messages": {"messages": [{"role": "user", "content": "Hi"}]},
              "token_ids": {"prompt": draw(st.lists(st.integers(1, 40000), min_size=1,
                                                    max_size=8))}}[shape]
    return {"type": "generate", **prompt, "params": params}


def json_frames():
    """Frames for a JSON (text) socket."""
    return st.one_of(
        messages().map(lambda m: (TEXT, json.dumps(m))),
        json_values.map(lambda v: (TEXT, json.dumps(v))),  # arrays, scalars, junk maps
        huge_number_text().map(lambda t: (TEXT, t)),
        deep_text().map(lambda t: (TEXT, t)),
        st.text(max_size=200).map(lambda t: (TEXT, t)),  # not JSON at all
        messages().map(lambda m: (TEXT, json.dumps(m)[:-1])),  # truncated
        invalid_utf8().map(lambda b: (BINARY, b)),
        st.binary(max_size=512).map(lambda b: (BINARY, b)),
        hostile_json(), hostile_json(),
    )


def msgpack_frames():
    """Frames for a socket that chose the tokenwire.msgpack subprotocol."""
    return st.one_of(
        messages(mp_values, mp_ints).map(lambda m: (BINARY, msgpack.packb(m))),
        mp_values.map(lambda v: (BINARY, msgpack.packb(v))),
        st.binary(max_size=512).map(lambda b: (BINARY, b)),
        messages(mp_values, mp_ints).map(lambda m: (BINARY, msgpack.packb(m)[:-1])),  # truncated
        deep_msgpack().map(lambda b: (BINARY, b)),
        bad_utf8_msgpack().map(lambda b: (BINARY, b)),
        messages().map(lambda m: (TEXT, json.dumps(m))),  # text on a binary socket
        hostile_msgpack(), hostile_msgpack(),
    )
