"""Third-party clients against the real server: wscat (npm) and the browser page in Chromium.

scripts/setup_browser.sh installs both (Debian's chromium; wscat and playwright-core from
tests/gateway/js/package-lock.json into tests/gateway/js/node_modules). The browser test writes
its screenshot to a temporary file; TOKENWIRE_UPDATE_SCREENSHOT=1 copies it to
docs/browser-chat.png (the one the README shows) so ordinary runs leave the tree clean.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = Path(__file__).resolve().parent / "js" / "node_modules"
WSCAT = TOOLS / ".bin" / "wscat"
CHROMIUM = Path(os.environ.get("CHROMIUM", "/usr/bin/chromium"))
SCREENSHOT = REPO / "docs" / "browser-chat.png"
BLOCK_SIZE = 16  # the engine's KV block: the prefix cache shares whole blocks only


def require(path: Path) -> None:
    if not path.exists():
        pytest.fail(f"{path} missing: run bash scripts/setup_browser.sh")


async def read_json_line(stream: asyncio.StreamReader, timeout: float = 60.0) -> dict:
    """The next JSON object wscat printed (it prefixes the first one after input with '> ')."""
    while True:
        line = (await asyncio.wait_for(stream.readline(), timeout)).decode()
        assert line, "wscat exited early"
        line = line.strip().removeprefix("> ").strip()
        if line.startswith("{"):
            return json.loads(line)


async def test_wscat_completes_a_chat_turn(base_url):
    require(WSCAT)
    proc = await asyncio.create_subprocess_exec(
        str(WSCAT), "--no-color", "-c", base_url.replace("http", "ws") + "/v1/ws",
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT)
    try:
        hello = await read_json_line(proc.stdout)
        assert hello["type"] == "hello"
        chat = {"type": "chat", "id": "w1", "content": "What is the capital of France?",
                "params": {"max_tokens": 16, "temperature": 0}}
        proc.stdin.write((json.dumps(chat) + "\n").encode())
        await proc.stdin.drain()
        text = ""
        while True:
            frame = await read_json_line(proc.stdout)
            if frame["type"] == "delta":
                text += frame["text"]
            elif frame["type"] == "done":
                break
        assert frame["id"] == "w1" and frame["usage"]["completion_tokens"] > 0
        assert "Paris" in text
    finally:
        proc.kill()
        await proc.wait()


async def test_browser_page_two_turn_chat(server, base_url, tmp_path):
    require(TOOLS / "playwright-core")
    require(CHROMIUM)
    assert server.engine.core.config.block_size == BLOCK_SIZE
    shot = tmp_path / "browser-chat.png"
    # Turns 1 and 2 end at EOS; max_tokens only bounds the long third reply, which must
    # still be streaming when Playwright's click lands (200 tokens ran out first on CI).
    proc = await asyncio.create_subprocess_exec(
        shutil.which("node") or "node", str(Path(__file__).parent / "js" / "browser_chat.js"),
        base_url + "/?max_tokens=1000&temperature=0", str(shot),
        env={**os.environ, "CHROMIUM": str(CHROMIUM)},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 180)
    assert proc.returncode == 0, err.decode()[-2000:]
    result = json.loads(out.decode().strip().splitlines()[-1])
    assert result["users"] == [
        "Please answer in one short sentence, in plain English, for a school quiz: what is "
        "the capital of France?", "And what is its most famous tower?"]
    assert len(result["replies"]) == 2 and all(r.strip() for r in result["replies"])
    assert "Paris" in result["replies"][0]
    assert all(m.startswith("TTFT ") and "tok/s" in m for m in result["metas"])
    # Turn 2's prompt starts with turn 1's, so every full block of turn 1's prompt comes
    # from the prefix cache: more than the system prompt's blocks that any chat shares.
    first, second = result["usages"][:2]
    bound = first["prompt_tokens"] // BLOCK_SIZE * BLOCK_SIZE
    assert bound >= 3 * BLOCK_SIZE and second["cached_tokens"] >= bound, result["usages"]
    assert f"{second['cached_tokens']} cached" in result["metas"][1]
    assert result["stopped"].endswith("· cancelled")  # the Stop button ended turn 3
    assert result["consoleErrors"] == []
    assert shot.stat().st_size > 10_000
    if os.environ.get("TOKENWIRE_UPDATE_SCREENSHOT"):
        SCREENSHOT.parent.mkdir(exist_ok=True)
        shutil.copyfile(shot, SCREENSHOT)
