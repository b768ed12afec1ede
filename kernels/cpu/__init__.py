"""C++ CPU kernels for fp32 (ops.cpp: decode attention and pointwise ops; linear.cpp: the
projections' matmul on packed weights; prefill_attention.cpp: prefill/extend attention),
built with torch's extension loader at first use and cached (TORCH_EXTENSIONS_DIR,
default ~/.cache/torch_extensions).

`load()` returns the built module, or None where it cannot be built (no C++ compiler or
ninja): callers then keep the plain-torch path, which computes the same thing.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform

log = logging.getLogger(__name__)

SOURCES = [os.path.join(os.path.dirname(__file__), name)
           for name in ("ops.cpp", "linear.cpp", "prefill_attention.cpp")]
# paged_decode/prefill_attention are built for these head sizes (templates).
ATTENTION_HEAD_DIMS = (64, 128)
# -march=native: built for the CPU that runs it. -ffast-math lets GCC vectorize exp()
# (glibc's vector math) and reorder sums; it is a compile flag only, so the library does
# not switch the process to flush-to-zero when it loads.
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math"]


@functools.cache
def load():
    """The compiled kernels module, or None (logged) if this machine cannot build it."""
    try:
        from torch.utils import cpp_extension
        return cpp_extension.load(name=f"tokenwire_cpu_ops_{_cpu_id()}", sources=SOURCES,
                                  extra_cflags=FLAGS, extra_ldflags=["-fopenmp"])
    except Exception as exc:  # a missing compiler or ninja raises several types
        log.warning("CPU kernels unavailable, using plain torch ops: %s", exc)
        return None


def _cpu_id() -> str:
    """A short hash of this CPU's instruction-set flags: a cache shared between machines
    (an NFS home) keeps one -march=native build per kind of CPU, never the wrong one."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return hashlib.sha1((platform.machine() + flags).encode()).hexdigest()[:10]
