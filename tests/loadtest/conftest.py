"""Small real aiohttp servers that speak protocol v1 and OpenAI SSE, to test the clients.

The end-to-end test against the real tokenwire server is in test_e2e_tokenwire.py.
"""
import asyncio
import json

import msgpack
import pytest
from aiohttp import WSMsgType, web

DELTA_TOKENS = 2  # tokens per delta frame


class FakeProtocolServer:
    """Answers `generate` and `chat` with `max_tokens / 2` deltas of 2 tokens each, then done.

    A prompt containing "REFUSE" gets an `overloaded` error; "HANG" never finishes.
    """

    def __init__(self):
        self.sockets = 0
        self.chats_per_socket: list[int] = []
        self.app = web.Application()
        self.app.router.add_get("/v1/ws", self.ws)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_post("/v1/completions", self.sse)
        self.app.router.add_post("/v1/chat/completions", self.sse)

    async def ws(self, request):
        ws = web.WebSocketResponse(protocols=("tokenwire.msgpack",))
        await ws.prepare(request)
        binary = ws.ws_protocol == "tokenwire.msgpack"
        send = (lambda m: ws.send_bytes(msgpack.packb(m))) if binary else ws.send_json
        self.sockets += 1
        index = len(self.chats_per_socket)
        self.chats_per_socket.append(0)
        await send({"type": "hello", "protocol": "tokenwire.v1", "session_id": "s",
                    "resumed": False, "model": "fake", "limits": {}})
        tasks = []
        async for msg in ws:
            frame = msgpack.unpackb(msg.data) if msg.type == WSMsgType.BINARY \
                else json.loads(msg.data)
            if frame["type"] == "chat":
                self.chats_per_socket[index] += 1
            text = frame.get("prompt") or frame.get("content") or str(frame.get("messages"))
            tasks.append(asyncio.create_task(self.answer(send, frame, text)))
        for task in tasks:
            task.cancel()
        return ws

    async def answer(self, send, frame, text):
        if "REFUSE" in text:
            await send({"type": "error", "id": frame["id"], "code": "overloaded",
                        "message": "busy", "retry_after_ms": 100})
            return
        chunks = frame["params"]["max_tokens"] // DELTA_TOKENS
        for _ in range(chunks):
            await asyncio.sleep(0.002)
            await send({"type": "delta", "id": frame["id"], "text": "ab", "n": DELTA_TOKENS})
        if "HANG" in text:
            await asyncio.sleep(3600)
        await send({"type": "done", "id": frame["id"], "finish_reason": "length",
                    "usage": {"prompt_tokens": 5, "completion_tokens": chunks * DELTA_TOKENS,
                              "cached_tokens": 0},
                    "timing": {"ttft_ms": 1.0, "queue_ms": 0.1}})

    async def models(self, request):
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def sse(self, request):
        body = await request.json()
        text = str(body.get("prompt") or body.get("messages"))
        if "REFUSE" in text:
            return web.json_response({"error": {"code": "overloaded"}}, status=503,
                                     headers={"Retry-After": "1"})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        chat = "messages" in body
        for _ in range(body["max_tokens"]):
            choice = {"delta": {"content": "x"}} if chat else {"text": "x"}
            await resp.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
        usage = {"prompt_tokens": 4, "completion_tokens": body["max_tokens"]}
        final = {"choices": [], "usage": usage}
        await resp.write(f"data: {json.dumps(final)}\n\ndata: [DONE]\n\n".encode())
        return resp


@pytest.fixture
async def fake_server(aiohttp_server):
    fake = FakeProtocolServer()
    server = await aiohttp_server(fake.app, host="127.0.0.1")
    fake.port = server.port
    return fake
