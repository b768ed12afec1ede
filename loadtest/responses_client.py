"""Agent tool chains on `/v1/responses` for `tokenwire loadtest --endpoint responses(-ws)`.

A session is a tool chain: its first turn is a user message, each later turn the output
of the tool the model called in the turn before (a `function_call_output` answering its
`call_id`, the turn's prompt text as the tool's result). Every turn forces a call
(`tool_choice` naming the one function), so a chain never ends early. The ways an agent
has to send the chain:

    ws      WebSocket mode (GET /v1/responses): `response.create` events with
            previous_response_id, one socket per chain
    ws-local  the same with store false: the socket keeps the chain's last response in
            memory (OpenAI's WebSocket mode keeps it so), the store is never touched
    chain   HTTP POST (SSE) with previous_response_id: the server keeps the history
    resend  HTTP POST (SSE) with store false, `input` the whole history so far

TTFT is taken at the first output event of a turn (a text delta or a call's arguments):
the gateway sends a call whole once it parses, so a forced call's TTFT includes its decode.
A stateless prompt (the random dataset) is a chain of one turn.
"""
from __future__ import annotations

import json
import time
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from loadtest.datasets import Prompt
from loadtest.http_client import STATUS_CODES, fetch_model
from loadtest.records import RequestRecord

TOOL = {"type": "function", "name": "lookup", "description": "Look a word up",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "maxLength": 16}},
            "required": ["query"], "additionalProperties": False}, "strict": True}
FORCED = {"type": "function", "name": "lookup"}
# end event -> the finish_reason the metrics use
_FINISH = {"response.completed": "stop", "response.incomplete": "length",
           "response.failed": "error"}
_DELTAS = ("response.output_text.delta", "response.function_call_arguments.delta")
MODES = ("ws", "chain", "resend", "ws-local")


class ToolChain:
    """One chain's state: the last response and call, and (for `resend`) every item."""

    def __init__(self, backend: ResponsesBackend):
        self.backend = backend
        self.previous: str | None = None
        self.call_id: str | None = None
        self.history: list[dict] = []
        self.ws: aiohttp.ClientWebSocketResponse | None = None  # mode ws: the chain's socket

    def body(self, prompt: Prompt) -> dict:
        """The create body of the next turn."""
        if self.call_id is None:
            items = [{"type": "message", "role": "user", "content": prompt.text}]
        else:
            items = [{"type": "function_call_output", "call_id": self.call_id,
                      "output": json.dumps({"result": prompt.text})}]
        body = {"model": self.backend.model, "tools": [TOOL], "tool_choice": FORCED,
                "max_output_tokens": prompt.output_len,
                "temperature": self.backend.temperature}
        if self.backend.mode == "resend":
            self.history += items
            return {**body, "input": list(self.history), "store": False}
        if self.backend.mode == "ws-local":
            body["store"] = False
        return {**body, "input": items, "previous_response_id": self.previous}

    def answered(self, response: dict, record: RequestRecord) -> None:
        """Keep what the next turn needs; a turn without a call fails (the chain cannot go
        on: too few --random-output-len tokens for the call, most likely)."""
        calls = [item for item in response.get("output") or []
                 if item.get("type") == "function_call"]
        if record.success and not calls:
            record.fail("no_tool_call", f"response {response.get('id')} called no tool")
        if not calls:
            return
        self.previous, self.call_id = response.get("id"), calls[-1]["call_id"]
        self.history += response["output"]

    async def turn(self, prompt: Prompt, record: RequestRecord) -> None:
        body = self.body(prompt)
        response = await self.backend.send(self, body, record)
        if response is not None:
            self.answered(response, record)

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()


def fold(event: dict, now: float, record: RequestRecord) -> dict | None:
    """Fold one server event into the record; the Response at the end event (or {} when an
    error ended the turn), else None."""
    kind = event.get("type")
    if kind in _DELTAS:
        record.add_chunk(now, event["delta"], 1)  # no token count per event: usage wins
    elif kind == "error":
        error = event.get("error") or {}
        record.fail(error.get("code") or "error", error.get("message", ""))
        return {}
    elif kind in _FINISH:
        response = event["response"]
        usage = response.get("usage") or {}
        record.usage_prompt_tokens = usage.get("input_tokens")
        record.usage_completion_tokens = usage.get("output_tokens")
        record.usage_cached_tokens = (usage.get("input_tokens_details") or {}).get(
            "cached_tokens")
        record.finish(now, _FINISH[kind])
        if not record.success:
            record.fail("failed", json.dumps(response.get("error"))[:200])
        return response
    return None


class ResponsesBackend:
    """The load tester's backend for /v1/responses; `mode` is one of MODES."""

    def __init__(self, url: str, mode: str, model: str | None, temperature: float,
                 connect_timeout_s: float = 30.0):
        parts = urlsplit(url)
        scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
        path = parts.path.rstrip("/").removesuffix("/responses")
        self.base_url = urlunsplit((scheme, parts.netloc, path, "", ""))
        self.ws_url = urlunsplit(({"http": "ws", "https": "wss"}[scheme], parts.netloc,
                                  path + "/responses", "", ""))
        self.mode, self.model, self.temperature = mode, model, temperature
        self.connect_timeout_s = connect_timeout_s
        self.http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        if self.model is None:
            self.model = await fetch_model(self.http, self.base_url)

    async def complete(self, prompt: Prompt, record: RequestRecord) -> None:
        chain = await self.open_session()
        try:
            await chain.turn(prompt, record)
        finally:
            await chain.close()

    async def open_session(self) -> ToolChain:
        return ToolChain(self)

    async def send(self, chain: ToolChain, body: dict, record: RequestRecord) -> dict | None:
        if self.mode.startswith("ws"):
            return await self._over_socket(chain, body, record)
        return await self._over_http(body, record)

    async def _over_socket(self, chain: ToolChain, body: dict,
                           record: RequestRecord) -> dict | None:
        """One response.create on the chain's socket (opened at its first turn, as an
        agent opens it before it sends anything: the dial is not in the turn's time)."""
        ws = chain.ws
        if ws is None or ws.closed:
            try:
                ws = chain.ws = await self.http.ws_connect(
                    self.ws_url, timeout=aiohttp.ClientWSTimeout(ws_receive=None,
                                                                 ws_close=5.0),
                    max_msg_size=0)
            except (aiohttp.ClientError, TimeoutError) as exc:
                record.fail("connect_failed", repr(exc))
                return None
        record.start = time.perf_counter()
        await ws.send_str(json.dumps({"type": "response.create", **body}))
        async for raw in ws:
            if raw.type == aiohttp.WSMsgType.TEXT:
                response = fold(json.loads(raw.data), time.perf_counter(), record)
                if response is not None:
                    return response
        record.fail("disconnected", "socket closed")
        return None

    async def _over_http(self, body: dict, record: RequestRecord) -> dict | None:
        record.start = time.perf_counter()
        try:
            async with self.http.post(f"{self.base_url}/responses",
                                      json={**body, "stream": True}) as resp:
                if resp.status != 200:
                    record.fail(STATUS_CODES.get(resp.status, f"http_{resp.status}"),
                                await resp.text())
                    return None
                async for raw_line in resp.content:
                    line = raw_line.decode("utf-8").strip()
                    if line.startswith("data:"):
                        response = fold(json.loads(line[5:]), time.perf_counter(), record)
                        if response is not None:
                            return response
        except aiohttp.ClientError as exc:
            record.fail("disconnected", repr(exc))
            return None
        record.fail("disconnected", "the stream ended before the response did")
        return None

    async def close(self) -> None:
        if self.http is not None:
            await self.http.close()
