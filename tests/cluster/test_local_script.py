"""deploy/local.sh as a user runs it (2 replicas, Redis, HAProxy), on free loopback
ports: kill -9 of the replica a session runs on leaves the other serving, the session
resumes through HAProxy with its history, and the script starts the killed replica
again; SIGTERM then drains and stops every process it started."""
from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import psutil
import pytest

from loadtest.haproxy_process import HaproxyAdmin
from tests.reliability.harness import REPO, chat, connect, free_port, history

from .conftest import REPLICA_ARGS

pytestmark = pytest.mark.slow  # two replicas load the model, then one again

NUM_REPLICAS = 2
CLOSED = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED, aiohttp.WSMsgType.ERROR)
LOAD_TIMEOUT_S = 600.0  # model loads on a shared 2-core box


def _free_port_block(n: int) -> int:
    """A port p with p..p+n-1 all free now (the script puts replicas after HAProxy's)."""
    for _ in range(50):
        base = free_port()
        try:
            with contextlib.ExitStack() as held:
                for port in range(base, base + n):
                    held.enter_context(socket.socket()).bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {n} consecutive free ports")


class LocalCluster(HaproxyAdmin):
    """`bash deploy/local.sh N ARGS`, its output in `log_path`; the admin socket of its
    HAProxy (in `run_dir`) answers wait_up, servers_up and sticky."""

    def __init__(self, run_dir: Path, log_path: Path, *serve_args: str):
        super().__init__(run_dir / "admin.sock", ready_timeout_s=LOAD_TIMEOUT_S)
        self.lb_port = _free_port_block(NUM_REPLICAS + 1)
        self.log_path = log_path
        env = {**os.environ, "TOKENWIRE_LB_HOST": "127.0.0.1",
               "TOKENWIRE_LB_PORT": str(self.lb_port),
               "TOKENWIRE_REDIS_PORT": str(free_port()),
               "TOKENWIRE_RUN_DIR": str(run_dir),
               "TOKENWIRE": str(Path(sys.executable).with_name("tokenwire"))}
        env.pop("TOKENWIRE_TLS_CERT", None)
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                ["bash", "deploy/local.sh", str(NUM_REPLICAS), *serve_args], cwd=REPO,
                env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        self.ws_url = f"ws://127.0.0.1:{self.lb_port}/v1/ws"

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"local.sh exited with {self.proc.returncode}:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def processes(self) -> list[psutil.Process]:
        """Everything the script started and still runs (none once it is gone)."""
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def replica_pid(self, name: str) -> int | None:
        """The pid of the `tokenwire serve` that names itself `name`, if one runs."""
        for p in self.processes():
            try:
                args = p.cmdline()
            except psutil.NoSuchProcess:
                continue
            if "--instance-id" in args and args[args.index("--instance-id") + 1] == name:
                return p.pid
        return None

    def wait_restarted(self, name: str, old_pid: int) -> int:
        deadline = time.monotonic() + LOAD_TIMEOUT_S
        while (pid := self.replica_pid(name)) in (None, old_pid):
            self.check_alive()
            assert time.monotonic() < deadline, f"{name} was not started again:\n{self.log()}"
            time.sleep(0.2)
        self.wait_up({name})
        return pid

    def stop(self, timeout_s: float = 120.0) -> tuple[int | None, list[psutil.Process]]:
        """SIGTERM, as Ctrl-C would. (The script's status, None if it hung; what it left
        running, which is then killed.)"""
        started = self.processes()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            status = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            status = None
        left = [p for p in started if _running(p)]
        for p in left:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        return status, left


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


async def _session_with_a_turn(http, lb):
    """A new session with one finished turn; its socket stays open. Returns (ws, hello,
    the history its client saw)."""
    ws, hello = await connect(http, lb)
    content = "Name a colour."
    text, end = await chat(ws, "t0", content)
    assert end["type"] == "done", end
    expected = [{"role": "user", "content": content},
                {"role": "assistant", "content": text}] if text else []
    return ws, hello, expected


async def test_killed_replica_restarts_while_its_session_resumes_elsewhere(tmp_path):
    cluster = LocalCluster(tmp_path / "run", tmp_path / "local.log", *REPLICA_ARGS,
                           "--device", "cpu", "--num-threads", "1", "--log-level", "WARNING")
    try:
        cluster.wait_up()
        async with aiohttp.ClientSession() as http:
            ws, hello, expected = await _session_with_a_turn(http, cluster)
            victim, session_id = hello["instance"], hello["session_id"]
            assert cluster.sticky()[session_id] == victim  # learnt from the 101
            old_pid = cluster.replica_pid(victim)
            os.kill(old_pid, signal.SIGKILL)
            # The client rule: reconnect once the socket drops (the process is gone).
            assert (await ws.receive(timeout=30)).type in CLOSED, "the socket outlived it"
            with contextlib.suppress(psutil.NoSuchProcess):
                psutil.Process(old_pid).wait(30)
            ws, resumed = await connect(http, cluster, session_id)
            assert resumed["resumed"] and resumed["instance"] != victim, resumed
            assert await history(ws) == expected
            _, end = await chat(ws, "t1", "And another?")
            assert end["type"] == "done", end
            await ws.close()
        assert cluster.proc.poll() is None  # the script serves on
        cluster.wait_restarted(victim, old_pid)
        assert f"replica {victim} exited" in cluster.log()
    finally:
        status, left = cluster.stop()
        print(cluster.log())  # shown when the test fails
    assert status == 0 and "draining" in cluster.log()
    assert not left, left
