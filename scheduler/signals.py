"""Load signals the admission policy reads: NVML GPU utilization and memory, process RSS,
and the measured drain rate of the engine.

NVML is sampled off the event loop (asyncio.to_thread) every `interval_s`; an NVML that
is absent (no NVIDIA driver, as on CPU machines) or that fails is logged once and then
left alone, and its signals read None so the policy falls back to the others.
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib
import logging
import math

import psutil

log = logging.getLogger(__name__)


class ResourceSampler:
    """Periodic samples of GPU utilization/memory (NVML) and this process's RSS.

    `nvml` is the pynvml module, injectable for tests; None imports it on first use.
    """

    def __init__(self, interval_s: float = 1.0, device_index: int = 0, nvml=None,
                 process: psutil.Process | None = None):
        self.interval_s = interval_s
        self.device_index = device_index
        self._nvml = nvml
        self._handle = None
        self._nvml_off = False  # set once NVML is found absent or failing
        self._process = process or psutil.Process()
        self._task: asyncio.Task | None = None
        self.gpu_util: float | None = None  # 0..1
        self.gpu_memory_used: int | None = None  # bytes
        self.gpu_memory_total: int | None = None
        self.rss_bytes: int | None = None

    @property
    def nvml_available(self) -> bool:
        return self._handle is not None and not self._nvml_off

    def sample(self) -> None:
        """Take one sample of every signal (blocking; call it off the event loop)."""
        self.rss_bytes = self._process.memory_info().rss
        if self._nvml_off:
            return
        try:
            if self._handle is None:
                self._handle = self._open_device()
            nvml = self._nvml
            util = nvml.nvmlDeviceGetUtilizationRates(self._handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(self._handle)
            self.gpu_util = util.gpu / 100.0
            self.gpu_memory_used, self.gpu_memory_total = int(mem.used), int(mem.total)
        except Exception as exc:  # noqa: BLE001 - any NVML trouble degrades, never crashes
            self._turn_nvml_off(exc)

    def _open_device(self):
        if self._nvml is None:
            self._nvml = importlib.import_module("pynvml")
        self._nvml.nvmlInit()
        return self._nvml.nvmlDeviceGetHandleByIndex(self.device_index)

    def _turn_nvml_off(self, exc: BaseException) -> None:
        log.warning("NVML unavailable (%s: %s); GPU signals off, admission uses the others",
                    type(exc).__name__, exc)
        self._nvml_off = True
        self.gpu_util = self.gpu_memory_used = self.gpu_memory_total = None
        if self._handle is not None:
            self._handle = None
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()

    async def run(self) -> None:
        """Sample forever, each sample on a worker thread so the event loop never waits."""
        while True:
            await asyncio.to_thread(self.sample)
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self.run(), name="nvml-sampler")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._handle is not None:
            self._handle = None
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()


class DrainRate:
    """How fast the engine finishes work while it is saturated: EWMA of completions/s
    and prompt tokens/s, over busy time only.

    Counts decay with time constant `window_s`; the rate is the decayed count over the
    decayed length of busy time. Idle time is not counted (an idle server finishes
    nothing, which says nothing about its capacity), nor are completions while idle.
    """

    __slots__ = ("window_s", "min_busy_s", "_requests", "_tokens", "_busy_window",
                 "_busy_total", "_last", "_busy")

    def __init__(self, window_s: float = 10.0, min_busy_s: float = 0.5):
        self.window_s = window_s
        self.min_busy_s = min_busy_s
        self._requests = 0.0
        self._tokens = 0.0
        self._busy_window = 0.0
        self._busy_total = 0.0  # undecayed, for the warm-up floor
        self._last: float | None = None
        self._busy = False

    def _advance(self, now: float) -> None:
        if self._last is not None and self._busy and now > self._last:
            decay = math.exp(-(now - self._last) / self.window_s)
            self._requests *= decay
            self._tokens *= decay
            self._busy_window = self._busy_window * decay + self.window_s * (1.0 - decay)
            self._busy_total += now - self._last
        self._last = now

    def set_busy(self, now: float, busy: bool) -> None:
        """Mark whether the engine is saturated from `now` on."""
        self._advance(now)
        self._busy = busy

    def record(self, now: float, prompt_tokens: int) -> None:
        """One request finished and released its engine slot."""
        self._advance(now)
        if self._busy:
            self._requests += 1.0
            self._tokens += prompt_tokens

    def _measured(self) -> bool:
        return self._requests > 0 and self._busy_total >= self.min_busy_s

    @property
    def requests_per_s(self) -> float | None:
        return self._requests / self._busy_window if self._measured() else None

    @property
    def tokens_per_s(self) -> float | None:
        if not self._measured() or self._tokens <= 0:
            return None
        return self._tokens / self._busy_window
