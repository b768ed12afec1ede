"""Rolling restart of the three replicas under `tokenwire loadtest --dataset sessions`
through HAProxy: no turn fails; the ones cut short by a drain are sent again by the
client on another replica (and then succeed), and the load tester reports them with the
reconnects."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from tests.reliability.harness import REPO, _http_status

pytestmark = pytest.mark.slow  # three replicas load the model: minutes on a 2-core box

NUM_SESSIONS = 6
SETTLE_TIMEOUT_S = 120.0


def _sessions_attached(cluster) -> int:
    """Sessions attached to a socket, summed over the replicas' /metrics."""
    total = 0
    for replica in cluster.replicas:
        with urllib.request.urlopen(replica.http_url + "/metrics", timeout=5) as resp:
            for line in resp.read().decode().splitlines():
                if line.startswith("tokenwire_sessions_active "):
                    total += float(line.split()[1])
    return int(total)


def _wait_attached(cluster, load: subprocess.Popen) -> None:
    """Until every session of the load is attached somewhere (the load test's own first
    socket, which opened a session too, may be gone after a restart)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while _sessions_attached(cluster) < NUM_SESSIONS:
        assert load.poll() is None, "the load test ended early"
        assert time.monotonic() < deadline, "the sessions did not all reattach"
        time.sleep(0.5)


def test_rolling_restart_under_session_load(cluster, tmp_path):
    result_path, log_path = tmp_path / "result.json", tmp_path / "loadtest.log"
    # More turns than the restarts take: the load is wound down with SIGINT after them.
    cmd = [sys.executable, "-m", "gateway.cli", "loadtest", "--url", cluster.lb.ws_url,
           "--dataset", "sessions", "--num-sessions", str(NUM_SESSIONS), "--turns", "2000",
           "--random-input-len", "12", "--random-output-len", "8", "--think-time", "1",
           "--tokenizer", "none", "--disable-tqdm", "--result-json", str(result_path)]
    with open(log_path, "wb") as log:
        load = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_attached(cluster, load)
        for replica in cluster.replicas:
            replica.terminate()  # SIGTERM: the gateway drains
            assert replica.proc.wait(120) == 0, replica.log()
            cluster.restart(replica)
            assert _http_status(replica.port, "/ready") == 200
            _wait_attached(cluster, load)
        load.send_signal(signal.SIGINT)  # no new turns; the ones in flight end
        assert load.wait(120) == 0, log_path.read_text()
    finally:
        if load.poll() is None:
            load.kill()
    result = json.loads(result_path.read_text())
    report = log_path.read_text()
    assert result["failed"] == 0, (result["errors_by_code"], report)
    # Every replica held sessions when it drained (leastconn spreads 6 over 3).
    assert result["reconnects"] >= len(cluster.replicas), report
    assert "Reconnects" in report and "Retried requests" in report
    print(f"\nrolling restart: {result['completed']} turns, {result['reconnects']} "
          f"reconnects, {result['retried_requests']} turns retried, 0 failed")
