"""Three real `tokenwire serve` replicas sharing one Redis session store, behind the
shipped HAProxy config, all on loopback (real redis-server and haproxy processes): one cluster for the whole package (each replica loads
the model, ~30-60 s on the CI box). A test that kills or restarts replicas leaves all
three up and seen up by HAProxy when it ends.
"""
from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from loadtest.haproxy_process import HaproxyProcess
from tests.reliability.harness import ServerProcess
from tests.services import RedisServer

BLOCK_SIZE = 16
REPLICA_ARGS = ("--block-size", str(BLOCK_SIZE), "--num-kv-blocks", "256",
                "--drain-timeout", "60", "--reconnect-after", "300",
                # The CI box is slow and shared: no refusals from the TTFT estimate.
                "--ttft-bound-s", "600")


class Cluster:
    """replicas[i] is HAProxy's server r{i+1}, and says so in hello.instance."""

    def __init__(self, replicas: list[ServerProcess], lb: HaproxyProcess):
        self.replicas, self.lb = replicas, lb

    def name(self, replica: ServerProcess) -> str:
        return f"r{self.replicas.index(replica) + 1}"

    def replica(self, name: str) -> ServerProcess:
        return self.replicas[int(name[1:]) - 1]

    def restart(self, replica: ServerProcess) -> None:
        """Start a stopped replica again on its port; return once HAProxy sees it up."""
        replica.start()
        self.lb.wait_up()


@pytest.fixture(scope="package")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    redis = RedisServer(tmp / "redis").start()
    replicas = [ServerProcess(tmp / f"r{i + 1}.log", "--session-store", redis.url,
                              "--instance-id", f"r{i + 1}", *REPLICA_ARGS)
                for i in range(3)]
    try:
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(ServerProcess.start, replicas))
        with HaproxyProcess([f"127.0.0.1:{r.port}" for r in replicas]) as lb:
            yield Cluster(replicas, lb)
    finally:
        for replica in replicas:
            replica.stop()
        redis.stop()


@pytest.fixture(scope="package")
def tls_pem(tmp_path_factory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (openssl, as on every Debian box):
    (the PEM HAProxy loads, certificate and key; the certificate alone, for clients)."""
    tmp = tmp_path_factory.mktemp("tls")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec",
                    "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    pem = tmp / "haproxy.pem"
    pem.write_text(cert.read_text() + key.read_text())
    return pem, cert
