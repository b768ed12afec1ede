"""The socket's writer: a cancellation that lands as a send completes is not lost, and the
writer ends once its outbox closes even without one.

On Python 3.11, asyncio.wait_for() returned the send's result instead of raising when the
task was cancelled in the same loop turn as the awaited send completed; the writer's sends
now run under asyncio.timeout, which keeps the cancellation. That race cannot be timed on a
real socket, so these tests drive the writer with a socket stand-in whose send they complete
by hand; everything else is the real Outbox and run_writer.
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


async def _writer_inside_its_send() -> tuple[HeldSocket, Outbox, asyncio.Task]:
    ws, outbox = HeldSocket(), Outbox(max_pending=8)
    writer = asyncio.create_task(run_writer(ws, Codec(binary=False).encode, outbox, None, 5.0,
                                            lambda: None))
    outbox.put({"type": "pong", "t": 1})
    for _ in range(3):
        await asyncio.sleep(0)
    return ws, outbox, writer


async def test_a_cancellation_landing_as_the_send_completes_is_kept():
    ws, _, writer = await _writer_inside_its_send()
    ws.release.set_result(None)  # the send completes ...
    writer.cancel()  # ... in the same loop turn as the cancellation
    done, _ = await asyncio.wait({writer}, timeout=2.0)
    assert writer in done and writer.cancelled(), "the writer lost its cancellation"


async def test_writer_ends_when_its_outbox_closes():
    ws, outbox, writer = await _writer_inside_its_send()
    ws.release.set_result(None)
    outbox.close()
    done, _ = await asyncio.wait({writer}, timeout=2.0)
    assert writer in done and not writer.cancelled(), "the writer outlived its closed outbox"
    assert ws.sent == ['{"type":"pong","t":1}']
