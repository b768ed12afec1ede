"""C++ CPU kernels for fp32 decode steps (ops.cpp), built with torch's extension loader
at first use and cached (TORCH_EXTENSIONS_DIR, default ~/.cache/torch_extensions).

`load()` returns the built module, or None where it cannot be built (no C++ compiler or
ninja): callers then keep the plain-torch path, which computes the same thing.
"""
from __future__ import annotations

import functools
import logging
import os

log = logging.getLogger(__name__)

SOURCE = os.path.join(os.path.dirname(__file__), "ops.cpp")
# -march=native: the build runs on the machine that uses it (and is cached per source hash).
# paged_decode_attention is built for these head sizes (templates in ops.cpp).
DECODE_HEAD_DIMS = (64, 128)
FLAGS = ["-O3", "-march=native", "-fopenmp", "-ffast-math"]


@functools.cache
def load():
    """The compiled kernels module, or None (logged) if this machine cannot build it."""
    try:
        from torch.utils import cpp_extension
        return cpp_extension.load(name="tokenwire_cpu_ops", sources=[SOURCE],
                                  extra_cflags=FLAGS, extra_ldflags=["-fopenmp"])
    except Exception as exc:  # a missing compiler or ninja raises several types
        log.warning("CPU kernels unavailable, using plain torch ops: %s", exc)
        return None
