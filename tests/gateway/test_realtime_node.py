"""A second real client of /v1/realtime: the openai npm package's realtime WebSocket client
(OpenAIRealtimeWS over `ws`, pinned in tests/gateway/package-lock.json, installed by
scripts/setup_browser.sh). That client always speaks wss://, so this app is served over
TLS with a throwaway self-signed certificate that node is told to trust."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import subprocess
from pathlib import Path

from test_clients import TOOLS, require

SCRIPT = Path(__file__).parent / "js" / "realtime_node.mjs"


def self_signed(tmp: Path) -> tuple[Path, ssl.SSLContext]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return cert, context


async def test_node_openai_realtime_client_two_turns(server, tmp_path):
    require(TOOLS / "openai")
    require(TOOLS / "ws")
    cert, context = self_signed(tmp_path)
    url = server.start_app(ssl=context)
    try:
        proc = await asyncio.create_subprocess_exec(
            shutil.which("node") or "node", str(SCRIPT), url + "/v1",
            env={**os.environ, "NODE_EXTRA_CA_CERTS": str(cert)},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 180)
    finally:
        server.stop_app(url)
    assert proc.returncode == 0, err.decode()[-2000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    first, second = result["turns"]
    assert result["session_id"] and result["types"][0] == "session.created"
    assert "Paris" in first["text"] and second["text"]
    assert result["types"].count("response.done") == 2
    assert result["types"].count("error") == 0
    # The second turn's prompt carries the first, and finds it in the prefix cache.
    assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"]
    assert second["usage"]["input_token_details"]["cached_tokens"] > 0
    assert server.all_blocks_free()
