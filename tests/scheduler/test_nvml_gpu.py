"""The real NVML sampler on a GPU machine: while the engine generates on CUDA it reads
utilization > 0 and memory in use, and prints the figures (for docs/benchmarks.md).

Skipped without CUDA or a working NVML. The model is TOKENWIRE_NVML_MODEL (default
random weights in SmolLM2-135M's shape: no download, same kernels):

    pytest tests/scheduler/test_nvml_gpu.py -m gpu -s
"""
from __future__ import annotations

import asyncio
import os
import time

import pytest

from scheduler.signals import ResourceSampler

pytestmark = pytest.mark.gpu

MODEL = os.environ.get("TOKENWIRE_NVML_MODEL", "dummy:smollm2-135m")
STREAMS, MAX_TOKENS = 32, 512


@pytest.fixture
def nvml_sampler():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    sampler = ResourceSampler(interval_s=0.05, device_index=torch.cuda.current_device())
    sampler.sample()
    if not sampler.nvml_available:
        pytest.skip("NVML does not work on this machine")
    return sampler


def test_real_nvml_reads_the_device(nvml_sampler):
    assert 0.0 <= nvml_sampler.gpu_util <= 1.0
    assert 0 < nvml_sampler.gpu_memory_used <= nvml_sampler.gpu_memory_total


async def test_real_nvml_sees_the_engine_generate(nvml_sampler):
    from engine.async_engine import AsyncEngine
    from engine.config import EngineConfig
    from engine.sampling_params import SamplingParams

    idle = _figures(nvml_sampler)
    engine = await asyncio.to_thread(AsyncEngine, EngineConfig(model=MODEL, device="cuda"))
    await engine.start()
    samples: list[tuple[float, int]] = []
    nvml_sampler.start()
    try:
        watcher = asyncio.create_task(_watch(nvml_sampler, samples))
        params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True)
        start = time.perf_counter()
        tokens = sum(await asyncio.gather(*(_run(engine, f"Story {i}:", params)
                                            for i in range(STREAMS))))
        elapsed = time.perf_counter() - start
        watcher.cancel()
    finally:
        await nvml_sampler.stop()
        await engine.stop()
    utils = sorted(u for u, _ in samples)
    busy_mem = max(m for _, m in samples)
    print(f"\nNVML on {MODEL}, {STREAMS} streams x {MAX_TOKENS} tokens: {tokens} tokens in "
          f"{elapsed:.1f}s ({tokens / elapsed:.0f} tok/s); {len(samples)} samples every "
          f"{nvml_sampler.interval_s}s: utilization p50 {utils[len(utils) // 2]:.0%} max "
          f"{utils[-1]:.0%} (idle {idle[0]:.0%}); memory used {busy_mem / 2**30:.2f} GiB "
          f"of {nvml_sampler.gpu_memory_total / 2**30:.1f} GiB (idle {idle[1] / 2**30:.2f} GiB)")
    assert tokens == STREAMS * MAX_TOKENS
    assert len(samples) >= 3
    assert utils[-1] > 0.0
    assert busy_mem > idle[1]  # the engine's weights and KV cache show up


def _figures(sampler: ResourceSampler) -> tuple[float, int]:
    sampler.sample()
    return sampler.gpu_util, sampler.gpu_memory_used


async def _watch(sampler: ResourceSampler, samples: list) -> None:
    """Record what the running sampler last read (it samples on a worker thread)."""
    while True:
        await asyncio.sleep(sampler.interval_s)
        if sampler.gpu_util is not None:
            samples.append((sampler.gpu_util, sampler.gpu_memory_used))


async def _run(engine, prompt: str, params) -> int:
    tokens = 0
    async for out in engine.generate(prompt, params):
        tokens = out.num_output_tokens
    return tokens
