"""Host memory for engines that run on the CPU: glibc's malloc set to keep freed step
buffers, and the KV pool's lazily mapped small pages (`lazy_zeros`).

A CPU step allocates tens of MB of activations (a 2048-token prefill's MLP output alone
is 25 MB). glibc serves such blocks with fresh mmaps and unmaps them on free, so every
step page-faults and zeroes its activations again. With the mmap threshold above any
step buffer and trimming off, freed blocks are reused from the heap: prefill steps ran
~20% faster on the 2-core box (docs/benchmarks.md). The cost is that the process keeps its
peak heap rather than handing it back to the OS. Set once the weights and the KV pool
are allocated, so those (long-lived, large) stay in their own mappings. An engine that
has been idle a while hands the free part back (`release_free_heap`): a served model's
memory after a burst of work is then its weights, KV pool and runtime, not the burst's
peak (150 MB on the default model after 64 prompts at once).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
import mmap

import torch

_M_TRIM_THRESHOLD = -1  # mallopt parameter numbers from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_BYTES = 1 << 30
_NEVER_TRIM_BYTES = 2**31 - 1


def keep_freed_step_buffers() -> bool:
    """Tune glibc's malloc as above; False where the C library is not glibc."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c")).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    return (mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES) == 1
            and mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM_BYTES) == 1)


def release_free_heap() -> bool:
    """glibc's malloc_trim(0): free heap pages (all arenas) go back to the OS; False
    where the C library is not glibc."""
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    return trim(0) == 1


def lazy_zeros(shape: tuple, dtype: torch.dtype) -> torch.Tensor:
    """A zeroed CPU tensor on an anonymous mapping of small pages: the OS maps zero pages
    that take memory only once written, so a KV pool sized for a whole context costs what
    the live sequences use (torch.zeros writes every page at once). Not in transparent huge
    pages (numpy's zeros asks for them): a huge page is faulted in, 2 MB at once, by the
    first write into it, so one decode step of SmolLM2-135M that crossed into fresh pool
    memory faulted 2 MB of every layer's K and V, 60 of them, and stalled 110-260 ms on the
    2-core AMD box (docs/benchmarks.md); small pages spread that cost over the blocks."""
    count = math.prod(shape)
    buffer = mmap.mmap(-1, count * dtype.itemsize)
    try:
        buffer.madvise(mmap.MADV_NOHUGEPAGE)
    except (AttributeError, OSError):  # no THP in this kernel or on this OS: small already
        pass
    return torch.frombuffer(buffer, dtype=dtype, count=count).view(shape)
