"""A Responses chain survives `tokenwire serve` being killed -9 and restarted: its stored
responses are in the SQLite store of the state directory (the default), so the next
`previous_response_id` finds the full history, over HTTP and over WebSocket mode."""
from __future__ import annotations

import asyncio
import sys

import aiohttp
from openai import AsyncOpenAI
from test_serve import free_port, wait_ready

FAST = {"model": "default", "max_output_tokens": 8, "temperature": 0}


async def _serve(tmp_path, port: int):
    log = open(tmp_path / f"serve-{port}.log", "ab")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", "serve", "--port", str(port), "--num-threads",
        "1", "--state-dir", str(tmp_path / "state"), stdout=log,
        stderr=asyncio.subprocess.STDOUT)
    async with aiohttp.ClientSession() as s:
        await wait_ready(s, f"http://127.0.0.1:{port}", proc)
    return proc, log


async def test_chain_survives_kill_and_restart(tmp_path):
    port = free_port()
    client = AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused",
                         max_retries=0)
    proc, log = await _serve(tmp_path, port)
    try:
        first = await client.responses.create(input="My name is Ada.", **FAST)
        second = await client.responses.create(input="I live in Paris.",
                                               previous_response_id=first.id, **FAST)
        proc.kill()  # -9: nothing is flushed on the way out
        await proc.wait()
        log.close()
        proc, log = await _serve(tmp_path, port)
        got = await client.responses.retrieve(second.id)
        assert got.output_text == second.output_text
        third = await client.responses.create(input="What is my name?",
                                              previous_response_id=second.id, **FAST)
        # Its prompt holds both earlier turns, questions and replies.
        assert third.usage.input_tokens > second.usage.input_tokens + \
            second.usage.output_tokens
        async with client.responses.connect() as conn:
            await conn.response.create(input="And where do I live?",
                                       previous_response_id=third.id, **FAST)
            async for event in conn:
                assert event.type != "error", event
                if event.type in ("response.completed", "response.incomplete"):
                    break
        assert event.response.usage.input_tokens > third.usage.input_tokens
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        log.close()
