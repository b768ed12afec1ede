"""Every numeric param, over /v1/ws (JSON and msgpack) and HTTP, refuses huge, negative,
NaN and infinite values with `invalid_request` naming the field; the socket stays open."""
from __future__ import annotations

import aiohttp
import msgpack
import pytest

from ws_helpers import open_ws, recv_type

NUMERIC = ("max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
           "presence_penalty", "frequency_penalty", "seed", "priority")
# JSON number literals as a client writes them: 400 digits, beyond a double, negative.
JSON_LITERALS = ("1" + "0" * 400, "-" + "9" * 400, "1e309", "-1e309", "-1000")
MSGPACK_VALUES = (float("nan"), float("inf"), float("-inf"), 2**64 - 1, -(2**63), -1000.0)


def _frames(field: str, literal: str) -> list[tuple[str | None, str]]:
    """(id, frame text) of each frame type that carries params."""
    params = f'{{"{field}":{literal}}}'
    return [(f"g-{field}", f'{{"type":"generate","id":"g-{field}","prompt":"x",'
                           f'"params":{params}}}'),
            (f"c-{field}", f'{{"type":"chat","id":"c-{field}","content":"x","params":{params}}}'),
            (None, f'{{"type":"session.update","params":{params}}}')]


def _assert_refused(error: dict, request_id: str | None, field: str, sent) -> None:
    assert error["type"] == "error" and error["code"] == "invalid_request", (sent, error)
    assert error.get("id") == request_id, (sent, error)
    assert error["message"].startswith(f"params.{field}:"), (sent, error)


async def test_json_socket_refuses_bad_numbers_naming_the_field(base_url):
    async with aiohttp.ClientSession() as s:
        ws, _ = await open_ws(s, base_url)
        for literal in JSON_LITERALS:
            for field in NUMERIC:
                for request_id, frame in _frames(field, literal):
                    await ws.send_str(frame)
                    _assert_refused(await recv_type(ws, "error"), request_id, field, frame)
        await ws.send_json({"type": "ping", "t": "still open"})
        assert (await recv_type(ws, "pong"))["t"] == "still open"
        await ws.close()


async def test_msgpack_socket_refuses_bad_numbers_naming_the_field(base_url):
    async with aiohttp.ClientSession() as s:
        ws = await s.ws_connect(base_url + "/v1/ws", protocols=("tokenwire.msgpack",))
        assert msgpack.unpackb((await ws.receive()).data)["type"] == "hello"
        for field in NUMERIC:
            for value in MSGPACK_VALUES:
                frame = {"type": "generate", "id": field, "prompt": "x", "params": {field: value}}
                await ws.send_bytes(msgpack.packb(frame))
                _assert_refused(msgpack.unpackb((await ws.receive()).data), field, field, frame)
        await ws.send_bytes(msgpack.packb({"type": "ping", "t": 1}))
        assert msgpack.unpackb((await ws.receive()).data) == {"type": "pong", "t": 1}
        await ws.close()


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
async def test_http_refuses_bad_numbers_naming_the_param(base_url, path):
    head = ('{"messages":[{"role":"user","content":"x"}]' if "chat" in path
            else '{"prompt":"x"')

    async def post(s, field: str, literal: str) -> tuple[int, dict]:
        values = {"max_tokens": "4", field: literal}
        body = head + "".join(f',"{k}":{v}' for k, v in values.items()) + "}"
        async with s.post(base_url + path, data=body,
                          headers={"Content-Type": "application/json"}) as r:
            return r.status, (await r.json())["error"]

    async with aiohttp.ClientSession() as s:
        for field in NUMERIC:
            for literal in JSON_LITERALS:
                status, error = await post(s, field, literal)
                assert status == 400, (field, literal[:12], error)
                assert error["type"] == "invalid_request_error", (field, literal[:12], error)
                assert error["param"] == field, (field, literal[:12], error)
            for literal in ("NaN", "Infinity", "-Infinity"):  # not JSON at all
                status, error = await post(s, field, literal)
                assert status == 400 and error["code"] == "invalid_json", (field, error)
