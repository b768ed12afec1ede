"""TLS on `tokenwire serve` itself (--ssl-certfile/--ssl-keyfile, --ssl-ca-certs): the
OpenAI SDK chats over https://, WebSocket clients dial wss:// on both socket endpoints,
plain HTTP to the TLS port gets nothing, an unfinished handshake is cut at
--header-timeout, and a bad certificate stops the server before it starts."""
from __future__ import annotations

import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import httpx
import openai
import pytest
import websockets

from common.errors import ConfigError
from gateway.config import GatewayConfig
from loadtest.server_process import REPO, ServerProcess, free_port, http_get

KEY = "sk-tls-test-key-0123456789"
# A tiny random model on torch attention: starts in seconds, its text does not matter.
TINY = ["--model", "dummy:tiny", "--device", "cpu", "--num-threads", "1",
        "--attention-backend", "torch", "--num-kv-blocks", "64", "--session-store", "memory:"]


def _self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """(certificate, key) for 127.0.0.1, made with the openssl CLI."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec",
                    "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    return cert, key


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("tls")
    (cert, key), (client, client_key) = _self_signed(tmp, "server"), _self_signed(tmp, "client")
    return {"cert": cert, "key": key, "client": client, "client_key": client_key}


@pytest.fixture(scope="module")
def trust(certs) -> ssl.SSLContext:
    """A client context that trusts only the test's server certificate."""
    return ssl.create_default_context(cafile=str(certs["cert"]))


@pytest.fixture(scope="module")
def server(certs, trust):
    with ServerProcess([*TINY, "--ssl-certfile", str(certs["cert"]), "--ssl-keyfile",
                        str(certs["key"]), "--api-key", KEY, "--header-timeout", "1"],
                       tls=trust) as server:
        yield server


def test_the_openai_sdk_chats_over_https(server, trust):
    with httpx.Client(verify=trust) as http:
        client = openai.OpenAI(base_url=server.base + "/v1", api_key=KEY, http_client=http)
        reply = client.chat.completions.create(
            model="dummy:tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert server.base.startswith("https://")
    assert reply.choices[0].finish_reason in ("stop", "length")
    assert reply.usage.completion_tokens >= 1


async def test_websockets_dial_wss_on_both_socket_endpoints(server, trust):
    auth = {"Authorization": f"Bearer {KEY}"}
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(server.ws_url, ssl=trust, headers=auth) as ws:
            hello = await ws.receive_json(timeout=30)
    realtime = server.ws_url.replace("/v1/ws", "/v1/realtime")
    async with websockets.connect(realtime, ssl=trust, additional_headers=auth) as ws:
        created = json.loads(await ws.recv())
    assert server.ws_url.startswith("wss://")
    assert hello["type"] == "hello" and created["type"] == "session.created"


# The WHATWG WebSocket a browser has, built into Node (22+; 20 behind a flag): no headers,
# so the key goes as a subprotocol, beside the `realtime` one the server echoes.
NODE_WSS = """
const ws = new WebSocket(process.argv[1], ["realtime", "openai-insecure-api-key." + process.argv[2]]);
ws.onmessage = (e) => { console.log(JSON.stringify({protocol: ws.protocol,
                                                    type: JSON.parse(e.data).type})); ws.close(); };
ws.onerror = (e) => { console.error(e.message || "error"); process.exit(1); };
"""


def test_nodes_built_in_websocket_dials_wss(server, certs):
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    major = int(subprocess.check_output([node, "--version"], text=True)[1:].split(".")[0])
    flags = ["--experimental-websocket"] if major < 22 else []
    url = server.ws_url.replace("/v1/ws", "/v1/realtime")
    done = subprocess.run([node, *flags, "-e", NODE_WSS, url, KEY], capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, "NODE_EXTRA_CA_CERTS": str(certs["cert"])})
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == {"protocol": "realtime", "type": "session.created"}


def test_plain_http_to_the_tls_port_gets_no_answer(server, trust):
    plain = server.base.replace("https://", "http://")
    assert http_get(plain + "/health") == (0, "")
    assert http_get(server.base + "/health", context=trust)[0] == 200


def test_an_unfinished_handshake_is_cut_at_the_header_timeout(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        started = time.monotonic()
        assert sock.recv(1) == b""  # the server closed it; a timeout would raise
        assert time.monotonic() - started < 5  # --header-timeout 1; asyncio's own: 60 s


def test_client_certificates_with_ssl_ca_certs(certs, trust):
    """--ssl-ca-certs: a client without a certificate the CA signed is refused in the
    handshake; one with it is served."""
    mutual = ssl.create_default_context(cafile=str(certs["cert"]))
    mutual.load_cert_chain(certs["client"], certs["client_key"])
    with ServerProcess([*TINY, "--ssl-certfile", str(certs["cert"]), "--ssl-keyfile",
                        str(certs["key"]), "--ssl-ca-certs", str(certs["client"])],
                       tls=mutual) as server:
        assert http_get(server.base + "/health", context=mutual)[0] == 200
        assert http_get(server.base + "/health", context=trust)[0] == 0


def test_tls_does_not_stand_in_for_keys():
    """A non-loopback bind with TLS still needs API keys (or --insecure-no-auth)."""
    with pytest.raises(ConfigError, match="needs API keys"):
        GatewayConfig(host="0.0.0.0", ssl_certfile="cert.pem", ssl_keyfile="key.pem")


def test_a_certificate_that_cannot_load_stops_the_server(certs, tmp_path):
    missing = tmp_path / "missing.pem"
    serve = [sys.executable, "-m", "gateway.cli", "serve", "--port", str(free_port()),
             *TINY, "--ssl-certfile", str(certs["cert"]), "--ssl-keyfile", str(missing)]
    refused = subprocess.run(serve, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2
    assert "ssl_certfile: cannot load the certificate and key" in refused.stderr
