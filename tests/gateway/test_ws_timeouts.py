"""Per-socket timers from GatewayConfig: receive timeout and heartbeat."""
from __future__ import annotations

import aiohttp

from ws_helpers import open_ws


async def test_silent_socket_closed_after_receive_timeout(server):
    url = server.start_app(receive_timeout_s=0.5)
    try:
        async with aiohttp.ClientSession() as s:
            ws, _ = await open_ws(s, url)
            msg = await ws.receive(timeout=10)
            assert msg.type == aiohttp.WSMsgType.CLOSE
            assert ws.close_code == 1000 and msg.extra == "receive timeout"
    finally:
        server.stop_app(url)


async def test_client_that_never_answers_pings_is_dropped(server):
    url = server.start_app(heartbeat_s=0.3)
    try:
        async with aiohttp.ClientSession() as s:
            # autoping=False: the client sees the server's pings and never answers them.
            ws, _ = await open_ws(s, url, autoping=False)
            kinds = [(await ws.receive(timeout=10)).type]
            while kinds[-1] == aiohttp.WSMsgType.PING and len(kinds) < 10:
                kinds.append((await ws.receive(timeout=10)).type)
            # Pinged, then dropped within an interval or two of getting no pong.
            assert kinds[0] == aiohttp.WSMsgType.PING and len(kinds) <= 3 and ws.closed
    finally:
        server.stop_app(url)
