"""A sequence's blocks in the KV tiers through AsyncEngine: park (written down to host RAM
and through to disk while the pool keeps them), prefetch (loaded back into the pool ahead
of a request, after a restart), forget (deleted from every tier)."""
import asyncio

from engine.async_engine import AsyncEngine
from engine.config import EngineConfig
from engine.sampling_params import SamplingParams
from tests.engine.test_kv_tiers import (  # noqa: F401 - prompts: a fixture
    BLOCK,
    CACHEABLE,
    GREEDY,
    LONG_TOKENS,
    block_hashes,
    prompts,
)

POOL_BLOCKS = 64
FULL = LONG_TOKENS // BLOCK  # the long prompt's full blocks, all computed once it ran


async def started(disk_dir, **tiers) -> AsyncEngine:
    config = EngineConfig(model="default", device="cpu", num_kv_blocks=POOL_BLOCKS,
                          block_size=BLOCK, max_num_batched_tokens=512,
                          kv_disk_dir=str(disk_dir), **tiers)
    engine = await asyncio.to_thread(AsyncEngine, config)
    await engine.start()
    return engine


async def run(engine: AsyncEngine, prompt: list[int], params: SamplingParams = GREEDY):
    """(the generated token ids, the cached prompt tokens)"""
    tokens = []
    async for out in engine.generate(prompt, params):
        tokens += out.new_token_ids
    return tokens, out.num_cached_tokens


def files(disk_dir) -> set[str]:
    return {p.name for p in disk_dir.glob("*/*") if not p.name.startswith(".")}


async def test_park_writes_through_to_disk_and_a_restart_prefetches_it(prompts, tmp_path):
    long, _ = prompts
    engine = await started(tmp_path, kv_host_bytes=64 << 20)
    try:
        first = await run(engine, long)
        # Nothing was evicted, so only a park puts the blocks below the pool.
        assert files(tmp_path) == set()
        assert await engine.park(long) == FULL
        engine.core.kv_tiers.disk.flush()
        assert files(tmp_path) == {h.hex() for h in block_hashes(long)}
        assert engine.stats().num_free_blocks == POOL_BLOCKS  # the pool kept them, free
    finally:
        await engine.stop()
    restarted = await started(tmp_path, kv_host_bytes=64 << 20)
    try:
        assert await restarted.prefetch(long) == FULL
        assert restarted.stats().kv_tiers["disk"].loads == FULL
        again = await run(restarted, long)
        assert again == (first[0], CACHEABLE)
        assert restarted.stats().kv_tiers["disk"].loads == FULL  # the pool served it
    finally:
        await restarted.stop()


async def test_forget_deletes_a_sequence_from_every_tier(prompts, tmp_path):
    long, fillers = prompts
    engine = await started(tmp_path, kv_host_bytes=64 << 20)
    try:
        await run(engine, long)
        await run(engine, fillers[0])
        await engine.park(long)
        await engine.park(fillers[0])
        engine.core.kv_tiers.disk.flush()
        parked = files(tmp_path)
        hashes = [h.hex() for h in block_hashes(long)]
        # a prefix others share (a deleted response's earlier turns): its full blocks stay
        assert await engine.forget(long, keep_tokens=5 * BLOCK + 3) == FULL - 5
        assert parked - files(tmp_path) == set(hashes[5:])
        assert await engine.forget(long) == 5
        assert parked - files(tmp_path) == set(hashes)
        assert all(h not in engine.core.kv_tiers.host for h in block_hashes(long))
        assert files(tmp_path)  # the filler's blocks stay
        assert await engine.forget(long) == 0
    finally:
        await engine.stop()


async def test_tier_calls_on_a_short_sequence_or_a_stopped_engine_do_nothing(prompts,
                                                                             tmp_path):
    long, _ = prompts
    engine = await started(tmp_path, kv_host_bytes=1 << 20)
    try:
        for action in (engine.park, engine.prefetch, engine.forget):
            assert await action([1, 2, 3]) == 0  # no full block
    finally:
        await engine.stop()
    for action in (engine.park, engine.prefetch, engine.forget):
        assert await asyncio.wait_for(action(long), 5) == 0
