"""A multi-turn session over protocol v1 that follows the client rule (docs/deploy.md):

    `draining` ........ let the turn in flight end, then reopen the socket with
                        ?session_id= after (a random part of) reconnect_after_ms
    1012 / lost socket  reopen at once, backing off while no replica takes it
    turn cut short .... (error `draining` or `disconnected`, or `cancelled` by the drain's
                        timeout) send it again on the new socket, without reading the
                        history first: a cut turn the session kept (with its partial reply)
                        is then asked twice, which a synthetic chat does not mind

Each retry and reopened socket is counted on the turn's record, so the load tester
reports them beside the failures.
"""
from __future__ import annotations

import asyncio
import random

from loadtest.datasets import Prompt, request_params
from loadtest.records import RequestRecord
from loadtest.ws_client import ConnectFailed, WsConnection

RETRY_CODES = frozenset({"draining", "disconnected"})
MAX_RETRIES = 3  # per turn: a turn that fails more often than this is reported failed
FIRST_BACKOFF_S, MAX_BACKOFF_S = 0.1, 2.0


class WsSession:
    """One session's turns over a socket it reopens when the server goes away."""

    def __init__(self, backend, conn: WsConnection):
        self.backend, self.conn = backend, conn
        self.session_id = conn.hello["session_id"]
        self.has_history = False  # a turn ended with `done`: the store holds the session
        self.lost = False  # an idle gap's resume found no session: the history is gone

    async def turn(self, prompt: Prompt, record: RequestRecord) -> None:
        params = request_params(prompt, self.backend.temperature, self.backend.ignore_eos)
        message = {"type": "chat", "content": prompt.text, "params": params}
        if self.lost:
            record.fail("session_lost", "the server did not resume the session after idling")
            return
        while True:
            if self.conn.closed or self.conn.draining is not None:
                try:
                    resumed = await self._reopen(record)
                except ConnectFailed as exc:
                    record.fail(exc.code, str(exc))
                    return
                if self.has_history and not resumed:  # expired, or lost by the store
                    record.fail("session_lost", "the server did not resume the session")
                    return
            await self.conn.request(message, record)
            if record.finish_reason is not None:
                self.has_history = True
            if not self._cut_short(record) or record.retries >= MAX_RETRIES:
                return
            record.retry()

    def _cut_short(self, record: RequestRecord) -> bool:
        """Refused by a draining replica, cut by a lost socket, or ended `cancelled` by
        the drain's timeout (the replica was too slow to finish it in time)."""
        if record.error_code in RETRY_CODES:
            return True
        return record.error_code == "cancelled" and self.conn.draining is not None

    async def _reopen(self, record: RequestRecord) -> bool:
        """Replace the socket by one that resumes this session; whether it was resumed
        (if not, the session goes on as the new one the server made)."""
        old = self.conn
        await self.backend.pool.forget(old)
        if old.draining is not None:
            wait_ms = old.draining.get("reconnect_after_ms") or 0
            await asyncio.sleep(random.uniform(0.5, 1.0) * wait_ms / 1000)
        resumed = await self._connect()
        record.reconnects += 1
        return resumed

    async def idle(self, seconds: float) -> None:
        """Close the socket for `seconds`, as a user who walks away, then resume the
        session on a new one before the next turn (the client's choice: not counted as
        a reconnect). A failed connect is left to the next turn, which retries it."""
        await self.backend.pool.forget(self.conn)
        await asyncio.sleep(seconds)
        try:
            resumed = await self._connect()
        except ConnectFailed:
            return
        self.lost = self.has_history and not resumed

    async def _connect(self) -> bool:
        """A socket that resumes this session, backing off while no replica takes it;
        whether it was resumed. ConnectFailed once the connect timeout passes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.backend.connect_timeout_s
        backoff = FIRST_BACKOFF_S
        while True:
            try:
                self.conn = await self.backend.pool.connect(self.session_id)
                break
            except ConnectFailed:
                if loop.time() + backoff > deadline:
                    raise
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, MAX_BACKOFF_S)
        self.session_id = self.conn.hello["session_id"]
        return bool(self.conn.hello.get("resumed"))

    async def close(self) -> None:
        await self.backend.pool.forget(self.conn)
