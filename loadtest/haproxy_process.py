"""deploy/haproxy/haproxy.cfg run as a child process on loopback, for the tests and the
load-balancer benchmark.

    with HaproxyProcess(["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"]) as lb:
        lb.ws_url                       # ws://127.0.0.1:PORT/v1/ws
        lb.servers_up()                 # {"r1": True, ...} from HAProxy's own health checks
        lb.sticky()                     # {session_id: "r2", ...}: the stick table

The shipped file is used as it is: addresses come in through its environment variables,
and a second file adds only an admin socket (HAProxy merges `global` sections).
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

from loadtest.server_process import free_port, stop_process

CONFIG = Path(__file__).resolve().parents[1] / "deploy" / "haproxy" / "haproxy.cfg"
NUM_SERVERS = 3  # server lines in the shipped config


class HaproxyProcess:
    """`haproxy -f haproxy.cfg` in front of up to three replicas. With fewer addresses the
    first is repeated, so every server line names a replica that exists."""

    def __init__(self, replicas: list[str], ready_timeout_s: float = 60.0):
        if not 1 <= len(replicas) <= NUM_SERVERS:
            raise ValueError(f"1 to {NUM_SERVERS} replicas, got {len(replicas)}")
        self.replicas = replicas + [replicas[0]] * (NUM_SERVERS - len(replicas))
        self.port = free_port()
        self.ws_url = f"ws://127.0.0.1:{self.port}/v1/ws"
        self.http_url = f"http://127.0.0.1:{self.port}"
        self.ready_timeout_s = ready_timeout_s
        self._dir = Path(tempfile.mkdtemp(prefix="tokenwire-haproxy-"))
        self.admin = self._dir / "admin.sock"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "HaproxyProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "HaproxyProcess":
        extra = self._dir / "admin.cfg"
        extra.write_text(f"global\n    stats socket {self.admin} level admin\n")
        env = {**os.environ, "TOKENWIRE_LB_BIND": f"127.0.0.1:{self.port}"}
        env.update({f"TOKENWIRE_REPLICA_{i + 1}": addr for i, addr in enumerate(self.replicas)})
        log = open(self._dir / "haproxy.log", "wb")
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(CONFIG), "-f", str(extra)],
                                     env=env, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT)
        log.close()
        self.wait_up()
        return self

    def wait_up(self, names: set[str] | None = None) -> None:
        """Until HAProxy's health checks see every server (or `names`) up."""
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"haproxy exited:\n{self.log()}")
            try:
                up = self.servers_up()
            except OSError:
                up = {}
            if up and all(up.get(n) for n in (names or up)):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"haproxy sees {up} after {self.ready_timeout_s}s")
            time.sleep(0.2)

    def servers_up(self) -> dict[str, bool]:
        """Server name -> whether HAProxy's checks say UP (DRAIN and MAINT count as not)."""
        lines = self.command("show stat").splitlines()
        header = lines[0].lstrip("# ").split(",")
        rows = [dict(zip(header, line.split(","))) for line in lines[1:] if line]
        return {r["svname"]: r["status"] == "UP" for r in rows
                if r["pxname"] == "replicas" and r["svname"] not in ("BACKEND", "FRONTEND")}

    def sticky(self) -> dict[str, str]:
        """The stick table: session id -> server name."""
        names = {r["srv_id"]: r["srv_name"] for r in self._servers_state()}
        table = {}
        for line in self.command("show table replicas").splitlines()[1:]:
            fields = dict(part.split("=", 1) for part in line.split()[1:] if "=" in part)
            if "key" in fields and "server_id" in fields:
                table[fields["key"]] = names.get(fields["server_id"], fields["server_id"])
        return table

    def _servers_state(self) -> list[dict]:
        lines = self.command("show servers state replicas").splitlines()
        header = lines[1].lstrip("# ").split()
        return [dict(zip(header, line.split())) for line in lines[2:] if line.strip()]

    def command(self, text: str) -> str:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(5)
            s.connect(str(self.admin))
            s.sendall(text.encode() + b"\n")
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def log(self) -> str:
        path = self._dir / "haproxy.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        stop_process(self.proc, 10)
        shutil.rmtree(self._dir, ignore_errors=True)
