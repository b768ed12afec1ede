"""A `tokenwire serve` child process on a free loopback port, for the comparisons and tests.

    with ServerProcess(["--model", "default", "--device", "cpu"]) as server:
        server.ws_url   # ws://127.0.0.1:PORT/v1/ws
"""
from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0,
             context: ssl.SSLContext | None = None) -> tuple[int, str]:
    """(status, body); status 0 when nothing answered. `context`: the TLS client context
    of an https:// URL."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


def stop_process(proc: subprocess.Popen | None, grace_s: float) -> None:
    """SIGTERM, then SIGKILL if the process has not exited within `grace_s` seconds."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class ServerProcess:
    """Starts `python -m gateway.cli serve ARGS --port P` and waits until /ready answers 200.
    With `tls` (a client context that trusts the server's certificate) it speaks https://
    and wss:// to a server started with --ssl-certfile.

    The server's log goes to a temporary file (a pipe nobody reads would fill and block
    it); its tail is in the error when the server dies or never becomes ready.
    """

    def __init__(self, serve_args: list[str], ready_timeout_s: float = 600.0,
                 tls: ssl.SSLContext | None = None):
        self.serve_args = list(serve_args)
        self.ready_timeout_s = ready_timeout_s
        self.tls = tls
        self.port = free_port()
        self.base = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        self.ws_url = f"{'wss' if tls else 'ws'}://127.0.0.1:{self.port}/v1/ws"
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile()

    def __enter__(self) -> "ServerProcess":
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--host", "127.0.0.1",
               "--port", str(self.port), "--log-level", "WARNING", *self.serve_args]
        self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.ready_timeout_s
        while http_get(f"{self.base}/ready", 2.0, self.tls)[0] != 200:
            # /health answers 503 only once loading has failed (or the engine died): the
            # process stays up to say so, and would never become ready
            failed = http_get(f"{self.base}/health", 2.0, self.tls)[0] == 503
            if failed or self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"tokenwire serve did not become ready:\n{self.log_tail()}")
            time.sleep(0.5)
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        """SIGTERM (graceful drain), SIGKILL after 30 s."""
        stop_process(self.proc, 30)

    def log_tail(self, chars: int = 3000) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-chars:]
