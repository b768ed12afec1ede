"""`python -m tests.reliability.probe serve ...`: the real `tokenwire serve`, plus a probe.

On SIGUSR1 the server process writes what it holds to $TOKENWIRE_PROBE_FILE as JSON: its
live asyncio tasks (by coroutine name), open file descriptors and TCP connections, so a
test can check from outside that nothing was left behind. Python runs the handler on the
main thread between bytecodes, where the event loop is the running one.
"""
from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import sys

import psutil

from gateway.cli import main

PROBE_FILE_ENV = "TOKENWIRE_PROBE_FILE"


def snapshot() -> dict:
    loop = asyncio._get_running_loop()  # noqa: SLF001 - the loop this handler interrupted
    tasks = asyncio.all_tasks(loop) if loop is not None else set()
    names = collections.Counter(t.get_coro().__qualname__ for t in tasks if not t.done())
    proc = psutil.Process()
    # Every socket but the listener, whatever its state (CLOSE_WAIT would be a leak too).
    sockets = [c for c in proc.net_connections(kind="inet") if c.status != psutil.CONN_LISTEN]
    return {"tasks": sum(names.values()), "task_names": dict(names), "fds": proc.num_fds(),
            "sockets": len(sockets)}


def _on_probe(signum, frame) -> None:
    path = os.environ[PROBE_FILE_ENV]
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(snapshot(), f)
    os.replace(path + ".tmp", path)  # the reader never sees half a file


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, _on_probe)
    sys.exit(main())
