"""Sessions keep their KV (docs/sessions.md, "KV tiers"): a long session parked while it
idles comes back from host RAM after other sessions filled the pool twice over, and from
disk after kill -9, with the greedy output of a server that computed it all; a block file
altered on disk is caught and its tokens prefilled again.

Two real `tokenwire serve` processes on loopback, the default model on CPU, a small pool:
one with the tiers on (the default with the SQLite store), one with `--kv-tiers off` and no
prefix cache, which prefills the whole history every turn, as a tiers-off server does once
other sessions evicted it (and saves the test that eviction's prefills); the same turns on
both, their figures printed side by side.
"""
from __future__ import annotations

import asyncio
import shutil

import aiohttp
import pytest

from tests.sizes import FULL_SIZE

from .harness import connect
from .kv_turns import (BLOCK, LONG_SENTENCES, MIN_CACHED, POOL_BLOCKS, chat, figures, text,
                       tier_metric, wait_for_metric)

# Each filler is half of the long session, so four fill its pool twice over.
FILLER_SENTENCES = 47 if FULL_SIZE else 19
# A ratio shrinks with the prefill it saves: CI's smaller session measured 11.5-12.5x.
MIN_SPEEDUP = 5.0 if FULL_SIZE else 3.0
NUM_FILLERS = 4
IDLE_S = 1.0
# A long heartbeat: the long session's client reads nothing while the fillers run.
FLAGS = ("--block-size", str(BLOCK), "--num-kv-blocks", str(POOL_BLOCKS),
         "--kv-park-idle", str(IDLE_S), "--heartbeat", "600")


async def fill_pool(http, server) -> None:
    """Other sessions, one after another, each prompt as long as half the pool."""
    for i in range(NUM_FILLERS):
        ws, _ = await connect(http, server)
        _, end = await chat(ws, "fill", text(f"Filler Rock {i}", FILLER_SENTENCES))
        assert end["type"] == "done", end
        await ws.close()


class Run:
    """One server's side of the scenario: the long session's socket and what it saw."""

    def __init__(self, server, state_dir, tiers: bool):
        self.server, self.state_dir, self.tiers = server, state_dir, tiers
        self.ws = self.session_id = None
        self.turns: dict[str, tuple[str, dict]] = {}

    async def turn(self, http, name: str, content: str) -> tuple[str, dict]:
        if self.ws is None:
            self.ws, hello = await connect(http, self.server, self.session_id)
            assert hello["resumed"] == (self.session_id is not None)
            self.session_id = hello["session_id"]
        reply, end = await chat(self.ws, name, content)
        self.turns[name] = (reply, figures(end))
        return self.turns[name]

    async def idle_then_crowded_out(self, http) -> None:
        """The long session's first turn, its idle park (tiers on), then the fillers."""
        _, first = await self.turn(http, "long", text("Ardnamurchan", LONG_SENTENCES))
        if self.tiers:  # parked once idle; then crowded out of the pool
            await wait_for_metric(http, self.server, "kv_tier_stores_total", "disk",
                                  first["prompt"] // BLOCK - 1)
            await fill_pool(http, self.server)

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
            self.ws = None


@pytest.fixture(scope="module")
def servers(spawn, tmp_path_factory):
    """Started, then stopped with their block files deleted (hundreds of MB of fp32 KV)."""
    on_dir, off_dir = tmp_path_factory.mktemp("tiers-on"), tmp_path_factory.mktemp("off")
    on = spawn("--state-dir", str(on_dir), *FLAGS, name="on")
    off = spawn("--state-dir", str(off_dir), *FLAGS, "--kv-tiers", "off",
                "--no-prefix-caching", name="off")
    yield (on.start(), on_dir), (off.start(), off_dir)
    for server, state in ((on, on_dir), (off, off_dir)):
        server.stop()
        shutil.rmtree(state)


@pytest.fixture(scope="module")
def idle_turns(servers):
    """Both servers through the idle scenario (the long session's socket open all along,
    closed at the end), for the tests that go on from there."""
    on, off = Run(*servers[0], tiers=True), Run(*servers[1], tiers=False)

    async def scenario():
        async with aiohttp.ClientSession() as http:
            for run in (on, off):
                await run.idle_then_crowded_out(http)
                await run.turn(http, "after idle", "Which place was it? One word.")
                await run.close()

    asyncio.run(scenario())
    return on, off


def side_by_side(label: str, on: dict, off: dict) -> None:
    print(f"\n{label}: tiers on cached {on['cached']}/{on['prompt']} TTFT "
          f"{on['ttft_ms']:.0f} ms | tiers off cached {off['cached']}/{off['prompt']} TTFT "
          f"{off['ttft_ms']:.0f} ms | {off['ttft_ms'] / max(on['ttft_ms'], 1e-3):.1f}x")


def test_an_idle_session_comes_back_from_host_ram(idle_turns):
    on, off = idle_turns
    (on_text, on_fig), (off_text, off_fig) = on.turns["after idle"], off.turns["after idle"]
    side_by_side("after idle, pool filled twice", on_fig, off_fig)
    assert on_fig["cached"] >= MIN_CACHED
    assert off_fig["cached"] < MIN_CACHED  # the tiers, not the pool, kept it
    assert on_fig["ttft_ms"] * MIN_SPEEDUP <= off_fig["ttft_ms"]
    assert on_text == off_text  # restored KV, same greedy reply as a full prefill


async def test_a_session_comes_back_from_disk_after_kill9(idle_turns):
    on, off = idle_turns
    async with aiohttp.ClientSession() as http:
        # Its socket closed: parked through to disk (most blocks were there already).
        await wait_for_metric(http, on.server, "kv_tier_stores_total", "disk",
                              on.turns["after idle"][1]["prompt"] // BLOCK - 1)
        on.server.kill9()
        on.server.start()
        reply, fig = await on.turn(http, "after kill", "And the year? One word.")
        off_reply, off_fig = await off.turn(http, "after kill", "And the year? One word.")
        await on.close()
        await off.close()
    side_by_side("after kill -9 and a restart", fig, off_fig)
    assert fig["cached"] >= MIN_CACHED
    assert fig["ttft_ms"] * MIN_SPEEDUP <= off_fig["ttft_ms"]
    assert reply == off_reply


def flip_a_byte_in_the_middle_of(session_files: list) -> None:
    """Alter one payload byte of a block in the middle of the session's chain: its files
    are the most recently used (the resume's prefetch read them in chain order)."""
    newest_first = sorted(session_files, key=lambda p: p.stat().st_mtime, reverse=True)
    path = newest_first[len(newest_first) // 4]
    data = bytearray(path.read_bytes())
    data[-100] ^= 0xFF
    path.write_bytes(bytes(data))


async def test_an_altered_block_file_is_caught_and_prefilled_again(idle_turns):
    on, off = idle_turns
    on.server.kill9()
    files = [p for p in on.state_dir.glob("kv/*/*") if not p.name.startswith(".")]
    flip_a_byte_in_the_middle_of(files)
    on.server.start()
    async with aiohttp.ClientSession() as http:
        reply, fig = await on.turn(http, "altered", "And the month? One word.")
        off_reply, off_fig = await off.turn(http, "altered", "And the month? One word.")
        corrupt = await tier_metric(http, on.server, "kv_tier_corrupt_blocks_total", "disk")
        await on.close()
        await off.close()
    side_by_side("after a block file was altered", fig, off_fig)
    assert corrupt == 1
    assert fig["cached"] < fig["prompt"] - 10 * BLOCK  # stopped at the altered block
    assert reply == off_reply
