"""A request cancelled while its prompt renders off the event loop ends cancelled, even when
the cancel lands just as the render finishes: on Python 3.11, asyncio.wait_for returned the
finished job's result then and dropped the cancellation, and the chat turn ran to its end
(CI saw a cancelled 4,000-token turn finish with `length`)."""
import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from scheduler.models import ModelSlot


async def test_a_cancel_landing_as_the_render_finishes_is_not_lost():
    slot = SimpleNamespace(_text_thread=ThreadPoolExecutor(1))
    release = threading.Event()

    def render() -> list[int]:
        release.wait()
        return [1, 2, 3]

    task = asyncio.create_task(ModelSlot.off_loop(slot, render, 60))
    await asyncio.sleep(0.05)  # the task waits on the thread
    release.set()
    time.sleep(0.2)  # the loop held: the render's result is queued before the cancel
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    slot._text_thread.shutdown()


async def test_a_render_past_its_time_is_a_timeout():
    slot = SimpleNamespace(_text_thread=ThreadPoolExecutor(1))
    with pytest.raises(TimeoutError):
        await ModelSlot.off_loop(slot, lambda: time.sleep(0.5), 0.05)
    slot._text_thread.shutdown()
