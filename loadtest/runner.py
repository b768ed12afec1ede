"""Run a workload against a backend: paced arrivals, a concurrency cap, a hard time cap.

    arrivals --paced--> task per request (or per session) --semaphore--> backend
                                   |                                   |
                                records <--------- deltas, done -------+
"""
from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass

from tqdm import tqdm

from loadtest.arrivals import paced
from loadtest.config import LoadTestConfig
from loadtest.datasets import Prompt
from loadtest.records import RequestRecord
from loadtest.ws_client import ConnectFailed


@dataclass
class RunResult:
    """The records of every request sent, and the run's wall-clock window."""

    records: list[RequestRecord]
    t0: float
    duration: float
    model: str | None


class Runner:
    """Sends a workload through `backend` under the config's arrival process and limits."""

    def __init__(self, cfg: LoadTestConfig, backend, show_progress: bool = True):
        self.cfg = cfg
        self.backend = backend
        self.records: list[RequestRecord] = []
        self._limit = asyncio.Semaphore(cfg.max_concurrency or 1 << 30)
        self._rng = random.Random(cfg.seed + 1)  # arrivals draw apart from the dataset
        self._stopping = False
        self._progress = tqdm(total=cfg.num_requests, disable=not show_progress,
                              unit="req", dynamic_ncols=True)

    async def run(self, prompts: list[Prompt] | None = None,
                  sessions: list[list[Prompt]] | None = None) -> RunResult:
        """Send `prompts` (stateless) or `sessions` (multi-turn); return once all end."""
        await self.backend.start()
        t0 = time.perf_counter()
        tasks: list[asyncio.Task] = []
        try:
            async with _cap(self.cfg.duration):
                if sessions is not None:
                    await self._launch(sessions, self._session, tasks)
                else:
                    await self._launch(prompts, self._one, tasks)
                await asyncio.gather(*tasks)
        finally:
            duration = time.perf_counter() - t0
            await _cancel(tasks)
            self._mark_unfinished()
            self._progress.close()
            await self.backend.close()
        return RunResult(self.records, t0, duration, self.backend.model)

    def stop(self) -> None:
        """Wind down (SIGINT): nothing new starts, sessions end after the turn in flight,
        and the report covers what was sent."""
        self._stopping = True

    async def _launch(self, items: list, worker, tasks: list[asyncio.Task]) -> None:
        index = 0
        async for item in paced(items, self.cfg.request_rate, self.cfg.burstiness, self._rng):
            if self._stopping:
                return
            tasks.append(asyncio.create_task(worker(index, item)))
            index += 1

    async def _one(self, index: int, prompt: Prompt) -> None:
        async with self._limit:
            if self._stopping:
                return
            record = self._new_record(prompt)
            await self.backend.complete(prompt, record)
            self._progress.update(1)

    async def _session(self, index: int, turns: list[Prompt]) -> None:
        session = None
        try:
            session = await self.backend.open_session()
            for turn, prompt in enumerate(turns):
                if self._stopping:
                    break
                async with self._limit:
                    record = self._new_record(prompt, session=index, turn=turn)
                    await session.turn(prompt, record)
                    self._progress.update(1)
                if turn + 1 < len(turns):
                    await self._pause(session)
        except ConnectFailed as exc:
            self._new_record(turns[0], session=index, turn=0).fail(exc.code, str(exc))
            self._progress.update(len(turns))
        finally:
            if session is not None:
                await session.close()

    async def _pause(self, session) -> None:
        """Between turns: think time with the socket open, then an idle gap with it closed."""
        if self.cfg.think_time:
            await asyncio.sleep(self.cfg.think_time)
        if self.cfg.idle_gap:
            await session.idle(self.cfg.idle_gap)

    def _new_record(self, prompt: Prompt, **where) -> RequestRecord:
        record = RequestRecord(prompt.prompt_len, prompt.output_len, model=prompt.model,
                               **where)
        self.records.append(record)
        return record

    def _mark_unfinished(self) -> None:
        """Requests the time cap cut off count as failed with code `timeout`."""
        for record in self.records:
            if record.latency is None and record.error_code is None:
                record.fail("timeout", "cut off by --duration")


@contextlib.asynccontextmanager
async def _cap(seconds: float | None):
    """Stop the run after `seconds` (None: no cap); the cut is not an error."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        pass


async def _cancel(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
