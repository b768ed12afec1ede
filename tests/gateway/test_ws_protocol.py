"""Protocol v1 over a real socket: every message type, chat sessions, multiplexing, cancel."""
from __future__ import annotations

import socket

import aiohttp
import msgpack

from gateway.ws.frames import MSGPACK_SUBPROTOCOL

from ws_helpers import open_ws, recv_type, recv_until

GREEDY = {"temperature": 0, "max_tokens": 12}


async def test_hello_names_protocol_model_and_limits(base_url):
    async with aiohttp.ClientSession() as s:
        ws, hello = await open_ws(s, base_url)
        assert hello["protocol"] == "tokenwire.v1"
        assert hello["model"] == "SmolLM2-135M-Instruct"
        assert hello["resumed"] is False
        assert len(hello["session_id"]) >= 22  # 128 random bits, URL-safe base64
        assert hello["limits"] == {"max_tokens": 4096, "max_context": 2048,
                                   "max_message_bytes": 1 << 20, "max_inflight": 8}
        assert hello["instance"].startswith(socket.gethostname() + ":")  # default host:port
        await ws.send_json({"type": "ping", "t": 123.5})
        assert await ws.receive_json() == {"type": "pong", "t": 123.5}
        await ws.close()


async def test_hello_names_the_configured_instance(server):
    url = server.start_app(instance_id="replica-b")
    async with aiohttp.ClientSession() as s:
        ws, hello = await open_ws(s, url)
        assert hello["instance"] == "replica-b"
        await ws.close()
    server.stop_app(url)


async def test_chat_two_turns_history_and_prefix_cache(base_url):
    async with aiohttp.ClientSession() as s:
        ws, _ = await open_ws(s, base_url)
        await ws.send_json({"type": "session.update", "system": "You are terse.",
                            "params": {"temperature": 0}})
        updated = await recv_type(ws, "session.updated")
        assert updated["system"] == "You are terse." and updated["params"] == {"temperature": 0}
        texts, dones = [], []
        first = ("Here is a list of European countries: France, Italy, Spain, Portugal, "
                 "Germany, Austria, Belgium, the Netherlands, Denmark, Sweden, Norway, "
                 "Finland. What is the capital of France?")
        for i, question in enumerate([first, "And of Italy?"]):
            await ws.send_json({"type": "chat", "id": f"t{i}", "content": question,
                                "params": {"max_tokens": 12}})
            frames, done = await recv_until(ws, f"t{i}")
            assert done["type"] == "done" and done["finish_reason"] in ("stop", "length")
            deltas = [f for f in frames if f["type"] == "delta"]
            assert deltas and sum(d["n"] for d in deltas) == done["usage"]["completion_tokens"]
            # A reader that keeps up gets tokens as produced, not batched (margin for a
            # busy box where the writer can fall a step behind).
            assert len(deltas) >= done["usage"]["completion_tokens"] // 2
            texts.append("".join(d["text"] for d in deltas))
            dones.append(done)
        assert set(dones[1]["timing"]) == {"queue_ms", "ttft_ms", "e2e_ms", "tpot_ms"}
        assert 0 <= dones[1]["timing"]["ttft_ms"] <= dones[1]["timing"]["e2e_ms"]
        # Turn 2's prompt starts with turn 1's: its full blocks come from the prefix cache.
        assert dones[0]["usage"]["prompt_tokens"] >= 48  # three full blocks at least
        assert dones[1]["usage"]["cached_tokens"] >= dones[0]["usage"]["prompt_tokens"] // 16 * 16
        assert dones[1]["usage"]["prompt_tokens"] > dones[0]["usage"]["prompt_tokens"]
        await ws.send_json({"type": "session.history"})
        history = await recv_type(ws, "session.history")
        assert history["system"] == "You are terse."
        assert history["messages"] == [
            {"role": "user", "content": first},
            {"role": "assistant", "content": texts[0]},
            {"role": "user", "content": "And of Italy?"},
            {"role": "assistant", "content": texts[1]}]
        await ws.send_json({"type": "session.reset"})
        assert (await recv_type(ws, "session.updated"))["history_length"] == 0
        await ws.close()


