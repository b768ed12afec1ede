"""deploy/haproxy/haproxy.cfg run as a child process on loopback, for the tests and the
load-balancer benchmark.

    with HaproxyProcess(["127.0.0.1:8001", "127.0.0.1:8002", "127.0.0.1:8003"]) as lb:
        lb.ws_url                       # ws://127.0.0.1:PORT/v1/ws (wss:// with tls_cert)
        lb.servers_up()                 # {"r1": True, ...} from HAProxy's own health checks
        lb.sticky()                     # {session_id: "r2", ...}: the stick table

The shipped file is used as it is, with one `server` line per replica appended (as
deploy/local.sh does) and an admin socket; its other addresses come in through its
environment variables. HaproxyAdmin alone talks to the admin socket of an HAProxy that
something else started (deploy/local.sh's).
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


def render_config(replicas: list[str], admin: Path) -> str:
    """The shipped config, server r1..rN for `replicas` and an admin socket at `admin`."""
    servers = "".join(f"    server r{i + 1} {addr}\n" for i, addr in enumerate(replicas))
    return (f"{CONFIG.read_text()}{servers}"
            f"\nglobal\n    stats socket {admin} level admin\n")


class HaproxyAdmin:
    """Server states and the stick table, read from HAProxy's admin socket."""

    def __init__(self, admin: Path, ready_timeout_s: float = 60.0):
        self.admin = admin
        self.ready_timeout_s = ready_timeout_s

    def wait_up(self, names: set[str] | None = None) -> None:
        """Until HAProxy's health checks see every server (or `names`) up."""
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            self.check_alive()
            try:
                up = self.servers_up()
            except OSError:
                up = {}
            if up and all(up.get(n) for n in (names or up)):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"haproxy sees {up} after {self.ready_timeout_s}s")
            time.sleep(0.2)

    def check_alive(self) -> None:
        """Raise if HAProxy is known to have exited; whoever owns the process knows."""

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


class HaproxyProcess(HaproxyAdmin):
    """`haproxy -f haproxy.cfg` in front of `replicas` (server r1, r2, ... in order);
    with `tls_cert` (a PEM with the certificate and its key) it speaks TLS only."""

    def __init__(self, replicas: list[str], ready_timeout_s: float = 60.0,
                 tls_cert: Path | None = None):
        if not replicas:
            raise ValueError("no replicas")
        self._dir = Path(tempfile.mkdtemp(prefix="tokenwire-haproxy-"))
        super().__init__(self._dir / "admin.sock", ready_timeout_s)
        self.replicas = replicas
        self.tls_cert = tls_cert
        self.port = free_port()
        scheme = "s" if tls_cert else ""
        self.ws_url = f"ws{scheme}://127.0.0.1:{self.port}/v1/ws"
        self.http_url = f"http{scheme}://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "HaproxyProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> "HaproxyProcess":
        config = self._dir / "haproxy.cfg"
        config.write_text(render_config(self.replicas, self.admin))
        env = {**os.environ, "TOKENWIRE_LB_BIND": f"127.0.0.1:{self.port}"}
        env.pop("TOKENWIRE_TLS_CERT", None)
        if self.tls_cert:
            env["TOKENWIRE_TLS_CERT"] = str(self.tls_cert)
        log = open(self._dir / "haproxy.log", "wb")
        self.proc = subprocess.Popen(["haproxy", "-db", "-f", str(config)],
                                     env=env, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=subprocess.STDOUT)
        log.close()
        self.wait_up()
        return self

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(f"haproxy exited:\n{self.log()}")

    def log(self) -> str:
        path = self._dir / "haproxy.log"
        return path.read_text(errors="replace")[-3000:] if path.exists() else ""

    def stop(self) -> None:
        stop_process(self.proc, 10)
        shutil.rmtree(self._dir, ignore_errors=True)
