"""A llama.cpp `llama-server` child process on a free loopback port: the peer of
`tokenwire bench --peer llama.cpp` (scripts/build_llama_server.sh builds one)."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from loadtest.server_process import REPO, free_port, http_get, stop_process


def find_llama_server(given: str | None) -> str | None:
    """--llama-server, else $LLAMA_SERVER, else `llama-server` on PATH, else the build
    script's cached binary; None when there is none."""
    for candidate in (given, os.environ.get("LLAMA_SERVER"), shutil.which("llama-server")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    cache = Path(os.environ.get("TOKENWIRE_CACHE_DIR", Path.home() / ".cache" / "tokenwire"))
    built = sorted((cache / "llama.cpp").glob("build-*/bin/llama-server"))
    return str(built[-1]) if built else None


def peer_env(env) -> dict[str, str]:
    """llama-server's environment: ours without OMP_WAIT_POLICY. tokenwire's commands may
    set it PASSIVE for themselves (gateway/cli.py), and llama.cpp's OpenMP threads, which
    wait between the graph's ops, then sleep and wake late: its c=1 TPOT is then nearly
    three times what it is with their default spinning (docs/benchmarks.md)."""
    return {k: v for k, v in env.items() if k != "OMP_WAIT_POLICY"}


class LlamaServer:
    """`llama-server -m GGUF` with `slots` parallel sequences of `slot_tokens` each and
    `threads` CPU threads, and `extra_args` after them; waits until /health answers 200."""

    def __init__(self, binary: str, gguf: str, slots: int, slot_tokens: int, threads: int,
                 ready_timeout_s: float = 300.0, extra_args: tuple[str, ...] = ()):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.cmd = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port),
                    "-np", str(slots), "-c", str(slots * slot_tokens), "-t", str(threads),
                    "-tb", str(threads), *extra_args]
        self.ready_timeout_s = ready_timeout_s
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile()

    def __enter__(self) -> "LlamaServer":
        self.proc = subprocess.Popen(self.cmd, cwd=REPO, env=peer_env(os.environ),
                                     stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.ready_timeout_s
        while http_get(f"{self.base}/health", timeout=2.0)[0] != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                self._log.seek(0)
                tail = self._log.read().decode(errors="replace")[-3000:]
                raise RuntimeError(f"llama-server did not become ready:\n{tail}")
            time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> None:
        stop_process(self.proc, 30)
