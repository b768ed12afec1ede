"""An unload's collection (scheduler/heap.py): the frozen heap is thawed and walked only
for a model frozen in it; a model loaded since the last freeze is freed without that."""
import gc
import weakref

from scheduler import heap


class _Model:
    """A stand-in for an engine's objects: a cycle, which only the collector frees."""

    def __init__(self):
        self.me = self


def test_an_unload_thaws_the_frozen_heap_only_for_a_model_frozen_in_it():
    old = _Model()
    old_ref = weakref.ref(old)
    old_at = heap.freezes()  # loaded, then the heap frozen with it
    heap.freeze()
    young = _Model()
    young_ref = weakref.ref(young)
    young_at = heap.freezes()  # loaded after the last freeze
    del old, young
    try:
        heap.collect_unloaded(young_at)
        assert young_ref() is None  # freed ...
        assert old_ref() is not None and heap.freezes() == young_at  # ... heap not thawed
        heap.collect_unloaded(old_at)
        assert old_ref() is None  # thawed, collected, and what lives frozen again
        assert gc.get_freeze_count() > 0 and heap.freezes() == young_at + 1
    finally:
        gc.unfreeze()
