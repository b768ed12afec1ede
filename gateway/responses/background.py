"""`background: true`: a response that runs detached from the request that made it.

    POST (background)  -> stored at once (in_progress), its run started as its own task;
                          the answer is the in_progress Response (or, with stream, the
                          run's events as they come)
    the run            -> admission, the engine, every event appended to its EventLog,
                          the final Response stored (GET polls the store)
    GET ?stream=true&starting_after=N -> the log's events after N, then the live ones
    POST .../cancel    -> the run's task cancelled: the engine request aborted (its KV
                          freed), the response stored as cancelled

Runs and their logs live in this process (a stream resumes on the replica that runs the
response); a finished run's log is kept for `background_log_s` (--background-log-time),
its Response for as long as the store keeps it.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from dataclasses import dataclass, field

from aiohttp import web

from gateway.errors import RequestError
from gateway.responses.run import Prepared, finish, generate
from gateway.runtime import Runtime
from gateway.stream import Stream

log = logging.getLogger(__name__)
_ids = itertools.count()


class EventLog:
    """A run's events in order (each stamped); readers follow it as it grows."""

    def __init__(self):
        self.events: list[dict] = []
        self.done = False
        self._changed = asyncio.Event()

    def append(self, event: dict) -> None:
        self.events.append(event)
        self._wake()

    def close(self) -> None:
        self.done = True
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def follow(self, after: int):
        """The events with sequence_number > `after`, then each new one until the end."""
        at = max(0, after + 1)
        while True:
            changed = self._changed
            while at < len(self.events):
                yield self.events[at]
                at += 1
            if self.done:
                return
            await changed.wait()


@dataclass(eq=False)
class BackgroundRun:
    prepared: Prepared
    stream: Stream
    log: EventLog = field(default_factory=EventLog)
    task: asyncio.Task | None = None

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()


# this process's background runs by response id (set up with the routes)
RUNS = web.AppKey("responses_background", dict)


def start(app: web.Application, rt: Runtime, prepared: Prepared) -> BackgroundRun:
    """Start the run of a response already stored as in_progress (version 1)."""
    stream = Stream(prepared.shape.id, f"bg-resp-{next(_ids)}", "http")
    run = BackgroundRun(prepared, stream)
    for event in prepared.shape.opening():
        run.log.append(prepared.shape.stamp(event))
    run.task = stream.task = asyncio.create_task(_run(rt, run))
    registry = app[RUNS]
    registry[prepared.shape.id] = run
    run.task.add_done_callback(lambda _: asyncio.get_running_loop().call_later(
        rt.config.background_log_s, registry.pop, prepared.shape.id, None))
    return run


async def _run(rt: Runtime, run: BackgroundRun) -> None:
    prepared, stream, shape = run.prepared, run.stream, run.prepared.shape
    admission = None
    rt.http_streams.add(stream)  # a drain waits for it, then cancels it
    try:
        await rt.hold_model()  # the request's model (this task inherits it), until run ends
        admission = await rt.admit(stream, prepared.turn.params.priority,
                                   len(prepared.prompt), None, prepared.owner)
        stream.admitted = time.perf_counter()
        async with contextlib.aclosing(generate(admission, prepared, stream)) as outputs:
            async for out in outputs:
                if out.delta_text and prepared.generate:
                    for event in shape.feed(out.delta_text):
                        run.log.append(shape.stamp(event))
    except asyncio.CancelledError:
        asyncio.current_task().uncancel()  # the run goes on, to store how it ended
        stream.finish_reason = "cancelled"  # a cancel (or a drain): stored as cancelled
        stream.error = stream.error or "the response was cancelled"
    except RequestError as exc:
        stream.finish_reason, shape.error = "error", {"code": "server_error",
                                                      "message": exc.message}
    except Exception:  # noqa: BLE001 - a detached run's fault ends that run only
        log.exception("background response %s failed", shape.id)
        stream.finish_reason, stream.error = "error", "internal error"
    finally:
        if admission is not None:
            admission.release(stream.completion_tokens, stream.finish_reason)
        rt.http_streams.discard(stream)
    prepared.version = 1  # the in_progress record: the final one replaces it
    await finish(rt, prepared, stream)
    for event in shape.closing(stream):
        run.log.append(shape.stamp(event))
    run.log.close()


async def cancel(run: BackgroundRun) -> None:
    """Stop the run (the engine aborts the request and frees its blocks) and wait until
    its cancelled Response is stored."""
    if run.running:
        run.stream.cancel_requested = True
        run.task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.shield(run.task)
