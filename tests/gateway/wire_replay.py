"""Recorded sessions of every wire format, normalized so that two runs compare equal.

A script drives a real client against a real server and logs every frame both ways:
("send", frame) and ("recv", frame), or for HTTP one ("http", request, answer) entry.
`normalize` keeps every byte the gateway decides (field names and their order, types,
error codes and messages, token counts, finish reasons) and masks what legitimately
differs between runs:

    timing, created, instance          -> "<masked>"
    server-made ids (session, resp_*,   -> "<id1>", "<id2>", ... by first appearance, so
      item_*, event_*, chatcmpl-*, ...)    an id that recurs still has to match itself
    floats (logprobs)                  -> "<float>"
    top-k alternatives' tokens         -> "<token>"  (their order may swap on near ties)
    consecutive deltas of one stream   -> merged into one (how many tokens share a frame
                                          depends on how fast the reader drains)

The generated text itself is kept: every request is greedy and at most a few tokens long
on prompts whose first tokens are decisive, so it is the same on each CPU kernel path.
"""
from __future__ import annotations

import json
import re

import aiohttp
import msgpack

GREEDY = {"temperature": 0, "max_tokens": 3, "ignore_eos": True}
_MASKED_KEYS = {"timing", "created", "instance", "created_at"}
_ID_PATTERNS = re.compile(r"^(?:(?:resp|item|conv|event)_[0-9a-f]+|event_\d+|"
                          r"(?:chatcmpl|cmpl)-[0-9a-f]{24})$")
_TOP_KEYS = {"top", "top_logprobs"}


class Normalizer:
    """Masks one recording; ids map to placeholders in order of first appearance."""

    def __init__(self, session_ids: set[str] = frozenset()):
        self._ids: dict[str, str] = {}
        self._session_ids = set(session_ids)

    def __call__(self, value, key: str | None = None, in_top: bool = False):
        if key in _MASKED_KEYS:
            return "<masked>"
        if isinstance(value, dict):
            return {k: self(v, k, in_top or k in _TOP_KEYS) for k, v in value.items()}
        if isinstance(value, list):
            return [self(v, key, in_top) for v in value]
        if isinstance(value, float):
            return "<float>"
        if isinstance(value, bytes):  # msgpack's bin type, as JSON can hold it
            return {"<bytes>": value.hex()}
        if isinstance(value, str):
            if value in self._session_ids or _ID_PATTERNS.match(value):
                return self._ids.setdefault(value, f"<id{len(self._ids) + 1}>")
            if in_top and key in ("token",):
                return "<token>"
        if in_top and key in ("token_id", "bytes"):
            return "<token>"
        return value


def merge_deltas(entries: list) -> list:
    """Consecutive received deltas of one stream as one (text joined, counts summed)."""
    merged: list = []
    for entry in entries:
        last = merged[-1] if merged else None
        if last is not None and last[0] == "recv" == entry[0] and _same_stream(last[1], entry[1]):
            merged[-1] = ("recv", _join(last[1], entry[1]))
        else:
            merged.append(entry)
    return merged


def _same_stream(a: dict, b: dict) -> bool:
    if a.get("type") != b.get("type"):
        return False
    if a["type"] == "delta":
        return a["id"] == b["id"]
    if a["type"] == "response.output_text.delta":
        return a["item_id"] == b["item_id"]
    return False


def _join(a: dict, b: dict) -> dict:
    joined = dict(a)
    if a["type"] == "delta":
        joined["text"] = a["text"] + b["text"]
        joined["n"] = a["n"] + b["n"]
        if "logprobs" in a:
            joined["logprobs"] = a["logprobs"] + b["logprobs"]
    else:
        joined["delta"] = a["delta"] + b["delta"]
    return joined


def merge_sse_chunks(events: list) -> list:
    """Consecutive SSE content chunks of one choice as one (content joined)."""
    merged: list = []
    for event in events:
        last = merged[-1] if merged else None
        if last is not None and _mergeable_chunk(last) and _mergeable_chunk(event) \
                and last["choices"][0]["index"] == event["choices"][0]["index"]:
            merged[-1] = _join_chunk(last, event)
        else:
            merged.append(event)
    return merged


def _mergeable_chunk(event) -> bool:
    if not isinstance(event, dict) or len(event.get("choices") or ()) != 1:
        return False
    choice = event["choices"][0]
    body = choice.get("delta", choice.get("text"))
    has_text = (isinstance(body, str) and body) or (isinstance(body, dict)
                                                    and set(body) == {"content"})
    return bool(has_text) and choice["finish_reason"] is None


def _join_chunk(a: dict, b: dict) -> dict:
    joined = json.loads(json.dumps(a))
    ca, cb = joined["choices"][0], b["choices"][0]
    if "delta" in ca:
        ca["delta"]["content"] += cb["delta"]["content"]
    else:
        ca["text"] += cb["text"]
    lp_a, lp_b = ca.get("logprobs"), cb.get("logprobs")
    if lp_a is not None and lp_b is not None:
        for field, values in lp_b.items():
            if isinstance(values, list):
                lp_a[field] = lp_a[field] + values
    return joined


# -- recorders ---------------------------------------------------------------------------
class SocketRecorder:
    """A real WebSocket client that logs every frame it sends and receives."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, binary: bool = False):
        self.ws = ws
        self.binary = binary
        self.log: list = []

    async def send(self, frame: dict | str) -> None:
        self.log.append(("send", frame))
        if isinstance(frame, str):  # raw text, as a broken client sends it
            await self.ws.send_str(frame)
        elif self.binary:
            await self.ws.send_bytes(msgpack.packb(frame))
        else:
            await self.ws.send_str(json.dumps(frame))

    async def recv(self, timeout: float = 60.0) -> dict:
        msg = await self.ws.receive(timeout)
        if msg.type == aiohttp.WSMsgType.BINARY:
            frame = msgpack.unpackb(msg.data)
        elif msg.type == aiohttp.WSMsgType.TEXT:
            frame = json.loads(msg.data)
        else:
            raise AssertionError(f"socket ended: {msg}")
        self.log.append(("recv", frame))
        return frame

    async def until(self, done) -> dict:
        """Receive until a frame for which done(frame) holds; returns it."""
        while True:
            frame = await self.recv()
            if done(frame):
                return frame


def terminal(request_id: str):
    return lambda f: f.get("id") == request_id and f["type"] in ("done", "error")


def of_type(*kinds: str):
    return lambda f: f["type"] in kinds


async def http_entry(http: aiohttp.ClientSession, method: str, url: str, path: str,
                     body: dict | str | None = None) -> tuple:
    """One HTTP exchange: (request, {status, content_type, body or SSE events})."""
    kwargs = {"data": body} if isinstance(body, str) else {"json": body}
    async with http.request(method, url + path, **kwargs) as resp:
        raw = await resp.read()
        answer = {"status": resp.status, "content_type": resp.content_type}
        if resp.content_type == "text/event-stream":
            events = [part.removeprefix("data: ") for part in raw.decode().split("\n\n") if part]
            answer["events"] = merge_sse_chunks(
                [e if e == "[DONE]" else json.loads(e) for e in events])
        elif resp.content_type == "application/json":
            answer["body"] = json.loads(raw)
        else:
            answer["size"] = len(raw)
    return ("http", {"method": method, "path": path, "body": body}, answer)
