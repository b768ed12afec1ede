"""The socket's writer ends once its outbox closes, even when its cancellation is lost.

On Python 3.11, asyncio.wait_for() returns the result instead of raising when the task is
cancelled in the same loop turn as the awaited send completes. That race cannot be timed
on a real socket, so this test drives the writer with a socket stand-in whose send it
completes by hand; everything else is the real Outbox and run_writer.
"""
from __future__ import annotations

import asyncio

from gateway.sockets.outbox import Outbox, run_writer
from gateway.ws.frames import Codec


class HeldSocket:
    """Only what run_writer calls: a send that completes when the test says so."""

    def __init__(self):
        self.sent: list[str] = []
        self.release = asyncio.get_running_loop().create_future()

    async def send_str(self, data: str) -> None:
        await self.release
        self.sent.append(data)


async def test_writer_ends_when_closed_even_if_its_cancellation_is_lost():
    ws, outbox = HeldSocket(), Outbox(max_pending=8)
    writer = asyncio.create_task(run_writer(ws, Codec(binary=False).encode, outbox, None, 5.0,
                                            lambda: None))
    outbox.put({"type": "pong", "t": 1})
    for _ in range(3):
        await asyncio.sleep(0)  # the writer is inside its send
    ws.release.set_result(None)  # the send completes ...
    outbox.close()  # ... in the same turn as the socket's teardown
    writer.cancel()
    done, _ = await asyncio.wait({writer}, timeout=2.0)
    assert writer in done, "the writer outlived its closed outbox"
    assert ws.sent == ['{"type":"pong","t":1}']
