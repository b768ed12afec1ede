"""Real services for tests: a redis-server process on a free loopback port.

scripts/setup_services.sh installs redis-server (Debian); tests never skip for want of it.
Importable from any tests/ subfolder (tests/ is on sys.path through its conftest.py):

    with RedisServer(tmp_path) as redis:      # started, answering PING
        url = redis.url                       # redis://127.0.0.1:PORT/0
        redis.stop(); redis.start()           # same port and data dir: an outage
        redis.freeze(); redis.thaw()          # a Redis that hangs without closing
"""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

START_TIMEOUT_S = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """redis-server on 127.0.0.1, data and log in `workdir`, no persistence to disk (a
    stop loses the data, as a replaced Redis would, unless `persist=True`: then a stop
    saves an RDB file that the next start loads)."""

    def __init__(self, workdir: Path, *, persist: bool = False):
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise RuntimeError("redis-server not found: run scripts/setup_services.sh")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.persist = persist
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> "RedisServer":
        save = ["--save", "", "--appendonly", "no"]
        if self.persist:
            save = ["--save", "3600 1", "--dbfilename", "dump.rdb"]
        log = open(self.workdir / "redis.log", "ab")
        self.proc = subprocess.Popen(
            [self.binary, "--bind", "127.0.0.1", "--port", str(self.port),
             "--dir", str(self.workdir), "--protected-mode", "no", *save],
            stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self._wait_ping()
        return self

    def stop(self) -> None:
        """SIGTERM (Redis saves first when persisting) and wait for the exit."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def freeze(self) -> None:
        """SIGSTOP: the port still accepts connections but nothing answers (a hung host)."""
        self.proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def _wait_ping(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: "
                                   f"{(self.workdir / 'redis.log').read_text()[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"redis-server did not answer PING in {START_TIMEOUT_S}s")

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