async def test_generate_prompt_and_messages_multiplexed(base_url):
    async with aiohttp.ClientSession() as s:
        ws, _ = await open_ws(s, base_url)
        params = {"temperature": 0, "max_tokens": 10, "ignore_eos": True}
        await ws.send_json({"type": "generate", "id": "a", "prompt": "Once upon a time",
                            "params": params})
        await ws.send_json({"type": "generate", "id": "b", "params": params,
                            "messages": [{"role": "user", "content": "Name a colour."}]})
        await ws.send_json({"type": "generate", "id": "c", "prompt": [1, 2, 3, 4],
                            "params": params})
        frames = []
        done = {}
        while len(done) < 3:
            frame = await ws.receive_json()
            frames.append(frame)
            if frame["type"] == "done":
                done[frame["id"]] = frame
        assert all(d["finish_reason"] == "length" for d in done.values())
        assert all(d["usage"]["completion_tokens"] == 10 for d in done.values())
        # Interleaved: every request had streamed before the first one finished.
        first_done = next(i for i, f in enumerate(frames) if f["type"] == "done")
        started = {f["id"] for f in frames[:first_done] if f["type"] == "delta"}
        assert started == {"a", "b", "c"}
        assert done["c"]["usage"]["prompt_tokens"] == 4
        await ws.close()


async def test_cancel_ends_with_cancelled_and_frees_blocks(server, base_url):
    async with aiohttp.ClientSession() as s:
        ws, _ = await open_ws(s, base_url)
        await ws.send_json({"type": "generate", "id": "long", "prompt": "Count: 1, 2, 3,",
                            "params": {"max_tokens": 500, "ignore_eos": True}})
        assert (await recv_type(ws, "delta"))["id"] == "long"
        await ws.send_json({"type": "cancel", "id": "long"})
        _, done = await recv_until(ws, "long")
        assert done["type"] == "done" and done["finish_reason"] == "cancelled"
        assert done["usage"]["completion_tokens"] < 500
        assert server.all_blocks_free()
        await ws.close()


async def test_disconnect_aborts_requests_and_frees_kv_blocks(server, base_url):
    async with aiohttp.ClientSession() as s:
        ws, _ = await open_ws(s, base_url)
        for i in range(2):
            await ws.send_json({"type": "generate", "id": f"g{i}", "prompt": "Tell me a story",
                                "params": {"max_tokens": 1000, "ignore_eos": True}})
        await recv_type(ws, "delta")
        assert server.engine.stats().num_running > 0
        await ws.close()
    # 1000 tokens would take minutes on CPU: freed within seconds means aborted.
    assert server.all_blocks_free(timeout=10)


async def test_msgpack_subprotocol(base_url):
    async with aiohttp.ClientSession() as s:
        ws = await s.ws_connect(base_url + "/v1/ws", protocols=(MSGPACK_SUBPROTOCOL,))
        assert ws.protocol == MSGPACK_SUBPROTOCOL
        hello = await ws.receive()
        assert hello.type == aiohttp.WSMsgType.BINARY
        assert msgpack.unpackb(hello.data)["type"] == "hello"
        await ws.send_bytes(msgpack.packb({"type": "chat", "id": "m", "content": "Hi!",
                                           "params": GREEDY}))
        text, done = "", None
        while done is None:
            msg = await ws.receive()
            assert msg.type == aiohttp.WSMsgType.BINARY
            frame = msgpack.unpackb(msg.data)
            text += frame.get("text", "")
            done = frame if frame["type"] == "done" else None
        assert done["id"] == "m" and text
        await ws.send_str('{"type": "ping"}')  # text frames are refused on a msgpack socket
        error = msgpack.unpackb((await ws.receive()).data)
        assert error["type"] == "error" and error["code"] == "invalid_json"
        await ws.close()


async def test_resume_by_session_id(base_url):
    async with aiohttp.ClientSession() as s:
        ws, hello = await open_ws(s, base_url)
        await ws.send_json({"type": "chat", "id": "x", "content": "Remember: 42.",
                            "params": GREEDY})
        await recv_until(ws, "x")
        await ws.close()
        ws, again = await open_ws(s, base_url, params={"session_id": hello["session_id"]})
        assert again["resumed"] is True and again["session_id"] == hello["session_id"]
        await ws.send_json({"type": "session.history"})
        messages = (await recv_type(ws, "session.history"))["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"]
        assert messages[0]["content"] == "Remember: 42."
        await ws.close()
        ws, fresh = await open_ws(s, base_url, params={"session_id": "no-such-session"})
        assert fresh["resumed"] is False and fresh["session_id"] != "no-such-session"
        await ws.close()
