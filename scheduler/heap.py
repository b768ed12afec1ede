"""The garbage collector's heap: frozen once the default model is up, and collected again
when a model unloads, walking the frozen heap only when that model is part of it.

A full collection walks every tracked object with the GIL held, stalling the event loop
and every engine (~190 ms on the default model's ~380k objects, docs/benchmarks.md). So
the entry point freezes what is alive once the default model is ready (gateway/cli), and
an unload, which must collect the model's cycles, thaws the frozen heap only for a model
that was loaded before the last freeze (its objects are in it); a model loaded since has
none there, and a collection that leaves the frozen heap alone frees it.
"""
from __future__ import annotations

import gc

_freezes = 0  # how many times the heap was frozen: a model loaded before the last is in it


def freeze() -> None:
    """Collect the garbage (none of it kept for good), then freeze what is alive."""
    global _freezes
    gc.collect()
    gc.freeze()
    _freezes += 1


def freezes() -> int:
    """The freeze count now: a model records it when it loads (collect_unloaded's key)."""
    return _freezes


def collect_unloaded(loaded_at: int) -> None:
    """Collect an unloaded model's cycles; `loaded_at`: freezes() when it loaded."""
    if loaded_at < _freezes:  # frozen with the heap: thaw, collect, freeze the rest again
        gc.unfreeze()
        freeze()
    else:
        gc.collect()
