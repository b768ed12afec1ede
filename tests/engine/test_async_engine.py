"""AsyncEngine: streaming, abort, duplicate ids and shutdown, on a tiny random model."""
import asyncio

import pytest
import torch

from engine import AsyncEngine, EngineConfig, SamplingParams
from engine.errors import EngineDeadError, InvalidRequestError

LONG = SamplingParams(max_tokens=10_000, ignore_eos=True, temperature=0)


@pytest.fixture
async def engine():
    torch.set_num_threads(1)
    eng = AsyncEngine(EngineConfig(model="dummy:tiny", device="cpu", max_model_len=20_000))
    await eng.start()
    yield eng
    await eng.stop()


async def test_streams_each_token_then_one_final_output(engine):
    outs = [o async for o in engine.generate([5, 6, 7], SamplingParams(max_tokens=6,
                                                                       ignore_eos=True))]
    assert sum(len(o.new_token_ids) for o in outs) == 6
    assert [o.finished for o in outs].count(True) == 1 and outs[-1].finished


async def test_duplicate_live_id_is_refused_and_the_first_keeps_running(engine):
    stream = engine.generate([5, 6, 7], LONG, request_id="dup")
    first = await anext(stream)
    with pytest.raises(InvalidRequestError, match="already running"):
        await anext(engine.generate([8, 9], LONG, request_id="dup"))
    second = await anext(stream)
    assert not first.finished and not second.finished
    engine.abort("dup")
    outs = [o async for o in stream]
    assert outs[-1].finish_reason == "cancelled"
    await asyncio.sleep(0.05)
    assert engine.core.blocks.num_free_blocks == engine.core.blocks.num_blocks
    assert not engine.core.requests


async def test_stop_ends_running_requests_instead_of_leaving_them_waiting():
    torch.set_num_threads(1)
    eng = AsyncEngine(EngineConfig(model="dummy:tiny", device="cpu", max_model_len=20_000))
    await eng.start()
    stream = eng.generate([5, 6, 7], LONG)
    await anext(stream)
    await eng.stop()
    rest = await asyncio.wait_for(_drain(stream), timeout=5)
    assert rest[-1].finished and rest[-1].finish_reason == "error"
    with pytest.raises(EngineDeadError):
        await anext(eng.generate([1, 2], LONG))


async def _drain(stream):
    return [o async for o in stream]
