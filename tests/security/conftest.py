"""Real `tokenwire serve` processes on loopback for the hostile-client suite: what a
client can do to a server is measured from outside, as an attacker sees it."""
from __future__ import annotations

import pytest

from loadtest.server_process import ServerProcess

# A small context so that the hostile histories below must be fitted to it, one thread
# for the engine so a core is left for the event loop and the tokenizer's thread.
SMALL = ["--model", "default", "--device", "cpu", "--num-threads", "1",
         "--num-kv-blocks", "512", "--max-model-len", "2048", "--ttft-bound-s", "600"]


@pytest.fixture(scope="module")
def serve():
    """`serve(*flags)` -> a started ServerProcess; every one is stopped at module end."""
    started: list[ServerProcess] = []

    def start(*flags: str) -> ServerProcess:
        server = ServerProcess([*SMALL, *flags]).__enter__()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
