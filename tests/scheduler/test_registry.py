"""ModelRegistry over real engines (dummy:tiny on CPU): shared loads, the bound on load
waiters, keep-alive 0, a held model never unloaded, and a model whose engine dies."""
from __future__ import annotations

import asyncio

import pytest

from engine import SamplingParams
from engine.async_engine import AbortRequest
from engine.config import EngineConfig
from scheduler.models import ModelSlot
from scheduler.registry import ModelBusy, ModelRegistry, ModelUnavailable
from scheduler.ticket import Rejected

pytestmark = pytest.mark.usefixtures("cpu_kernels")


def _slot(name: str, keep_alive_s: float = -1, preload: bool = False) -> ModelSlot:
    config = EngineConfig(model="dummy:tiny", device="cpu", num_kv_blocks=16,
                          max_model_len=256, max_num_seqs=2)
    return ModelSlot(config=config, name=name, keep_alive_s=keep_alive_s, preload=preload)


async def test_waiters_share_one_load_and_too_many_are_refused():
    b = _slot("b", keep_alive_s=0)
    models = ModelRegistry([_slot("a", preload=True), b], max_load_waiters=2)
    try:
        results = await asyncio.gather(*(models.hold(b) for _ in range(4)),
                                       return_exceptions=True)
        refused = [r for r in results if isinstance(r, Rejected)]
        assert len(refused) == 2 and refused[0].code == "overloaded"
        assert results[:2] == [None, None] and b.loaded and b.loads == 1
        with pytest.raises(ModelBusy):
            await models.unload(b)  # held: never unloaded
        for _ in range(4):
            models.release(b)
        for _ in range(100):  # keep-alive 0: unloaded once the last hold ends
            if not b.loaded:
                break
            await asyncio.sleep(0.02)
        assert models.state(b) == "unloaded"
    finally:
        await models.stop()


async def test_a_model_whose_engine_dies_fails_alone_until_a_load_retries_it():
    a, b = _slot("a", preload=True), _slot("b")
    models = ModelRegistry([a, b])
    try:
        await models.load(a)
        await models.load(b)
        dead = b.engine()

        def boom():
            raise RuntimeError("injected fault outside a step")

        dead.core.has_work = boom  # the engine loop's own check: its thread dies
        dead._submit(AbortRequest("wake"))
        await asyncio.wait_for(b.dead.wait(), 10)
        assert models.state(b) == "failed" and "injected fault" in b.reason
        with pytest.raises(ModelUnavailable, match="engine is dead"):
            await models.hold(b)
        models.release(b)
        await models.hold(a)  # the other model serves on
        outs = [o async for o in a.engine().generate([1, 2, 3], SamplingParams(max_tokens=2))]
        models.release(a)
        assert outs[-1].finish_reason == "length" and models.state(a) == "loaded"
        await models.load(b)  # a retry: the dead engine dropped, a new one loaded
        assert models.state(b) == "loaded" and b.engine() is not dead and b.loads == 2
    finally:
        await models.stop()


async def test_a_hold_during_an_unload_to_make_room_waits_for_its_own_load():
    """c's load unloads the idle d to fit the budget; a request for d that comes while that
    unload runs must not find d "loaded" and then lose its engine: it waits for d to load
    again, after c's hold ends (the race a two-model gateway test met under CI)."""
    a, c, d = _slot("a", preload=True), _slot("c"), _slot("d")
    models = ModelRegistry([a, c, d], memory_budget=1)  # one model beside the default
    try:
        await models.load(a)
        await models.hold(d)
        models.release(d)
        # A tiny model's RSS growth can be 0 where the heap reuses memory freed by earlier
        # tests: its footprint as measured is set, so c (taken to be as large) must unload d.
        d.memory_bytes = 1 << 20
        assert d.loaded
        loading_c = asyncio.create_task(models.hold(c))
        while d.loaded and d in models._watchers:  # the unload's first step
            await asyncio.sleep(0)
        holding_d = asyncio.create_task(models.hold(d))
        await loading_c
        await asyncio.sleep(0.1)
        assert c.loaded and not holding_d.done()  # d waits while c is held
        models.release(c)
        await asyncio.wait_for(holding_d, 60)
        assert d.loaded and d.engine() is not None and not c.loaded
        models.release(d)
    finally:
        await models.stop()
