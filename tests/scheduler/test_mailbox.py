"""Mailboxes merge deltas into one slot; the writer sends with a timeout."""
import asyncio

import pytest

from scheduler.mailbox import Mailbox, Outbox, OutboxOverflow, SendTimeout, write_outbox


def test_mailbox_merges_and_keeps_final():
    box = Mailbox("a")
    for word in ("Hel", "lo", " world"):
        box.put_delta(word, 1)
    box.put_final({"type": "done", "id": "a"})
    box.put_delta("late", 1)  # after done: ignored
    box.put_final({"type": "done", "id": "other"})  # the first final stays
    assert box.take() == [{"type": "delta", "id": "a", "text": "Hello world", "n": 3},
                          {"type": "done", "id": "a"}]
    assert box.take() == [{"type": "done", "id": "a"}]


async def test_outbox_holds_constant_frames_per_stream():
    out = Outbox()
    for i in range(10_000):
        out.put_delta("a", "x", 1)
        out.put_delta("b", "yy", 2)
    assert out.pending_frames == 2 and out.num_streams == 2
    assert out.pending_bytes == 30_000  # just the text itself, no per-frame overhead
    first = await out.get()
    assert first == [{"type": "delta", "id": "a", "text": "x" * 10_000, "n": 10_000}]
    out.put_final("b", {"type": "done", "id": "b"})
    assert [f["type"] for f in await out.get()] == ["delta", "done"]
    assert out.num_streams == 1  # a finished stream's mailbox is gone


async def test_control_frames_first_and_bounded():
    out = Outbox(max_control_frames=2)
    out.put_delta("a", "x", 1)
    out.put_control({"type": "pong"})
    out.put_control({"type": "pong", "t": 2})
    with pytest.raises(OutboxOverflow):
        out.put_control({"type": "pong"})
    assert (await out.get())[0]["type"] == "pong"
    assert (await out.get())[0]["t"] == 2
    assert (await out.get())[0]["type"] == "delta"


async def test_streams_take_turns():
    out = Outbox()
    out.put_delta("a", "1", 1)
    out.put_delta("b", "1", 1)
    assert (await out.get())[0]["id"] == "a"
    out.put_delta("a", "2", 1)  # a goes to the back of the line
    assert (await out.get())[0]["id"] == "b"
    assert (await out.get())[0]["id"] == "a"


async def test_writer_sends_until_closed():
    out, sent = Outbox(), []

    async def send(frame):
        sent.append(frame)

    writer = asyncio.create_task(write_outbox(out, send, 1.0))
    out.put_delta("a", "hi", 1)
    out.put_final("a", {"type": "done", "id": "a"})
    await asyncio.sleep(0.01)
    out.close()
    out.put_delta("b", "dropped", 1)
    await asyncio.wait_for(writer, 1.0)
    assert [f["type"] for f in sent] == ["delta", "done"]


async def test_writer_times_out_on_a_stuck_socket():
    out = Outbox()
    stuck = asyncio.Event()

    async def send(frame):
        await stuck.wait()

    out.put_delta("a", "hi", 1)
    with pytest.raises(SendTimeout):
        await write_outbox(out, send, 0.05)
