"""The browser page follows the reconnect rule through HAProxy: two replicas (apps on the
shared engine, one session store), a drain of the one holding the page's session while a
turn streams; the turn finishes, the page resumes on the other replica with its history
and goes on."""
from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

from gateway.app import drain
from gateway.sessions.store import MemorySessionStore
from loadtest.haproxy_process import HaproxyProcess

from test_clients import CHROMIUM, TOOLS, require

SCRIPT = Path(__file__).parent / "js" / "browser_reconnect.js"


async def test_browser_page_resumes_after_a_drain(server):
    require(TOOLS / "playwright-core")
    require(CHROMIUM)
    store = MemorySessionStore()
    urls = {name: server.start_app(store=store, instance_id=name, reconnect_after_ms=200)
            for name in ("a", "b")}
    lb = HaproxyProcess([u.removeprefix("http://") for u in urls.values()]).start()
    proc = None
    try:
        proc = await asyncio.create_subprocess_exec(
            shutil.which("node") or "node", str(SCRIPT),
            lb.http_url + "/?max_tokens=60&temperature=0",
            env={**os.environ, "CHROMIUM": str(CHROMIUM)},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        line = await asyncio.wait_for(proc.stdout.readline(), 120)
        assert line.strip() == b"streaming", (line, (await proc.stderr.read())[-2000:])
        holder = lb.sticky()
        (first,) = set(holder.values())
        app = server.apps[urls["a" if first == "r1" else "b"]]
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(drain(app), server.loop))
        out, err = await asyncio.wait_for(proc.communicate(), 180)
        assert proc.returncode == 0, err.decode()[-2000:]
    finally:
        if proc is not None and proc.returncode is None:
            proc.kill()
        lb.stop()
        for url in urls.values():
            server.stop_app(url)
    result = json.loads(out.decode().strip().splitlines()[-1])
    hellos = result["hellos"]
    assert len(hellos) == 2 and hellos[1]["resumed"], hellos
    assert hellos[0]["instance"] != hellos[1]["instance"], hellos
    assert result["users"] == ["What is the capital of France?",
                               "Count from one to thirty in words.", "Thank you."]
    # The drain let the streaming turn finish: three turns, none cut.
    assert len(result["dones"]) == 3 and "cancelled" not in result["dones"], result["dones"]
