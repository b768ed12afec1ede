"""ResourceSampler against a fake pynvml module (injected), and the DrainRate meter."""
import asyncio
import logging
import sys
import types

import pytest

from scheduler.signals import DrainRate, ResourceSampler


class FakeNvml:
    """Just the pynvml calls the sampler makes; `fail_on` names one to raise from."""

    def __init__(self, fail_on: str | None = None):
        self.fail_on = fail_on
        self.calls: list[str] = []
        self.util = 40

    def _call(self, name):
        self.calls.append(name)
        if name == self.fail_on:
            raise RuntimeError(f"{name} failed")

    def nvmlInit(self):
        self._call("nvmlInit")

    def nvmlShutdown(self):
        self._call("nvmlShutdown")

    def nvmlDeviceGetHandleByIndex(self, index):
        self._call("nvmlDeviceGetHandleByIndex")
        return ("handle", index)

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._call("nvmlDeviceGetUtilizationRates")
        return types.SimpleNamespace(gpu=self.util, memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._call("nvmlDeviceGetMemoryInfo")
        return types.SimpleNamespace(used=3 << 30, total=8 << 30, free=5 << 30)


def test_sampler_reads_util_memory_and_rss():
    nvml = FakeNvml()
    sampler = ResourceSampler(nvml=nvml)
    sampler.sample()
    assert sampler.gpu_util == 0.4
    assert (sampler.gpu_memory_used, sampler.gpu_memory_total) == (3 << 30, 8 << 30)
    assert sampler.rss_bytes > 1 << 20
    nvml.util = 100
    sampler.sample()
    assert sampler.gpu_util == 1.0 and nvml.calls.count("nvmlInit") == 1


@pytest.mark.parametrize("fail_on", ["nvmlInit", "nvmlDeviceGetHandleByIndex",
                                     "nvmlDeviceGetMemoryInfo"])
def test_failing_nvml_logs_once_and_degrades(fail_on, caplog):
    nvml = FakeNvml(fail_on=fail_on)
    sampler = ResourceSampler(nvml=nvml)
    with caplog.at_level(logging.WARNING, logger="scheduler.signals"):
        for _ in range(3):
            sampler.sample()
    assert [r.message.startswith("NVML unavailable") for r in caplog.records] == [True]
    assert sampler.gpu_util is None and sampler.gpu_memory_used is None
    assert sampler.rss_bytes is not None  # the other signals carry on
    assert nvml.calls.count(fail_on) == 1  # never retried


def test_absent_pynvml_library_degrades(caplog):
    """On this machine pynvml imports but finds no driver: nvmlInit raises NVMLError."""
    sampler = ResourceSampler()  # the real pynvml module
    with caplog.at_level(logging.WARNING, logger="scheduler.signals"):
        sampler.sample()
        sampler.sample()
    if sampler.nvml_available:
        pytest.skip("this machine has a working NVML")
    assert len(caplog.records) == 1 and sampler.gpu_util is None


def test_missing_pynvml_module_degrades(monkeypatch, caplog):
    """No nvidia-ml-py installed at all: the import fails, logged once, RSS still sampled."""
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise
    sampler = ResourceSampler()
    with caplog.at_level(logging.WARNING, logger="scheduler.signals"):
        sampler.sample()
        sampler.sample()
    assert len(caplog.records) == 1
    assert caplog.records[0].message.startswith("NVML unavailable (ModuleNotFoundError")
    assert sampler.gpu_util is None and sampler.rss_bytes > 0


async def test_sampler_runs_off_loop_and_stops():
    nvml = FakeNvml()
    sampler = ResourceSampler(interval_s=0.01, nvml=nvml)
    sampler.start()
    await asyncio.sleep(0.1)
    await sampler.stop()
    reads = nvml.calls.count("nvmlDeviceGetUtilizationRates")
    assert reads >= 2 and nvml.calls[-1] == "nvmlShutdown"
    await asyncio.sleep(0.05)
    assert nvml.calls.count("nvmlDeviceGetUtilizationRates") == reads


def test_drain_rate_measures_busy_time_only():
    rate = DrainRate(window_s=10.0, min_busy_s=0.5)
    assert rate.requests_per_s is None
    rate.set_busy(0.0, True)
    for i in range(1, 21):  # 4 completions/s of 100-token prompts for 5 s
        rate.record(i * 0.25, 100)
    assert rate.requests_per_s == pytest.approx(4.0, rel=0.15)
    assert rate.tokens_per_s == pytest.approx(400.0, rel=0.15)
    rate.set_busy(5.0, False)
    rate.record(60.0, 100)  # idle: neither the minute nor this completion count
    rate.set_busy(60.0, True)
    assert rate.requests_per_s == pytest.approx(4.0, rel=0.15)


def test_drain_rate_follows_a_change():
    rate = DrainRate(window_s=2.0, min_busy_s=0.5)
    rate.set_busy(0.0, True)
    t = 0.0
    for _ in range(20):
        t += 0.1  # 10/s
        rate.record(t, 1)
    for _ in range(20):
        t += 1.0  # then 1/s for 20 s: many windows later
        rate.record(t, 1)
    assert rate.requests_per_s == pytest.approx(1.0, rel=0.3)


def test_drain_rate_needs_warmup():
    rate = DrainRate(window_s=10.0, min_busy_s=1.0)
    rate.set_busy(0.0, True)
    rate.record(0.1, 10)
    assert rate.requests_per_s is None
    rate.record(1.1, 10)
    assert rate.requests_per_s is not None
