"""HAProxy as the public door of the cluster: it terminates TLS (a wss:// chat turn
through it to a replica, with a self-signed certificate the client trusts) and refuses
/metrics, however the path is spelt, while the replicas serve it inside."""
from __future__ import annotations

import ssl

import aiohttp
import pytest

from loadtest.haproxy_process import HaproxyProcess
from tests.reliability.harness import _http_status, chat, connect

pytestmark = pytest.mark.slow  # three replicas load the model: minutes on a 2-core box

# Spellings of /metrics: the replica's router takes the first two (checked below); the
# others, folded by some routers, must not slip past the door either.
SERVED = ("/metrics", "/%6detrics")
METRICS_PATHS = (*SERVED, "/metrics?x=1", "/./metrics", "//metrics", "/v1/../metrics")


async def test_wss_through_haproxy_completes_a_turn(cluster, tls_pem):
    pem, cert = tls_pem
    client_tls = ssl.create_default_context(cafile=str(cert))  # verifies, 127.0.0.1 in SAN
    addresses = [f"127.0.0.1:{r.port}" for r in cluster.replicas]
    with HaproxyProcess(addresses, tls_cert=pem) as lb:
        assert lb.ws_url.startswith("wss://")
        async with aiohttp.ClientSession() as http:
            ws, hello = await connect(http, lb, ssl=client_tls)
            _, end = await chat(ws, "t0", "Say hello.")
            await ws.close()
            assert end["type"] == "done", end
            assert hello["instance"] in {cluster.name(r) for r in cluster.replicas}
            # The TLS port speaks nothing else.
            with pytest.raises(aiohttp.ClientError):
                await http.ws_connect(lb.ws_url.replace("wss://", "ws://", 1))


def test_metrics_are_refused_at_the_door_but_served_inside(cluster):
    replica = cluster.replicas[0]
    served = {path: _http_status(replica.port, path) for path in SERVED}
    assert all(status == 200 for status in served.values()), served
    at_door = {path: _http_status(cluster.lb.port, path) for path in METRICS_PATHS}
    assert all(status == 403 for status in at_door.values()), at_door
    assert _http_status(cluster.lb.port, "/ready") == 200
