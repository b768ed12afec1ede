"""The engine loop stops under open sockets: `internal` errors, the socket stays usable,
/health and /ready turn 503. Runs its own small engine (random weights) so the shared one
keeps serving the other tests."""
from __future__ import annotations

import aiohttp

from ws_helpers import open_ws, recv_type, tiny_engine


async def test_engine_loop_stopped_gives_internal_and_unhealthy(server):
    engine = server.call(tiny_engine())
    url = server.start_app(engine=engine)
    try:
        async with aiohttp.ClientSession() as s:
            ws, hello = await open_ws(s, url)
            assert hello["model"] == "dummy:tiny"
            server.call(engine.stop())
            await ws.send_json({"type": "generate", "id": "g", "prompt": "hi"})
            error = await recv_type(ws, "error")
            assert error == {"type": "error", "id": "g", "code": "internal",
                             "message": "internal error"}  # no internals leak out
            await ws.send_json({"type": "ping", "t": 7})
            assert (await recv_type(ws, "pong"))["t"] == 7
            async with s.get(url + "/health") as r:
                assert r.status == 503 and (await r.json())["engine_alive"] is False
            async with s.get(url + "/ready") as r:
                assert r.status == 503 and (await r.json())["reason"] == "engine loop stopped"
            async with s.post(url + "/v1/completions", json={"prompt": "hi"}) as r:
                assert r.status == 503
            await ws.close()
    finally:
        server.stop_app(url)
